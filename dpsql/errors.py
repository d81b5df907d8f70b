"""dpsql's exceptions: one root, one class per kind of refusal, and THE error table.

Every message says what was asked, what is allowed and how to fix it. Messages never
contain data values (cell counts, raw rows, engine error text): only policy and query text,
which are public.

:data:`ERROR_TABLE` maps each class to its command-line exit status (``sysexits.h``), its
PostgreSQL SQLSTATE and its PEP 249 (DB-API) exception class name. It is the only such
mapping: the CLI, the shell, scripts and the DB-API driver read it through
:func:`error_row` (docs/scripts.md, "Exit status"; docs/dbapi.md, "Errors").
"""

from __future__ import annotations

import os
import re
import textwrap
from dataclasses import dataclass
from fractions import Fraction


class DpsqlError(Exception):
    """Root of every error dpsql raises on purpose. Raised itself: a refused request that no
    subclass describes (e.g. a release name used for a different batch)."""


class UsageError(DpsqlError):
    """The command line is malformed: an unknown option, a missing argument, a flag value of
    the wrong form (``--epsilon abc``). Ranges and meanings are checked later
    (:class:`PrivacyParameterError`)."""


class InputFileError(DpsqlError):
    """A file named by the user (database, policy, script) does not exist, is a directory,
    cannot be read, or is not UTF-8 text."""


class ParseError(DpsqlError):
    """The SQL text could not be parsed. Carries the position of the problem."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None,
                 highlight: str | None = None):
        self.line = line
        self.column = column
        self.highlight = highlight
        where = f" (line {line}, column {column})" if line is not None else ""
        super().__init__(f"{message}{where}")


class UnsupportedQueryError(ParseError):
    """The SQL parsed but uses a construct outside dpsql's allow-list."""


class PolicyError(DpsqlError):
    """A policy (domains, budgets) is invalid, missing, or a query contradicts it."""


class UnknownTableError(UnsupportedQueryError, PolicyError):
    """A query or command names a table that is not protected (no policy declares it).

    Both an :class:`UnsupportedQueryError` (it carries the position in the SQL, when there
    is one) and a :class:`PolicyError` (the policy is what is missing)."""


class PrivacyParameterError(DpsqlError):
    """An epsilon / delta / calibration request is invalid."""


class StrategyError(DpsqlError):
    """A strategy cannot be built or does not support the workload."""


class EngineError(DpsqlError):
    """The database engine failed. Its own message is withheld: it can contain data values."""


class SchemaVersionError(EngineError):
    """The database cannot be opened: its dpsql tables were written by a newer dpsql (a
    newer schema version); nothing was changed. Upgrade dpsql."""


class DomainTooLarge(DpsqlError):
    """An operation on an implicit (Kronecker / marginal) workload would build an array the
    size of the full product of the columns; refused before allocating it."""


class BatchTooLarge(DpsqlError):
    """A batch cannot be planned within the request's ``max_memory`` and ``time_limit``:
    every candidate strategy's predicted memory or time (from the batch's size: cells,
    queries, the strategy's own dense matrices and flops) exceeds them, or an allocation
    failed anyway. Refused before any charge; the message names the limit, the batch's size
    and the columns and statements that make it large (split the batch there)."""


class LockTimeoutError(DpsqlError):
    """Another process held the database for longer than the configured wait."""


class RequestCancelled(KeyboardInterrupt):
    """A request was cancelled before its charge: Ctrl-C, a DB-API ``Connection.cancel()``
    from another thread, or a server client's disconnect (``Session.cancel()``). Nothing was
    charged. A ``KeyboardInterrupt`` (not an ``Exception``) so that no ``except Exception``
    on the way swallows it, and every interface handles it as it handles Ctrl-C."""


class Terminated(RequestCancelled):
    """SIGTERM stopped the command-line interface (a request in planning is cancelled,
    nothing charged; one already charged completes first, like Ctrl-C)."""


class ScaleRefused(StrategyError):
    """The kernel's own computation of a noise scale disagrees with the caller's: refused
    before any noise was drawn (and, for the matrix and d_X Laplace releases, before the
    charge). One line, naming the mechanism and the shortfall. A bug in dpsql if it is
    ever seen: no analyst input makes a scale too small."""


class InternalFailure(DpsqlError):
    """dpsql itself failed (a bug, or a dependency such as OpenDP refusing what dpsql
    checked): nothing was released. Also the row for any exception that is not a
    :class:`DpsqlError` reaching an interface."""


class NoTerminal(DpsqlError):
    """A confirmation was needed but there is no terminal to ask on: nothing was spent. The
    shell adds how to spend without asking."""


class WorkloadBlockError(ParseError):
    """A workload marker out of place: ``BEGIN WORKLOAD`` inside an open block (blocks do not
    nest), or a script's block never committed (:mod:`dpsql.sql.marker`). Nothing charged."""


class ScriptError(DpsqlError):
    """A script was refused or stopped. ``released``: what it released before stopping;
    ``cause``: the error that stopped it, if any (its row in the table decides the exit
    status, so a script stopped by an exhausted budget exits as the budget error does)."""

    def __init__(self, message: str, *, workload: int | None = None, released=(),
                 line: int | None = None, column: int | None = None,
                 cause: DpsqlError | None = None):
        super().__init__(" ".join(message.split("\n")))
        self.workload = workload
        self.released = tuple(released)
        self.line = line
        self.column = column
        self.cause = cause


class AccessDenied(DpsqlError):
    """The server's analyst may not do this: a table without an allowance, another
    analyst's result table, an owner-only operation. Nothing was charged."""


class AuthenticationFailed(DpsqlError):
    """The server refused the login (unknown user or wrong password; never says which)."""


class TooManyConnections(DpsqlError):
    """The server already serves its documented maximum of connections; try again later."""


class BudgetExceededError(DpsqlError):
    """A release would spend more than a table's budget. Nothing was charged."""

    def __init__(self, table: str, quantity: str, spent: Fraction, requested: Fraction,
                 limit: Fraction, note: str = ""):
        self.table = table
        self.quantity = quantity
        self.spent = spent
        self.requested = requested
        self.limit = limit
        super().__init__(
            f"budget exceeded on table {table!r}: {quantity} spent {show_exact(spent)}, "
            f"requested {show_exact(requested)}, limit {show_exact(limit)} "
            f"(remaining {show_exact(max(limit - spent, Fraction(0)))}); nothing was charged "
            "or released; ask for less, or the data owner must raise the budget"
            + (f"; {note}" if note else "")
        )


def show_exact(value) -> str:
    """Show an exact budget value readably: a short decimal when exact, else num/den."""
    f = Fraction(repr(value)) if isinstance(value, float) else Fraction(value)
    if f == 0:
        return "0"
    if f.denominator == 1 and abs(f) < 10 ** 15:     # 10, not 1e+01
        return str(f.numerator)
    for digits in range(1, 18):
        s = f"{float(f):.{digits}g}"
        if Fraction(s) == f:
            return s
    return f"{float(f):.6g} (exactly {f.numerator}/{f.denominator})"


# --------------------------------------------------------------------------- the error table

@dataclass(frozen=True)
class ErrorRow:
    """How one error class leaves each interface."""

    exit_status: int   # dpsql's command-line status (sysexits.h)
    sqlstate: str      # PostgreSQL SQLSTATE, for the PostgreSQL-wire server
    dbapi: str         # the PEP 249 exception class dpsql.dbapi raises (by name)
    meaning: str       # one line, for `dpsql --help` and the docs


EXIT_OK = 0
EXIT_INTERRUPTED = 130     # Ctrl-C (128 + SIGINT); a release being charged completes first
EXIT_TERMINATED = 143      # SIGTERM (128 + SIGTERM); likewise
EXIT_BROKEN_PIPE = 141     # the reader of stdout went away (128 + SIGPIPE), e.g. `| head`
EX_USAGE, EX_DATAERR, EX_NOINPUT, EX_UNAVAILABLE, EX_SOFTWARE, EX_TEMPFAIL, EX_NOPERM = (
    64, 65, 66, 69, 70, 75, 77)

#: THE mapping of every error class to its exit status, SQLSTATE and DB-API class.
#: Budget exhausted is EX_NOPERM (77): the request is valid (not 65) and retrying does not
#: help (not 75); only the data owner's budget forbids it. Its SQLSTATE is 53400
#: configuration_limit_exceeded (class 53, insufficient resources: the owner's configured
#: limit). A lock held too long is EX_TEMPFAIL (75): retry later; a database that cannot
#: be opened or fails is EX_UNAVAILABLE (69): retrying will not help without a fix.
ERROR_TABLE: dict[type, ErrorRow] = {
    DpsqlError: ErrorRow(EX_DATAERR, "42000", "DatabaseError",
                         "request refused"),
    UsageError: ErrorRow(EX_USAGE, "08P01", "InterfaceError",
                         "usage: unknown option, missing argument, malformed value"),
    InputFileError: ErrorRow(EX_NOINPUT, "58P01", "OperationalError",
                             "input file (database, policy, script) missing, a directory, "
                             "unreadable or not UTF-8"),
    ParseError: ErrorRow(EX_DATAERR, "42601", "ProgrammingError", "SQL syntax error"),
    UnsupportedQueryError: ErrorRow(EX_DATAERR, "0A000", "ProgrammingError",
                                    "SQL outside the allow-list or the domains"),
    UnknownTableError: ErrorRow(EX_DATAERR, "42P01", "ProgrammingError",
                                "table not protected"),
    PolicyError: ErrorRow(EX_DATAERR, "42P17", "ProgrammingError",
                          "invalid policy (TOML, types, domains, budgets)"),
    PrivacyParameterError: ErrorRow(EX_DATAERR, "22023", "ProgrammingError",
                                    "bad privacy setting"),
    StrategyError: ErrorRow(EX_DATAERR, "22023", "ProgrammingError",
                            "strategy unknown or unfit"),
    ScriptError: ErrorRow(EX_DATAERR, "42000", "ProgrammingError",
                          "script refused (a setting missing, a name taken)"),
    WorkloadBlockError: ErrorRow(EX_DATAERR, "25000", "ProgrammingError",
                                 "BEGIN WORKLOAD / COMMIT out of place (nested or unclosed)"),
    NoTerminal: ErrorRow(EX_DATAERR, "55000", "OperationalError",
                         "confirmation needed, no terminal"),
    SchemaVersionError: ErrorRow(EX_UNAVAILABLE, "55000", "OperationalError",
                                 "database written by a newer dpsql: upgrade dpsql"),
    EngineError: ErrorRow(EX_UNAVAILABLE, "58000", "InternalError",
                          "database cannot be opened or the engine failed"),
    DomainTooLarge: ErrorRow(EX_DATAERR, "54000", "OperationalError",
                             "would build the full product of the columns: split the batch"),
    BatchTooLarge: ErrorRow(EX_DATAERR, "54000", "OperationalError",
                            "batch too large for max_memory / time_limit: split it"),
    LockTimeoutError: ErrorRow(EX_TEMPFAIL, "55P03", "OperationalError",
                               "database busy in another process: try again later"),
    BudgetExceededError: ErrorRow(EX_NOPERM, "53400", "BudgetExceeded",
                                  "budget exhausted: nothing was charged"),
    AccessDenied: ErrorRow(EX_NOPERM, "42501", "ProgrammingError",
                           "not granted to this analyst (server): nothing was charged"),
    AuthenticationFailed: ErrorRow(EX_NOPERM, "28P01", "OperationalError",
                                   "login refused (server): unknown user or wrong password"),
    TooManyConnections: ErrorRow(EX_TEMPFAIL, "53300", "OperationalError",
                                 "server at its connection limit: try again later"),
    RequestCancelled: ErrorRow(EXIT_INTERRUPTED, "57014", "OperationalError",
                               "cancelled (Ctrl-C, cancel()) before the charge: nothing "
                               "charged"),
    Terminated: ErrorRow(EXIT_TERMINATED, "57P01", "OperationalError",
                         "terminated (SIGTERM); a release already charged completes first"),
    ScaleRefused: ErrorRow(EX_SOFTWARE, "XX000", "InternalError",
                           "the kernel refused a noise scale (a dpsql bug; nothing was drawn)"),
    InternalFailure: ErrorRow(EX_SOFTWARE, "XX000", "InternalError",
                              "internal error (please report it)"),
}


def error_row(error: BaseException | type) -> ErrorRow:
    """The table's row for an error (instance or class): its nearest class with a row. A
    :class:`ScriptError` with a ``cause`` takes its cause's row; anything that is not a
    :class:`DpsqlError` is an internal failure."""
    if isinstance(error, BaseException):
        cause = getattr(error, "cause", None)
        if isinstance(error, ScriptError) and isinstance(cause, DpsqlError):
            return error_row(cause)
        error = type(error)
    for klass in error.__mro__:
        if klass in ERROR_TABLE:
            return ERROR_TABLE[klass]
    return ERROR_TABLE[InternalFailure]


def exit_status(error: BaseException | type) -> int:
    """The command-line exit status of an error, from :data:`ERROR_TABLE`."""
    return error_row(error).exit_status


def one_line(error: BaseException) -> str:
    """An error as the interfaces print it: one line; a non-dpsql exception's text is
    withheld (it could carry data values)."""
    if not isinstance(error, DpsqlError):
        return (f"internal error ({type(error).__name__}); details withheld because they "
                "could contain data; please report it")
    return re.sub(r"\s*\n\s*", " ", str(error)).strip() or type(error).__name__


def exit_statuses_text(width: int = 88) -> str:
    """The exit statuses, one per line, for ``dpsql --help`` (generated from the table)."""
    by_status: dict[int, list[str]] = {}
    for row in ERROR_TABLE.values():
        by_status.setdefault(row.exit_status, []).append(row.meaning)
    rows = [(EXIT_OK, "success")]
    rows += [(status, "; ".join(meanings)) for status, meanings in sorted(by_status.items())]
    if EXIT_INTERRUPTED not in by_status:
        rows.append((EXIT_INTERRUPTED, "interrupted (Ctrl-C)"))
    rows.append((EXIT_BROKEN_PIPE, "output pipe closed by its reader (e.g. `| head`)"))
    rows.sort(key=lambda row: row[0])
    return "\n".join(textwrap.fill(text, width, initial_indent=f"  {status:>3}  ",
                                    subsequent_indent=" " * 7) for status, text in rows)


# --------------------------------------------------------------------------- input files

def read_input_file(path: str, what: str) -> str:
    """The text of a user-named file (``what``: "policy file", "script", ...), a UTF-8 byte
    order mark dropped. Every way it cannot be read is one :class:`InputFileError` naming
    the problem and the fix; its bytes are never echoed."""
    shown = repr(str(path))
    if not os.path.exists(path):
        raise InputFileError(f"{what} {shown} does not exist; check the path")
    if os.path.isdir(path):
        raise InputFileError(f"{what} {shown} is a directory; give the path of a file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InputFileError(f"{what} {shown} cannot be read ({reason}); check its "
                             "permissions") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{what} {shown} is not UTF-8 text (invalid byte at offset "
                             f"{exc.start}); save it as UTF-8") from None
    return text[1:] if text.startswith("\ufeff") else text


def check_database_path(path: str, create: bool, fix: str = "pass create=True to create "
                        "a new database") -> None:
    """A database named by the user must exist unless ``create`` (``:memory:`` always may):
    a typo'd path would otherwise become a new, empty database. Missing or a directory is
    an :class:`InputFileError` naming the path and ``fix``."""
    if path == ":memory:" or path.startswith(":memory:"):
        return
    if os.path.isdir(path):
        raise InputFileError(f"database {str(path)!r} is a directory; give the path of a "
                             "DuckDB database file")
    if not create and not os.path.exists(path):
        raise InputFileError(f"database {str(path)!r} does not exist; check the path, or "
                             f"{fix}")

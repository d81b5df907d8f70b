"""PEP 249 (DB-API 2.0) driver for dpsql: read-only, and every execute is one charged release.

Each ``execute``/``executemany`` is ONE release (one workload, one ledger charge of the
connection's current epsilon/delta, committed before any number is returned); a refused
request charges nothing. Accuracy first: a connection set with ``target_rmse`` or
``max_stderr`` instead of ``epsilon`` spends the smallest epsilon meeting it, only with
``confirm=True`` (``cursor.explain`` shows that epsilon first). With ``reuse`` (the
default) an execute is answered from past releases wherever they are at least as accurate:
a batch they answer in full is recorded at zero cost. ``BEGIN WORKLOAD`` ... ``COMMIT``
(:mod:`dpsql.sql.marker`) collects several executes into ONE release, charged at the
``COMMIT``; ``ROLLBACK`` discards them. Parameters (qmark) are bound
as literals in sqlglot's syntax tree, never by string formatting. ``threadsafety = 2``:
threads may share the module and connections, not cursors (a Session holds a per-file lock
for each whole request, and a connection's settings are read once per execute under its own
lock). Design, error mapping and compliance: docs/dbapi.md.
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import functools
import math
import numbers
import os
import threading
import warnings
import weakref
from typing import Any, Iterable, Iterator, Sequence

from sqlglot import exp

from dpsql import errors as dp
from dpsql.session import InterruptedAfterRelease, Session
from dpsql.sql.marker import WorkloadBlock, has_marker, notice_discarded, pieces, walk
from dpsql.sql.parse import split_statements
from dpsql.request.declared import CONNECTION_SETTINGS, settings_for
from dpsql.request.value import Request
from dpsql.workload import limits as planning

apilevel = "2.0"
threadsafety = 2
paramstyle = "qmark"


# --------------------------------------------------------------------------- exceptions

class Warning(Exception):  # noqa: A001 - the name is the PEP's
    """Important warnings (PEP 249). dpsql raises none today."""


class Error(Exception):
    """Base of every error this driver raises (PEP 249)."""


class InterfaceError(Error):
    """The driver itself was misused or failed, not the database."""


class DatabaseError(Error):
    """An error related to the database."""


class DataError(DatabaseError):
    """Problems with processed data (unused: dpsql never fails on a data value)."""


class OperationalError(DatabaseError):
    """The request could not be served now: budget exhausted, database busy."""


class IntegrityError(DatabaseError):
    """Relational integrity (unused: the driver never writes rows)."""


class InternalError(DatabaseError):
    """The database engine failed (its own message is withheld)."""


class ProgrammingError(DatabaseError):
    """The request is invalid: SQL outside the allow-list, bad parameters, closed objects."""


class NotSupportedError(DatabaseError):
    """The operation does not exist for dpsql (rollback)."""


class WorkloadDiscarded(UserWarning):
    """A connection was closed with a workload block open: its statements were discarded
    and nothing was charged (a Python warning category, not a PEP 249 exception)."""


class BudgetExceeded(OperationalError):
    """The release would exceed a budget; nothing was charged. Carries dpsql's exact figures."""

    table = quantity = spent = requested = limit = None


def error_class(error: BaseException | type) -> type:
    """The PEP 249 class for a dpsql error: the one :data:`dpsql.errors.ERROR_TABLE` names."""
    return globals()[dp.error_row(error).dbapi]


@contextlib.contextmanager
def _backend() -> Iterator[None]:
    """The boundary with dpsql: its errors leave as PEP 249 errors (the class the error
    table names), chained with ``from``."""
    try:
        yield
    except dp.RequestCancelled as exc:    # Connection.cancel(): nothing was charged
        raise error_class(exc)(str(exc)) from exc
    except dp.DpsqlError as exc:
        err = error_class(exc)(str(exc))
        if isinstance(exc, dp.BudgetExceededError):
            for attr in ("table", "quantity", "spent", "requested", "limit"):
                setattr(err, attr, getattr(exc, attr))
        raise err from exc


def check_closed(method):
    """Refuse any use of a closed connection or cursor (PEP 249: raise an Error)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self.closed:
            raise ProgrammingError(f"{type(self).__name__} is closed; open a new one")
        return method(self, *args, **kwargs)
    return wrapper


# --------------------------------------------------------------------------- types

class DBAPITypeObject:
    """A PEP 249 type object: equal to every type code (DuckDB type name) it covers."""

    def __init__(self, name: str, *type_codes: str):
        self.name = name
        self.type_codes = frozenset(type_codes)

    def __eq__(self, other) -> bool:
        if isinstance(other, DBAPITypeObject):
            return self is other
        return isinstance(other, str) and other.upper() in self.type_codes

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"<DB-API type {self.name}>"


STRING = DBAPITypeObject("STRING", "VARCHAR")
BINARY = DBAPITypeObject("BINARY", "BLOB")
NUMBER = DBAPITypeObject("NUMBER", "BIGINT", "INTEGER", "DOUBLE", "DECIMAL")
DATETIME = DBAPITypeObject("DATETIME", "DATE", "TIME", "TIMESTAMP")
ROWID = DBAPITypeObject("ROWID", "ROWID")

Date = datetime.date
Time = datetime.time
Timestamp = datetime.datetime
Binary = bytes
DateFromTicks = datetime.date.fromtimestamp              # local time, as the PEP's examples
TimestampFromTicks = datetime.datetime.fromtimestamp


def TimeFromTicks(ticks: float) -> datetime.time:
    return TimestampFromTicks(ticks).time()


def _type_code(values) -> str | None:
    """The DuckDB type name of a released column, from its (public) values."""
    for v in values:
        if v is None:
            continue
        if isinstance(v, str):
            return "VARCHAR"
        return "BIGINT" if isinstance(v, numbers.Integral) else "DOUBLE"
    return None


#: the last columns of every result table: count, stderr, ci_low, ci_high (DOUBLE, and
#: NULL in every row for stderr and the interval when the error is data-dependent: MWEM)
_ANSWER_COLUMNS = 4


# --------------------------------------------------------------------------- binding

def _literal(value: Any, position: int) -> exp.Expression:
    """One parameter as a syntax-tree literal; refuses every type dpsql cannot compare."""
    where = f"parameter {position}"
    if value is None:
        raise ProgrammingError(f"{where} is None: a comparison with NULL is never true in "
                               "SQL; write IS NULL / IS NOT NULL in the SQL text instead")
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, bool):
        raise ProgrammingError(f"{where} is a bool; pass an int or a str matching the "
                               "column's declared domain")
    if isinstance(value, numbers.Integral):
        number, negative = str(abs(int(value))), value < 0
    elif isinstance(value, (float, decimal.Decimal)):
        if not (math.isfinite(value) if isinstance(value, float) else value.is_finite()):
            raise ProgrammingError(f"{where} is not finite; pass a finite number")
        if isinstance(value, float):
            number, negative = repr(abs(value)), value < 0
        else:       # no arithmetic: abs() and < round and trap in the context (Overflow)
            if value and not -400 < value.adjusted() < 400:
                raise DataError(f"{where} is out of range: a number's magnitude must lie "
                                "between 1e-400 and 1e400 (or be 0)")
            number, negative = str(value.copy_abs()), value.is_signed() and bool(value)
    else:
        raise ProgrammingError(f"{where} has type {type(value).__name__}; dpsql binds int, "
                               "float, str and decimal.Decimal")
    node = exp.Literal.number(number)
    return exp.Neg(this=node) if negative else node


class _Template:
    """A batch parsed once; ``bind`` returns its statements with the parameters inlined."""

    def __init__(self, sql: Any):
        if not isinstance(sql, str):
            raise ProgrammingError(f"the operation must be SQL text (str), got "
                                   f"{type(sql).__name__}")
        self.sql = sql
        with _backend():
            self.statements = split_statements(sql)
        self.count = 0
        for stmt in self.statements:
            for node in stmt.find_all(exp.Placeholder, bfs=False):
                if node.this is not None:
                    raise ProgrammingError(
                        f"placeholder {node.sql()!r} is not supported: paramstyle is 'qmark', "
                        "write ? for each parameter and pass a sequence")
                self.count += 1

    def bind(self, parameters: Any) -> str | list[str]:
        if parameters is None:
            parameters = ()
        if isinstance(parameters, (str, bytes, bytearray)) or not isinstance(parameters,
                                                                              Sequence):
            raise ProgrammingError(
                f"parameters must be a sequence (tuple or list) for paramstyle 'qmark', got "
                f"{type(parameters).__name__}")
        if len(parameters) != self.count:
            raise ProgrammingError(f"the SQL has {self.count} placeholder(s) but "
                                   f"{len(parameters)} parameter(s) were given")
        if self.count == 0:
            return self.sql                      # submitted as written (ledger, positions)
        values = iter(parameters)
        position = 0
        bound = []
        for stmt in self.statements:
            tree = stmt.copy()
            # depth-first in argument order: the placeholders' order in the text
            for node in list(tree.find_all(exp.Placeholder, bfs=False)):
                position += 1
                if node is tree:
                    raise ProgrammingError("a whole statement cannot be a parameter")
                node.replace(_literal(next(values), position))
            bound.append(tree)
        texts = [tree.sql(dialect="duckdb") for tree in bound]
        marks = pieces(self.sql)   # workload markers stay as written (sqlglot quotes END)
        if len(marks) == len(texts):
            texts = [m.text if m.marker else t for m, t in zip(marks, texts)]
            bound = [None if m.marker else tree for m, tree in zip(marks, bound)]
        # post-condition: the text parses back to exactly the bound trees
        with _backend():
            again = split_statements(texts)
        if len(again) != len(bound) or any(b is not None and a != b
                                           for a, b in zip(again, bound)):
            raise InterfaceError("the parameters could not be bound exactly as literals; "
                                 "nothing was submitted")
        return texts


# --------------------------------------------------------------------------- connection

def _validated(settings: dict) -> dict:
    """The settings, checked together as one :class:`~dpsql.request.value.Request` (all or
    nothing; every setting with its declared parser). Numbers are kept as given (a
    connection reads back the 0.1 it was set to); the others as the parser normalised
    them (a strategy spec stripped, a model in lower case)."""
    with _backend():
        request = Request(**{s.keyword: settings[s.name] for s in _SETTINGS})
    return {s.name: settings[s.name] if s.kind == "number" and settings[s.name] is not None
            else getattr(request, s.keyword) for s in _SETTINGS}


#: the settings of a connection's requests (connect keywords, attributes, configure())
_SETTINGS = settings_for("dbapi")
#: settings :meth:`Session.explain` takes (the others only matter when spending)
_EXPLAIN_SETTINGS = tuple(s.name for s in _SETTINGS if s.explain)


def connect(database, *, spark=None, **settings) -> "Connection":
    """``connect(database, *, epsilon, delta, ...)``: a connection whose every execute
    charges (epsilon, delta) or asks by an accuracy target; change the settings in between
    (attributes or :meth:`Connection.configure`). The keywords are the declared settings
    (:data:`dpsql.request.declared.SETTINGS` exposed to ``dbapi``: epsilon, target_rmse, max_stderr,
    delta, strategy, calibration, model, nonnegative, integer, reuse, confirm) and the
    connection's own (:data:`dpsql.request.declared.CONNECTION_SETTINGS`: lock_timeout, create,
    max_memory, time_limit, spark_master, spark_remote). ``spark=SparkSession`` reads the
    tables whose policy names a Spark source through that session (docs/spark.md).
    ``delta=0`` is pure epsilon-DP; ``model="metric"`` charges epsilon per unit distance
    to the table's metric (d_X) budget. Accuracy first: ``target_rmse`` or ``max_stderr``
    instead of ``epsilon`` (with ``confirm=True`` to spend what it needs)."""
    return Connection(database, spark=spark, **settings)


def _setting(name: str, doc: str) -> property:
    def get(self):
        return self._settings[name]

    @check_closed
    def set_(self, value):
        self.configure(**{name: value})
    return property(get, set_, doc=doc)


def _unknown(settings: dict) -> None:
    unknown = set(settings) - {s.name for s in _SETTINGS}
    if unknown:
        raise ProgrammingError(f"unknown setting(s) {sorted(unknown)}; settings are "
                               f"{sorted(s.name for s in _SETTINGS)}")


class Connection:
    """A DB-API connection: one dpsql Session plus the privacy settings each execute charges."""

    Warning, Error, InterfaceError, DatabaseError = Warning, Error, InterfaceError, DatabaseError
    DataError, OperationalError, IntegrityError = DataError, OperationalError, IntegrityError
    InternalError, ProgrammingError = InternalError, ProgrammingError
    NotSupportedError, BudgetExceeded = NotSupportedError, BudgetExceeded

    def __init__(self, database, *, spark=None, **settings):
        try:
            path = os.fspath(database)
        except TypeError:
            raise ProgrammingError(f"database must be a path, got "
                                   f"{type(database).__name__}") from None
        missing = [s.name for s in _SETTINGS if s.required and s.name not in settings]
        if missing:       # the privacy parameters are never implicit
            raise TypeError(f"connect() missing required keyword argument(s): {missing}")
        own = {s.name: settings.pop(s.name, s.default)
               for s in CONNECTION_SETTINGS.values() if "dbapi" in s.interfaces}
        _unknown(settings)
        self._settings = _validated({s.name: settings.get(s.name, s.default)
                                     for s in _SETTINGS})
        with _backend():
            own = {name: CONNECTION_SETTINGS[name].parse(v) for name, v in own.items()}
            dp.check_database_path(path, own["create"])
        self._lock = threading.Lock()
        self._block = WorkloadBlock()      # BEGIN WORKLOAD ... COMMIT (dpsql.sql.marker)
        self._block_lock = threading.RLock()
        #: notices (one line each, oldest first), as psycopg2's ``connection.notices``: the
        #: no-op BEGIN / COMMIT / ROLLBACK, a discarded or empty workload block
        self.notices: list[str] = []
        self._cursors: weakref.WeakSet = weakref.WeakSet()
        self.closed = False
        #: a SELECT over result tables only is read back (free); the server turns it off
        #: (it reads an analyst's own result tables from its shadow, and must not say whether
        #: another analyst's table exists)
        self.read_results = True
        with _backend():
            self._session = Session(path, lock_timeout=own["lock_timeout"], spark=spark,
                                    spark_master=own["spark_master"],
                                    spark_remote=own["spark_remote"])
        self._limits = {k: own[k] for k in ("max_memory", "time_limit")}

    def _planning(self):
        """Plan this connection's requests within its ``max_memory`` and ``time_limit``."""
        return planning.applied(**self._limits)

    @check_closed
    def configure(self, **changes) -> None:
        """Change several settings at once (validated together; all or nothing), e.g.
        ``configure(epsilon=None, target_rmse=50, confirm=True)`` to ask by accuracy."""
        _unknown(changes)
        with self._lock:
            self._settings = _validated(dict(self._settings, **changes))

    def _snapshot(self) -> dict:
        with self._lock:
            return dict(self._settings)

    @property
    def workload(self) -> tuple | None:
        """The statements collected by an open ``BEGIN WORKLOAD`` block (released as one
        workload at ``COMMIT``), or None when no block is open."""
        with self._block_lock:
            return tuple(self._block.statements) if self._block.is_open else None

    @property
    def session(self) -> Session:
        """The underlying dpsql Session (budget, ledger, data-owner operations)."""
        return self._session

    @check_closed
    def cursor(self) -> "Cursor":
        cur = Cursor(self)
        with self._lock:
            self._cursors.add(cur)
        return cur

    def cancel(self) -> None:
        """Cancel the request this connection is running, from any thread (psycopg's name;
        optional in PEP 249): unless it was already charged, its ``execute`` raises
        :class:`OperationalError` (SQLSTATE 57014) within a fraction of a second and nothing
        is charged; a request past its charge completes. No effect when nothing runs."""
        if not self.closed:
            self._session.cancel("cancelled by Connection.cancel()")

    @check_closed
    def commit(self) -> None:
        """No-op: the ledger commits every release before its answers are returned."""

    @check_closed
    def rollback(self) -> None:
        raise NotSupportedError(
            "rollback is not supported: every release was charged to the privacy ledger and "
            "committed before its answers were returned, and spent budget cannot be given "
            "back (the answers may already have been seen); there is never a pending "
            "transaction to roll back")

    @check_closed
    def close(self) -> None:
        with self._block_lock:
            if self._block.is_open:     # never released implicitly: discarded, with a warning
                message = ("connection closed with a workload block open: "
                           + notice_discarded(len(self._block.close())))
                self.notices.append(message)
                warnings.warn(message, WorkloadDiscarded, stacklevel=2)
        self.closed = True
        with self._lock:
            cursors = list(self._cursors)
        for cur in cursors:
            cur._closed = True
        with _backend():
            self._session.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        if not self.closed:
            self.close()


for _s in _SETTINGS:     # one attribute per declared setting, validated on assignment
    setattr(Connection, _s.name, _setting(_s.name, _s.help))
del _s


# --------------------------------------------------------------------------- cursor

class Cursor:
    """Executes dpsql batches and walks their result sets (one per statement)."""

    def __init__(self, connection: Connection):
        self.connection = connection
        self.arraysize = 1
        self.lastrowid = None
        self.release = None               # the last dpsql Release, or None
        self._closed = False
        self._sets: list | None = None    # ResultTable per statement of the last release
        self._set = 0
        self._row = 0
        self._empty = "no result set: call execute() or executemany() first"

    @property
    def closed(self) -> bool:
        return self._closed or self.connection.closed

    # ---------------------------------------------------------------- executing
    @check_closed
    def execute(self, operation: str, parameters: Sequence | None = None) -> "Cursor":
        """Answer ``operation`` (one or more statements) as one charged release."""
        self._reset()
        return self._run(_Template(operation).bind(parameters))

    @check_closed
    def executemany(self, operation: str, seq_of_parameters) -> "Cursor":
        """Bind every parameter set and answer all statements as ONE workload (one charge).

        Result sets come in order: the statements of the first parameter set, then the
        second, ... (``nextset()`` moves between them). No parameter sets: nothing runs.
        """
        self._reset()
        template = _Template(operation)
        if isinstance(seq_of_parameters, (str, bytes)) or not isinstance(seq_of_parameters,
                                                                         Iterable):
            raise ProgrammingError("seq_of_parameters must be a sequence of sequences")
        texts: list[str] = []
        for parameters in seq_of_parameters:
            bound = template.bind(parameters)
            texts.extend([bound] if isinstance(bound, str) else bound)
        if not texts:
            return self
        return self._run(texts)

    @check_closed
    def explain(self, operation: str | None = None, parameters: Sequence | None = None):
        """Expected accuracy under the connection's settings: reads no data, charges nothing.
        With an accuracy target, the explanation is at the smallest ε meeting it (its
        ``epsilon`` is what an execute with ``confirm=True`` would spend). Without an
        operation: the open workload block (what its ``COMMIT`` would release)."""
        if operation is None:
            sql = list(self.connection.workload or ())
            if not sql:
                raise ProgrammingError("explain() without SQL explains the open workload "
                                       "block, and none is open (or it is empty); pass SQL, "
                                       "or execute BEGIN WORKLOAD and some statements first")
        else:
            sql = _Template(operation).bind(parameters)
        return self._explain(sql)

    def _explain(self, sql):
        s = self.connection._snapshot()
        with _backend(), self.connection._planning():
            return self.connection._session.explain(
                sql, **{k: v for k, v in s.items() if k in _EXPLAIN_SETTINGS})

    def _run(self, sql: str | list[str]) -> "Cursor":
        """Answer ``sql``, walking its workload markers (:func:`dpsql.sql.marker.walk`) when
        it has any or a block is open: queries inside a block are checked (explained with
        the block so far) and collected; ``COMMIT`` releases the block as one workload. The
        result sets of every release this execute made are loaded, in order."""
        conn = self.connection
        texts = [sql] if isinstance(sql, str) else sql
        with conn._block_lock:
            if not conn._block.is_open and not any(has_marker(t) for t in texts):
                self._answer(sql)
                return self
            try:
                for step in walk(sql, conn._block):
                    if step.kind == "collect":
                        self._collect(step.text)
                    elif step.kind == "notice":
                        conn.notices.append(step.text)
                    else:
                        self._answer(step.text if step.kind == "answer" else
                                     list(step.statements))
            except dp.WorkloadBlockError as exc:
                raise error_class(exc)(str(exc)) from exc
        if self._sets is None and conn._block.is_open:
            self._empty = (f"the statement was added to the open workload block "
                           f"({conn._block.describe()}); COMMIT releases them as one workload")
        return self

    def _collect(self, text: str) -> None:
        """Add one statement to the open block once the block with it explains (a refused
        statement is not added; the block stays open as it was)."""
        block = self.connection._block
        try:
            self._explain([*block.statements, text])
        except Error as exc:
            raise type(exc)(f"{exc}; the statement was not added to the open workload "
                            f"block ({block.describe()}): fix it and execute it again, or "
                            "ROLLBACK to discard the block") from exc.__cause__
        block.add(text)

    def _answer(self, sql: str | list[str]) -> None:
        parts = None
        if self.connection.read_results:   # reading result tables back: free, no release
            with _backend():
                parts = self.connection._session.read_plan(sql)
        for kind, texts in parts or [("answer", sql)]:
            if kind == "read":
                self._read(texts[0])
            else:
                self._release(texts)

    def _read(self, text: str) -> None:
        with _backend():
            table = self.connection._session.read_results(text)
        if table is None:         # no longer a result table: the release path says why
            return self._release(text)
        self._sets = (self._sets or []) + [table]

    def _release(self, sql: str | list[str]) -> None:
        settings = self.connection._snapshot()
        try:
            with _backend(), self.connection._planning():
                release = self.connection._session.answer(sql, **settings)
        except InterruptedAfterRelease as exc:  # charged and written: keep the answers
            self._load(exc.release)
            raise
        self._load(release)

    def _load(self, release) -> None:
        """Add a release's result sets (several releases of one execute: all, in order)."""
        self.release = release
        self._sets = (self._sets or []) + list(release.results)

    def _reset(self) -> None:
        self._sets, self._set, self._row = None, 0, 0   # a failed execute leaves no results
        self._empty = "no result set: call execute() or executemany() first"

    def _current(self):
        if self._sets is None:
            raise ProgrammingError(self._empty)
        return self._sets[self._set]

    # ---------------------------------------------------------------- results
    @property
    def description(self):
        """(name, type_code, None, None, None, None, None) per column; None before execute."""
        if self._sets is None:
            return None
        table = self._sets[self._set]
        if table.types:           # a result table read back: its DuckDB types
            return tuple((n, t, None, None, None, None, None)
                         for n, t in zip(table.columns, table.types))
        first_answer = len(table.columns) - _ANSWER_COLUMNS
        return tuple((name, "DOUBLE" if i >= first_answer else
                      _type_code(row[i] for row in table.rows), None, None, None, None, None)
                      for i, name in enumerate(table.columns))

    @property
    def rowcount(self) -> int:
        """Rows of the current result set; -1 before any execute."""
        return -1 if self._sets is None else len(self._sets[self._set].rows)

    @check_closed
    def fetchone(self) -> tuple | None:
        rows = self.fetchmany(1)
        return rows[0] if rows else None

    @check_closed
    def fetchmany(self, size: int | None = None) -> list[tuple]:
        size = self.arraysize if size is None else size
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ProgrammingError("fetchmany size must be a non-negative int")
        rows = self._current().rows[self._row:self._row + size]
        self._row += len(rows)
        return [tuple(r) for r in rows]

    @check_closed
    def fetchall(self) -> list[tuple]:
        return self.fetchmany(len(self._current().rows))

    @check_closed
    def nextset(self) -> bool | None:
        """Move to the next statement's result set: True, or None when there is none."""
        self._current()
        if self._set + 1 >= len(self._sets):
            return None
        self._set, self._row = self._set + 1, 0
        return True

    def __iter__(self) -> "Cursor":
        return self

    def __next__(self) -> tuple:
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    @check_closed
    def setinputsizes(self, sizes) -> None:
        """No-op (PEP 249 allows it)."""

    @check_closed
    def setoutputsize(self, size, column=None) -> None:
        """No-op (PEP 249 allows it)."""

    @check_closed
    def close(self) -> None:
        self._closed = True
        self._reset()

    def __enter__(self) -> "Cursor":
        return self

    def __exit__(self, *exc) -> None:
        if not self.closed:
            self.close()

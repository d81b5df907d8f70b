"""dpsql's exceptions: one root, one class per kind of refusal.

Every message says what was asked, what is allowed and how to fix it. Messages never
contain data values (cell counts, raw rows, engine error text): only policy and query text,
which are public.
"""

from __future__ import annotations

from fractions import Fraction


class DpsqlError(Exception):
    """Root of every error dpsql raises on purpose."""


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


class PrivacyParameterError(DpsqlError):
    """An epsilon / delta / calibration request is invalid."""


class StrategyError(DpsqlError):
    """A strategy cannot be built or does not support the workload."""


class EngineError(DpsqlError):
    """The database engine failed. Its own message is withheld: it can contain data values."""


class SchemaVersionError(EngineError):
    """The database cannot be opened: its dpsql tables were written by a newer dpsql (a
    newer schema version); nothing was changed. Upgrade dpsql."""


class LockTimeoutError(DpsqlError):
    """Another process held the database for longer than the configured wait."""


class BudgetExceededError(DpsqlError):
    """A release would spend more than a table's budget. Nothing was charged."""

    def __init__(self, table: str, quantity: str, spent: Fraction, requested: Fraction,
                 limit: Fraction):
        self.table = table
        self.quantity = quantity
        self.spent = spent
        self.requested = requested
        self.limit = limit
        super().__init__(
            f"budget exceeded on table {table!r}: {quantity} spent {show_exact(spent)}, "
            f"requested {show_exact(requested)}, limit {show_exact(limit)} "
            f"(remaining {show_exact(limit - spent)}); nothing was charged or released"
        )


def show_exact(value) -> str:
    """Show an exact budget value readably: a short decimal when exact, else num/den."""
    f = Fraction(repr(value)) if isinstance(value, float) else Fraction(value)
    if f == 0:
        return "0"
    for digits in range(1, 18):
        s = f"{float(f):.{digits}g}"
        if Fraction(s) == f:
            return s
    return f"{float(f):.6g} (exactly {f.numerator}/{f.denominator})"

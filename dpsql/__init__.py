"""dpsql: answer batches of SQL counting queries over DuckDB under differential privacy.

    import dpsql
    db = dpsql.connect("census.duckdb")
    db.protect("adult", "policy.toml")
    print(db.explain("SELECT sex, COUNT(*) FROM adult GROUP BY sex", epsilon=0.5, delta=1e-6))
    release = db.answer("SELECT sex, COUNT(*) FROM adult GROUP BY sex", epsilon=0.5, delta=1e-6)

``connect``, ``Session``, ``InterruptedAfterRelease`` and ``planning_limits`` are imported on
first use (PEP 562), so ``import dpsql`` — which every ``dpsql`` command runs first — does not
load the release path (scipy, sqlglot, the strategies) for commands that never open a
database (``--help``, ``--version``, ``user``); the errors are imported at once.
"""

from dpsql.errors import (BatchTooLarge, BudgetExceededError, DpsqlError, EngineError, InputFileError,
                     InternalFailure, LockTimeoutError, ParseError, PolicyError,
                     PrivacyParameterError, StrategyError, UnknownTableError,
                     UnsupportedQueryError, UsageError)

__version__ = "0.1.0"

__all__ = [
    "BatchTooLarge", "BudgetExceededError", "DpsqlError", "EngineError", "InputFileError", "InternalFailure",
    "InterruptedAfterRelease", "LockTimeoutError", "ParseError", "PolicyError",
    "PrivacyParameterError", "Session", "StrategyError", "UnknownTableError",
    "UnsupportedQueryError", "UsageError", "connect", "planning_limits",
]


def __getattr__(name: str):
    """The session's names, imported when first asked for (and then bound here)."""
    if name in ("InterruptedAfterRelease", "Session", "connect"):
        from dpsql import session

        value = getattr(session, name)
    elif name == "planning_limits":
        from dpsql.workload.limits import applied as value
    else:
        raise AttributeError(f"module 'dpsql' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

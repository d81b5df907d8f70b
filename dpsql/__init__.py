"""dpsql: answer batches of SQL counting queries over DuckDB under differential privacy.

    import dpsql
    db = dpsql.connect("census.duckdb")
    db.protect("adult", "policy.toml")
    print(db.explain("SELECT sex, COUNT(*) FROM adult GROUP BY sex", epsilon=0.5, delta=1e-6))
    release = db.answer("SELECT sex, COUNT(*) FROM adult GROUP BY sex", epsilon=0.5, delta=1e-6)
"""

from dpsql.errors import (BatchTooLarge, BudgetExceededError, DpsqlError, EngineError, InputFileError,
                     InternalFailure, LockTimeoutError, ParseError, PolicyError,
                     PrivacyParameterError, StrategyError, UnknownTableError,
                     UnsupportedQueryError, UsageError)
from dpsql.session import InterruptedAfterRelease, Session, connect
from dpsql.workload.limits import applied as planning_limits

__version__ = "0.1.0"

__all__ = [
    "BatchTooLarge", "BudgetExceededError", "DpsqlError", "EngineError", "InputFileError", "InternalFailure",
    "InterruptedAfterRelease", "LockTimeoutError", "ParseError", "PolicyError",
    "PrivacyParameterError", "Session", "StrategyError", "UnknownTableError",
    "UnsupportedQueryError", "UsageError", "connect", "planning_limits",
]

"""DuckDB statements that a signal interrupts: Ctrl-C and SIGTERM cancel, never crash.

DuckDB's Python client runs a signal's handler inside a statement, drops what the handler
raised (``KeyboardInterrupt``, :class:`~dpsql.errors.Terminated`) and raises its own error
instead. :func:`interrupts_restored` puts the interrupt back, around every request
(``Session._request``), a script's workloads and the command-line guard.

DuckDB is not imported here: an error can only be DuckDB's if DuckDB was loaded, so the
check looks it up among the loaded modules, and the command-line guard around ``dpsql
--help`` does not load DuckDB for it.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator


def engine_interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is DuckDB's answer to a signal that landed mid-statement. Its Python
    client runs the signal's handler inside the statement, drops what the handler raised
    (``KeyboardInterrupt``, :class:`~dpsql.errors.Terminated`) and raises its own error."""
    duckdb = sys.modules.get("duckdb")      # not loaded: no DuckDB statement ran
    return (duckdb is not None and isinstance(exc, duckdb.InterruptException)) or (
        isinstance(exc, RuntimeError) and str(exc) == "Query interrupted")


@contextlib.contextmanager
def interrupts_restored() -> Iterator[None]:
    """Raise ``KeyboardInterrupt`` for a DuckDB statement that a signal interrupted
    (:func:`engine_interrupted`), as if the signal had landed between statements: Ctrl-C and
    SIGTERM cancel, never end as an internal error (the command-line interfaces' SIGTERM
    handler records the signal, so they still exit with its status)."""
    try:
        yield
    except Exception as exc:
        if engine_interrupted(exc):
            raise KeyboardInterrupt from None
        raise

"""The DuckDB database: connections, catalog look-ups and result tables (never the data vector:
that is :mod:`dpsql.engines.duckdb`, called only by the kernel).

It knows nothing of noise. It runs only SQL that dpsql generates from the declared
policy (identifiers and literals quoted here); the analyst's SQL text is never executed.

Schema. Every connection handed out has dpsql's tables at the current schema version (or
none yet): :mod:`dpsql.store.schema` migrates an older database on opening and refuses one
written by a newer dpsql.

Connections. A DuckDB file can be open read-write in one OS process at a time, so dpsql
opens the file for the duration of one operation and closes it after; a second process
waiting for the file retries until ``lock_timeout``. Within a process a per-file lock
serialises threads. Together these make every check-and-charge of the ledger atomic across
threads and processes. Analyst-facing connections disable external file access, extension
auto-loading, and lock the configuration. DuckDB's own error text is never shown (it can
contain data values): every engine failure becomes :class:`EngineError`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Iterator, Sequence

import duckdb

from dpsql.store import schema
from dpsql.workload.domain import CategoricalDomain, IntegerDomain
from dpsql.errors import EngineError, LockTimeoutError

ANALYST_CONFIG = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "lock_configuration": True,
}

_path_locks: dict[str, threading.RLock] = {}
_path_locks_guard = threading.Lock()


def _lock_for(path: str) -> threading.RLock:
    with _path_locks_guard:
        return _path_locks.setdefault(path, threading.RLock())


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, bool) or value is None:
        raise EngineError("internal error: unsupported literal in generated SQL")
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


class Database:
    """A DuckDB database file (or ``:memory:``) opened per operation."""

    def __init__(self, path: str, *, lock_timeout: float = 30.0):
        self.path = path if path == ":memory:" else os.path.abspath(path)
        self.lock_timeout = float(lock_timeout)
        self._memory = None
        # one lock per file, however it is named (symlinks, relative paths)
        self._lock = _lock_for(os.path.realpath(self.path) if path != ":memory:"
                               else f":memory:{id(self)}")
        if path == ":memory:":
            self._memory = duckdb.connect(":memory:", config=dict(ANALYST_CONFIG))

    @contextlib.contextmanager
    def connect(self, *, owner: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """Hold the database for one operation (threads and processes wait their turn).

        ``owner=True`` gives a connection without the analyst restrictions, for data-owner
        operations that dpsql itself drives (loading the demo data). Analyst requests never
        get one.

        Opening checks dpsql's schema version (:func:`dpsql.store.schema.check`): an older
        database is migrated first (one transaction), a newer one refused.
        """
        with self._lock:
            if self._memory is not None:
                schema.check(self._memory, repr(self.path))
                yield self._memory
                return
            con = self._open(owner)
            try:
                schema.check(con, repr(self.path))
                yield con
            finally:
                con.close()

    def _open(self, owner: bool) -> duckdb.DuckDBPyConnection:
        deadline = time.monotonic() + self.lock_timeout
        delay = 0.005
        config = {} if owner else dict(ANALYST_CONFIG)
        while True:
            try:
                return duckdb.connect(self.path, config=config)
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower():
                    raise EngineError(
                        f"could not open database {self.path!r} (engine message withheld); "
                        "check that it is a DuckDB database file that you may read and write"
                    ) from None
                if time.monotonic() >= deadline:
                    raise LockTimeoutError(
                        f"database {self.path!r} stayed busy in another process for "
                        f"{self.lock_timeout:g} s; try again later"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 1.5, 0.1)
            except duckdb.Error:
                raise EngineError(
                    f"could not open database {self.path!r} (engine message withheld); "
                    "check that it is a DuckDB database file that you may read and write"
                ) from None

    def close(self) -> None:
        if self._memory is not None:
            self._memory.close()
            self._memory = None


@contextlib.contextmanager
def engine_errors(what: str) -> Iterator[None]:
    """Turn any DuckDB failure into an EngineError that withholds the engine's text."""
    try:
        yield
    except RuntimeError as exc:
        if str(exc) == "Query interrupted":    # DuckDB's answer to Ctrl-C mid-query
            raise KeyboardInterrupt from None
        raise
    except duckdb.InterruptException:
        raise KeyboardInterrupt from None
    except duckdb.Error as exc:
        raise EngineError(
            f"the database engine failed while {what} ({type(exc).__name__}; details "
            "withheld because engine messages can contain data values)"
        ) from None


# --------------------------------------------------------------------------- catalog


def relation_names(con, schema: str = "main") -> set[str]:
    """Lower-cased names of every table and view in ``schema`` (one catalog read)."""
    with engine_errors("reading the catalog"):
        rows = con.execute(
            "SELECT lower(table_name) FROM duckdb_tables() WHERE schema_name = ? UNION ALL "
            "SELECT lower(view_name) FROM duckdb_views() WHERE schema_name = ?",
            [schema, schema]).fetchall()
    return {r[0] for r in rows}


def table_exists(con, name: str, schema: str = "main") -> bool:
    with engine_errors("reading the catalog"):
        row = con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? "
            "AND lower(table_name) = lower(?)",
            [schema, name]).fetchone()
        if row[0]:
            return True
        row = con.execute(
            "SELECT count(*) FROM duckdb_views() WHERE schema_name = ? "
            "AND lower(view_name) = lower(?)",
            [schema, name]).fetchone()
    return bool(row[0])


def table_columns(con, name: str) -> dict[str, str]:
    """Column names (lower case) and types of a main-schema table: public catalog only."""
    with engine_errors("reading the catalog"):
        rows = con.execute(
            "SELECT column_name, data_type FROM duckdb_columns() "
            "WHERE schema_name = 'main' AND lower(table_name) = lower(?)", [name]).fetchall()
    return {c.lower(): t for c, t in rows}


# --------------------------------------------------------------------------- result tables

SQL_TYPES = {"str": "VARCHAR", "int": "BIGINT", "float": "DOUBLE", "bool": "BOOLEAN"}


def key_sql_type(domain) -> str:
    if isinstance(domain, CategoricalDomain):
        return "VARCHAR" if isinstance(domain.values[0], str) else "BIGINT"
    if isinstance(domain, IntegerDomain):
        return "BIGINT"
    return "DOUBLE"


def write_table(con, name: str, columns: Sequence[tuple[str, str, list]], *,
                replace: bool = False, comment: str | None = None) -> None:
    """Create ``main.name`` with (column name, SQL type, values) in one statement; an
    optional table comment (``COMMENT ON TABLE``) describes how the values were made."""
    create = "CREATE OR REPLACE TABLE" if replace else "CREATE TABLE"
    with engine_errors(f"writing result table {name!r}"):
        if columns:       # one statement: the typed lists unnested side by side
            select = ", ".join(f"unnest(${i + 1}::{t}[]) AS {quote_ident(c)}"
                               for i, (c, t, _) in enumerate(columns))
            con.execute(f"{create} main.{quote_ident(name)} AS SELECT {select}",
                        [list(v) for _, _, v in columns])
        else:
            con.execute(f"{create} main.{quote_ident(name)} ()")
        if comment is not None:
            con.execute(f"COMMENT ON TABLE main.{quote_ident(name)} IS "
                        f"'{comment.replace(chr(39), chr(39) * 2)}'")

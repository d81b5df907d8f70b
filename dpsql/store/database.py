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
import re
import threading
import time
from typing import Iterator, Sequence

import duckdb

from dpsql import cancel
from dpsql.store import schema, served
from dpsql.store.interrupts import interrupts_restored
from dpsql.workload.categorical import CategoricalDomain
from dpsql.workload.ordered import IntegerDomain
from dpsql.errors import EngineError, LockTimeoutError

ANALYST_CONFIG = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "lock_configuration": True,
}

#: a wait for another process's lock is announced after this many seconds, and again after
#: each further such interval (a brief wait stays silent)
LOCK_NOTICE_EVERY = 1.0

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
    """A DuckDB database file (or ``:memory:``) opened per operation.

    ``on_lock_wait(holder, remaining)`` is called about once per second while another
    process holds the file (``holder``: "pid N (program)" when DuckDB names it, else None;
    ``remaining``: seconds left of ``lock_timeout``), and once with ``remaining=None`` when
    the wait ends: the command-line interfaces show it as a countdown."""

    def __init__(self, path: str, *, lock_timeout: float = 30.0, on_lock_wait=None):
        self.path = path if path == ":memory:" else os.path.abspath(path)
        if path != ":memory:":
            served.check(self.path)      # a running dpsql server owns it: say so at once
        self.lock_timeout = float(lock_timeout)
        self.on_lock_wait = on_lock_wait
        self._memory = None
        self._held = threading.local()       # this thread's open connection, if any
        # one lock per file, however it is named (symlinks, relative paths)
        self._lock = _lock_for(os.path.realpath(self.path) if path != ":memory:"
                               else f":memory:{id(self)}")
        if path == ":memory:":
            self._memory = duckdb.connect(":memory:", config=dict(ANALYST_CONFIG))

    def held(self):
        """The connection this thread holds open (inside :meth:`connect`), or None."""
        return getattr(self._held, "con", None)

    def depth(self) -> int:
        """How many :meth:`connect` blocks of this thread are open (0: none)."""
        return getattr(self._held, "depth", 0)

    @contextlib.contextmanager
    def connect(self, *, owner: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """Hold the database for one operation (threads and processes wait their turn).

        Re-entrant: inside a thread's open ``connect`` block, a nested one yields the same
        connection (no second opening).

        ``owner=True`` gives a connection without the analyst restrictions, for data-owner
        operations that dpsql itself drives (loading the demo data). Analyst requests never
        get one.

        Opening checks dpsql's schema version (:func:`dpsql.store.schema.check`): an older
        database is migrated first (one transaction), a newer one refused.
        """
        held = self.held()
        if held is not None:
            self._held.depth += 1
            try:
                yield held
            finally:
                self._held.depth -= 1
            return
        with self._lock:
            con = self._memory if self._memory is not None else self._open(owner)
            self._held.con, self._held.depth = con, 1
            try:
                schema.check(con, repr(self.path))
                yield con
            finally:
                self._held.con, self._held.depth = None, 0
                if con is not self._memory:
                    con.close()

    def planning(self) -> "PlanningConnection":
        """A connection for planning that opens on first use and can be let go before a
        long step (:class:`PlanningConnection`)."""
        return PlanningConnection(self)

    def _open(self, owner: bool) -> duckdb.DuckDBPyConnection:
        deadline = time.monotonic() + self.lock_timeout
        delay, shown, waited = 0.005, None, False
        config = {} if owner else dict(ANALYST_CONFIG)
        try:
            while True:
                try:
                    return duckdb.connect(self.path, config=config)
                except duckdb.IOException as exc:
                    if "lock" not in str(exc).lower():
                        raise EngineError(
                            f"could not open database {self.path!r} (engine message "
                            "withheld); check that it is a DuckDB database file that you "
                            "may read and write") from None
                    now = time.monotonic()
                    if now >= deadline:
                        raise LockTimeoutError(
                            f"database {self.path!r} stayed busy in another process"
                            f"{_holder_words(exc)} for {self.lock_timeout:g} s; try again "
                            "later, or wait longer (lock_timeout, --lock-timeout)") from None
                    shown = now if shown is None else shown     # first refusal
                    if self.on_lock_wait is not None and now - shown >= LOCK_NOTICE_EVERY:
                        shown, waited = now, True
                        self.on_lock_wait(lock_holder(str(exc)), deadline - now)
                    cancel.check()
                    time.sleep(min(delay, max(0.0, deadline - now)))
                    delay = min(delay * 1.5, 0.1)
                except duckdb.Error:
                    raise EngineError(
                        f"could not open database {self.path!r} (engine message withheld); "
                        "check that it is a DuckDB database file that you may read and write"
                    ) from None
        finally:
            if waited:
                self.on_lock_wait(None, None)

    def close(self) -> None:
        if self._memory is not None:
            self._memory.close()
            self._memory = None


def lock_holder(message: str) -> str | None:
    """Who holds the file, from DuckDB's lock error ("... held in /usr/bin/python3 (PID
    123) ..."): "pid 123 (python3)", or None when it does not say. No data in it."""
    found = re.search(r"held in (.*?) \(PID (\d+)\)", message)
    if found:
        return f"pid {found.group(2)} ({os.path.basename(found.group(1)) or '?'})"
    found = re.search(r"PID (\d+)", message)
    return f"pid {found.group(1)}" if found else None


def _holder_words(exc) -> str:
    holder = lock_holder(str(exc))
    return f" ({holder})" if holder else ""


class PlanningConnection:
    """The database as planning sees it: opened on first use (one connection, kept while
    planning reads and writes its caches) and closed by :meth:`release` before a long
    step, so other processes can charge meanwhile; the next use opens it again (waiting
    for the lock like any opening). Inside a :meth:`Database.connect` block of the same
    thread (the release's locked section) it uses that connection."""

    def __init__(self, db: Database):
        self._db = db
        self._stack: contextlib.ExitStack | None = None

    def _con(self):
        held = self._db.held()
        if held is not None:
            return held
        stack = contextlib.ExitStack()
        con = stack.enter_context(self._db.connect())
        self._stack = stack
        return con

    def execute(self, *args, **kwargs):
        return self._con().execute(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._con(), name)

    def release(self) -> None:
        """Close the connection if this object opened it and nothing nested uses it."""
        if self._stack is not None and self._db.depth() <= 1:
            stack, self._stack = self._stack, None
            stack.close()

    def __enter__(self) -> "PlanningConnection":
        return self

    def __exit__(self, *exc) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.close()


@contextlib.contextmanager
def engine_errors(what: str) -> Iterator[None]:
    """Turn any DuckDB failure into an EngineError that withholds the engine's text (an
    interrupted statement into ``KeyboardInterrupt``: :func:`interrupts_restored`)."""
    try:
        with interrupts_restored():
            yield
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


def write_tables(con, tables: Sequence[tuple], *, release: int,
                 comment: str | None = None) -> None:
    """Create a release's result tables in one bulk write: ``tables`` are ``(name, columns,
    replace)`` with ``columns`` ``(column name, SQL type, values)``; ``release`` is the
    release's id.

    Every release's rows go into a few shared tables, one per tuple of column types
    (:func:`stored_table`: ``dpsql_results.answers_vdd`` holds every VARCHAR, DOUBLE, DOUBLE
    answer of every release), appended by one statement per type tuple from typed lists
    (:func:`_store_rows`); each result table is a view in ``main`` over its slice
    (``_release``, ``_t``), in row order, created and commented in one multi-statement call
    (:func:`_create_tables`). A view is a catalog entry (about 0.5 ms to create). A base
    table per statement cost DuckDB a 256 KB block each (issue 16's 24,975-statement batch:
    6.3 GB and ~96 s), and a stored table per release and column layout still cost a block
    each: about 1 MB of file per small release and an ever slower opening of the database
    (245 MB and 155 ms per opening after 210 releases of a 12-answer batch); shared tables
    grow with the answers only. A replaced name that is still a base table (written before
    schema version 3) is dropped first. Runs inside the caller's transaction (the release's,
    which also marks it released), so a failure rolls every table and row back."""
    groups: dict = {}
    for k, (_, columns, _) in enumerate(tables):
        groups.setdefault(tuple((c, t) for c, t, _ in columns), []).append(k)
    with engine_errors("writing result tables"):
        statements = [f"DROP TABLE main.{quote_ident(name)}" for name in
                      _base_tables(con, [name for name, _, replace in tables if replace])]
        offsets: dict = {}
        for signature, members in groups.items():
            if not signature:
                raise ValueError("a result table has at least its count columns")
            types = tuple(t for _, t in signature)
            stored = stored_table(types)
            first = offsets.get(types, 0)
            offsets[types] = first + len(members)
            _store_rows(con, stored, types, release, first, [tables[k][1] for k in members])
            cols = ", ".join(f"c{i} AS {quote_ident(c)}" for i, (c, _) in enumerate(signature))
            for j, k in enumerate(members, start=first):
                name, _, replace = tables[k]
                create = "CREATE OR REPLACE VIEW" if replace else "CREATE VIEW"
                target = f"main.{quote_ident(name)}"
                statements.append(f"{create} {target} AS SELECT {cols} FROM {stored} "
                                  f"WHERE _release = {int(release)} AND _t = {j} ORDER BY _r")
                if comment is not None:
                    statements.append(f"COMMENT ON VIEW {target} IS "
                                      f"'{comment.replace(chr(39), chr(39) * 2)}'")
        _create_tables(con, statements)


def _base_tables(con, names: list) -> list:
    """Which of ``names`` are base tables in main (result tables written before version 3)."""
    if not names:
        return []
    rows = con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' "
                       "AND list_contains(?, lower(table_name))",
                       [[n.lower() for n in names]]).fetchall()
    return [r[0] for r in rows]


#: one letter per column type in a stored table's name
_TYPE_CODES = {"VARCHAR": "v", "BIGINT": "b", "DOUBLE": "d", "BOOLEAN": "l", "INTEGER": "i"}


def stored_table(types: tuple) -> str:
    """The shared table holding every release's answers whose columns have these SQL types:
    ``dpsql_results.answers_<one letter per column>`` (a type without a letter spells the
    whole tuple's hash instead, so names stay distinct)."""
    if all(t in _TYPE_CODES for t in types):
        suffix = "".join(_TYPE_CODES[t] for t in types)
    else:
        import hashlib

        suffix = "h" + hashlib.sha256("|".join(types).encode()).hexdigest()[:16]
    return f"{schema.RESULTS_SCHEMA}.{quote_ident('answers_' + suffix)}"


def _store_rows(con, stored: str, types: tuple, release: int, first: int,
                columns: list) -> None:
    """Append the rows of result tables with these column types to their shared table
    (created on first use): ``_release``, ``_t`` the table's index among the release's
    tables of this type tuple (from ``first``), ``_r`` the row's, then ``c0, c1, …``."""
    sizes = [len(cols[0][2]) for cols in columns]
    params = [[first + t for t, n in enumerate(sizes) for _ in range(n)],
              [r for n in sizes for r in range(n)]]
    params += [[v for cols in columns for v in cols[i][2]] for i in range(len(types))]
    defs = ", ".join(["_release BIGINT", "_t INTEGER", "_r INTEGER"]
                     + [f"c{i} {t}" for i, t in enumerate(types)])
    con.execute(f"CREATE TABLE IF NOT EXISTS {stored} ({defs})")
    select = ", ".join([f"{int(release)}::BIGINT", "unnest($1::INTEGER[])",
                        "unnest($2::INTEGER[])"]
                       + [f"unnest(${i + 3}::{t}[])" for i, t in enumerate(types)])
    con.execute(f"INSERT INTO {stored} SELECT {select}", params)


def _create_tables(con, statements: list) -> None:
    """Run the tables' statements in one call (DuckDB runs a multi-statement text in order)."""
    if statements:
        con.execute(";\n".join(statements))

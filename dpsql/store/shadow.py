"""A shadow: a private in-memory DuckDB holding copies of released numbers, never a
protected row.

The PostgreSQL-wire server keeps one per connection for its catalog
(:mod:`dpsql.interfaces.server.shadow` adds the PostgreSQL spellings), and
:mod:`dpsql.store.readback` fills one with just the result tables a query reads, so that
reading released numbers (post-processing) runs where no protected table exists. Bounded
(one thread, 256 MB) and without external access (no files, no extensions).
"""

from __future__ import annotations

import threading

import duckdb

from dpsql.store.database import ANALYST_CONFIG, quote_ident


class Shadow:
    """One private in-memory DuckDB of public tables (result tables, catalog views)."""

    def __init__(self):
        # bounded: a query here cannot take the process's memory or every core
        self.con = duckdb.connect(":memory:", config=dict(ANALYST_CONFIG, threads=1,
                                                          memory_limit="256MB"))
        self.lock = threading.Lock()
        self.tables: set[str] = set()

    def _create(self, name: str, ddl: str) -> None:
        with self.lock:
            self.con.execute(ddl)
            self.tables.add(name.lower())

    def table(self, name: str, columns, rows, types=None, schema: str | None = None) -> None:
        """A table with rows (a result table or a budget view): ``types`` SQL types; in
        ``schema`` when given (created if needed; the name is then listed as
        ``schema.name`` in :attr:`tables`)."""
        types = types or [sql_type(rows, i) for i in range(len(columns))]
        cols = ", ".join(f"{quote_ident(c)} {t}" for c, t in zip(columns, types))
        qualified = quote_ident(name) if schema is None else \
            f"{quote_ident(schema)}.{quote_ident(name)}"
        with self.lock:
            if schema is not None:
                self.con.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}")
            self.con.execute(f"CREATE OR REPLACE TABLE {qualified} ({cols})")
            if rows:
                marks = ", ".join("?" for _ in columns)
                self.con.executemany(f"INSERT INTO {qualified} VALUES ({marks})",
                                     [list(r) for r in rows])
            self.tables.add(name.lower() if schema is None else f"{schema}.{name}".lower())

    def drop(self, name: str, schema: str | None = None) -> None:
        """Remove a table :meth:`table` made (no error when it is not there)."""
        qualified = quote_ident(name) if schema is None else \
            f"{quote_ident(schema)}.{quote_ident(name)}"
        with self.lock:
            self.con.execute(f"DROP TABLE IF EXISTS {qualified}")
            self.tables.discard(name.lower() if schema is None else
                                f"{schema}.{name}".lower())

    def _sql(self, sql: str) -> str:
        """The statement as this shadow's DuckDB reads it (the server rewrites spellings)."""
        return sql

    def run(self, sql: str):
        """(columns [(name, duckdb type)], rows) of one statement, or (None, [])."""
        with self.lock:
            cur = self.con.execute(self._sql(sql))
            if cur.description is None:
                return None, []
            columns = [(d[0], str(d[1])) for d in cur.description]
            return columns, cur.fetchall()

    def close(self) -> None:
        with self.lock:
            self.con.close()

    def __enter__(self) -> "Shadow":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def sql_type(rows, i: int) -> str:
    for r in rows:
        v = r[i]
        if v is None:
            continue
        if isinstance(v, bool):
            return "BOOLEAN"
        if isinstance(v, int):
            return "BIGINT"
        if isinstance(v, float):
            return "DOUBLE"
        return "VARCHAR"
    return "VARCHAR"

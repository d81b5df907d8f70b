"""Reading result tables back: post-processing of released numbers, at no privacy cost.

A query whose every table is a result table (one a release wrote, known from
``dpsql.release_tables``: :func:`dpsql.store.ledger.is_result_table`) runs on a
:class:`~dpsql.store.shadow.Shadow` that holds copies of just those tables: the protected
rows are never in the DuckDB that runs it, nothing is charged and no ledger row is written.
A query that names a result table together with a protected table, a table function, a
table of another schema or a table that is neither is refused in one line; one that names
no result table is not a read (None: the release path answers or refuses it).
"""

from __future__ import annotations

import duckdb

from dpsql import cancel
from dpsql.errors import UnsupportedQueryError
from dpsql.sql.marker import pieces
from dpsql.sql.readback import references, split, tree_of
from dpsql.store import ledger
from dpsql.store.database import quote_ident
from dpsql.store.results import ResultTable
from dpsql.store.shadow import Shadow


def _mixed(results, refs, protected) -> str | None:
    """Why a query naming result tables cannot be read as post-processing (None: it can)."""
    others = [t for t in refs.tables if t not in results]
    what = f"this query reads result table(s) {', '.join(results)}"
    if refs.functions:
        return (f"{what} with the table function {refs.functions[0]}; read result tables "
                "on their own")
    if refs.qualified:
        return (f"{what} with {refs.qualified[0]}, outside the main schema; name result "
                "tables only")
    mixed = [t for t in others if t in protected]
    if mixed:
        return (f"{what} together with the protected table {mixed[0]}: a result table is "
                "read on its own (free), a protected table only through a release; run them "
                "as separate statements")
    if others:
        return (f"{what} together with {others[0]!r}, which is neither a result table nor a "
                "protected table; check the name")
    return None


def _copies(con, sql: str) -> list | None:
    """(name, columns, types, rows) of each result table ``sql`` reads; None if it reads
    none (not a read back)."""
    refs = references(sql)
    if refs is None or not refs.tables:
        return None
    protected = set(ledger.load_policies(con))
    results = [t for t in refs.tables if t not in protected and ledger.is_result_table(con, t)]
    if not results:
        return None
    why = _mixed(results, refs, protected)
    if why:
        raise UnsupportedQueryError(why)
    copies = []
    for name in results:
        cur = con.execute(f"SELECT * FROM main.{quote_ident(name)}")
        copies.append((name, [d[0] for d in cur.description],
                       [str(d[1]) for d in cur.description], cur.fetchall()))
    return copies


def read(db, sql: str) -> ResultTable | None:
    """The rows of ``sql`` when it reads only result tables (free; the ledger untouched),
    None when it names no result table; refused (:class:`UnsupportedQueryError`) when it
    mixes one with anything else. ``db``: the :class:`~dpsql.store.database.Database`,
    held only while the result tables are copied."""
    with db.connect() as con:
        copies = _copies(con, sql)
    if copies is None:
        return None
    with Shadow() as shadow:
        for name, columns, types, rows in copies:
            shadow.table(name, columns, rows, types)
        try:
            columns, rows = shadow.run(sql)
        except duckdb.Error as exc:
            # the shadow holds released numbers only: its message names nothing protected
            raise UnsupportedQueryError("reading result table(s) "
                                        f"{', '.join(c[0] for c in copies)}: "
                                        + str(exc).splitlines()[0][:200]) from None
    name = copies[0][0] if len(copies) == 1 else "result"
    return ResultTable(name, tuple(c for c, _ in columns), rows,
                       tuple(t for _, t in columns))


def plan(db, texts) -> list[tuple[str, list[str]]] | None:
    """A submission (texts, each one or more statements, without workload markers) as
    workloads and result-table reads in order (:func:`dpsql.sql.readback.split`); None when
    it reads no result table."""
    statements = [p.text for t in texts for p in pieces(t)]
    trees = [tree_of(s) for s in cancel.checked(statements)]     # each parsed once
    if not any(refs is not None and refs.tables
               for refs in (references(s, t) for s, t in zip(statements, trees))):
        return None
    return split(statements, *names(db), trees)


def names(db) -> tuple[set, set]:
    """(protected tables, result tables) of the database, lower case: what tells a read of
    result tables from a release (:func:`dpsql.sql.readback.reads`)."""
    with db.connect() as con:
        return set(ledger.load_policies(con)), set(ledger.result_names(con))

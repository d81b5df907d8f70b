"""Helpers of the Spark engine tests: the same rows in DuckDB and in Spark, and the
engines' marginals compared statement by statement.

Spark spends about a second of planning and scheduling on any query, however small, so a
suite of statements is compared in ONE call of each engine: the statements' columns (each
with the parts its own compilation gives it: a column compiled two ways is two columns of
the call) and their cliques, all in one ``GROUPING SETS`` query per engine, through the
engines' public calls (:func:`dpsql.engines.duckdb.marginals`,
:func:`dpsql.engines.spark.marginals`). A grouping set's rows do not depend on the other
sets of the query, so each statement gets exactly what its own query would give it.
"""

from __future__ import annotations

import itertools

import numpy as np

from dpsql.engines import duckdb as duck_engine
from dpsql.engines import spark as spark_engine
from dpsql.policy.source import Source


def columns_of(policy, workload) -> list:
    return [(p.column, policy.column(p.column), p.unit_to_part) for p in workload.partitions]


def cliques_of(n_columns: int, pairs: int | None = None) -> list[tuple]:
    """The data vector's clique (all columns) and the 2-way marginals (the first ``pairs``
    of them; all by default): both kinds of query the kernel asks for."""
    everything = tuple(range(n_columns))
    two_way = list(itertools.combinations(range(n_columns), 2))[:pairs]
    return list(dict.fromkeys([everything, *two_way]))


def to_parquet(con, table: str, path: str) -> str:
    con.execute(f"COPY (SELECT * FROM {table}) TO '{path}' (FORMAT parquet)")
    return path


def parquet_source(path: str) -> Source:
    return Source(engine="spark", path=path, format="parquet")


def combined(jobs) -> tuple[list, list]:
    """``jobs``: (label, columns, cliques) per statement. Returns the call's columns (one
    per distinct column and parts) and, per statement, its label and its cliques over
    them (axes in the statement's own order)."""
    index: dict = {}
    columns: list = []
    mapped = []
    for label, cols, cliques in jobs:
        positions = []
        for name, domain, u2p in cols:
            key = (name, domain, tuple(int(v) for v in u2p))
            if key not in index:
                index[key] = len(columns)
                columns.append((name, domain, np.asarray(u2p)))
            positions.append(index[key])
        mapped.append((label, [tuple(positions[i] for i in c) for c in cliques]))
    return columns, mapped


def compare(con, duck_table: str, session, source: Source, jobs) -> list[str]:
    """The statements whose marginals differ between the engines (empty: none), each
    named by its label with the differing cells."""
    columns, mapped = combined(jobs)
    cliques = [c for _, cs in mapped for c in cs]
    duck = duck_engine.marginals(con, duck_table, columns, cliques)
    spark = spark_engine.marginals(session, source, duck_table, columns, cliques)
    bad = []
    for label, cs in mapped:
        diff = {c: (duck[c].ravel().tolist(), spark[c].ravel().tolist()) for c in cs
                if not np.array_equal(duck[c], spark[c])}
        if diff:
            bad.append(f"{label}: {str(diff)[:300]}")
    return bad


def rows_counted(con, duck_table: str, jobs) -> list[float]:
    """Each statement's total in DuckDB (every row lands in exactly one cell)."""
    columns, mapped = combined(jobs)
    cliques = [cs[0] for _, cs in mapped]
    got = duck_engine.marginals(con, duck_table, columns, cliques)
    return [float(got[c].sum()) for c in cliques]

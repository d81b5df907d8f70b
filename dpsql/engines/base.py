"""The engine interface: what every engine does with the one data-path query.

An engine (:mod:`dpsql.engines.duckdb`, :mod:`dpsql.engines.spark`) is reached through an
:class:`Engine`: it names the protected table as a relation of its dialect, lists the
table's columns and types (the catalog: names and types, never values), and runs a
rendered query, returning its result columns as NumPy arrays (only the marginal vectors:
one row per non-empty cell, never a protected row). Everything else is shared and lives
here: the query (:func:`dpsql.engines.query.marginals_query`), the marginals assembled from
its rows (every declared part present, zeros included) and the data vector, which is the
marginal of the clique of all used columns. Engines know nothing of noise; they are called
only by :mod:`dpsql.kernel.data`.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np
from sqlglot import exp

from dpsql.engines import mapping
from dpsql.engines.query import (COUNT, Aggregate, Cap, Sum, UsedColumn, marginals_query,
                                 set_id)
from dpsql.errors import EngineError


class Engine(Protocol):
    """One protected table as an engine reaches it."""

    #: the sqlglot dialect the engine's queries are rendered in
    dialect: str
    #: the most grouping sets one query may carry (None: no limit)
    max_grouping_sets: int | None

    def relation(self) -> exp.Expression:
        """The table (or the view over its files) in the engine's dialect."""

    def columns(self) -> dict[str, str]:
        """Lower-cased column names and their SQL types (catalog only)."""

    def fetch(self, query: exp.Expression, what: str) -> dict[str, np.ndarray]:
        """Run ``query``; its columns as arrays. Failures become
        :class:`~dpsql.errors.EngineError` without the engine's text (``what`` says what
        was being done)."""


def used_columns(columns, types: dict[str, str]) -> list[UsedColumn]:
    """(name, domain, unit_to_part) triples with how each column's type is read."""
    return [UsedColumn(name, domain, np.asarray(u), mapping.kind(types.get(name.lower())))
            for name, domain, u in columns]


def marginals(engine: Engine, columns, cliques, *, types: dict[str, str] | None = None,
              aggregates: Sequence[Aggregate] = (COUNT,), cap: Cap | None = None) -> dict:
    """Each clique's marginal (float64 array, axes in the clique's column order, every
    declared part present, zeros included) by one query (a few when the cliques need more
    grouping sets than the engine takes, or more than :data:`MAX_USED_COLUMNS` columns).
    ``columns``: (name, domain, unit_to_part) per column; ``cap``: rows kept per unit."""
    return marginal_aggregates(engine, columns, cliques, types=types, aggregates=aggregates,
                               cap=cap)[aggregates[0].name]


def marginal_aggregates(engine: Engine, columns, cliques, *, types=None,
                        aggregates: Sequence[Aggregate] = (COUNT,),
                        cap: Cap | None = None) -> dict:
    """``{aggregate name: {clique: array}}``: :func:`marginals` for every aggregate."""
    cliques = list(dict.fromkeys(tuple(int(i) for i in c) for c in cliques))
    used_cols = used_columns(columns, engine.columns() if types is None else types)
    out: dict = {a.name: {} for a in aggregates}
    for chunk in _chunks(cliques, engine.max_grouping_sets):
        query = marginals_query(engine.relation(), used_cols, chunk, aggregates=aggregates,
                                cap=cap)
        got = engine.fetch(query, "counting the marginals")
        for a in aggregates:
            out[a.name].update(_assemble(got, used_cols, chunk, a.name, a.exact))
    return out


#: the most columns one query groups by: each grouping set's id is a BIGINT with a bit per
#: used column (no real batch comes near it; a batch of many marginals is split)
MAX_USED_COLUMNS = 62


def _chunks(cliques: list, max_sets: int | None) -> list[list]:
    """The cliques in as few queries as the limits allow (usually one): at most
    ``max_sets`` grouping sets and :data:`MAX_USED_COLUMNS` columns per query."""
    chunks: list[list] = [[]]
    columns: set = set()
    for c in cliques:
        grown = columns | set(c)
        if chunks[-1] and (len(grown) > MAX_USED_COLUMNS
                           or (max_sets is not None and len(chunks[-1]) >= max_sets)):
            chunks.append([])
            grown = set(c)
        if len(grown) > MAX_USED_COLUMNS:
            raise EngineError(f"internal error: a clique of {len(c)} columns (at most "
                              f"{MAX_USED_COLUMNS})")
        chunks[-1].append(c)
        columns = grown
    return chunks


def _assemble(got: dict, columns: Sequence[UsedColumn], cliques, name: str,
              exact: bool = False) -> dict:
    sizes = [c.n_parts for c in columns]
    used = sorted({i for c in cliques for i in c})
    dtype = np.int64 if exact else np.float64
    values = np.asarray(got[name]).astype(dtype)
    sets = np.asarray(got["set"], dtype=np.int64) if used else np.zeros(len(values), np.int64)
    out = {}
    for c in cliques:
        T = np.zeros(tuple(sizes[i] for i in c), dtype=dtype)
        rows = np.flatnonzero(sets == set_id(used, c))
        if c:
            idx = tuple(np.asarray(got[f"p{i}"], dtype=np.int64)[rows] for i in c)
            if any(v.size and (v.min() < 0 or v.max() >= sizes[i]) for v, i in zip(idx, c)):
                raise EngineError("internal error: a row mapped outside the declared parts")
            T[idx] = values[rows]
        else:
            T[()] = values[rows].sum()
        out[c] = T
    return out


def sum_aggregate(name: str, s: Sum, types: dict[str, str]) -> Aggregate:
    """The exact per-cell sum of one bounded value (:func:`dpsql.engines.mapping.value_units`,
    read as the column's SQL type says)."""
    how = mapping.kind(types.get(s.column.lower()))
    row = mapping.value_units(exp.column(s.column, quoted=True), how, s.exponent, s.lo_units,
                              s.hi_units)
    return Aggregate(name, row=row, exact=True)


def data_vectors(engine: Engine, columns, n_cells: int, sums: Sequence[Sum] = (), *,
                 cap: Cap | None = None, types: dict[str, str] | None = None
                 ) -> tuple[np.ndarray, list]:
    """The cell counts ``x`` (float64) and each bounded value's per-cell sums in whole units
    (int64, exact), by one query: the marginal of the clique of all ``columns``, cells in C
    order (first column slowest)."""
    types = engine.columns() if types is None else types
    aggregates = [COUNT] + [sum_aggregate(f"s{i}", s, types) for i, s in enumerate(sums)]
    everything = tuple(range(len(columns)))
    got = marginal_aggregates(engine, columns, [everything], types=types,
                              aggregates=aggregates, cap=cap)
    out = [got[a.name][everything].reshape(-1) for a in aggregates]
    if out[0].size != n_cells:
        raise EngineError("internal error: the cells do not match the columns' parts")
    return out[0], out[1:]


def data_vector(engine: Engine, columns, n_cells: int, *, cap: Cap | None = None,
                types: dict[str, str] | None = None) -> np.ndarray:
    """The cell counts ``x`` (float64): :func:`data_vectors` without sums."""
    return data_vectors(engine, columns, n_cells, cap=cap, types=types)[0]

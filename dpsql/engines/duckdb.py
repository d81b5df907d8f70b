"""The DuckDB engine: protected tables in the DuckDB control database itself (the default).

Called only by :mod:`dpsql.kernel.data` (import-linter contracts in ``pyproject.toml``). It
knows nothing of noise. The one data-path query is built by :mod:`dpsql.engines.query` and
rendered here for DuckDB (:func:`render`); no value in a row (NaN, ±inf, out of range,
unparsable) can make it fail, and DuckDB's own error text never leaves (it can contain data
values): every failure becomes :class:`~dpsql.errors.EngineError`. The clamped value
sums and the per-unit row cap of issue 20 are part of that one query
(:class:`~dpsql.engines.query.Sum`, :class:`~dpsql.engines.query.Cap`), so Spark computes
the same vectors.
"""

from __future__ import annotations

import numpy as np
from sqlglot import exp

from dpsql.engines import base
from dpsql.store.database import engine_errors, table_columns

DIALECT = "duckdb"


def render(query: exp.Expression) -> str:
    """The DuckDB text of the data-path query (the one place it is rendered)."""
    return query.sql(dialect=DIALECT)


class DuckDBEngine:
    """A table of the control database, on the caller's connection."""

    dialect = DIALECT
    max_grouping_sets = None

    def __init__(self, con, table: str):
        self.con, self.table = con, table

    def relation(self) -> exp.Expression:
        return exp.table_(self.table, db="main", quoted=True)

    def columns(self) -> dict[str, str]:
        return table_columns(self.con, self.table)

    def fetch(self, query: exp.Expression, what: str) -> dict[str, np.ndarray]:
        with engine_errors(what):
            got = self.con.execute(render(query)).fetchnumpy()
        return {k: np.asarray(v) for k, v in got.items()}


def columns(con, table: str) -> dict[str, str]:
    """The table's column names (lower case) and DuckDB types: the catalog only."""
    return table_columns(con, table)


def data_vector(con, table: str, columns, n_cells: int, *, cap=None,
                types=None) -> np.ndarray:
    """The cell counts ``x`` (float64) by one DuckDB query. Called only by the kernel.

    ``columns``: (name, domain, unit_to_part) per used column, slowest-varying first;
    ``cap`` (:class:`~dpsql.engines.query.Cap`): at most ``k`` rows per privacy unit;
    ``types`` (name -> DuckDB type, as :func:`columns` returns; read when not given) only
    chooses how each value is read (:func:`dpsql.engines.mapping.kind`) and the plan."""
    return base.data_vector(DuckDBEngine(con, table), columns, n_cells, cap=cap, types=types)


def data_vectors(con, table: str, columns, n_cells: int, sums=(), *, cap=None,
                 types=None) -> tuple[np.ndarray, list]:
    """The cell counts ``x`` (float64) and each bounded value's per-cell sums in whole units
    (int64, exact; :class:`~dpsql.engines.query.Sum`) by one DuckDB query. Called only by
    the kernel."""
    return base.data_vectors(DuckDBEngine(con, table), columns, n_cells, sums, cap=cap,
                             types=types)


def marginals(con, table: str, columns, cliques, *, cap=None, types=None) -> dict:
    """Each clique's marginal (float64 array, axes in the clique's column order, every
    declared part present, zeros included) by one DuckDB query (``GROUPING SETS``).
    Called only by the kernel."""
    return base.marginals(DuckDBEngine(con, table), columns, cliques, cap=cap, types=types)

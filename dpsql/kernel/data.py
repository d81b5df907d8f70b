"""The kernel's reads of the protected rows: the only module that imports :mod:`dpsql.engines`.

An import-linter contract in ``pyproject.toml`` keeps every other module, the kernel's own
included, from importing the engines. Both reads here are called by
:mod:`dpsql.kernel.boundary` only after the release's charge is committed, so whatever
happens once the data is touched has been paid for. Both refuse a table of 2**32 rows or
more, for which the products ``A x`` would no longer be exact in float64 (the charge stays
spent; nothing is released).
"""

from __future__ import annotations

import numpy as np

from dpsql.engines import duckdb as engine
from dpsql.errors import StrategyError
from dpsql.workload.matrix import EXACT_ROWS


def _columns(policy, workload) -> list:
    """Each used column with its declared domain and its units' parts (public)."""
    return [(p.column, policy.column(p.column), p.unit_to_part) for p in workload.partitions]


def _check_rows(rows: float) -> None:
    if rows >= EXACT_ROWS:
        raise StrategyError("the table is too large for exact products (2**32 rows or more); "
                            "this release was charged and nothing was released")


def _data_vector(con, policy, workload) -> np.ndarray:
    """The cell counts of a compiled workload (called only after the charge is committed)."""
    x = engine.data_vector(con, policy.table, _columns(policy, workload), workload.n_cells)
    _check_rows(x.sum())
    return x


def _clique_marginals(con, policy, workload, cliques) -> dict:
    """The marginals of ``cliques`` over the columns' declared parts, by one engine scan
    (``GROUPING SETS``: every part present, zeros included; called only after the charge is
    committed)."""
    counts = engine.marginals(con, policy.table, _columns(policy, workload), cliques)
    _check_rows(max(float(T.sum()) for T in counts.values()))
    return counts

"""The kernel's reads of the protected rows: the only module that imports :mod:`dpsql.engines`.

An import-linter contract in ``pyproject.toml`` keeps every other module, the kernel's own
included, from importing the engines. Every read here is called by
:mod:`dpsql.kernel.boundary` only after the release's charge is committed, so whatever
happens once the data is touched has been paid for. Each refuses a table of 2**32 rows or
more, for which the products ``A x`` would no longer be exact in float64 (the charge stays
spent; nothing is released).

Under user-level privacy (the policy's ``privacy_unit``) every read keeps at most
``max_rows_per_unit`` rows per unit (:func:`_cap`): the selection key is read from the
control database here, after the charge, and goes nowhere but into the engine's query.
"""

from __future__ import annotations

import numpy as np

from dpsql.engines import duckdb as engine
from dpsql.errors import StrategyError
from dpsql.store import ledger
from dpsql.workload.matrix import EXACT_ROWS
from dpsql.workload.values import ValueBound


def _columns(policy, workload) -> list:
    """Each used column with its declared domain and its units' parts (public)."""
    return [(p.column, policy.column(p.column), p.unit_to_part) for p in workload.partitions]


def _cap(con, policy, workload, values=()) -> engine.Cap | None:
    """The per-unit row cap of a user-level policy over the columns this read uses, or None
    (row-level privacy)."""
    if policy.privacy_unit is None:
        return None
    read = [p.column for p in workload.partitions] + [v.column for v in values]
    return engine.Cap(policy.privacy_unit, int(policy.contribution),
                      ledger.unit_key(con, policy.table), tuple(dict.fromkeys(read)))


def _sum_of(value) -> engine.Sum:
    """The engine's per-cell sum of a bounded value (:class:`~dpsql.sql.ir.Value`), in the
    whole units :class:`~dpsql.workload.values.ValueBound` derives from its bounds."""
    b = ValueBound(value.lo, value.hi)
    return engine.Sum(value.column, b.exponent, b.lo_units, b.hi_units)


def _check_rows(rows: float) -> None:
    if rows >= EXACT_ROWS:
        raise StrategyError("the table is too large for exact products (2**32 rows or more); "
                            "this release was charged and nothing was released")


def _data_vector(con, policy, workload) -> np.ndarray:
    """The cell counts of a compiled workload (called only after the charge is committed)."""
    x = engine.data_vector(con, policy.table, _columns(policy, workload), workload.n_cells,
                           cap=_cap(con, policy, workload))
    _check_rows(x.sum())
    return x


def _data_vectors(con, policy, workload, values) -> tuple[np.ndarray, list]:
    """The cell counts and, per bounded value, its per-cell sums in whole units (int64), by
    one scan (called only after the charge is committed)."""
    x, sums = engine.data_vectors(con, policy.table, _columns(policy, workload),
                                  workload.n_cells, [_sum_of(v) for v in values],
                                  cap=_cap(con, policy, workload, values))
    _check_rows(x.sum())
    return x, sums


def _clique_marginals(con, policy, workload, cliques) -> dict:
    """The marginals of ``cliques`` over the columns' declared parts, by one engine scan
    (``GROUPING SETS``: every part present, zeros included; called only after the charge is
    committed)."""
    counts = engine.marginals(con, policy.table, _columns(policy, workload), cliques,
                              cap=_cap(con, policy, workload))
    _check_rows(max(float(T.sum()) for T in counts.values()))
    return counts

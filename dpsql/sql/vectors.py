"""A batch with SUM or AVG: its rows of ``W`` split by the data vector they read.

The compiled batch (:func:`dpsql.sql.compile.compile_workload`) has one row of ``W`` per
answer over the batch's cells, whatever the aggregate. A COUNT row reads the counts ``x``; a
SUM row reads the per-cell sums ``s_v`` of its bounded value ``v`` (:mod:`dpsql.workload.values`);
an AVG row is the ratio of the same row on ``s_v`` and on ``x`` (``SUM(v) / COUNT(v)`` over
the same rows). :func:`split` gives one :class:`Vector` per data vector the batch reads —
the counts first, then each distinct ``(column, lo, hi)`` in order of first use — with its
own workload ``W[rows]`` (a strategy is chosen for each, as for any batch), and per answer
where its numerator and denominator sit. Public: the query text and the policy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dpsql.sql.compile import Output, Workload


@dataclass(frozen=True)
class Vector:
    """One data vector the batch reads: ``value`` None for the counts, and the rows of the
    batch's ``W`` measured on it, as a workload of its own (``rows[i]`` is its row ``i``)."""

    value: object
    rows: np.ndarray
    workload: Workload

    @property
    def label(self) -> str:
        return "COUNT" if self.value is None else f"SUM({self.value.label})"


@dataclass(frozen=True)
class Split:
    """The batch (``base``: every answer's row) and the vectors its rows read. Per answer
    (row of ``base.W``): ``numerator[r] = (vector, row in it)`` and, for an AVG,
    ``denominator[r]`` (the counts' row), else ``(-1, -1)``."""

    base: Workload
    vectors: tuple
    numerator: np.ndarray           # (n answers, 2) int64
    denominator: np.ndarray         # (n answers, 2) int64, (-1, -1) unless an AVG

    @property
    def kinds(self) -> list:
        """Per answer: count, sum or avg."""
        out = []
        for o in self.base.outputs:
            out += [o.query.aggregate] * (o.stop - o.start)
        return out


def has_values(queries) -> bool:
    """Whether a batch reads a bounded value (a SUM or an AVG)."""
    return any(getattr(q, "aggregate", "count") != "count" for q in queries)


def _key(value):
    return (value.column, value.lo, value.hi)


def split(workload: Workload) -> Split:
    """One :class:`Vector` per data vector the batch reads (module docstring)."""
    order: list = [None]
    wanted: dict = {None: []}                # vector key -> rows of base W
    for o in workload.outputs:
        q = o.query
        rows = list(range(o.start, o.stop))
        if q.aggregate in ("count", "avg"):
            wanted[None] += rows
        if q.aggregate in ("sum", "avg"):
            key = _key(q.value)
            if key not in wanted:
                order.append(key)
                wanted[key] = []
            wanted[key] += rows
    values = {None: None}
    for o in workload.outputs:
        if o.query.value is not None:
            values.setdefault(_key(o.query.value), o.query.value)
    keys = [k for k in order if wanted[k]]
    vectors = tuple(_vector(workload, values[k], np.asarray(wanted[k], dtype=np.int64))
                    for k in keys)
    m = workload.n_queries
    numerator = np.full((m, 2), -1, dtype=np.int64)
    denominator = np.full((m, 2), -1, dtype=np.int64)
    position = {(i, int(r)): j for i, v in enumerate(vectors) for j, r in enumerate(v.rows)}
    for o in workload.outputs:
        q = o.query
        own = keys.index(None if q.aggregate == "count" else _key(q.value))
        for r in range(o.start, o.stop):
            numerator[r] = (own, position[(own, r)])
            if q.aggregate == "avg":
                denominator[r] = (0, position[(0, r)])   # the counts come first
    return Split(workload, vectors, numerator, denominator)


def _vector(base: Workload, value, rows: np.ndarray) -> Vector:
    """The rows of ``base`` on one vector, as a workload (its outputs renumbered)."""
    W = sp.csr_matrix(base.W[rows])
    W.sum_duplicates()
    for a in (W.data, W.indices, W.indptr):
        a.flags.writeable = False
    outputs, start = [], 0
    picked = set(rows.tolist())
    for o in base.outputs:
        mine = [r for r in range(o.start, o.stop) if r in picked]
        if not mine:
            continue
        keys = tuple(o.keys[r - o.start] for r in mine)
        gids = None if o.grouping_ids is None else tuple(o.grouping_ids[r - o.start]
                                                        for r in mine)
        outputs.append(Output(o.query, start, start + len(mine), o.key_columns,
                              o.key_sources, keys, gids))
        start += len(mine)
    return Vector(value, rows, Workload(base.table, base.partitions, W, tuple(outputs)))

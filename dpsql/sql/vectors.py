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

    owners: tuple = ()              # per answer: the Query whose aggregate it is

    @property
    def kinds(self) -> list:
        """Per answer: count, sum or avg."""
        return [q.aggregate for q in self.owners]


def has_values(queries) -> bool:
    """Whether a batch reads a bounded value (a SUM or an AVG)."""
    return any(getattr(q, "aggregate", "count") != "count" for q in queries)


def _key(value):
    return (value.column, value.lo, value.hi)


def row_owners(workload: Workload) -> tuple:
    """Per row of ``W``: the statement whose aggregate it is. A statement assembled from
    other rows (a quantile, a GROUP BY on a public column: :mod:`dpsql.sql.expand`) owns the
    COUNT rows it reads, which other such statements may share; the first one keeps them."""
    owners = [None] * workload.n_queries
    for o in workload.outputs:
        rows = np.unique(o.rows) if getattr(o, "assembled", False) \
            else range(o.start, o.stop)
        for r in rows:
            if owners[r] is None:
                owners[r] = o.query
    missing = [r for r, q in enumerate(owners) if q is None]
    if missing:
        raise ValueError(f"internal error: rows {missing[:5]} of W belong to no statement")
    return tuple(owners)


def split(workload: Workload) -> Split:
    """One :class:`Vector` per data vector the batch reads (module docstring)."""
    owners = row_owners(workload)
    order: list = [None]
    wanted: dict = {None: []}                # vector key -> rows of base W
    values = {None: None}
    for r, q in enumerate(owners):
        if q.aggregate in ("count", "avg"):
            wanted[None].append(r)
        if q.aggregate in ("sum", "avg"):
            key = _key(q.value)
            if key not in wanted:
                order.append(key)
                wanted[key] = []
                values[key] = q.value
            wanted[key].append(r)
    keys = [k for k in order if wanted[k]]
    vectors = tuple(_vector(workload, owners, values[k], np.asarray(wanted[k], dtype=np.int64))
                    for k in keys)
    m = workload.n_queries
    numerator = np.full((m, 2), -1, dtype=np.int64)
    denominator = np.full((m, 2), -1, dtype=np.int64)
    position = {(i, int(r)): j for i, v in enumerate(vectors) for j, r in enumerate(v.rows)}
    for r, q in enumerate(owners):
        own = keys.index(None if q.aggregate == "count" else _key(q.value))
        numerator[r] = (own, position[(own, r)])
        if q.aggregate == "avg":
            denominator[r] = (0, position[(0, r)])   # the counts come first
    return Split(workload, vectors, numerator, denominator, owners)


def _vector(base: Workload, owners: tuple, value, rows: np.ndarray) -> Vector:
    """The rows of ``base`` on one vector, as a workload: one output per run of rows of one
    statement (the keys are the statement's own for a plain statement; an assembled one's
    result rows are built from the base workload's answers, so its runs carry none)."""
    W = sp.csr_matrix(base.W[rows])
    W.sum_duplicates()
    for a in (W.data, W.indices, W.indptr):
        a.flags.writeable = False
    plain = {id(o.query): o for o in base.outputs if not getattr(o, "assembled", False)}
    outputs, start = [], 0
    for run in _runs(rows, owners):
        q = owners[int(run[0])]
        o = plain.get(id(q))
        if o is None:
            keys, gids, columns, sources = tuple(() for _ in run), None, (), ()
        else:
            keys = tuple(o.keys[r - o.start] for r in run)
            gids = None if o.grouping_ids is None else tuple(o.grouping_ids[r - o.start]
                                                            for r in run)
            columns, sources = o.key_columns, o.key_sources
        outputs.append(Output(q, start, start + len(run), columns, sources, keys, gids))
        start += len(run)
    return Vector(value, rows, Workload(base.table, base.partitions, W, tuple(outputs)))


def _runs(rows: np.ndarray, owners: tuple) -> list:
    """``rows`` (ascending) cut where the owning statement changes."""
    runs, current = [], []
    for r in rows.tolist():
        if current and owners[r] is not owners[current[-1]]:
            runs.append(current)
            current = []
        current.append(r)
    return runs + ([current] if current else [])

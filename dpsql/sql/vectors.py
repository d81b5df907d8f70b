"""A batch with SUM or AVG: its rows of ``W`` split by the data vector they read.

The compiled batch (:func:`dpsql.sql.compile.compile_workload`) has one row of ``W`` per
answer over the batch's cells, whatever the aggregate. A COUNT row reads the counts ``x``; a
SUM row reads the per-cell sums ``s_v`` of its bounded value ``v`` (:mod:`dpsql.workload.values`);
an AVG row is the ratio of the same row on ``s_v`` and on ``x`` (``SUM(v) / COUNT(v)`` over
the same rows). :func:`split` gives one :class:`Vector` (a measurement block) per data
vector the batch reads — the counts first, then each distinct ``(column, lo, hi)`` in order
of first use — with its own workload ``W[rows]`` (a strategy is chosen for each, as for any
batch), and per answer where its numerator and denominator sit. Public: the query text and
the policy only.

Two refinements keep each block's strategy small whatever the batch's cells:

- a block's workload is over the cells *its* rows tell apart (equal columns of ``W[rows]``
  merged, :func:`~dpsql.workload.values.merged_cells`): a SUM over three groups reads three
  merged cells, not the thousands the batch's other statements cut the table into;
- a quantile's CDF counts (:mod:`dpsql.sql.quantiles`, hundreds of rows at unit resolution
  of one column) are a block of their own on the counts, so the batch's other counts keep a
  strategy on their own few cells. The budget split between blocks is the joint release's
  (:mod:`dpsql.release.joint`), so this costs only what measuring the two jointly would save.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dpsql.sql.cells import Output
from dpsql.sql.compile import ColumnPartition, Workload
from dpsql.workload.values import merge_cells, merged_cells


@dataclass(frozen=True)
class Vector:
    """One data vector the batch reads: ``value`` None for the counts, and the rows of the
    batch's ``W`` measured on it, as a workload of its own (``rows[i]`` is its row ``i``)."""

    value: object
    rows: np.ndarray
    workload: Workload
    cells: np.ndarray | None = None      # batch cell -> merged cell of ``workload``
    part: str = ""                       # which of the vector's blocks, when it has several

    @property
    def label(self) -> str:
        name = "COUNT" if self.value is None else f"SUM({self.value.label})"
        return f"{name} [{self.part}]" if self.part else name

    def on_cells(self, vector: np.ndarray) -> np.ndarray:
        """A per-batch-cell data vector as this block measures it (summed over merged cells)."""
        return merge_cells(self.cells, vector, self.workload.n_cells)


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


#: the one column of a block's merged cells (not a column of any table)
MERGED = "(merged cells)"


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
    """One :class:`Vector` per measurement block of the batch (module docstring): the counts'
    rows of plain statements, each quantile's CDF counts apart, then each value's sums."""
    owners = row_owners(workload)
    order: list = [None]
    wanted: dict = {None: []}                # block key -> rows of base W
    values, parts = {None: None}, {None: ""}
    for r, q in enumerate(owners):
        keys = []
        if q.aggregate in ("count", "avg"):
            keys.append(None if q.quantile is None else ("quantile", q.index))
        if q.aggregate in ("sum", "avg"):
            keys.append(_key(q.value))
        for key in keys:
            if key not in wanted:
                order.append(key)
                wanted[key] = []
                values[key] = None if key is None or key[0] == "quantile" else q.value
                parts[key] = _part(q) if key is not None and key[0] == "quantile" else ""
            wanted[key].append(r)
    keys = [k for k in order if wanted[k]]
    vectors = tuple(_vector(workload, owners, values[k], np.asarray(wanted[k], dtype=np.int64),
                            parts[k]) for k in keys)
    m = workload.n_queries
    numerator = np.full((m, 2), -1, dtype=np.int64)
    denominator = np.full((m, 2), -1, dtype=np.int64)
    position = {(i, int(r)): j for i, v in enumerate(vectors) for j, r in enumerate(v.rows)}
    for r, q in enumerate(owners):
        counts = keys.index(None if q.quantile is None else ("quantile", q.index)) \
            if q.aggregate in ("count", "avg") else -1
        own = counts if q.aggregate == "count" else keys.index(_key(q.value))
        numerator[r] = (own, position[(own, r)])
        if q.aggregate == "avg":
            denominator[r] = (counts, position[(counts, r)])
    return Split(workload, vectors, numerator, denominator, owners)


def _part(query) -> str:
    """A quantile's own block of the counts, named by its statement."""
    return f"CDF of statement {query.index + 1}"


def _vector(base: Workload, owners: tuple, value, rows: np.ndarray, part: str = "") -> Vector:
    """The rows of ``base`` on one vector, as a workload over the cells they tell apart
    (:func:`~dpsql.workload.values.merged_cells`; a strategy is then chosen on those): one
    output per run of rows of one statement (the keys are the statement's own for a plain
    statement; an assembled one's result rows are built from the base workload's answers,
    so its runs carry none)."""
    W = sp.csr_matrix(base.W[rows])
    W.sum_duplicates()
    cells = merged_cells(W)
    partitions = base.partitions
    if cells is not None:
        n = int(cells.max()) + 1
        first = np.full(n, len(cells), dtype=np.int64)       # each merged cell's first
        np.minimum.at(first, cells, np.arange(len(cells), dtype=np.int64))
        W = sp.csr_matrix(W[:, first])
        W.sum_duplicates()
        partitions = (ColumnPartition(MERGED, np.arange(n, dtype=np.int64), n,
                                      tuple((i,) for i in range(n))),)
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
    return Vector(value, rows, Workload(base.table, partitions, W, tuple(outputs)), cells, part)


def _runs(rows: np.ndarray, owners: tuple) -> list:
    """``rows`` (ascending) cut where the owning statement changes."""
    runs, current = [], []
    for r in rows.tolist():
        if current and owners[r] is not owners[current[-1]]:
            runs.append(current)
            current = []
        current.append(r)
    return runs + ([current] if current else [])

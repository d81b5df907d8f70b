"""Metric (d_X) privacy for counting workloads: the cell metric as a graph.

The model and its declaration (the record metric ``d`` and the budget of ε per unit
distance) are :mod:`dpsql.policy.record_metric`'s; this module turns them into the metric
of a batch's compiled cells, the public structure every d_X mechanism and the kernel check
their privacy loss on.

From values to cells (proof sketches; full statements in the function docstrings):

1. A mechanism that sees only cell counts has, for cells ``i, j``, a privacy loss
   ``L(i, j)`` (for Laplace: ``Σ_k |W[k,i] − W[k,j]| / b_k``), a pseudometric on cells. It is
   d_X-private iff ``L(i, j) ≤ ε · d(u, v)`` for all values ``u ∈ i, v ∈ j``, i.e.
   ``L ≤ ε·D`` with ``D(i, j)`` the MINIMUM record distance between the two cells.
2. As ``L`` obeys the triangle inequality, ``L ≤ ε·D`` ⟺ ``L ≤ ε·D*``, ``D*`` the shortest-path
   closure of ``D``: (⇐) ``D* ≤ D``; (⇒) along any path ``L(i,j) ≤ Σ L(edge) ≤ ε Σ D(edge)``.
3. For product cells and a sum metric, ``D*`` is the sum of the per-column closures (project
   any path onto each column), i.e. the path metric of the Cartesian product of per-column
   graphs. So ``L ≤ ε·w`` on the edges of those graphs is equivalent to all pairs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import shortest_path

from dpsql.policy.record_metric import ColumnMetric, MetricModel, column_domain
from dpsql.workload.categorical import CategoricalDomain
from dpsql.workload.ordered import IntegerDomain
from dpsql.errors import PolicyError, StrategyError

#: all-pairs programs (and all-pairs verification) only up to this many cells: n(n−1)/2
#: pairs, 79,800 at 400. Larger cell sets use the edge-reduced program (exact, see above).
MAX_PAIRS_CELLS = 400
#: the largest number of constraint edges the product graph may have
MAX_EDGES = 5_000_000


def _down(value: Fraction) -> float:
    """The largest float not above an exact value (rounding in favour of privacy)."""
    f = float(value)
    return math.nextafter(f, -math.inf) if Fraction(f) > value else f


@dataclass(frozen=True)
class ColumnGraph:
    """The path metric of one used column on its parts: edges ``(p, q)`` with exact weights."""

    column: str
    n_parts: int
    p: np.ndarray                   # int64, part index (p < q)
    q: np.ndarray
    weights: tuple                  # Fraction per edge

    def closure(self) -> np.ndarray:
        """Dense shortest-path distances between parts (floats rounded down per edge)."""
        w = np.array([_down(x) for x in self.weights], dtype=float)
        G = sp.coo_matrix((w, (self.p, self.q)), shape=(self.n_parts,) * 2).tocsr()
        return shortest_path(G, directed=False)


@dataclass(frozen=True)
class CellGraph:
    """The cell metric ``D*`` as a graph: Cartesian product of the per-column graphs."""

    shape: tuple
    columns: tuple                  # ColumnGraph per used column (the workload's order)
    i: np.ndarray                   # product edges, cell indices (C order)
    j: np.ndarray
    d: np.ndarray                   # float edge weights, rounded down

    @property
    def n_cells(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def n_edges(self) -> int:
        return len(self.i)

    @property
    def d_min(self) -> float:
        """The closest pair of distinct cells (every path is at least one edge long)."""
        return float(self.d.min()) if len(self.d) else math.inf

    def distances(self) -> np.ndarray:
        """Dense ``D*`` over all cells (only up to :data:`MAX_PAIRS_CELLS` cells)."""
        n = self.n_cells
        if n > MAX_PAIRS_CELLS:
            raise StrategyError(f"all-pairs distances are limited to {MAX_PAIRS_CELLS} cells; "
                                f"this batch has {n} (use the edge-reduced program)")
        D = np.zeros((n, n))
        coords = np.unravel_index(np.arange(n), self.shape) if self.shape else ()
        for cg, idx in zip(self.columns, coords):
            D += cg.closure()[idx[:, None], idx[None, :]]
        return D


def _column_graph(cm: ColumnMetric | None, partition, dom, table: str) -> ColumnGraph:
    col = partition.column
    if cm is None:
        raise PolicyError(
            f"table {table!r}: the batch uses column {col!r}, which has no distance in the "
            "metric model (an undeclared column has distance 0, so a d_X release may not "
            "depend on it); declare its distance or leave it out of the batch")
    n = partition.n_parts
    u2p = np.asarray(partition.unit_to_part)
    best: dict[tuple, Fraction] = {}

    def add(pu: int, pv: int, w: Fraction) -> None:
        if pu != pv:
            key = (min(pu, pv), max(pu, pv))
            if key not in best or w < best[key]:
                best[key] = w

    if cm.kind == "different":
        if n * (n - 1) // 2 > MAX_EDGES:
            raise StrategyError(f"column {col!r} has {n:,} parts: the complete graph of a "
                                f"`different` metric would exceed {MAX_EDGES:,} edges")
        for a in range(n):
            for b in range(a + 1, n):
                best[(a, b)] = cm.value
    elif cm.kind == "weight":
        if not isinstance(dom, IntegerDomain):
            raise PolicyError(f"table {table!r}, column {col!r}: `weight` needs an integer "
                              "column")
        # consecutive value units are one apart (unit k ends at min + (k+1)·step − 1, unit
        # k+1 starts at min + (k+1)·step); walking them realises every |u − v|
        nv = dom.n_value_units
        k = np.flatnonzero(u2p[: nv - 1] != u2p[1:nv])
        ends = np.unique(np.sort(np.stack([u2p[k], u2p[k + 1]], axis=1), axis=1), axis=0)
        for a, b in ends.tolist():
            add(a, b, cm.value)
        if dom.nullable:
            if cm.null is None:
                raise PolicyError(f"table {table!r}, column {col!r}: nullable; the metric "
                                  "needs `null`")
            for a in np.unique(u2p[:nv]).tolist():
                add(int(u2p[dom.null_unit]), a, cm.null)
    else:
        k = len(cm.matrix)
        if not isinstance(dom, CategoricalDomain) or len(dom.values) != k:
            raise PolicyError(f"table {table!r}, column {col!r}: the metric matrix does not "
                              "match the declared values")
        def unit_distance(a: int, b: int) -> Fraction:
            if a == b:
                return Fraction(0)
            return cm.matrix[a][b] if a < k and b < k else cm.other
        for a in range(dom.n_units):     # min over member pairs, per part pair
            for b in range(a + 1, dom.n_units):
                add(int(u2p[a]), int(u2p[b]), unit_distance(a, b))
    keys = sorted(best)
    p = np.array([a for a, _ in keys], dtype=np.int64)
    q = np.array([b for _, b in keys], dtype=np.int64)
    return ColumnGraph(col, n, p, q, tuple(best[key] for key in keys))


def cell_distance_graph(model: MetricModel, partitions, domains) -> CellGraph:
    """The metric of the compiled cells as a graph whose shortest paths give ``D*``.

    ``partitions``: ``Workload.partitions`` (one ``ColumnPartition`` per used column, parts
    as sets of units, possibly non-contiguous); ``domains``: the ``TablePolicy`` or
    ``{column: Domain}``.

    Per column ``c`` the graph ``H_c`` on parts has, for an integer ``weight`` column, an edge
    for every two consecutive units in different parts (weight × their gap, always
    ``weight`` for integers); the NULL unit is joined to every value unit by ``null``. Its path
    metric is the closure of the min-over-values part distance ``δ_c``: every edge is some
    ``δ_c(P, Q)`` or more (so paths are ≥ ``δ_c*``), and walking the consecutive units from
    ``u`` to ``v`` costs exactly ``weight·|u − v|`` (so paths ≤ ``δ_c``, hence ≤ ``δ_c*``).
    ``different``: the complete graph, every edge the declared distance. ``matrix``: the
    complete graph with ``δ_c(P, Q) = min`` over member pairs (``other``/NULL included).
    The product graph joins two cells that differ in one column along an ``H_c`` edge; its
    path metric is ``Σ_c δ_c*`` = the closure of ``D`` (module docstring, point 3).
    """
    shape = tuple(p.n_parts for p in partitions)
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    graphs = [_column_graph(model.column(p.column), p, column_domain(domains, p.column),
                            model.table)
              for p in partitions]
    n_edges = sum(len(g.p) * (n // g.n_parts) for g in graphs)
    if n_edges > MAX_EDGES:
        raise StrategyError(f"the cell graph would have {n_edges:,} edges, more than the limit "
                            f"of {MAX_EDGES:,}; split the batch or coarsen its columns")
    cells = np.arange(n, dtype=np.int64).reshape(shape) if shape else np.zeros(1, np.int64)
    I, J, D = [], [], []
    for axis, g in enumerate(graphs):
        moved = np.moveaxis(cells, axis, 0).reshape(g.n_parts, -1)
        w = np.array([_down(x) for x in g.weights], dtype=float)
        I.append(moved[g.p].reshape(-1))
        J.append(moved[g.q].reshape(-1))
        D.append(np.repeat(w, moved.shape[1]))
    cat = lambda parts, dt: np.concatenate(parts) if parts else np.zeros(0, dt)  # noqa: E731
    return CellGraph(shape, tuple(graphs), cat(I, np.int64), cat(J, np.int64), cat(D, float))


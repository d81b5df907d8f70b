"""Metric (d_X) privacy for counting workloads: the public-only core.

Model (Chatzikokolakis et al. 2013; Kamalaruban et al., "d_X-private mechanisms for linear
queries"). A release is d_X-private with ``ε`` per unit distance when, for every data set and
every change of ONE record from value ``u`` to value ``v``, the output densities stay within a
factor ``exp(ε · d(u, v))``. ``d`` is the record metric declared by the data owner; changes of
the number of records are not covered (the table's size is public under this model).

Declared in a table's policy::

    [tables.adult.metric]
    epsilon = 1.0          # budget: cumulative ε per unit distance, separate from (ε, δ)
    [tables.adult.metric.columns]
    age = { weight = 0.1 }                       # integer column: |Δage| × 0.1
    hours = { weight = 0.1, null = 5.0 }         # nullable: NULL is 5.0 from every value
    sex = { different = 1.0 }                    # any column: 1.0 between distinct values
    race = { matrix = [[0,1,2],[1,0,1],[2,1,0]], other = 2.0 }

Per column, exactly one of

- ``weight = w`` (integer columns): ``w · |u − v|``. ``null = c`` is required when the column is
  nullable (NULL is ``c`` from every value). Not allowed on numeric columns: their bins touch
  (39.999 vs 40), so the distance between neighbouring bins is 0 and no finite noise could
  separate them; use ``different`` or declare the column integer.
- ``different = w`` (any column): ``w`` between any two distinct values, ``other`` and NULL
  included (the discrete metric).
- ``matrix = [[...]]`` (categorical columns): distances between the declared ``values``, in
  declaration order; symmetric, zero diagonal, positive off the diagonal, triangle
  inequality. ``other = c`` is required: the distance from the implicit ``other`` unit and
  from NULL to every declared value and to each other.

The record distance is the sum over columns (an L1 product metric). A column without an entry
has distance 0: a release under the metric may never depend on it, and a batch that uses it
is refused. Distances are read exactly (floats through their shortest repr). The metric is on
records as dpsql reads them: after the documented clamping to ``[min, max]`` (1-Lipschitz, so
the guarantee carries over to raw values) and flooring to the declared integer grid.

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
from decimal import Decimal
from fractions import Fraction
from typing import Any, Mapping

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import shortest_path

from dpsql.noise.accounting import fraction_from_text
from dpsql.workload.domain import CategoricalDomain, IntegerDomain, NumericDomain
from dpsql.errors import PolicyError, PrivacyParameterError, StrategyError

#: all-pairs programs (and all-pairs verification) only up to this many cells: n(n−1)/2
#: pairs, 79,800 at 400. Larger cell sets use the edge-reduced program (exact, see above).
MAX_PAIRS_CELLS = 400
#: the largest number of constraint edges the product graph may have
MAX_EDGES = 5_000_000
#: the largest categorical distance matrix (the triangle check is cubic)
MAX_MATRIX_CATEGORIES = 256
#: verified maximum privacy-loss ratio must be at most 1 − this (covers float rounding)
VERIFY_MARGIN = 1e-9
#: relative slack covering the few roundings of a float ratio (exponential mechanism)
_FLOAT_SLACK = 1e-12

_COLUMN_KINDS = ("weight", "different", "matrix")
_COLUMN_FIELDS = {"weight": {"weight", "null"}, "different": {"different"},
                  "matrix": {"matrix", "other"}}


def _exact(value: Any, where: str) -> Fraction:
    """A declared distance or budget as an exact Fraction (also ``"num/den"`` text)."""
    if isinstance(value, str):
        try:
            return fraction_from_text(value)
        except PrivacyParameterError:
            raise PolicyError(f"{where} must be a number, got the text {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, Decimal)):
        raise PolicyError(f"{where} must be a number, got {type(value).__name__}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PolicyError(f"{where} must be finite, got {value!r}")
        return Fraction(repr(float(value)))
    if isinstance(value, Decimal) and not value.is_finite():
        raise PolicyError(f"{where} must be finite, got {value}")
    return Fraction(value)


def _positive(value: Any, where: str) -> Fraction:
    f = _exact(value, where)
    if f <= 0:
        raise PolicyError(f"{where} must be > 0, got {float(f)!r}")
    return f


def _down(value: Fraction) -> float:
    """The largest float not above an exact value (rounding in favour of privacy)."""
    f = float(value)
    return math.nextafter(f, -math.inf) if Fraction(f) > value else f


def _text(value: Fraction) -> str:
    return f"{value.numerator}/{value.denominator}"


@dataclass(frozen=True)
class ColumnMetric:
    """One column's declared distance (see the module docstring for the schema)."""

    column: str
    kind: str                       # "weight" | "different" | "matrix"
    value: Fraction | None = None   # the weight, or the `different` distance
    matrix: tuple | None = None     # tuple of tuples of Fraction (declared values)
    other: Fraction | None = None   # matrix: distance from `other` / NULL to everything
    null: Fraction | None = None    # weight: distance from NULL to every value
    table: str = "?"

    def __post_init__(self) -> None:
        where = f"table {self.table!r}, metric of column {self.column!r}"
        if self.kind not in _COLUMN_KINDS:
            raise PolicyError(f"{where}: kind must be one of {_COLUMN_KINDS}, got {self.kind!r}")
        fix = lambda name, v: object.__setattr__(self, name, v)  # noqa: E731
        if self.kind in ("weight", "different"):
            fix("value", _positive(self.value, f"{where}: {self.kind}"))
        if self.null is not None:
            if self.kind != "weight":
                raise PolicyError(f"{where}: `null` goes with `weight` only")
            fix("null", _positive(self.null, f"{where}: null"))
        if self.kind == "matrix":
            fix("other", _positive(self.other, f"{where}: other"))
            if not isinstance(self.matrix, (list, tuple)) or not all(
                    isinstance(r, (list, tuple)) for r in self.matrix):
                raise PolicyError(f"{where}: matrix must be a list of rows of numbers")
            fix("matrix", tuple(tuple(_exact(v, f"{where}: matrix entry ({a}, {b})")
                                      for b, v in enumerate(row))
                                for a, row in enumerate(self.matrix)))
            _check_matrix(self.matrix, where, self.other)
        elif self.matrix is not None or self.other is not None:
            raise PolicyError(f"{where}: `matrix` / `other` go with kind 'matrix' only")

    def describe(self) -> dict:
        if self.kind == "matrix":
            return {"matrix": [[_text(v) for v in row] for row in self.matrix],
                    "other": _text(self.other)}
        out = {self.kind: _text(self.value)}
        if self.null is not None:
            out["null"] = _text(self.null)
        return out


def _check_matrix(matrix, where: str, other: Fraction) -> None:
    """Square, symmetric, zero diagonal, positive off-diagonal, triangle inequality (with the
    `other` point appended). Exact: entries are scaled to integers by their common
    denominator."""
    k = len(matrix)
    if k < 1 or k > MAX_MATRIX_CATEGORIES:
        raise PolicyError(f"{where}: matrix must have 1 to {MAX_MATRIX_CATEGORIES} rows, got {k}")
    for a, row in enumerate(matrix):
        if len(row) != k:
            raise PolicyError(f"{where}: matrix must be square ({k}×{k}); row {a} has "
                              f"{len(row)} entries")
    for a in range(k):
        if matrix[a][a] != 0:
            raise PolicyError(f"{where}: matrix diagonal must be 0; entry ({a}, {a}) is "
                              f"{float(matrix[a][a])!r}")
        for b in range(a + 1, k):
            if matrix[a][b] != matrix[b][a]:
                raise PolicyError(f"{where}: matrix must be symmetric; entry ({a}, {b}) is "
                                  f"{float(matrix[a][b])!r} but ({b}, {a}) is "
                                  f"{float(matrix[b][a])!r}")
            if matrix[a][b] <= 0:
                raise PolicyError(f"{where}: off-diagonal distances must be > 0; entry "
                                  f"({a}, {b}) is {float(matrix[a][b])!r}")
    ext = [list(row) + [other] for row in matrix] + [[other] * k + [Fraction(0)]]
    den = math.lcm(*(v.denominator for row in ext for v in row))
    if den * max(v for row in ext for v in row) > 2 ** 60:
        raise PolicyError(f"{where}: matrix entries need too many digits for the exact "
                          "triangle check; round them to fewer decimals")
    M = np.array([[int(v * den) for v in row] for row in ext], dtype=np.int64)
    for b in range(k + 1):
        bad = M[:, b][:, None] + M[b, :][None, :] < M
        if bad.any():
            a, c = (int(x) for x in np.argwhere(bad)[0])
            name = ["<other>" if i == k else str(i) for i in range(k + 1)]
            raise PolicyError(
                f"{where}: matrix breaks the triangle inequality on the triple "
                f"(a, b, c) = ({name[a]}, {name[b]}, {name[c]}): d(a, c) = "
                f"{float(ext[a][c])!r} > d(a, b) + d(b, c) = {float(ext[a][b])!r} + "
                f"{float(ext[b][c])!r} (indices are positions in the declared values)")


def _column_metric_from_spec(table: str, column: str, spec: Any) -> ColumnMetric:
    where = f"table {table!r}, metric of column {column!r}"
    if not isinstance(spec, Mapping):
        raise PolicyError(f"{where}: expected a table like {{ weight = 0.1 }}, got "
                          f"{type(spec).__name__}")
    kinds = [k for k in _COLUMN_KINDS if k in spec]
    if len(kinds) != 1:
        raise PolicyError(f"{where}: declare exactly one of weight, different, matrix; got "
                          f"{sorted(spec)}")
    kind = kinds[0]
    unknown = set(spec) - _COLUMN_FIELDS[kind]
    if unknown:
        raise PolicyError(f"{where}: unknown field(s) {sorted(unknown)} with {kind} "
                          f"(allowed: {sorted(_COLUMN_FIELDS[kind])})")
    if kind == "matrix":
        rows = spec["matrix"]
        if not isinstance(rows, (list, tuple)) or not all(isinstance(r, (list, tuple))
                                                         for r in rows):
            raise PolicyError(f"{where}: matrix must be a list of rows of numbers")
        if "other" not in spec:
            raise PolicyError(f"{where}: a matrix needs `other = <distance>`, the distance "
                              "from values outside the declared list (and NULL) to every "
                              "declared value")
        return ColumnMetric(column, kind, matrix=tuple(tuple(r) for r in rows),
                            other=_exact(spec["other"], f"{where}: other"), table=table)
    null = _exact(spec["null"], f"{where}: null") if "null" in spec else None
    return ColumnMetric(column, kind, value=_exact(spec[kind], f"{where}: {kind}"),
                        null=null, table=table)


def _domain(domains, column: str):
    if hasattr(domains, "column"):
        try:
            return domains.column(column)
        except KeyError:
            return None
    return dict(domains).get(column)


@dataclass(frozen=True)
class MetricModel:
    """A table's declared d_X model: the ε-per-unit budget and per-column distances."""

    table: str
    epsilon_per_unit: Fraction      # cumulative budget of ε per unit distance
    columns: tuple                  # ((name, ColumnMetric), ...) in declaration order

    def __post_init__(self) -> None:
        eps = _positive(self.epsilon_per_unit, f"table {self.table!r}: metric epsilon")
        object.__setattr__(self, "epsilon_per_unit", eps)
        if not self.columns:
            raise PolicyError(f"table {self.table!r}: the metric must declare at least one "
                              "column distance")
        names = [c for c, _ in self.columns]
        if len(set(names)) != len(names):
            raise PolicyError(f"table {self.table!r}: a column's metric is declared twice")
        for name, cm in self.columns:
            if not isinstance(cm, ColumnMetric) or cm.column != name:
                raise PolicyError(f"table {self.table!r}: bad metric entry for {name!r}")

    def column(self, name: str) -> ColumnMetric | None:
        for c, cm in self.columns:
            if c == name.lower():
                return cm
        return None

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any], *, table: str = "table",
                  domains=None) -> "MetricModel":
        """Parse a ``[tables.<t>.metric]`` section (fields ``epsilon``, ``columns``).

        ``domains`` (a ``TablePolicy`` or ``{column: Domain}``), when given, is checked with
        :meth:`validate_against`.
        """
        if not isinstance(spec, Mapping):
            raise PolicyError(f"table {table!r}: the metric section must be a table/dict")
        unknown = set(spec) - {"epsilon", "columns"}
        if unknown:
            raise PolicyError(f"table {table!r}: unknown metric field(s) {sorted(unknown)} "
                              "(allowed: ['columns', 'epsilon'])")
        for need in ("epsilon", "columns"):
            if need not in spec:
                raise PolicyError(f"table {table!r}: the metric section must declare `{need}`")
        cols = spec["columns"]
        if not isinstance(cols, Mapping):
            raise PolicyError(f"table {table!r}: metric `columns` must be a table/dict")
        model = cls(table.lower(),
                    _positive(spec["epsilon"], f"table {table!r}: metric epsilon"),
                    tuple((str(c).lower(), _column_metric_from_spec(table, str(c).lower(), s))
                          for c, s in cols.items()))
        if domains is not None:
            model.validate_against(domains)
        return model

    def validate_against(self, domains) -> None:
        """Check every entry against the table's declared column domains."""
        for name, cm in self.columns:
            where = f"table {self.table!r}, metric of column {name!r}"
            dom = _domain(domains, name)
            if dom is None:
                raise PolicyError(f"table {self.table!r}: the metric names column {name!r}, "
                                  "which the policy does not declare")
            if cm.kind == "weight":
                if isinstance(dom, NumericDomain):
                    raise PolicyError(
                        f"{where}: `weight` cannot be used on a numeric column: its bins touch "
                        "(e.g. 39.999 and 40), so neighbouring bins are at distance 0 and no "
                        "finite noise separates them; use `different`, or declare the column "
                        "as integer")
                if not isinstance(dom, IntegerDomain):
                    raise PolicyError(f"{where}: `weight` needs an integer column; use "
                                      "`different` or `matrix` on a categorical column")
                if dom.nullable and cm.null is None:
                    raise PolicyError(f"{where}: the column is nullable; declare `null = "
                                      "<distance>` (NULL's distance to every value)")
                span = cm.value * (dom.max - dom.min)
                if cm.null is not None and 2 * cm.null < span:
                    raise PolicyError(
                        f"{where}: breaks the triangle inequality on the triple (a, b, c) = "
                        f"({dom.min}, NULL, {dom.max}): d(a, c) = {float(span)!r} > d(a, b) + "
                        f"d(b, c) = {float(cm.null)!r} + {float(cm.null)!r}; raise `null` to "
                        f"at least {float(span / 2)!r}")
            if cm.kind == "matrix":
                if not isinstance(dom, CategoricalDomain):
                    raise PolicyError(f"{where}: `matrix` needs a categorical column")
                if len(cm.matrix) != len(dom.values):
                    raise PolicyError(f"{where}: matrix is {len(cm.matrix)}×{len(cm.matrix)} "
                                      f"but the column declares {len(dom.values)} values")

    def describe(self) -> dict:
        """The model in :meth:`from_dict`'s schema, with exact ``"num/den"`` numbers."""
        return {"epsilon": _text(self.epsilon_per_unit),
                "columns": {c: cm.describe() for c, cm in self.columns}}


# ---------------------------------------------------------------------------- cell graphs

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
    graphs = [_column_graph(model.column(p.column), p, _domain(domains, p.column), model.table)
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

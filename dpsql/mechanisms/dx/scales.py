"""d_X-private mechanisms for linear queries: per-query Laplace scales and the exponential
mechanism (Kamalaruban et al., "d_X-private mechanisms for linear queries"; NOTES.md, d_X).

Public inputs only: the workload ``W``, the cell metric of :mod:`dpsql.policy.metric` (its graph or a
dense distance matrix) and ε per unit distance. See :mod:`dpsql.policy.record_metric` for the model
and :mod:`dpsql.policy.metric` for why constraints on the graph's edges suffice.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from dpsql.errors import StrategyError
from dpsql.policy.metric import MAX_PAIRS_CELLS, CellGraph, _down
from dpsql.policy.record_metric import _positive
from dpsql.workload.matrix import exact_l1_sensitivity

#: verified maximum privacy-loss ratio must be at most 1 − this (covers float rounding)
VERIFY_MARGIN = 1e-9
#: relative slack covering the few roundings of a float ratio (exponential mechanism)
_FLOAT_SLACK = 1e-12


# ---------------------------------------------------------------------- d_X Laplace

@dataclass(frozen=True)
class DXPlan:
    """Per-query Laplace scales for a d_X release, verified, with their expected error.

    ``scales[k] = 0`` marks a query released exactly (``exact[k]``): it is constant over all
    cells, so with change-one-record neighbours it does not depend on the data beyond the
    table's size, which d_X privacy treats as public. ``baseline_rmse`` is standard (add /
    remove) Laplace ``Lap(Δ1(W) / (ε·d_min))`` on every query, ``Δ1`` the largest column L1
    norm: dpsql's standard path at the ε the closest pair of cells gets. (A baseline that is
    itself d_X-valid needs the change-one sensitivity, between ``Δ1`` and ``2Δ1``, so the
    reported ratio favours the baseline.)
    """

    scales: np.ndarray
    exact: np.ndarray
    epsilon_per_unit: float
    method: str                     # "edges", "pairs" (all pairs) or "pairs-pruned"
    n_constraints: int              # distinct constraint rows given to the solver
    n_checked: int                  # pairs verified after rounding
    max_ratio: float                # max over checked pairs of L(i,j) / (ε d(i,j)), ≤ 1
    expected_rmse: float            # sqrt(mean(2 b²))
    baseline_scale: float
    baseline_rmse: float
    d_min: float
    solver: str
    solve_seconds: float

    @property
    def rmse_ratio(self) -> float:
        return self.expected_rmse / self.baseline_rmse if self.baseline_rmse else math.nan

    def describe(self) -> str:
        return (f"d_X Laplace ({self.method}, {self.n_constraints} constraints, "
                f"{self.solver} {self.solve_seconds:.2f}s): RMSE {self.expected_rmse:.4g} vs "
                f"standard Laplace at ε·d_min {self.baseline_rmse:.4g} "
                f"(×{self.rmse_ratio:.3f}); {int(self.exact.sum())} exact queries; max "
                f"privacy-loss ratio {self.max_ratio:.9f}")


def _implied(D: np.ndarray) -> np.ndarray:
    """Pairs ``(i, j)`` implied by a two-step path: ``D[i,k] + D[k,j] ≤ D[i,j]`` for some
    ``k ∉ {i, j}``. Dropping them keeps the constraint set equivalent (induction on the
    distance: both steps are strictly shorter, and ``L`` obeys the triangle inequality); a
    relative tolerance of 1e-12 lets float sums of equal metrics match, and the final
    verification over all pairs absorbs it."""
    n = D.shape[0]
    out = np.zeros((n, n), dtype=bool)
    limit = D * (1 + 1e-12)
    for k in range(n):
        via = D[:, k][:, None] + D[k, :][None, :] <= limit
        via[k, :] = False
        via[:, k] = False
        out |= via
    return out


def _pairs(graph_or_distances, method: str):
    """The constraint pairs (I, J, d), the method used, the graph (or None) and the dense
    distance matrix for the all-pairs verification (None above MAX_PAIRS_CELLS cells)."""
    if method not in ("auto", "edges", "pairs"):
        raise StrategyError(f"method must be 'auto', 'edges' or 'pairs', got {method!r}")
    if isinstance(graph_or_distances, CellGraph):
        g = graph_or_distances
        D = g.distances() if g.n_cells <= MAX_PAIRS_CELLS else None
        if method in ("auto", "edges"):
            return g.i, g.j, g.d, "edges", g, D
        if D is None:
            g.distances()      # raises the limit error
        I, J = np.triu_indices(g.n_cells, 1)
        return I, J, D[I, J], "pairs", g, D
    if method == "edges":
        raise StrategyError("a distance matrix supports only method='auto' or 'pairs' (give a "
                            "CellGraph for the edge-reduced program)")
    D = np.asarray(graph_or_distances, dtype=float)
    n = D.shape[0] if D.ndim == 2 else -1
    if D.ndim != 2 or D.shape != (n, n):
        raise StrategyError(f"distances must be a square matrix, got shape {D.shape}")
    if n > MAX_PAIRS_CELLS:
        raise StrategyError(f"an all-pairs program is limited to {MAX_PAIRS_CELLS} cells, got "
                            f"{n}; build a CellGraph (cell_distance_graph) instead")
    off = ~np.eye(n, dtype=bool)
    if (not np.isfinite(D).all() or (D != D.T).any() or (np.diag(D) != 0).any()
            or (D[off] <= 0).any()):
        raise StrategyError("distances must be finite, symmetric, 0 on the diagonal and > 0 "
                            "off it")
    I, J = np.triu_indices(n, 1)
    if method == "auto":
        keep = ~_implied(D)[I, J]
        I, J = I[keep], J[keep]
        return I, J, D[I, J], "pairs-pruned", None, D
    return I, J, D[I, J], "pairs", None, D


def _differences(W: sp.csr_matrix, I, J) -> sp.csr_matrix:
    """``|W[:, i] − W[:, j]|`` as rows, one per pair (sparse, pairs × queries)."""
    WT = W.T.tocsr()
    return abs(WT[I] - WT[J]).tocsr()


def _ratios(A: sp.csr_matrix, inv_b: np.ndarray, eps: float, d: np.ndarray) -> np.ndarray:
    return (A @ inv_b) / (eps * d)


def _max_ratio(A: sp.csr_matrix, inv_b: np.ndarray, eps: float, d: np.ndarray) -> float:
    return float(np.max(_ratios(A, inv_b, eps, d))) if A.shape[0] else 0.0


def _solve_scaled(R: sp.csr_matrix, solver: str | None):
    """min Σ s_k^-2 s.t. R s ≤ 1, s > 0 (t = ε·s). Returns (s, solver name)."""
    import cvxpy as cp

    s = cp.Variable(R.shape[1], pos=True)
    problem = cp.Problem(cp.Minimize(cp.sum(cp.power(s, -2))), [R @ s <= 1])
    used = solver or cp.CLARABEL
    try:
        problem.solve(solver=used)
    except cp.error.SolverError:
        used = cp.SCS
        problem.solve(solver=used, eps=1e-9, max_iters=200000)
    if s.value is None or problem.status not in ("optimal", "optimal_inaccurate"):
        raise StrategyError(f"the d_X scale program did not solve ({problem.status})")
    return np.asarray(s.value, dtype=float), str(used)


def dx_laplace_scales(W, graph_or_distances, epsilon_per_unit, method: str = "auto", *,
                      allow_exact: bool = True, solver: str | None = None) -> DXPlan:
    """Per-query Laplace scales ``b`` for a d_X release of ``W x`` (Kamalaruban et al., §3.1).

    Minimises the expected squared error ``Σ_k 2 b_k²`` subject to
    ``Σ_k |W[k,i] − W[k,j]| / b_k ≤ ε·d(i, j)`` — convex in ``t = 1/b`` (linear constraints,
    objective ``Σ 2 t_k^-2``), solved with cvxpy after factoring out ``ε``, dividing each row
    by ``d`` and dropping duplicate rows. Pure function of public inputs.

    ``graph_or_distances`` and ``method``:

    - a :class:`CellGraph`, ``"auto"``/``"edges"``: one constraint per edge (any size up to
      :data:`MAX_EDGES`). Edges suffice: the left side ``L(i, j)`` is a pseudometric (a
      weighted sum of ``|W[k,i] − W[k,j]|``), so if ``L ≤ ε·w`` on every edge then along a
      shortest path ``L(i, j) ≤ Σ L(edge) ≤ ε Σ w = ε·D*(i, j)``; conversely every edge is a
      pair with ``w ≥ D*``, so nothing is lost.
    - a :class:`CellGraph`, ``"pairs"``: every pair with ``D*`` — the reference program;
    - a dense ``n × n`` distance matrix: ``"pairs"`` (every pair) or ``"auto"`` (pairs implied
      by a two-step path dropped, see :func:`_implied`).

    All-pairs programs are limited to :data:`MAX_PAIRS_CELLS` cells; measured with Clarabel
    and 200 range queries they cost about 3 ms per constraint row (74 cells: 2,701 rows, 8 s;
    120 cells: 7,125 rows, 17 s), so near the limit they take minutes — the edge program for
    the same 74 cells takes 0.05 s.

    Queries constant over all cells (``W[k,i] = W[k,j]`` on every constraint pair of the
    connected graph, e.g. the total count) appear in no constraint: their privacy loss is 0
    under change-one neighbours and any scale is private, so they get ``b_k = 0`` (released
    exactly) instead of sending the solver to an unbounded ``t_k``. ``allow_exact=False``
    refuses them instead.

    After solving, ``t`` is scaled so that the largest ratio over the verification set (every
    constraint pair, and every pair of cells when there are at most :data:`MAX_PAIRS_CELLS`)
    is ``1 − 2·VERIFY_MARGIN``, ``b = 1/t`` is rounded up and the ratios are recomputed; one
    above ``1 − VERIFY_MARGIN`` is refused. The float check is rigorous: distances are rounded
    down, and the relative rounding error of a ratio is below ``(m + path + 8)·2^-53``, far
    under the margin.
    """
    eps = _down(_positive(epsilon_per_unit, "d_X epsilon per unit"))
    W = sp.csr_matrix(W, dtype=float)
    m, n = W.shape
    I, J, d, used_method, D = _checked_pairs(n, graph_or_distances, method)
    A = _differences(W, I, J)
    check = _verification_set(W, A, d, D)
    exact = _constant_queries(check[0], allow_exact)
    active = np.flatnonzero(~exact)
    started = time.perf_counter()
    scales, n_rows, used_solver = _solved_scales(A, d, check, active, eps, m, solver)
    seconds = time.perf_counter() - started
    ratio = _verified_ratio(A, d, check, scales, active, eps)
    d_min = float(np.min(check[1])) if len(check[1]) else math.inf   # all pairs if known
    base = exact_l1_sensitivity(W) / (eps * d_min) if math.isfinite(d_min) else 0.0
    return DXPlan(scales, exact, eps, used_method, n_rows, len(check[1]), ratio,
                  float(np.sqrt(np.mean(2 * scales ** 2))) if m else 0.0, base,
                  math.sqrt(2) * base, d_min, used_solver, seconds)


def _checked_pairs(n: int, graph_or_distances, method: str) -> tuple:
    """The constraint pairs ``(I, J, d, method, D)`` of :func:`_pairs` for ``n`` cells, refused
    when the metric covers another number of cells, a graph is not connected, or two
    distinct cells are at distance 0."""
    I, J, d, used_method, graph, D = _pairs(graph_or_distances, method)
    n_cells = graph.n_cells if graph is not None else D.shape[0]
    if n != n_cells:
        raise StrategyError(f"W has {n} columns but the metric covers {n_cells} cells")
    if graph is not None and n > 1:
        G = sp.coo_matrix((np.ones(len(I)), (I, J)), shape=(n, n))
        if connected_components(G, directed=False)[0] != 1:
            raise StrategyError("the cell graph is not connected: some pairs of cells would "
                                "have no distance")
    if len(d) and not (d > 0).all():
        raise StrategyError("two distinct cells are at distance 0: no finite noise separates "
                            "them")
    return I, J, d, used_method, D


def _verification_set(W, A, d: np.ndarray, D) -> tuple:
    """``(differences, distances)`` of the pairs the scales are verified on: every pair of
    cells when a dense matrix ``D`` is known and the constraints dropped some, else the
    constraint pairs themselves."""
    n = W.shape[1]
    if D is not None and A.shape[0] < n * (n - 1) // 2:
        VI, VJ = np.triu_indices(n, 1)
        return (_differences(W, VI, VJ), D[VI, VJ])
    return (A, d)


def _constant_queries(differences, allow_exact: bool) -> np.ndarray:
    """The queries constant on every checked pair (all pairs, or the edges of a connected
    graph), released exactly; refused unless ``allow_exact``."""
    exact = np.asarray(differences.sum(axis=0)).reshape(-1) == 0
    if exact.any() and not allow_exact:
        raise StrategyError(f"queries {np.flatnonzero(exact)[:10].tolist()} are constant over "
                            "all cells: under d_X they would be released exactly (the table "
                            "size is public); pass allow_exact=True or drop them")
    return exact


def _solved_scales(A, d: np.ndarray, check: tuple, active: np.ndarray, eps: float, m: int,
                   solver: str | None) -> tuple:
    """``(scales, constraint rows, solver)``: the program's ``t = 1/b`` for the ``active``
    queries, scaled so that the largest ratio over ``check`` is ``1 − 2·VERIFY_MARGIN``, and
    ``b = 1/t`` rounded up (0 for the others)."""
    scales = np.zeros(m)
    n_rows, used_solver = 0, "none"
    if len(active):
        R = (sp.diags(1.0 / d) @ A[:, active]).tocsr()
        R = R[np.diff(R.indptr) > 0]
        if R.shape[0] * R.shape[1] <= 50_000_000:   # drop duplicate rows (same constraint)
            R = sp.csr_matrix(np.unique(R.toarray(), axis=0))
        n_rows = R.shape[0]
        s, used_solver = _solve_scaled(R, solver)
        s = np.maximum(s, np.finfo(float).tiny)
        inv_b = np.zeros(m)
        inv_b[active] = eps * s
        worst = _max_ratio(check[0], inv_b, eps, check[1])
        scales[active] = np.nextafter(1.0 / (eps * s * (1 - 2 * VERIFY_MARGIN) / worst),
                                      np.inf)
    return scales, n_rows, used_solver


def _verified_ratio(A, d: np.ndarray, check: tuple, scales: np.ndarray, active: np.ndarray,
                    eps: float) -> float:
    """The largest privacy-loss ratio of the rounded scales over the constraint pairs and the
    verification set; refused above ``1 − VERIFY_MARGIN``."""
    inv_b = np.zeros(len(scales))
    inv_b[active] = 1.0 / scales[active]
    ratio = max(_max_ratio(A, inv_b, eps, d), _max_ratio(check[0], inv_b, eps, check[1]))
    if not ratio <= 1 - VERIFY_MARGIN:
        raise StrategyError(f"the d_X scales failed verification (privacy-loss ratio "
                            f"{ratio!r} > 1); nothing is released")
    return ratio


# ------------------------------------------------------------ d_X exponential mechanism

def _score_pairs(S, graph_or_distances):
    """Per constraint pair: Δ_ij = max_r |S[r,i] − S[r,j]| and the distance."""
    # a graph's edges are exact; a dense matrix is used pair by pair (cheap here: a max)
    method = "auto" if isinstance(graph_or_distances, CellGraph) else "pairs"
    I, J, d = _pairs(graph_or_distances, method)[:3]
    S = sp.csr_matrix(S, dtype=float)
    A = _differences(S, I, J)
    delta = A.max(axis=1).toarray().reshape(-1) if A.shape[1] else np.zeros(len(I))
    return delta, d


def dx_exponential_epsilon(S, graph_or_distances, temperature: float) -> float:
    """The ε per unit distance spent by the exponential mechanism at ``temperature``.

    The mechanism outputs ``r`` with probability ∝ ``exp(u(x, r) / T)``. ``S`` (outputs ×
    cells) bounds the scores' movement: when one record moves from cell ``i`` to ``j``,
    ``|u(x, r) − u(x', r)| ≤ |S[r,i] − S[r,j]|`` for every ``r`` (true for ``u = S x + c``
    and for MWEM's ``|S_r x − c_r|``). With ``Δ_ij = max_r |S[r,i] − S[r,j]|`` the output
    ratio is at most ``exp(2 Δ_ij / T)`` (numerator and normaliser each move by ``Δ_ij/T``),
    so the mechanism is d_X-private at ``ε = max_ij 2 Δ_ij / (T d(i, j))``. ``Δ`` is a
    pseudometric (a max of pseudometrics), so as for Laplace the maximum over the graph's
    edges is the maximum over all pairs. Rounded up.
    """
    if not (isinstance(temperature, (int, float)) and temperature > 0
            and math.isfinite(temperature)):
        raise StrategyError(f"temperature must be a finite number > 0, got {temperature!r}")
    delta, d = _score_pairs(S, graph_or_distances)
    if len(d) == 0:
        return 0.0
    worst = float(np.max(2 * delta / (temperature * d)))
    return worst * (1 + _FLOAT_SLACK) if worst > 0 else 0.0


def dx_em_scale(S, graph_or_distances, epsilon_per_unit) -> float:
    """The smallest temperature ``T`` at which the exponential mechanism with scores bounded by
    ``S`` (see :func:`dx_exponential_epsilon`) is d_X-private at ``ε`` per unit:
    ``T = max_ij 2 Δ_ij / (ε d(i, j))`` over the graph's edges, rounded up. Returns 0 when no
    score depends on the cells (any temperature, even the plain argmax, is private)."""
    eps = _down(_positive(epsilon_per_unit, "d_X epsilon per unit"))
    delta, d = _score_pairs(S, graph_or_distances)
    if len(d) == 0 or not (delta > 0).any():
        return 0.0
    T = float(np.max(2 * delta / (eps * d))) * (1 + 2 * _FLOAT_SLACK)
    if not float(np.max(2 * delta / (T * d))) * (1 + _FLOAT_SLACK) <= eps:
        raise StrategyError("the d_X temperature failed verification; nothing is released")
    return T

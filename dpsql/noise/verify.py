"""The kernel's independent checks of sensitivities and d_X scales it did not compute.

Issue 15, "the kernel owns noise scales": the mechanisms compute sensitivities, Lipschitz
constants and per-query d_X scales (fast, in floats); before any noise is drawn the kernel
verifies them here, by exact integer arithmetic or float arithmetic rounded against the
caller, and refuses on any shortfall. Every function returns ``None`` when the claim holds
and a one-line reason when it does not. Public inputs only (matrices, scales, the cell
metric's edges), no data.

Matrices are on the kernel's exact grid (entries ``m · 2^-20``, ``|m| <= 2^20``; the kernel
checks that first), so they are held here as int64 multiples of ``2^-20``: differences and
sums of at most 2^42 such entries are exact.

Float bounds. For non-negative terms, a float sum of ``k`` products ``a_q · t_q`` (each
rounded) is within relative ``γ_k = k u / (1 − k u)`` of the exact sum, in any summation
order (Higham, *Accuracy and Stability of Numerical Algorithms*, 2002, §3.1), ``u = 2^-53``.
Upper bounds are therefore inflated by ``(k + 2) · 2^-52`` and stepped one ulp up; right-hand
sides ``ε · d`` are stepped one ulp down from the correctly rounded product; ``ε`` is the
largest double below its exact value and every edge length ``d`` of a
:class:`~dpsql.policy.metric.CellGraph` is already rounded down from the declared exact
distance.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from dpsql.noise.accounting import float_down

_Q = 2 ** 20
_U2 = 2.0 ** -52


def _grid_ints(M) -> sp.csr_matrix:
    """A matrix on the 2^-20 grid as int64 multiples of 2^-20 (exact)."""
    M = sp.csr_matrix(M, dtype=float)
    out = sp.csr_matrix((np.rint(M.data * _Q).astype(np.int64), M.indices.copy(),
                         M.indptr.copy()), shape=M.shape)
    out.eliminate_zeros()
    return out


def edge_differences(M, I, J) -> sp.csr_matrix:
    """``|M[:, i] − M[:, j]|`` per edge (edges × rows) of a grid matrix, as exact int64
    multiples of 2^-20; pass it to :func:`metric_lipschitz_shortfall` as ``diffs`` to check
    several constants against the same rows without recomputing it."""
    return _edge_differences(_grid_ints(M), I, J)


def _edge_differences(M_int: sp.csr_matrix, I, J) -> sp.csr_matrix:
    """``|M[:, i] − M[:, j]|`` per edge (edges × rows), int64, exact."""
    MT = M_int.T.tocsr()
    out = abs(MT[np.asarray(I, dtype=np.int64)] - MT[np.asarray(J, dtype=np.int64)]).tocsr()
    out.eliminate_zeros()
    return out


def _upper(values: np.ndarray, terms: int) -> np.ndarray:
    """A float bound >= the exact value of a float sum of ``terms`` non-negative products."""
    return np.nextafter(values * (1.0 + (terms + 2) * _U2), np.inf)


def _allowance(lipschitz: float, d: np.ndarray) -> np.ndarray:
    """``lipschitz · d`` rounded down (<= the exact product)."""
    return np.nextafter(float(lipschitz) * np.asarray(d, dtype=float), -np.inf)


def is_connected(n_cells: int, I, J) -> bool:
    """Whether the cell graph joins every cell (its path metric is then finite)."""
    return _connected(n_cells, I, J)


def _connected(n_cells: int, I, J) -> bool:
    if n_cells <= 1:
        return True
    G = sp.coo_matrix((np.ones(len(I)), (np.asarray(I), np.asarray(J))),
                      shape=(n_cells, n_cells))
    return connected_components(G, directed=False)[0] == 1


def exact_l2_norm(A) -> float:
    """Largest column L2 norm of a matrix on the 2^-20 grid, exactly, rounded up: the same
    double as :func:`dpsql.workload.matrix.exact_l2_sensitivity` (the plan's recorded
    sensitivity), vectorised (integer squares summed per column with ``np.add.at``, exact
    in int64 below 2^22 rows), so the kernel recomputes it cheaply for wide plans."""
    if sp.issparse(A):
        M = sp.csr_matrix(A)
        ints = np.rint(M.data * _Q).astype(np.int64)
        sums = np.zeros(M.shape[1], dtype=np.int64)
        np.add.at(sums, M.indices, ints * ints)
    else:
        ints = np.rint(np.asarray(A, dtype=float) * _Q).astype(np.int64)
        sums = (ints * ints).sum(axis=0, dtype=np.int64) if ints.size else np.zeros(0, np.int64)
    best = int(sums.max()) if sums.size else 0
    if best == 0:
        return 0.0
    root = math.sqrt(best)                        # then the smallest double with root² >= best
    while Fraction(root) ** 2 < best:
        root = math.nextafter(root, math.inf)
    return root / _Q


def group_l1_shortfall(S, starts, stops, sensitivity: float) -> str | None:
    """Whether ``sensitivity`` bounds every group's largest column L1 norm, exactly.

    Standard MWEM's selection score ``Σ_{r∈g} |est_r − (S x)_r| − penalty_g`` moves by at most
    ``max_j Σ_{r∈g} |S[r, j]|`` when one row is added or removed; the exponential mechanism
    needs ``sensitivity`` >= the maximum of that over groups ``g = starts[g]:stops[g]``.
    Integer sums, compared with the exact value of ``sensitivity``.
    """
    S_int = abs(_grid_ints(S))
    starts = np.asarray(starts, dtype=np.int64).reshape(-1)
    stops = np.asarray(stops, dtype=np.int64).reshape(-1)
    lengths = stops - starts
    if starts.size == 0 or (lengths < 0).any():
        return "no candidate groups"
    rows = np.concatenate([np.arange(a, b) for a, b in zip(starts, stops)])
    G = sp.csr_matrix((np.ones(rows.size, dtype=np.int64),
                       (np.repeat(np.arange(starts.size), lengths), rows)),
                      shape=(starts.size, S_int.shape[0]))
    sums = (G @ S_int).tocsr()
    worst = int(sums.data.max()) if sums.nnz else 0
    if Fraction(worst, _Q) > Fraction(float(sensitivity)):
        return (f"selection sensitivity {float(sensitivity)!r} is below the candidate groups' "
                f"largest column L1 norm {worst / _Q!r}")
    return None


def metric_lipschitz_shortfall(S, I, J, d, n_cells: int, lipschitz: float, *,
                               form: str = "sum", starts=None, stops=None,
                               diffs=None, connected: bool = False) -> str | None:
    """Whether ``lipschitz`` bounds how far the rows of ``S`` move per unit of cell distance.

    For every edge ``(i, j)`` of the cell metric (length ``d``) and every group of rows
    (``form="sum"``: ``starts``/``stops``, default one group of all rows) the exact
    ``Σ_{r∈g} |S[r,i] − S[r,j]|`` (``form="max"``: ``max_r``) must be at most
    ``lipschitz · d`` rounded down. Edges suffice: the left side is a pseudometric on cells
    and the graph's path metric is the cell metric (:mod:`dpsql.policy.metric`, points 1–3),
    so the bound along a shortest path is the bound for every pair; the graph must be
    connected, checked here unless the caller already did (``connected=True``, see
    :func:`is_connected`). ``diffs``: :func:`edge_differences` of ``S`` on these edges,
    when already computed.
    """
    if form not in ("sum", "max"):
        return f"unknown form {form!r}"
    S_int = _grid_ints(S)
    if S_int.shape[1] != n_cells:
        return f"the rows cover {S_int.shape[1]} cells, the metric {n_cells}"
    if not connected and not _connected(n_cells, I, J):
        return "the cell graph is not connected"
    if len(I) == 0:
        return None
    A = _edge_differences(S_int, I, J) if diffs is None else diffs   # edges × rows
    if form == "max":
        per_edge = [np.asarray(A.max(axis=1).todense()).reshape(-1)] if A.shape[1] else []
    else:
        if starts is None:
            starts, stops = np.array([0]), np.array([S_int.shape[0]])
        starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        stops = np.asarray(stops, dtype=np.int64).reshape(-1)
        lengths = stops - starts
        rows = np.concatenate([np.arange(a, b) for a, b in zip(starts, stops)]) \
            if starts.size else np.zeros(0, np.int64)
        G = sp.csr_matrix((np.ones(rows.size, dtype=np.int64),
                           (rows, np.repeat(np.arange(starts.size), lengths))),
                          shape=(S_int.shape[0], starts.size))
        sums = (A @ G).tocsc()                          # edges × groups, exact
        per_edge = [np.asarray(sums.max(axis=1).todense()).reshape(-1)] if sums.shape[1] \
            else []
    if not per_edge:
        return None
    worst_int = per_edge[0].astype(np.int64)
    lhs = worst_int.astype(float)                     # exact below 2^53, else one ulp up
    lhs = np.where(worst_int < 2 ** 53, lhs, np.nextafter(lhs, np.inf)) / _Q
    rhs = _allowance(lipschitz, d)
    bad = np.flatnonzero(lhs > rhs)
    if bad.size:
        e = int(bad[0])
        return (f"Lipschitz constant {float(lipschitz)!r} is too small on cell edge "
                f"({int(I[e])}, {int(J[e])}): the rows move by {worst_int[e] / _Q!r} over "
                f"distance {float(d[e])!r}")
    return None


def dx_scales_shortfall(W, scales, I, J, d, n_cells: int, epsilon) -> str | None:
    """Whether per-query Laplace scales ``b`` make ``W x + Lap(b)`` d_X-private at ``epsilon``.

    Kamalaruban et al. (d_X-private Laplace): for every edge ``(u, v)`` of the cell graph
    ``Σ_q |W_q(u) − W_q(v)| / b_q <= ε · d(u, v)`` (edges suffice, see
    :func:`metric_lipschitz_shortfall`; the graph must be connected). ``b_q = 0`` (released
    exactly) is allowed only for a query that is equal on both ends of every edge, hence
    constant over all cells. The differences are exact integers; ``1/b_q`` is rounded up and
    the float row sums inflated by their rounding bound (module docstring), ``ε`` rounded
    down, so the check errs only against the caller.
    """
    W_int = _grid_ints(W)
    b = np.asarray(scales, dtype=float).reshape(-1)
    if b.size != W_int.shape[0] or not np.all(np.isfinite(b)) or np.any(b < 0):
        return "one finite scale >= 0 per query is needed"
    if W_int.shape[1] != n_cells:
        return f"the workload covers {W_int.shape[1]} cells, the metric {n_cells}"
    if not _connected(n_cells, I, J):
        return "the cell graph is not connected"
    if len(I) == 0:
        return None
    A = _edge_differences(W_int, I, J).tocsc()          # edges × queries, exact integers
    zero = np.flatnonzero(b == 0)
    moving = zero[np.diff(A.indptr)[zero] > 0]
    if moving.size:
        return (f"query {int(moving[0])} is released exactly (scale 0) but differs between "
                "neighbouring cells")
    inv = np.zeros(b.size)
    inv[b > 0] = np.nextafter(1.0 / b[b > 0], np.inf)   # >= 1/b exactly
    A = A.tocsr()
    terms = int(np.diff(A.indptr).max()) if A.shape[0] else 0
    loss = _upper(np.asarray(A.astype(float) @ inv).reshape(-1) / _Q, terms)
    rhs = _allowance(float_down(Fraction(epsilon)), d)
    bad = np.flatnonzero(loss > rhs)
    if bad.size:
        e = int(bad[np.argmax((loss / rhs)[bad])])
        return (f"d_X scales break the metric constraint on cell edge ({int(I[e])}, "
                f"{int(J[e])}): privacy loss {loss[e]!r} > epsilon x distance {rhs[e]!r}")
    return None


__all__ = ["dx_scales_shortfall", "edge_differences", "exact_l2_norm", "is_connected", "group_l1_shortfall", "metric_lipschitz_shortfall"]

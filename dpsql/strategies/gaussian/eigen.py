"""``eigen``: the Eigen-Design strategy (Li & Miklau, VLDB 2012, §3 Program 2, §4 options).

Program 2 (§3.3):

1. eigendecompose ``V = WᵀW = Qᵀ D Q`` (rows of ``Q``: the *eigen-queries*); eigenvalues
   ``<= 1e-10 · max`` are dropped (§4.1: they play no part in the error);
2. solve Program 1 (:mod:`.program1`) with ``λ = diag(D)``:
   ``min Σᵢ λᵢ / uᵢ  s.t.  Σᵢ uᵢ Q[i, j]² <= 1 for every cell j,  u >= 0``;
3. ``A' = diag(√u) Q``;
4. – 5. complete the columns: for every cell ``j`` whose column norm is below 1, append the
   row ``√(1 − ||A'[:, j]||²) · e_jᵀ``.

Privacy. Neighbouring databases differ by one row, i.e. by ±1 in one cell count, so ``A x``
moves by one column of ``A``: the L2 sensitivity is the largest column norm (§2). Program
1's constraints make every column norm of ``A'`` at most 1 (the weights are rescaled so the
largest is exactly 1), and the completion rows raise every column norm to exactly 1 (a
column short by less than 1e-12 is left as it is: its norm stays below 1). So the
completed ``A`` has sensitivity 1, and ``y = A x + N(0, σ²)`` with σ calibrated for
sensitivity 1 is (ε, δ)-DP by the Gaussian mechanism; least squares and ``W x̂`` are
post-processing. The strategy is a function of the workload alone (public), never of data.
:func:`~.base.make_plan` then scales ``A`` to a largest entry of 1 and rounds it to the
2**-20 grid; the plan's sensitivity is the *exact* largest column norm of that rounded
matrix (rounded up), so rounding can never make the calibration too small.

Error (§2, Prop. 4): total squared error ``σ² tr(V (AᵀA)⁻¹)``; for ``A'`` (with ``Q``
orthonormal, ``A'ᵀA' = Qᵀ diag(u) Q``) it equals ``σ² Σᵢ λᵢ / uᵢ``; completion adds
measurements, so it can only lower it. The singular value bound
``svdb = (Σᵢ √λᵢ)² / n`` (§3.4) is a lower bound for every strategy.

Options (§4.2, §3.4): ``principal_vectors=k`` weighs the top-``k`` eigen-queries
individually and gives every other one a single shared weight (``k + 1`` variables);
``separation=True`` optimises groups of about ``n^(1/3)`` eigen-queries (by eigenvalue)
separately, then one factor per group; ``relative=True`` first scales every workload row to
unit L2 norm (the relative-error heuristic; needs the rows ``W``). The design is
representation independent (§3.4): permuting cells permutes ``Q``'s columns and
leaves Program 1, hence the error, unchanged.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dpsql.errors import StrategyError
from dpsql.workload.matrix import Plan, WorkloadInfo, make_plan
from dpsql.strategies.gaussian.program1 import Program1Result, solve_program1, solve_program1_cvxpy

#: largest number of cells: Program 2 works with dense n x n eigendecompositions
MAX_CELLS = 4096
#: eigenvalues at or below this fraction of the largest are treated as zero (§4.1)
EIGEN_CUTOFF = 1e-10
#: columns whose squared norm falls short of 1 by less than this are left uncompleted
#: (a completion row that small rounds to zero on make_plan's 2**-20 grid anyway)
COMPLETION_CUTOFF = 1e-12


def eigen_queries(workload: WorkloadInfo, relative: bool = False,
                  max_cells: int = MAX_CELLS) -> tuple[np.ndarray, np.ndarray]:
    """Step 1 of Program 2: eigenvalues ``λ`` (descending, > 0) and eigen-queries ``Q`` (rows).

    With explicit rows and fewer queries than cells, the thin SVD of ``W`` (``V``'s
    eigenvectors are ``W``'s right singular vectors, ``λ = s²``) avoids the ``n x n``
    problem. ``relative`` scales the rows of ``W`` to unit L2 norm first (§3.4).
    """
    n = workload.n
    if n > max_cells:
        raise StrategyError(
            f"strategy 'eigen' works with dense {n} x {n} matrices; it supports at most "
            f"{max_cells} cells. Use strategy='identity' or coarser predicates (fewer cells)")
    W = workload.W
    if relative:
        if W is None:
            raise StrategyError("eigen with relative=True scales each query to unit norm and "
                                "needs the workload's rows, not only its Gram matrix")
        norms = np.sqrt(np.asarray(W.multiply(W).sum(axis=1)).reshape(-1))
        keep = norms > 0
        W = sp.diags(1.0 / norms[keep]) @ W[keep]
    if W is not None and 0 < W.shape[0] < n:
        _, s, Qt = np.linalg.svd(W.toarray(), full_matrices=False)
        lam, rows = s ** 2, Qt                         # descending already
    else:
        V = (W.T @ W).toarray() if relative else workload.V     # V is cached on workload
        lam, vecs = np.linalg.eigh(np.asarray(V, dtype=float))   # reads one triangle
        lam, rows = lam[::-1], vecs.T[::-1]
    top = float(lam.max(initial=0.0))
    if not top > 0:
        raise StrategyError("eigen cannot design for a batch whose queries select no cell "
                            "(every answer is 0 whatever the data); use strategy='identity'")
    keep = np.flatnonzero(lam > EIGEN_CUTOFF * top)
    return lam[keep], rows[keep]                       # one contiguous copy


def complete_columns(A1: np.ndarray) -> np.ndarray:
    """Steps 4–5 of Program 2: scale the largest column norm to 1, then append
    ``√(1 − ||A[:, j]||²) e_jᵀ`` for every shorter column: every column norm becomes 1."""
    c = (A1 ** 2).sum(axis=0)
    top = float(c.max())
    short = 1.0 - c / top
    cols = np.flatnonzero(short > COMPLETION_CUTOFF)
    k = A1.shape[0]
    A = np.zeros((k + cols.size, A1.shape[1]))
    np.multiply(A1, 1.0 / np.sqrt(top), out=A[:k])
    A[k + np.arange(cols.size), cols] = np.sqrt(short[cols])
    return A


def _grouped(lam, B, groups, solve) -> tuple[np.ndarray, Program1Result]:
    """Program 1 with one shared weight per group of design queries (rows summed)."""
    lam_g = np.array([lam[g].sum() for g in groups])
    B_g = np.vstack([B[g].sum(axis=0) for g in groups])
    res = solve(lam_g, B_g)
    u = np.empty(lam.size)
    for g, v in zip(groups, res.u):
        u[g] = v
    return u, res


class EigenDesign:
    """Eigen-Design (Program 2) with the paper's optional reductions.

    ``principal_vectors``: ``k >= 1`` top eigen-queries get their own weight, the rest one
    shared weight (§4.2). ``separation``: groups of ``group_size`` eigen-queries (default
    ``round(n^(1/3))``, §4.2) are solved separately, then one factor per group.
    ``relative``: unit-norm queries before design (§3.4). ``solver``: ``"fast"`` (certified
    dual L-BFGS-B, any size) or ``"cvxpy"`` (reference, small workloads). ``tol``: the
    certified relative optimality gap of each Program 1 solve.
    """

    name = "eigen"
    cacheable = True   # selection costs seconds at n in the thousands: dpsql.strategy_cache

    def estimated_seconds(self, workload) -> float:
        """About 12 s at n = 4096 on 2 cores (one eigendecomposition dominates: ~n³)."""
        return 15.0 * (workload.n / 4096.0) ** 3

    def __init__(self, principal_vectors: int | None = None, separation: bool = False,
                 group_size: int | None = None, relative: bool = False, solver: str = "fast",
                 tol: float = 1e-6, max_cells: int = MAX_CELLS):
        if principal_vectors is not None and (isinstance(principal_vectors, bool)
                                              or int(principal_vectors) < 1):
            raise ValueError(f"principal_vectors must be a positive integer or None, got "
                             f"{principal_vectors!r}")
        if principal_vectors is not None and separation:
            raise ValueError("choose at most one of principal_vectors and separation")
        if group_size is not None and int(group_size) < 1:
            raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
        if solver not in ("fast", "cvxpy"):
            raise ValueError(f"solver must be 'fast' or 'cvxpy', got {solver!r}")
        if not 0 < tol < 1:
            raise ValueError(f"tol must lie in (0, 1), got {tol!r}")
        self.principal_vectors = None if principal_vectors is None else int(principal_vectors)
        self.separation = bool(separation)
        self.group_size = None if group_size is None else int(group_size)
        self.relative = bool(relative)
        self.solver = solver
        self.tol = float(tol)
        self.max_cells = int(max_cells)

    def _solve(self, lam, B) -> Program1Result:
        if self.solver == "cvxpy":
            return solve_program1_cvxpy(lam, B)
        return solve_program1(lam, B, tol=self.tol)

    def weights(self, lam: np.ndarray, Q: np.ndarray) -> tuple[np.ndarray, str]:
        """Step 2: Program 1 weights ``u`` for the eigen-queries, and a note on how."""
        B = Q * Q
        k, n = Q.shape
        pv = self.principal_vectors
        if pv is not None and pv < k:
            groups = [np.array([i]) for i in range(pv)] + [np.arange(pv, k)]
            u, res = _grouped(lam, B, groups, self._solve)
            return u, f"principal vectors: top {pv} of {k} weighted, 1 shared weight " \
                      f"(Program 1 {res.describe()})"
        if self.separation:
            size = self.group_size or max(1, int(round(n ** (1 / 3))))
            groups = [np.arange(a, min(a + size, k)) for a in range(0, k, size)]
            u = np.empty(k)
            for g in groups:                                 # each group on its own
                u[g] = self._solve(lam[g], B[g]).u
            lam_g = np.array([(lam[g] / u[g]).sum() for g in groups])
            B_g = np.vstack([u[g] @ B[g] for g in groups])
            res = self._solve(lam_g, B_g)                    # one factor per group
            for g, v in zip(groups, res.u):
                u[g] *= v
            return u, f"eigen-separation: {len(groups)} groups of <= {size} " \
                      f"(combining: {res.describe()})"
        res = self._solve(lam, B)
        return res.u, f"Program 1 over {k} eigen-queries ({res.describe()})"

    def plan(self, workload: WorkloadInfo) -> Plan:
        lam, Q = eigen_queries(workload, self.relative, self.max_cells)
        u, how = self.weights(lam, Q)
        A1 = np.sqrt(u)[:, None] * Q
        A = complete_columns(A1)
        error = float((lam / u).sum()) * float((A1 ** 2).sum(axis=0).max())
        bound = float(np.sqrt(lam).sum()) ** 2 / workload.n
        target = "the unit-norm rows" if self.relative else "the workload"
        notes = (how, f"designed total squared error on {target} <= {error:.6g} sigma^2 at "
                      f"sensitivity 1; singular value bound {bound:.6g}")
        return make_plan(self.name, A, notes)

"""``optimal``: the optimal (ε, δ) matrix-mechanism strategy, solved in the dual and certified.

The program (Yuan et al., *Convex Optimization for Linear Query Processing under Approximate
Differential Privacy*, KDD 2016, §3, Program 10; NOTES "COA") is

    min_X  tr(V X⁻¹)   s.t.  diag(X) = 1,  X ≻ 0          (X = AᵀA, V = WᵀW),

whose optimum times σ² is the least total squared error of any strategy. Its dual is
``max_{w ∈ simplex} h(w)²``, ``h(w) = tr(M^½)``, ``M = D^½ V D^½``, ``D = diag(w)``. For any w:

- ``h(w)²`` is a lower bound on the optimum (at uniform ``w`` it is Li & Miklau's svdb);
- ``X(w) = D^-½ M^½ D^-½ / h`` has ``tr(V X(w)⁻¹) = h²`` and ``Σ_j w_j X(w)_jj = 1``, so
  ``X(w) / max_j X(w)_jj`` is feasible with value ``h² · max_j X(w)_jj`` (NOTES);
- better, ``X' = D_x^-½ X(w) D_x^-½`` (``x = diag X(w)``) has unit diagonal and value
  ``h Σ_kl C_kl² λ_l / √λ_k`` with ``M = Q Λ Qᵀ``, ``C = Qᵀ D_x^½ Q`` — one matrix product.
  Because ``Σ_j w_j (x_j − 1) = 0`` its excess over ``h²`` is second order in ``x − 1``:
  where ``max x − 1`` is 2e-3, this gap is already 3e-6.

The *certified gap*, (smaller value) / (largest ``h²`` seen) − 1, bounds the suboptimality of
the returned strategy whatever the solver did. ``h`` is concave, ``∂h/∂w_j = h X(w)_jj / 2``:
``X(w)_jj = 1`` on the support is optimality. Two ascents, both ending on that certificate:

- full-rank ``V``: the multiplicative fixed point ``w_j <- w_j X(w)_jj^γ`` (NOTES), over-relaxed
  (γ = 2) and accelerated by Anderson mixing on ``log w``, falling back to the plain γ = 1
  step whenever ``h`` decreases. A step is one float64 eigendecomposition of ``M`` (LAPACK
  syevd); float32 is too inaccurate near the optimum (range workloads have cond(M) ~ 1e7:
  an error of 0.2 in ``x``), so only a cold start's first step, at uniform ``w`` where
  ``x`` is off by 0.7 and float32 by 2.5e-3, is float32 (half the cost) and it only sets
  the next ``w``: every bound comes from float64 steps. Three steps give a gap below 1e-6
  on all ranges. A Gram matrix invariant under reversing the cell order (ranges, many
  marginals) splits into half-size eigenproblems on (anti)symmetric vectors: four times cheaper.
  Otherwise the steps are Newton's on ``log x(u) = 0`` (:mod:`~dpsql.strategies.gaussian.
  newton`: the Jacobian from the step's own eigendecomposition, built once from the first
  point, float32 included, and reused by chord steps while they converge, else rebuilt or
  handed back to the fixed point): on 1,024 points + 1,500 random ranges, float32 at uniform,
  Newton, float64, chord, float64 certifies a gap of ~5e-9 where the fixed point needed
  five float64 steps (0.89-0.93 against 1.45-1.65 s of CPU, one BLAS thread, load 4.4 on
  the 2-core machine).
- rank ``r < n`` (``V = F Fᵀ``, e.g. few queries over many cells): every quantity comes from
  ``K = Fᵀ D F`` (``r x r``), and the many optimal weights that are 0 — where the fixed point
  crawls — are reached on an equivalent bound-constrained concave program
  (:class:`~dpsql.strategies.gaussian.dual.FactoredForm`) by projected Newton steps
  (:mod:`~dpsql.strategies.gaussian.projected`: 8-12 evaluations on 36 batches of 64-1,536
  random ranges over 256-1,024 cells, where L-BFGS-B alone took 45-106; on 600 ranges over
  1,024 cells 12 against 106), L-BFGS-B where they stall short of the gap, then certified (and
  if need be finished) by the fixed point. (The rescaled ``X'`` would leave the row space of
  ``W`` here, so only ``X(w)/max x`` is used.)

Strategy: ``A = Λ^¼ Qᵀ D^-½ / √h`` (weighted eigen-queries, ``AᵀA = X(w)``) with its
columns rescaled to the chosen primal: by ``1/√x_j`` (``X'``) or by ``1/√max x``. When
``X(w)`` is singular (``V`` rank deficient) the plan measures ``√(1−t) A`` plus the
Eigen-Design completion rows ``√(1 − (1−t) X_jj) e_jᵀ`` (Li & Miklau, Eigen-Design Program 2
steps 4–5) with ``t = mix_weight(tol)`` (a quarter of the tolerance, at most ``MIX``), so
``AᵀA ⪰ (1−t) X + t I``: full column rank (which least squares and the 2**-20 grid need: the
completion rows alone give ``AᵀA ⪰ t I`` whatever the rounding of the rest), at most
``1/(1−t)`` times the error. The reported gap includes it, and so does the stopping rule: the
ascent of a point that needs the mix goes on to ``(1 + gap)/(1 − t) − 1 <= tol`` (with a
fixed ``t = 2e-6`` above a ``1e-6`` tolerance, rank-deficient workloads could never certify
and iterated to a stall).

Privacy: every column of the strategy has L2 norm at most 1 (``diag(AᵀA) <= 1``; the
completion rows fill each column to exactly 1), so one added or removed row moves ``A x`` by
at most 1 in L2 and the Gaussian mechanism calibrated by :func:`make_plan`'s exact
sensitivity of the rounded matrix is (ε, δ)-DP. The optimisation reads only ``W`` (public).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp

from dpsql import cancel
from dpsql.errors import StrategyError
from dpsql.strategies.gaussian.dual import FactoredForm, FullForm, anderson, blas_threads, eigh
from dpsql.strategies.gaussian import projected
from dpsql.strategies.gaussian.newton import Chord
from dpsql.workload.matrix import Plan, WorkloadInfo, make_plan

#: stop when the certified relative gap is at most this
TOL = 1e-6
#: over-relaxation exponent of the multiplicative update
GAMMA = 2.0
#: Anderson mixing memory (0: plain over-relaxed fixed point)
AA_MEMORY = 2
#: eigenvalues of V below this fraction of the largest are zero (rank decisions)
RANK_TOL = 1e-11
#: largest weight of the identity mixed into a singular optimum (keeps A of full column
#: rank); the weight used is :func:`mix_weight` of the tolerance
MIX = 2e-6
#: share of the tolerance the mix may take
MIX_SHARE = 0.25
#: mix also when the condition number of X could exceed this
COND_LIMIT = 1e8
#: completion rows are added for columns with at least this slack (always when mixing)
SLACK_ROWS = 1e-3
#: dense eigenproblems beyond this many cells are refused
MAX_CELLS = 8192
#: rank up to which L-BFGS-B finishes a low-rank ascent the projected Newton steps did not
#: certify (where they did not run — few queries over many cells — it ascends alone at any
#: rank), and its budget
LBFGS_MAX_RANK, LBFGS_EVALUATIONS = 1024, 1000


@dataclass(frozen=True)
class DualSolution:
    """A strategy with its certificate (values for V scaled to unit largest diagonal)."""

    A: np.ndarray | sp.csr_matrix  # strategy; columns of norm <= 1 (== 1 up to rounding)
    weights: np.ndarray            # dual weights w on the cells (sum 1)
    lower: float                   # certified lower bound on min tr(V X⁻¹), in units of V
    upper: float                   # tr(V X⁻¹) of the unmixed strategy, in units of V
    gap: float                     # upper / lower - 1 (plus the mixing's 1/(1-t) factor)
    iterations: int                # eigendecompositions performed
    mix: float                     # t above (0 when X(w) is well conditioned)
    scale: float                   # V was divided by this (its largest diagonal entry)


def _no_cells() -> StrategyError:
    return StrategyError("the optimal strategy needs a batch whose queries select some cell; "
                         "every answer here is 0 whatever the data (use strategy='identity')")


def _form(workload: WorkloadInfo, symmetry: bool):
    """The cells in use, the scale of V, and the cheapest dual evaluator for the workload."""
    n, W = workload.n, workload.W
    if W is not None and W.shape[0] < n:                # few queries: work on W's row space
        if not np.all(np.isfinite(W.data)):
            raise StrategyError("the optimal strategy needs a finite workload")
        col = np.asarray(W.multiply(W).sum(axis=0)).reshape(-1)
        support = np.flatnonzero(col > 0)
        if support.size == 0:
            raise _no_cells()
        Ws = sp.csr_matrix(W[:, support]) / math.sqrt(float(col.max()))
        return support, float(col.max()), FactoredForm(_row_space(Ws))
    V = np.asarray(workload.V, dtype=float)
    if not np.all(np.isfinite(V)):
        raise StrategyError("the optimal strategy needs a finite workload")
    diag = np.diag(V)
    support = np.flatnonzero(diag > 0)
    if support.size == 0:
        raise _no_cells()
    if support.size > MAX_CELLS:
        raise StrategyError(f"the optimal strategy handles at most {MAX_CELLS} cells "
                            f"(dense eigenproblems); this batch uses {support.size}")
    scale = float(diag.max())
    Vs = V / scale if support.size == n else V[np.ix_(support, support)] / scale
    Vs = (Vs + Vs.T) / 2
    try:                                        # full rank? (a cheap test before eigh)
        L = la.cholesky(Vs, lower=True, check_finite=False)
        if np.diag(L).min() ** 2 > 100 * RANK_TOL:
            return support, scale, FullForm(Vs, symmetry)
    except la.LinAlgError:
        pass
    lam, Q = eigh(Vs)
    keep = lam > RANK_TOL * lam.max()
    return support, scale, FactoredForm(Q[:, keep] * np.sqrt(lam[keep]))


def _row_space(Ws: sp.csr_matrix) -> np.ndarray:
    """``F`` (cells x rank, full column rank) with ``F Fᵀ = Wsᵀ Ws``: ``Wsᵀ`` itself when the
    rows are independent — a Cholesky factor of ``Ws Wsᵀ`` and LAPACK's estimate of its
    condition number say so, ``m³/3`` flops — else ``Wsᵀ`` on the eigenvectors of ``Ws Wsᵀ``
    above :data:`RANK_TOL` (an eigendecomposition: 1.5 s of 13 at 1,500 ranges over 2,048
    cells). Either ``F`` gives ``K = Fᵀ D F`` the same spectrum when no row is dropped. The
    Gram product is dense where the sparse one's ``Σ nnz(column)²`` multiply-adds would cost
    more (long ranges: 0.87 against 0.18 s at 1,500 ranges over 2,048 cells)."""
    m, cells = Ws.shape
    D = None
    if float(np.square(np.diff(Ws.tocsc().indptr), dtype=float).sum()) > m * m * cells / 50:
        D = np.asfortranarray(Ws.T.toarray())
        G = la.blas.dsyrk(1.0, D, trans=1)                   # upper triangle, lower zeros
        G += np.triu(G, 1).T                                  # eigh and the norm read both
    else:
        G = (Ws @ Ws.T).toarray()
    factor, info = la.lapack.dpotrf(G, lower=0)
    if info == 0:
        rcond, info = la.lapack.dpocon(factor, float(np.abs(G).sum(axis=0).max()))
        if info == 0 and rcond > 100 * RANK_TOL:
            return np.ascontiguousarray(Ws.T.toarray() if D is None else D)
    lam, U = eigh(G)
    keep = lam > RANK_TOL * lam.max()
    return np.asarray(Ws.T @ U[:, keep])


def solve(workload: WorkloadInfo, *, tol: float = TOL, max_iterations: int = 100,
          weights=None, symmetry: bool = True) -> DualSolution:
    """Maximise the dual to a certified gap ``<= tol``; see the module docstring.

    ``weights`` (length n, nonnegative) warm-starts the dual; the default is uniform, whose
    first lower bound is svdb (but a cold start's first step is float32 and no bound when a
    second step may follow: ``max_iterations > 1``). A low-rank workload is first ascended
    by projected Newton steps and, where they did not certify, L-BFGS-B (see
    :data:`LBFGS_MAX_RANK`); then the fixed point runs for at most ``max_iterations``
    eigendecompositions, stopping at the gap or when it stalls, and the best strategy found
    is returned with its certified gap.
    """
    if max_iterations < 1:
        raise StrategyError("the optimal strategy needs max_iterations >= 1")
    with blas_threads():
        support, scale, form = _form(workload, symmetry)
        w = _start(workload.n, support, weights, form.split)
        used = 0
        if isinstance(form, FactoredForm) and form.r < support.size:
            target = (1 + tol) * (1 - mix_weight(tol)) - 1       # X(w) is singular: mixed
            w, used, done = projected.ascend(form, w, 0.9 * target, LBFGS_EVALUATIONS)
            newton = projected.forms_hessian(support.size, form.r)
            if not done and (form.r <= LBFGS_MAX_RANK or not newton):
                w, more = form.ascend(w, LBFGS_EVALUATIONS, target / 2)
                used += more
        single = weights is None and isinstance(form, FullForm) and max_iterations > 1
        best, lower, it = _ascend(form, w, tol, max_iterations, single)
        return _assemble(workload.n, support, scale, form, best, lower, used + it, tol)


def _start(n: int, support: np.ndarray, weights, split: bool) -> np.ndarray:
    """The first dual point on the support: uniform, or the caller's warm start."""
    ns = support.size
    w = np.full(ns, 1.0 / ns)
    if weights is not None:
        w0 = np.asarray(weights, dtype=float).reshape(-1)
        if w0.shape != (n,) or not np.all(np.isfinite(w0)) or w0.min() < 0:
            raise StrategyError(f"warm-start weights must be {n} finite values >= 0")
        w0 = w0[support] + 1e-6 * w0[support].sum() / ns + 1e-300
        w = w0 / w0.sum()
    if split:
        w = (w + w[::-1]) / 2                   # concavity: the symmetrised w is no worse
    return w


def _ascend(form, w: np.ndarray, tol: float, max_iterations: int, single: bool = False):
    """Drive ``x`` to 1, one eigendecomposition per iteration, until the certified gap is
    ``<= tol`` or stalls: Newton and chord steps (:class:`~dpsql.strategies.gaussian.newton.
    Chord`) on a full ``V`` not split by symmetry, while they converge fast; else the fixed
    point ``w <- w x^γ``, Anderson-mixed on log w; a plain step from the best w when h drops
    (which also ends the Newton steps). ``single``: the first step (from uniform ``w``, far
    from the optimum) in float32; it only moves ``w`` and is no bound. Returns (best (upper,
    w, point, rescaled), the largest lower bound, iterations)."""
    u = np.log(np.maximum(w, 1e-300))
    u = np.maximum(u, u.max() - 600.0)
    hist_u, hist_r = [], []
    lower, best, anchor, gap = 0.0, None, None, math.inf
    stall = it = 0
    chord = Chord() if isinstance(form, FullForm) and not form.split else None
    while it < max_iterations:
        cancel.check()                           # inline (a short solve), a token lands here
        it += 1
        w = np.exp(u - u.max())
        w /= w.sum()
        if isinstance(form, FullForm):
            point = form.evaluate(w, single and it == 1, tol)
        else:
            point = form.evaluate(w)
        x = np.maximum(point.x, 1e-300)
        if not point.exact:                      # a direction only: no bound, no history
            hist_u, hist_r = [], []
        else:
            lower = max(lower, point.low ** 2)
            upper = min(point.h ** 2 * float(x.max()), point.rescaled)
            if best is None or upper < best[0]:
                best = (upper, w, point, upper == point.rescaled)
            new_gap = best[0] / lower / (1 - _mix(best, tol)) - 1
            stall = stall + 1 if new_gap > 0.9 * gap else 0
            gap = new_gap
            if gap <= tol or stall >= 5:
                break
            if anchor is not None and point.h < anchor[0] * (1 - 1e-10):
                hist_u, hist_r, chord = [], [], None   # h went down: plain step from the best w
                u = anchor[1] + np.log(anchor[2])
                anchor = (-math.inf,) + anchor[1:]   # accept whatever that step gives
                continue
            if anchor is None or point.h >= anchor[0]:
                anchor = (point.h, np.log(w), x)
        hist_u.append(np.log(w))
        hist_r.append(GAMMA * np.log(x))
        hist_u, hist_r = hist_u[-(AA_MEMORY + 1):], hist_r[-(AA_MEMORY + 1):]
        step = chord.step(point, w, x) if chord is not None else None
        u = anderson(hist_u, hist_r) if step is None else np.log(w) + step
        if not np.all(np.isfinite(u)):
            raise StrategyError("the optimal strategy's dual iteration diverged")
        u = np.maximum(u, u.max() - 600.0)       # keep every weight representable
    return best, lower, it


def mix_weight(tol: float) -> float:
    """The identity's weight ``t`` in a singular optimum's strategy: :data:`MIX_SHARE` of the
    tolerance, at most :data:`MIX` (and at least 1e-12, which keeps ``AᵀA`` invertible)."""
    return min(MIX, max(MIX_SHARE * tol, 1e-12))


def _mix(best, tol: float) -> float:
    """``t`` for the strategy of ``best`` (0 when its ``X`` is well conditioned)."""
    _, _, point, rescaled = best
    cond = point.cond * float(point.x.max() / point.x.min()) if rescaled else point.cond
    return 0.0 if cond <= COND_LIMIT else mix_weight(tol)


def _assemble(n: int, support, scale: float, form, best, lower: float,
              iterations: int, tol: float) -> DualSolution:
    upper, w, point, rescaled = best
    if rescaled:                                 # X' = D_x^-½ X(w) D_x^-½: unit diagonal
        x = np.ones(support.size)
        B = point.factor() / np.sqrt(point.x)
    else:                                        # X(w) / max_j X(w)_jj
        x = point.x / point.x.max()
        B = point.factor() / math.sqrt(point.x.max())
    mix = _mix(best, tol)
    slack = np.ones(n)
    slack[support] = 1 - (1 - mix) * x
    slack = np.clip(slack, 0.0, 1.0)
    rows = np.flatnonzero(slack >= (mix / 2 if mix else SLACK_ROWS))
    main = math.sqrt(1 - mix) * B
    completion = sp.csr_matrix((np.sqrt(slack[rows]), (np.arange(rows.size), rows)),
                               shape=(rows.size, n))
    if isinstance(form, FullForm):
        A = np.zeros((B.shape[0], n))
        A[:, support] = main
        if rows.size:
            A = np.vstack([A, completion.toarray()])
    else:
        top = sp.csr_matrix(main)
        top = sp.csr_matrix((top.data, support[top.indices], top.indptr), shape=(B.shape[0], n))
        A = sp.vstack([top, completion]).tocsr()
    weights = np.zeros(n)
    weights[support] = w
    gap = max((upper / lower) / (1 - mix) - 1, 0.0)   # (rounding can make it -1e-16)
    return DualSolution(A, weights, lower, upper, gap, iterations, mix, scale)


class Optimal:
    """``optimal``: the certified optimum of the (ε, δ) matrix mechanism (see module doc).

    Privacy/sensitivity: the plan's columns have L2 norm <= 1 before rounding (``AᵀA`` has
    unit diagonal, or at most 1 with completion rows filling it); :func:`make_plan` rounds
    ``A`` to the exact grid and computes the sensitivity of the rounded matrix, which the
    Gaussian mechanism is calibrated to. Pure function of the public workload.
    """

    name = "optimal"
    cacheable = True   # selection costs seconds at n in the thousands: dpsql.strategy_cache

    def estimated_seconds(self, workload) -> float:
        """Seconds on one core. Full rank: 0.2-1 s at n = 1,024, 10-29 s at 4,096 (three
        eigendecompositions of n x n). Fewer queries than cells (the factored dual, rank r <=
        m, m its queries): ``1.6e-9 · n r (n + r)`` with the projected Newton's Hessian (1.4 s
        at 600 ranges over 1,024 cells, 12 s at 1,500 over 2,048, 69 s at 2,000 over 3,000,
        where it took twice the usual 11 evaluations), else L-BFGS-B's ``1.4e-8 · n r²`` (28 s,
        138 evaluations, at 500 ranges over 8,000 cells). A batch with as many queries as
        cells but a singular Gram matrix is priced as full rank (its rank is not known before
        the solve): 2.4 s at 1,024 ranges over 1,024 cells."""
        n = workload.n
        m = getattr(workload, "m", n)
        if m >= n:
            return 0.45 * (n / 1024.0) ** 3
        if projected.forms_hessian(n, m):
            return 1.6e-9 * n * m * (n + m)
        return 1.4e-8 * n * m * m

    def __init__(self, tol: float = TOL, max_iterations: int = 100, symmetry: bool = True):
        self.tol, self.max_iterations, self.symmetry = float(tol), int(max_iterations), symmetry

    def solve(self, workload: WorkloadInfo, weights=None) -> DualSolution:
        return solve(workload, tol=self.tol, max_iterations=self.max_iterations,
                     weights=weights, symmetry=self.symmetry)

    def plan(self, workload: WorkloadInfo, weights=None) -> Plan:
        sol = self.solve(workload, weights)
        return make_plan(self.name, sol.A, notes=(
            ("gap", sol.gap), ("iterations", sol.iterations), ("mix", sol.mix),
            ("lower_bound", sol.lower * sol.scale), ("objective", sol.upper * sol.scale)))

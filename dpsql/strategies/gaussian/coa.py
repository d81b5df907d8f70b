"""``coa``: Yuan et al.'s COA — Newton's method on the convex strategy program.

Yuan, Yang, Zhang & Hao, *Convex Optimization for Linear Query Processing under Approximate
Differential Privacy* (KDD 2016). With ``X = AᵀA`` the (ε, δ) matrix mechanism's strategy
search becomes (§3, Program 10; NOTES "COA")

    min_X  F(X) = tr(V X⁻¹)   s.t.  diag(X) = 1,  X ≻ 0,

convex, with gradient ``G = −X⁻¹ V X⁻¹`` and Hessian action ``H[D] = −G D X⁻¹ − X⁻¹ D G``
(eq. 11; the n² x n² Hessian is never formed). This module follows the paper:

- Algorithm 1: from a feasible ``X₀`` (``I`` by default, or any warm start rescaled to unit
  diagonal), repeat: Newton direction, Armijo step, until optimal.
- Algorithm 2 (§4.1): the direction minimises ``⟨D, G⟩ + ½⟨D, H[D]⟩`` s.t. ``diag(D) = 0`` by
  conjugate gradients on the off-diagonal entries — the diagonals of ``D`` and of the residual
  are zeroed at every step, so ``diag(X) = 1`` holds exactly — with ``T = 5`` steps.
- §4.2: step ``α ∈ {1, β, β², …}``, β = 0.1, accepted when ``X + αD`` has a Cholesky factor
  (positive definite) and ``F(X + αD) <= F(X) + σ α ⟨G, D⟩``, σ = 0.25; the accepted factor is
  reused for ``X⁻¹`` (LAPACK ``potri``) at the next iteration.
- Algorithm 3 (§4.4): homotopy on ``V + θI``, θ = 1, 0.1, 0.01, … down to ``theta_min``, each
  stage warm-started from the last (and a final θ = 0 stage when ``V`` is nonsingular). A
  warm start ``X₀`` (e.g. ``AᵀA`` of another strategy) goes straight to the last stage.

Warm start (issue 21): by default COA starts from the best point dpsql knows, the certified
solution of ``optimal`` (its dual fixed point, :mod:`dpsql.strategies.gaussian.optimal`),
whose dual lower bound comes with it. ``warm="identity"`` is the paper's cold start from
``X₀ = I`` through the homotopy; an explicit ``X0`` (e.g. ``AᵀA`` of another strategy) goes
straight to the last stage.

Stopping and certificate: before every Newton step the gap is *certified* for the
unregularised problem by the dual (optimal.py): at the optimum ``X⁻¹VX⁻¹ = diag(y)`` with
``y`` the multipliers of ``diag(X) = 1``, so ``w = diag(X⁻¹(V + θI)X⁻¹) / Σ`` is the natural
dual point and ``h(w)² = (Σ √λ(D^½ V D^½))²`` is a lower bound on the optimum for any ``w``
in the simplex (one eigenvalue computation, no vectors). The largest bound seen (and the warm
start's own) is kept; ``gap = F(X) / lower − 1`` (``F`` for ``V + θI``, never below the true
value) bounds the suboptimality of the current ``X`` whatever the solver did. COA stops as
soon as it is at most ``tol`` — with no Newton step after that — and reports it. When the warm
start is already certified (``optimal`` stops at the same ``tol``), COA takes no Newton step
and returns that strategy with its gap: the paper's method has nothing left to do.

Strategy and privacy: ``A = Lᵀ`` for the Cholesky factor ``X = L Lᵀ``, so ``AᵀA = X`` and
every column of ``A`` has L2 norm ``√X_jj = 1``: sensitivity 1 (cells no query touches get a
unit row of their own). :func:`make_plan` rounds ``A`` to the exact grid and computes the
sensitivity of the rounded matrix, which the Gaussian mechanism is calibrated to; the
optimisation reads only the public workload.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp

from dpsql.errors import StrategyError
from dpsql.workload.matrix import Plan, WorkloadInfo, make_plan
from dpsql.strategies.gaussian import optimal
from dpsql.strategies.gaussian.dual import blas_threads
from dpsql.strategies.gaussian.optimal import COND_LIMIT, MAX_CELLS, mix_weight

#: Armijo parameters (§4.2) and CG steps per Newton direction (§4.1)
BETA, SIGMA, CG_STEPS = 0.1, 0.25, 5


@dataclass(frozen=True)
class COASolution:
    X: np.ndarray          # the optimised X on the cells in use (unit diagonal)
    support: np.ndarray    # those cells
    value: float           # tr(V X⁻¹) for the unregularised V
    lower: float           # certified lower bound on the optimum (dual at w ∝ diag(X⁻¹VX⁻¹))
    gap: float             # value / lower - 1
    iterations: int        # Newton steps over all homotopy stages
    theta: float           # last regulariser used


def _factor(X: np.ndarray):
    """Lower Cholesky factor of ``X``, or None when ``X`` is not positive definite."""
    try:
        L = la.cholesky(X, lower=True, check_finite=False)
    except la.LinAlgError:
        return None
    return L if np.all(np.isfinite(L)) and np.diag(L).min() > 0 else None


def _inverse(L: np.ndarray) -> np.ndarray:
    """``X⁻¹`` from the lower Cholesky factor of ``X`` (LAPACK potri, symmetrised)."""
    inv, info = la.lapack.dpotri(L, lower=1)
    if info != 0:
        raise StrategyError("COA: the strategy matrix became singular; use 'optimal'")
    return np.tril(inv) + np.tril(inv, -1).T


def _offdiag(M: np.ndarray) -> np.ndarray:
    np.fill_diagonal(M, 0.0)
    return M


def newton_direction(Z: np.ndarray, P: np.ndarray, steps: int = CG_STEPS) -> np.ndarray:
    """Algorithm 2: CG for ``H[D] = P`` on off-diagonal ``D`` (``P = −G = X⁻¹VX⁻¹``).

    ``H[D] = Z D P + P D Z`` with ``Z = X⁻¹``; both terms come from one product since the
    second is the transpose of the first.
    """
    D = np.zeros_like(P)
    R = _offdiag(P.copy())
    S = R.copy()
    rr = float(np.vdot(R, R))
    for _ in range(steps):
        if rr <= 0.0:
            break
        B = Z @ S @ P
        B = _offdiag(B + B.T)
        curvature = float(np.vdot(S, B))
        if curvature <= 0.0:
            break
        alpha = rr / curvature
        D += alpha * S
        R -= alpha * B
        rr, previous = float(np.vdot(R, R)), rr
        S = R + (rr / previous) * S
    return D


def dual_value(V: np.ndarray, w: np.ndarray) -> float:
    """``h(w)² = (Σ √λ⁺(D^½ V D^½))²``: a lower bound on min tr(V X⁻¹) for w in the simplex."""
    s = np.sqrt(np.maximum(w, 0.0) / max(float(np.sum(w)), 1e-300))
    lam = la.eigvalsh(V * s[:, None] * s[None, :], check_finite=False)
    return float(np.sqrt(np.maximum(lam, 0.0)).sum() ** 2)


class COA:
    """``coa``: Newton–CG with Armijo steps and homotopy (Yuan et al., Algorithms 1–3),
    warm-started from ``optimal``'s certified point and stopped by the certificate.

    Privacy/sensitivity: the plan is ``Lᵀ`` with ``X = LLᵀ`` and ``diag(X) = 1`` kept exactly
    by the CG (diagonals zeroed), so every column has norm 1 before rounding — or, when the
    warm start is already certified, ``optimal``'s plan (columns of norm <= 1, see there);
    the sensitivity used for calibration is that of the rounded plan (:func:`make_plan`).
    """

    name = "coa"
    cacheable = True

    def __init__(self, tol: float = 1e-6, theta_min: float = 1e-10, cg_steps: int = CG_STEPS,
                 max_newton: int = 60, X0=None, warm: str = "optimal"):
        if warm not in ("optimal", "identity"):
            raise StrategyError(f"COA's warm start must be 'optimal' or 'identity', got {warm!r}")
        self.tol, self.theta_min = float(tol), float(theta_min)
        self.cg_steps, self.max_newton = int(cg_steps), int(max_newton)
        self.X0, self.warm = X0, warm

    def solve(self, workload: WorkloadInfo, X0=None, lower: float = 0.0) -> COASolution:
        """Optimise ``X`` from ``X0`` (n x n, e.g. ``AᵀA`` of another strategy; default the
        paper's ``I`` with homotopy); ``lower`` is a known lower bound on the optimum (in the
        units of ``V``), e.g. the warm start's certificate."""
        with blas_threads():
            return self._solve(workload, X0, lower)

    def _solve(self, workload: WorkloadInfo, X0, lower: float) -> COASolution:
        V = np.asarray(workload.V, dtype=float)
        if not np.all(np.isfinite(V)):
            raise StrategyError("COA needs a finite workload")
        support = np.flatnonzero(np.diag(V) > 0)
        if support.size == 0:
            raise StrategyError("COA needs a batch whose queries select some cell; every "
                                "answer here is 0 whatever the data (use 'identity')")
        if support.size > MAX_CELLS:
            raise StrategyError(f"COA handles at most {MAX_CELLS} cells; this batch uses "
                                f"{support.size}")
        scale = float(np.diag(V).max())
        Vs = V[np.ix_(support, support)] / scale
        Vs = (Vs + Vs.T) / 2
        start = X0 if X0 is not None else self.X0
        X = self._start(start, support, workload.n)
        L = _factor(X)
        thetas = [10.0 ** -k for k in range(0, 1 + int(round(-math.log10(self.theta_min))))]
        if _factor(Vs) is not None:                          # V nonsingular: θ = 0 exists
            thetas.append(0.0)
        if start is not None:                                # a warm start is already near
            thetas = thetas[-1:]                             # the target: skip the homotopy
        iterations, best, low = 0, None, float(lower) / scale
        for theta in thetas:
            X, L, steps, low = self._stage(Vs, theta, X, L, low)
            iterations += steps
            Z = _inverse(L)
            value = float(np.vdot(Vs, Z))
            y = np.einsum("ij,ji->i", Z @ Vs, Z) + theta * np.einsum("ij,ij->i", Z, Z)
            low = max(low, dual_value(Vs, y))                # y: multipliers of diag(X) = 1
            gap = value / low - 1 if low > 0 else math.inf
            if best is None or gap < best[3]:
                best = (X.copy(), value, low, gap, theta)
            if gap <= self.tol:
                break
        X, value, low, gap, theta = best
        return COASolution(X, support, value * scale, low * scale, gap, iterations, theta)

    def _start(self, X0, support, n: int) -> np.ndarray:
        ns = support.size
        if X0 is None:
            return np.eye(ns)
        X0 = np.asarray(X0.toarray() if sp.issparse(X0) else X0, dtype=float)
        if X0.shape != (n, n) or not np.all(np.isfinite(X0)):
            raise StrategyError(f"COA's warm start must be a finite {n} x {n} matrix (AᵀA)")
        X = X0[np.ix_(support, support)]
        d = np.sqrt(np.clip(np.diag(X), 1e-300, None))
        X = (X + X.T) / 2 / d[:, None] / d[None, :]
        t = 0.0
        while _factor((1 - t) * X + t * np.eye(ns)) is None:   # not PD: mix in I
            t = 1e-6 if t == 0 else min(1.0, 10 * t)
        X = (1 - t) * X + t * np.eye(ns)
        np.fill_diagonal(X, 1.0)
        return X

    def _stage(self, Vs: np.ndarray, theta: float, X: np.ndarray, L: np.ndarray, low: float):
        """Algorithm 1 on ``V + θI`` from ``X`` (Cholesky factor ``L``), stopping as soon as
        ``F(X) / lower − 1 <= tol`` (the certificate) or the Newton decrement vanishes.
        Returns (X, L, Newton steps taken, the largest lower bound seen)."""
        Vt = Vs + theta * np.eye(Vs.shape[0])
        Z = _inverse(L)
        F = float(np.vdot(Vt, Z))
        for k in range(self.max_newton):
            P = Z @ Vt @ Z                                   # −G; diag: the multipliers
            low = max(low, dual_value(Vs, np.diag(P).copy()))
            if low > 0 and F / low - 1 <= self.tol:          # certified: no further step
                return X, L, k, low
            D = newton_direction(Z, P, self.cg_steps)
            slope = -float(np.vdot(P, D))                    # ⟨G, D⟩ < 0
            if not slope < -1e-3 * self.tol * F:             # Newton decrement: converged
                return X, L, k, low
            alpha = 1.0
            for _ in range(40):
                Xt = X + alpha * D
                Lt = _factor(Xt)
                if Lt is not None:
                    Zt = _inverse(Lt)
                    Ft = float(np.vdot(Vt, Zt))
                    if Ft <= F + SIGMA * alpha * slope:
                        break
                alpha *= BETA
            else:
                return X, L, k, low                          # no decrease possible
            X, L, Z, F = Xt, Lt, Zt, Ft
        return X, L, self.max_newton, low

    def plan(self, workload: WorkloadInfo, X0=None) -> Plan:
        """The plan; notes report the certified gap, the Newton steps taken and their
        process CPU seconds (``newton_seconds``: COA's own work after the warm start). On
        one BLAS thread (:func:`~dpsql.strategies.gaussian.dual.blas_threads`) throughout:
        the final eigenvalues and factor outside it spin two OpenBLAS threads (8.2 s of
        CPU against 1.0 s for a warm-started plan of all ranges at n = 1,024, load 4)."""
        with blas_threads():
            return self._plan(workload, X0)

    def _plan(self, workload: WorkloadInfo, X0) -> Plan:
        lower = 0.0
        if X0 is None and self.X0 is None and self.warm == "optimal":
            dual = optimal.solve(workload, tol=self.tol)
            if dual.gap <= self.tol:                         # certified: no Newton step
                return make_plan(self.name, dual.A, notes=(
                    ("gap", dual.gap), ("iterations", 0), ("newton_seconds", 0.0),
                    ("warm_iterations", dual.iterations), ("mix", dual.mix),
                    ("lower_bound", dual.lower * dual.scale),
                    ("objective", dual.upper * dual.scale)))
            A = dual.A.toarray() if sp.issparse(dual.A) else np.asarray(dual.A)
            X0, lower = A.T @ A, dual.lower * dual.scale
        started = time.process_time()
        sol = self.solve(workload, X0, lower)
        return self._plan_from(workload, sol, time.process_time() - started)

    def _plan_from(self, workload: WorkloadInfo, sol: COASolution, seconds: float) -> Plan:
        n, support = workload.n, sol.support
        X = sol.X
        lam = la.eigvalsh(X, check_finite=False)
        mix = 0.0 if lam.min() * COND_LIMIT >= lam.max() else mix_weight(self.tol)
        L = _factor((1 - mix) * X + mix * np.eye(X.shape[0]))
        if L is None:
            raise StrategyError("COA: the optimised X is not positive definite; use 'optimal'")
        others = np.setdiff1d(np.arange(n), support)
        A = np.zeros((support.size + others.size, n))
        A[: support.size, support] = L.T
        A[support.size + np.arange(others.size), others] = 1.0
        gap = max((1 + sol.gap) / (1 - mix) - 1, 0.0)
        return make_plan(self.name, A, notes=(
            ("gap", gap), ("iterations", sol.iterations), ("newton_seconds", seconds),
            ("theta", sol.theta), ("mix", mix),
            ("lower_bound", sol.lower), ("objective", sol.value)))

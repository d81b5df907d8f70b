"""Program 1 of Li & Miklau, *Eigen-Design* (VLDB 2012, §3.1): weights for fixed design queries.

Given design queries ``Q`` (rows) with eigenvalue weights ``λ`` and ``B = Q ∘ Q`` (entrywise
square; more generally any non-negative ``k x n`` matrix, e.g. rows of ``B`` summed over a
group of design queries for the §4.2 optimisations), find ``u`` solving::

    minimise  Σᵢ λᵢ / uᵢ   subject to   Σᵢ uᵢ B[i, j] <= 1  for every column j,   u >= 0.

The strategy ``diag(√u) Q`` then has every column norm ``<= 1`` and total squared error
``tr(V (AᵀA)⁻¹) = Σᵢ λᵢ / uᵢ`` on the workload whose Gram matrix is ``Qᵀ diag(λ) Q``.

Two solvers. :func:`solve_program1` (fast, any size) maximises the concave Lagrange dual::

    max over w >= 0 of  g(w) = 2 Σᵢ √(λᵢ (B w)ᵢ) − Σⱼ wⱼ

by L-BFGS-B (minimising over ``u`` for fixed ``w`` gives ``uᵢ = √(λᵢ / (B w)ᵢ)``; optimising
the scale of ``w`` shows the dual optimum equals ``max over the simplex of h(w)²`` with
``h(w) = Σᵢ √(λᵢ (B w)ᵢ)``). Every iterate is certified: for ``w`` in the simplex, ``h(w)²``
is a lower bound on the optimum (weak duality), and ``uᵢ ∝ √(λᵢ / (B w)ᵢ)`` rescaled to be
feasible is an upper bound ``h(w)² · max_j (Bᵀu)_j`` (with ``u`` normalised so that
``Σⱼ wⱼ (Bᵀu)ⱼ = 1``). The solver stops when the relative gap is below ``tol``; when L-BFGS-B
stalls it takes multiplicative steps ``wⱼ ← wⱼ (Bᵀu)ⱼ`` (the fixed point of the optimality
conditions) and restarts. :func:`solve_program1_cvxpy` states the primal for cvxpy; it is the
reference the fast solver is tested against (small ``k``, ``n``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.optimize as so

from dpsql.errors import StrategyError


@dataclass(frozen=True)
class Program1Result:
    u: np.ndarray          # feasible weights: max_j (Bᵀu)_j <= 1 (up to rounding)
    objective: float       # Σ λᵢ / uᵢ of ``u``
    lower_bound: float     # certified: no feasible u does better (nan: not certified)
    iterations: int        # dual evaluations (0 for cvxpy)

    @property
    def gap(self) -> float:
        """Certified relative optimality gap ``objective / lower_bound − 1`` (nan for cvxpy)."""
        return self.objective / self.lower_bound - 1.0

    def describe(self) -> str:
        if np.isnan(self.lower_bound):
            return "cvxpy, uncertified"
        return f"certified gap {self.gap:.1e}"


class _Converged(Exception):
    """Raised inside the objective to stop L-BFGS-B once the gap is certified."""


def _check(lam, B) -> tuple[np.ndarray, np.ndarray]:
    lam = np.asarray(lam, dtype=float).reshape(-1)
    B = np.asarray(B, dtype=float)
    if B.ndim != 2 or B.shape[0] != lam.size or lam.size == 0:
        raise StrategyError(f"Program 1 needs k weights and a k x n matrix; got {lam.size} "
                            f"weights and a matrix of shape {B.shape}")
    if (lam <= 0).any() or (B < 0).any() or not (np.isfinite(lam).all() and np.isfinite(B).all()):
        raise StrategyError("Program 1 needs positive finite weights λ and a non-negative "
                            "finite design matrix (drop zero eigenvalues first)")
    if (B.sum(axis=1) <= 0).any():
        raise StrategyError("Program 1: a design query touches no cell")
    return lam, B


class _Tracker:
    """Evaluates the dual and keeps the best certified primal point and lower bound."""

    def __init__(self, lam, B, tol):
        self.lam, self.B, self.tol = lam, B, tol
        self.sqrt_lam = np.sqrt(lam)
        self.best_u, self.upper, self.lower, self.calls = None, np.inf, 0.0, 0

    def certify(self, w) -> tuple[float, np.ndarray, np.ndarray]:
        """Dual value, gradient and certificate at ``w >= 0`` (any scale)."""
        self.calls += 1
        s = np.maximum(self.B @ w, 1e-300)
        root = self.sqrt_lam / np.sqrt(s)                  # √(λ / s)
        h = float(self.sqrt_lam @ np.sqrt(s))
        total = float(w.sum())
        grad = self.B.T @ root - 1.0
        c = (total / h) * (grad + 1.0)                     # (Bᵀu)_j for w / total
        lower, cmax = h * h / total, float(c.max())
        if lower > self.lower:
            self.lower = lower
        if lower * cmax < self.upper:
            self.upper = lower * cmax
            self.best_u = (total / h) * root / cmax        # feasible: max (Bᵀu) = 1
        return 2.0 * h - total, grad, c

    def done(self) -> bool:
        return self.upper <= self.lower * (1.0 + self.tol)


def solve_program1(lam, B, tol: float = 1e-6, max_rounds: int = 20,
                   round_iterations: int = 400) -> Program1Result:
    """Solve Program 1 by its dual (see the module docstring) to relative gap ``tol``.

    ``lam``: ``k`` positive weights; ``B``: ``k x n`` non-negative. Returns the best
    certified feasible ``u`` found, even when ``max_rounds`` ends before ``tol`` is reached
    (the strategy stays valid; only its optimality is weaker, as ``gap`` reports).
    """
    lam, B = _check(lam, B)
    n = B.shape[1]
    unit = float(np.sqrt(lam * B.sum(axis=1) / n).sum()) ** 2   # h(uniform w)² = unit
    track = _Tracker(lam / unit, B, tol)                       # scale-free from here on
    w = np.full(n, 1.0 / n)
    floor = 1e-15 / n

    def negative_dual(x):
        value, grad, _ = track.certify(x)
        if track.done():
            raise _Converged
        return -value, -grad

    for _ in range(max_rounds):
        try:
            res = so.minimize(negative_dual, w, jac=True, method="L-BFGS-B",
                              bounds=so.Bounds(np.full(n, floor), np.inf),
                              options={"maxiter": round_iterations, "maxcor": 30,
                                       "ftol": 0.0, "gtol": 0.0})
            w = np.maximum(res.x, floor)
        except _Converged:
            break
        w = w / w.sum()
        for _ in range(20):                              # multiplicative steps, then retry
            _, _, c = track.certify(w)
            if track.done():
                break
            w = np.maximum(w * c, floor)
            w = w / w.sum()
        if track.done():
            break
        w = w * float(np.sqrt(track.lam * (B @ w)).sum()) ** 2    # the best scale of w
    u = track.best_u / max(float((B.T @ track.best_u).max()), 1.0)
    objective = float((lam / u).sum())
    return Program1Result(u, objective, min(track.lower * unit, objective), track.calls)


def solve_program1_cvxpy(lam, B, solver: str | None = None) -> Program1Result:
    """The primal of Program 1 for cvxpy (CLARABEL by default): the reference solver."""
    import cvxpy as cp

    lam, B = _check(lam, B)
    scale = float(lam.max())
    u = cp.Variable(lam.size, nonneg=True)
    problem = cp.Problem(cp.Minimize(cp.sum(cp.multiply(lam / scale, cp.inv_pos(u)))),
                         [B.T @ u <= 1])
    try:
        problem.solve(solver=solver or cp.CLARABEL)
    except cp.error.SolverError:
        problem.solve(solver=cp.SCS, eps=1e-9, max_iters=200000)
    if u.value is None:
        raise StrategyError(f"Program 1: cvxpy returned status {problem.status!r}")
    x = np.maximum(np.asarray(u.value, dtype=float), 1e-300)
    x = x / max(float((B.T @ x).max()), 1.0)
    return Program1Result(x, float((lam / x).sum()), float("nan"), 0)

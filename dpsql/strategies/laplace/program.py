"""The L1 program of Eigen-Design's ε-DP variant (Li & Miklau, §3.5): nonnegative weights
``u`` for a fixed orthogonal basis minimising ``Σ c_i / u_i²`` subject to every column of
``diag(u)·|Q|`` having L1 norm at most 1. Convex; solved on its dual with a certified gap
(:func:`solve_l1_program`), with cvxpy as the reference (:func:`solve_l1_program_cvxpy`).
Public inputs only. See :mod:`dpsql.strategies.laplace.candidates` for the derivation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.optimize as so
import scipy.sparse as sp

from dpsql.errors import StrategyError

#: completion rows shorter than this (in L1, relative to 1) are not added
COMPLETION_CUTOFF = 1e-9


# --- the L1 program: weights for a fixed basis ----------------------------------------------

@dataclass(frozen=True)
class L1ProgramResult:
    u: np.ndarray          # feasible weights: max_j (Mᵀu)_j <= 1 (up to rounding)
    objective: float       # Σ cᵢ / uᵢ² of ``u``
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


def _check_program(c, M) -> tuple:
    c = np.asarray(c, dtype=float).reshape(-1)
    if sp.issparse(M):
        M = sp.csr_matrix(M, dtype=float)
        values = M.data
    else:
        M = np.ascontiguousarray(M, dtype=float)
        values = M
    if M.ndim != 2 or M.shape[0] != c.size or c.size == 0:
        raise StrategyError(f"the L1 program needs k costs and a k x n matrix; got {c.size} "
                            f"costs and a matrix of shape {M.shape}")
    if (c <= 0).any() or not np.isfinite(c).all() or (values < 0).any() \
            or not np.isfinite(values).all():
        raise StrategyError("the L1 program needs positive finite costs and a non-negative "
                            "finite matrix (drop the rows the workload does not see first)")
    if (np.asarray(M.sum(axis=1)).reshape(-1) <= 0).any():
        raise StrategyError("the L1 program: a basis row touches no cell")
    return c, M


class _Dual:
    """Evaluates ``G(w) = 3 h(w) − 2 Σw`` and keeps the best certified primal and bound.

    Dense products go through ``einsum`` (one thread, no BLAS): they are memory-bound, and a
    threaded BLAS matrix-vector product can stall for milliseconds on a busy machine.
    """

    def __init__(self, c, M, tol):
        self.c3 = np.cbrt(c)
        if sp.issparse(M):
            self.M, self.MT = M, M.T.tocsr()
            self.dot = lambda A, x: A @ x
        else:
            self.M, self.MT = M, np.ascontiguousarray(M.T)
            self.dot = lambda A, x: np.einsum("ij,j->i", A, x)
        self.tol = tol
        self.best_u, self.upper, self.lower, self.calls = None, math.inf, 0.0, 0

    def evaluate(self, w) -> tuple:
        """``(G, ∇G, r)`` at ``w >= 0`` (any scale); ``r = Mᵀu`` for the simplex point."""
        self.calls += 1
        s = np.maximum(self.dot(self.M, w), 1e-300)
        v = self.c3 / np.cbrt(s)                            # (c / s)^(1/3)
        h = float(v @ s)                                    # Σ c^(1/3) s^(2/3)
        g = self.dot(self.MT, v)
        total = float(w.sum())
        lower = h ** 3 / total ** 2                         # h(w / total)³
        r = g * (total / h)
        rmax = float(r.max())
        self.lower = max(self.lower, lower)
        if lower * rmax * rmax < self.upper:
            self.upper = lower * rmax * rmax
            self.best_u = v * (total / h) / rmax            # feasible: max (Mᵀu) = 1
        return 3.0 * h - 2.0 * total, 2.0 * g - 2.0, r

    def done(self) -> bool:
        return self.upper <= self.lower * (1.0 + self.tol)


def solve_l1_program(c, M, tol: float = 1e-6, max_rounds: int = 20,
                     round_iterations: int = 400) -> L1ProgramResult:
    """``min Σ cᵢ/uᵢ²  s.t.  Mᵀu <= 1, u >= 0`` by its dual, to certified relative gap ``tol``.

    ``c``: ``k`` positive costs; ``M``: ``k x n`` non-negative (dense or sparse). Returns the
    best certified feasible ``u`` found, even when ``max_rounds`` ends before ``tol`` (the
    strategy stays valid; ``gap`` reports how far from optimal it may be).
    """
    c, M = _check_program(c, M)
    n = M.shape[1]
    s0 = np.asarray(M.sum(axis=1)).reshape(-1) / n
    unit = float((np.cbrt(c) * np.cbrt(s0) ** 2).sum()) ** 3   # h(uniform)³
    dual = _Dual(c / unit, M, tol)                              # scale-free from here on
    w = np.full(n, 1.0 / n)
    floor = 1e-15 / n

    def negative(x):
        value, grad, _ = dual.evaluate(x)
        if dual.done():
            raise _Converged
        return -value, -grad

    for _ in range(max_rounds):
        try:
            res = so.minimize(negative, w, jac=True, method="L-BFGS-B",
                              bounds=so.Bounds(np.full(n, floor), np.inf),
                              options={"maxiter": round_iterations, "maxcor": 30,
                                       "ftol": 0.0, "gtol": 0.0})
            w = np.maximum(res.x, floor)
        except _Converged:
            break
        w = w / w.sum()
        for _ in range(20):                                   # multiplicative steps
            _, _, r = dual.evaluate(w)
            if dual.done():
                break
            w = np.maximum(w * r, floor)
            w = w / w.sum()
        if dual.done():
            break
        s = dual.dot(dual.M, w)
        w = w * float((dual.c3 * np.cbrt(s) ** 2).sum()) ** 3         # the best scale
    u = dual.best_u / max(float(dual.dot(dual.MT, dual.best_u).max()), 1.0)
    objective = float((c / (u * u)).sum())
    return L1ProgramResult(u, objective, min(dual.lower * unit, objective), dual.calls)


def solve_l1_program_cvxpy(c, M, solver: str | None = None) -> L1ProgramResult:
    """The primal of the L1 program for cvxpy (CLARABEL by default): the reference solver."""
    import cvxpy as cp

    c, M = _check_program(c, M)
    Md = M.toarray() if sp.issparse(M) else M
    u = cp.Variable(c.size, nonneg=True)
    problem = cp.Problem(cp.Minimize(cp.sum(cp.multiply(c / c.max(), cp.power(u, -2)))),
                         [Md.T @ u <= 1])
    try:
        problem.solve(solver=solver or cp.CLARABEL)
    except cp.error.SolverError:
        problem.solve(solver=cp.SCS, eps=1e-9, max_iters=200000)
    if u.value is None:
        raise StrategyError(f"the L1 program: cvxpy returned status {problem.status!r}")
    x = np.maximum(np.asarray(u.value, dtype=float), 1e-300)
    x = x / max(float((Md.T @ x).max()), 1.0)
    return L1ProgramResult(x, float((c / (x * x)).sum()), float("nan"), 0)


def complete_columns_l1(A1) -> np.ndarray | sp.csr_matrix:
    """Scale the largest column L1 norm of ``A1`` to 1, then append ``(1 − ‖A[:, j]‖₁) e_jᵀ``
    for every shorter column: every column's L1 norm becomes 1 (``Δ₁`` unchanged)."""
    norms = np.asarray(abs(A1).sum(axis=0)).reshape(-1)
    top = float(norms.max())
    short = 1.0 - norms / top
    cols = np.flatnonzero(short > COMPLETION_CUTOFF)
    extra = sp.csr_matrix((short[cols], (np.arange(cols.size), cols)),
                          shape=(cols.size, A1.shape[1]))
    if sp.issparse(A1):
        return sp.vstack([sp.csr_matrix(A1) * (1.0 / top), extra], format="csr")
    return np.vstack([np.asarray(A1) / top, extra.toarray()])

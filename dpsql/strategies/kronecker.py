"""Kronecker strategies for Kronecker blocks and their unions (Gaussian, L2).

McKenna, Miklau, Hay, Machanavajjhala, *Optimizing error of high-dimensional statistical
queries under differential privacy* (HDMM), VLDB 2018, §4 (OPT⊗) and §5 (unions); the algebra
as dpsql uses it is in NOTES, "Kronecker blocks". No code is taken from HDMM (AGPL).

For ``W = ⊗ W_i`` and ``A = ⊗ A_i``: ``tr(WᵀW (AᵀA)⁺) = Π_i tr(V_i (A_iᵀA_i)⁺)`` with
``V_i = W_iᵀW_i``, the L2 sensitivity (largest column norm) is ``Π_i ‖A_i‖_{1→2}`` and the L1
sensitivity ``Π_i ‖A_i‖_{1→1}`` (a column of ``⊗A_i`` is the Kronecker product of columns).

- :func:`opt_kron`, one block: the product of per-column optima. Each factor is dpsql's
  certified 1-D optimum (:mod:`dpsql.strategies.gaussian.optimal`, the COA dual) for ``V_i``
  (identity and all-ones Grams in closed form). It is also the optimum over *all* strategies:
  the dual weights ``w_1 ⊗ … ⊗ w_d`` certify ``Π h_i²`` as a lower bound, which ``⊗A_i`` attains.
- :func:`union_kron`, one shared Kronecker strategy for ``Σ_k w_k ⊗_i V_{k,i}``: error
  ``Σ_k w_k Π_i tr(V_{k,i} X_i⁻¹)``, minimised by cycling over columns; with the other factors
  fixed, column i's subproblem is the 1-D problem for ``Σ_k (w_k Π_{j≠i} tr(V_{k,j} X_j⁻¹)) V_{k,i}``.
  Every accepted step lowers the error (a step that would not is rejected).
- :func:`separate_kron`, one OPT⊗ per block with the budget split: Gaussian sensitivities add
  in squares, so scaling block k by ``c_k`` (``Σ c_k² = 1``) gives error ``Σ E_k / c_k²``,
  least at ``c_k² ∝ √E_k``: ``(Σ_k √E_k)²``.

Privacy: each factor is scaled to a largest column norm of exactly 1 (up to rounding), so a
Kronecker strategy has L2 sensitivity ``Π_i 1 = 1``; :attr:`KronStrategy.sensitivity`
recomputes the product from the factors. The optimisation reads the public workload only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dpsql.errors import StrategyError
from dpsql.strategies.gaussian.optimal import solve
from dpsql.workload.blocks import KronBlock, UnionWorkload
from dpsql.workload.matrix import WorkloadInfo

#: stop cycling when a round lowers the error by less than this fraction
TOL = 1e-6
#: relative tolerance for recognising identity / all-ones Gram matrices
SHAPE_TOL = 1e-12


@dataclass(frozen=True, eq=False)
class KronStrategy:
    """``A = ⊗ factors`` with its total squared error (σ = 1 per unit of L2 sensitivity)."""

    factors: tuple
    error: float           # sensitivity² · Σ_k w_k Π_i tr(V_{k,i} (A_iᵀA_i)⁺)
    rounds: int = 1

    @property
    def sensitivity(self) -> float:
        """L2: ``Π_i`` largest column norm of ``A_i``."""
        return math.prod(float(np.sqrt((F ** 2).sum(axis=0)).max()) for F in self.factors)

    @property
    def l1_sensitivity(self) -> float:
        """L1: ``Π_i`` largest column absolute sum of ``A_i`` (Laplace calibration)."""
        return math.prod(float(np.abs(F).sum(axis=0).max()) for F in self.factors)

    def dense(self) -> np.ndarray:
        out = np.ones((1, 1))
        for F in self.factors:
            out = np.kron(out, F)
        return out


def gram_pinv(A: np.ndarray) -> np.ndarray:
    """``(AᵀA)⁺`` by a symmetric eigendecomposition (small factors)."""
    lam, U = np.linalg.eigh(A.T @ A)
    keep = lam > 1e-12 * max(float(lam.max(initial=0.0)), 1e-300)
    return (U[:, keep] / lam[keep]) @ U[:, keep].T


def factor_error(V: np.ndarray, A: np.ndarray) -> float:
    """``tr(V (AᵀA)⁺)``; ``V``'s range must lie in ``A``'s row space (else the error is infinite)."""
    G = gram_pinv(A)
    P = G @ (A.T @ A)                       # projection on A's row space
    if np.abs(V - P.T @ V @ P).max(initial=0.0) > 1e-8 * max(np.abs(V).max(initial=0.0), 1e-300):
        return math.inf
    return float(np.sum(V * G))


def _normalised(A) -> np.ndarray:
    A = A.toarray() if sp.issparse(A) else np.asarray(A, dtype=float)
    A = A[np.any(A != 0, axis=1)]
    return A / float(np.sqrt((A ** 2).sum(axis=0)).max())


def one_dimensional(V) -> np.ndarray:
    """An optimal 1-D strategy for the Gram ``V`` (columns of norm <= 1, the largest 1)."""
    V = np.asarray(V, dtype=float)
    n = V.shape[0]
    top = float(np.abs(V).max(initial=0.0))
    if top == 0 or not np.all(np.isfinite(V)):
        raise StrategyError("a Kronecker factor's Gram matrix is zero or not finite")
    if np.abs(V - V[0, 0] * np.ones((n, n))).max() <= SHAPE_TOL * top:
        return np.ones((1, n))                        # a total: measure it (error 1 per unit)
    if np.abs(V - V[0, 0] * np.eye(n)).max() <= SHAPE_TOL * top:
        return np.eye(n)                              # tr(X⁻¹) with diag X = 1: X = I
    return _normalised(solve(WorkloadInfo(n, V=V, m=n)).A)


def opt_kron(block: KronBlock) -> KronStrategy:
    """OPT⊗: the product of per-column optima for one Kronecker block."""
    factors = tuple(one_dimensional(V) for V in block.gram_factors())
    grams = block.gram_factors()
    error = block.weight * math.prod(factor_error(V, A) for V, A in zip(grams, factors))
    strategy = KronStrategy(factors, error)
    return KronStrategy(factors, error * strategy.sensitivity ** 2)


def _errors(grams: list, factors: list) -> np.ndarray:
    """``E[k, i] = tr(V_{k,i} (A_iᵀA_i)⁺)``."""
    return np.array([[factor_error(V, A) for V, A in zip(Vs, factors)] for _, Vs in grams])


def _total(weights: np.ndarray, E: np.ndarray) -> float:
    return float(weights @ np.prod(E, axis=1))


def union_kron(union: UnionWorkload, max_rounds: int = 20, tol: float = TOL) -> KronStrategy:
    """One Kronecker strategy for the whole union, by cycling over the columns (see module)."""
    grams = union.gram_factors()
    weights = np.array([w for w, _ in grams])
    start = [one_dimensional(sum(w * Vs[i] for w, Vs in grams)) for i in range(len(union.sizes))]
    factors = list(start)
    E = _errors(grams, factors)
    total, rounds = _total(weights, E), 0
    while rounds < max_rounds:
        rounds += 1
        before = total
        for i in range(len(factors)):
            others = np.prod(np.delete(E, i, axis=1), axis=1) * weights
            candidate = one_dimensional(sum(c * Vs[i] for c, (_, Vs) in zip(others, grams)))
            column = np.array([factor_error(Vs[i], candidate) for _, Vs in grams])
            new_total = float(others @ column)
            if new_total < total:
                factors[i], E[:, i], total = candidate, column, new_total
        if not math.isfinite(total) or before - total <= tol * total:
            break
    if not math.isfinite(total):
        raise StrategyError("no Kronecker strategy answers every block of this workload")
    strategy = KronStrategy(tuple(factors), total, rounds)
    return KronStrategy(strategy.factors, total * strategy.sensitivity ** 2, rounds)


def separate_kron(union: UnionWorkload) -> tuple[list, np.ndarray, float]:
    """One OPT⊗ per block, budget split ``c_k² ∝ √E_k``: (strategies, c_k², total error)."""
    strategies = [opt_kron(b) for b in union.blocks]
    root = np.sqrt([s.error for s in strategies])
    return strategies, root / root.sum(), float(root.sum() ** 2)

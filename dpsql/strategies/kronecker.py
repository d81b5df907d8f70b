"""Kronecker strategies for Kronecker blocks and their unions (Gaussian L2; Laplace L1).

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
  fixed, column i's subproblem is the 1-D problem for the weighted Gram
  ``Σ_k (w_k Π_{j≠i} tr(V_{k,j} X_j⁻¹)) V_{k,i}``.
  Every accepted step lowers the error (a step that would not is rejected).
- :func:`separate_kron`, one OPT⊗ per block with the budget split: Gaussian sensitivities add
  in squares, so scaling block k by ``c_k`` (``Σ c_k² = 1``) gives error ``Σ E_k / c_k²``,
  least at ``c_k² ∝ √E_k``: ``(Σ_k √E_k)²``.

Laplace (``norm="l1"``, pure ε-DP): the same algebra with the L1 sensitivity; the error to
minimise is ``Δ₁² tr(V (AᵀA)⁺)`` (times ``2/ε²`` for the expected squared error), whose 1-D
factors come from :class:`dpsql.strategies.laplace.candidates.L1EigenDesign` (the best of its
weighted bases: a heuristic, not a certified optimum). Separate blocks add their L1
sensitivities, so ``c_k ∝ E_k^{1/3}`` (``Σ c_k = 1``) and the total is ``(Σ_k E_k^{1/3})³``.

Privacy: each factor is scaled to a largest column norm (L2) or column absolute sum (L1) of
exactly 1 up to rounding, so a Kronecker strategy has sensitivity ``Π_i 1 = 1`` in that norm;
:attr:`KronStrategy.sensitivity` / :attr:`KronStrategy.l1_sensitivity` recompute the products
from the factors, and integration must calibrate to the exact sensitivity of the rounded
factors. The optimisation reads the public workload only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dpsql.errors import StrategyError
from dpsql.inference.implicit import gram_pinv
from dpsql.strategies.gaussian.optimal import solve
from dpsql.strategies.laplace.candidates import L1EigenDesign
from dpsql.workload.blocks import KronBlock, UnionWorkload
from dpsql.workload.matrix import WorkloadInfo

#: stop cycling when a round lowers the error by less than this fraction
TOL = 1e-6
#: relative tolerance for recognising identity / all-ones Gram matrices
SHAPE_TOL = 1e-12
#: the certified tolerance of a factor's optimum: room for the identity's weight 2e-6 that
#: a singular factor mixes in (optimal.mix_weight) beside a 7e-6 gap. Kronecker products
#: multiply their factors' condition numbers, and with the 1e-6 default (t = 2.5e-7)
#: noiseless answers through a plan of ranges by 1-way marginals erred by 7.5e-9 of
#: themselves instead of ~1e-10; the product is a heuristic, not certified for the batch
FACTOR_TOL = 9e-6


@dataclass(frozen=True, eq=False)
class KronStrategy:
    """``A = ⊗ factors`` with its total squared error (σ = 1 per unit of L2 sensitivity)."""

    factors: tuple
    error: float           # Δ² · Σ_k w_k Π_i tr(V_{k,i} (A_iᵀA_i)⁺), Δ in the strategy's norm
    rounds: int = 1
    norm: str = "l2"       # "l2" (Gaussian, error in units of σ² per unit Δ₂) or "l1" (2/ε²)

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


def factor_error(V: np.ndarray, A: np.ndarray) -> float:
    """``tr(V (AᵀA)⁺)``; infinite unless ``V``'s range lies in ``A``'s row space."""
    return float(factor_errors([V], A)[0])


def factor_errors(Vs: list, A: np.ndarray) -> np.ndarray:
    """:func:`factor_error` for several Grams sharing one factor (one eigendecomposition)."""
    G = gram_pinv(A)
    P = G @ (A.T @ A)                       # projection on A's row space
    out = np.empty(len(Vs))
    for k, V in enumerate(Vs):
        top = max(np.abs(V).max(initial=0.0), 1e-300)
        out[k] = math.inf if np.abs(V - P.T @ V @ P).max(initial=0.0) > 1e-8 * top \
            else float(np.sum(V * G))
    return out


def _norm(A: np.ndarray, norm: str) -> float:
    if norm == "l1":
        return float(np.abs(A).sum(axis=0).max())
    return float(np.sqrt((A ** 2).sum(axis=0)).max())


def _normalised(A, norm: str) -> np.ndarray:
    A = A.toarray() if sp.issparse(A) else np.asarray(A, dtype=float)
    A = A[np.any(A != 0, axis=1)]
    return A / _norm(A, norm)


def _check_norm(norm: str) -> None:
    if norm not in ("l2", "l1"):
        raise StrategyError(f"norm must be 'l2' (Gaussian) or 'l1' (Laplace), got {norm!r}")


def one_dimensional(V, norm: str = "l2") -> np.ndarray:
    """A 1-D strategy for the Gram ``V``, scaled to sensitivity 1 in ``norm``: the certified
    optimum (L2) or the best weighted basis of the L1 design (L1)."""
    V = np.asarray(V, dtype=float)
    n = V.shape[0]
    top = float(np.abs(V).max(initial=0.0))
    if top == 0 or not np.all(np.isfinite(V)):
        raise StrategyError("a Kronecker factor's Gram matrix is zero or not finite")
    if np.abs(V - V[0, 0] * np.ones((n, n))).max() <= SHAPE_TOL * top:
        return np.ones((1, n))                        # a total: measure it (error 1 per unit)
    if np.abs(V - V[0, 0] * np.eye(n)).max() <= SHAPE_TOL * top:
        return np.eye(n)                              # tr(X⁻¹) with diag X = 1: X = I
    if norm == "l1":
        plan = L1EigenDesign().plan(WorkloadInfo(n, V=V, m=n))
        return np.eye(n) if plan.A is None else _normalised(plan.A, "l1")
    return _normalised(solve(WorkloadInfo(n, V=V, m=n), tol=FACTOR_TOL).A, "l2")


def _finish(factors, error: float, rounds: int, norm: str) -> KronStrategy:
    """The strategy with its error scaled by its (recomputed) sensitivity squared."""
    sensitivity = math.prod(_norm(F, norm) for F in factors)
    return KronStrategy(tuple(factors), error * sensitivity ** 2, rounds, norm)


def opt_kron(block: KronBlock, norm: str = "l2") -> KronStrategy:
    """OPT⊗: the product of per-column optima for one Kronecker block."""
    _check_norm(norm)
    grams = block.gram_factors()
    factors = tuple(one_dimensional(V, norm) for V in grams)
    error = block.weight * math.prod(factor_error(V, A) for V, A in zip(grams, factors))
    return _finish(factors, error, 1, norm)


def _errors(grams: list, factors: list) -> np.ndarray:
    """``E[k, i] = tr(V_{k,i} (A_iᵀA_i)⁺)`` (one eigendecomposition per factor)."""
    return np.stack([factor_errors([Vs[i] for _, Vs in grams], A)
                     for i, A in enumerate(factors)], axis=1)


def _total(weights: np.ndarray, E: np.ndarray) -> float:
    return float(weights @ np.prod(E, axis=1))


def union_kron(union: UnionWorkload, max_rounds: int = 20, tol: float = TOL,
               norm: str = "l2") -> KronStrategy:
    """One Kronecker strategy for the whole union, by cycling over the columns (see module)."""
    _check_norm(norm)
    grams = union.gram_factors()
    weights = np.array([w for w, _ in grams])
    start = [one_dimensional(sum(w * Vs[i] for w, Vs in grams), norm)
             for i in range(len(union.sizes))]
    factors = list(start)
    E = _errors(grams, factors)
    total, rounds = _total(weights, E), 0
    while rounds < max_rounds:
        rounds += 1
        before = total
        for i in range(len(factors)):
            others = np.prod(np.delete(E, i, axis=1), axis=1) * weights
            candidate = one_dimensional(sum(c * Vs[i] for c, (_, Vs) in zip(others, grams)), norm)
            column = factor_errors([Vs[i] for _, Vs in grams], candidate)
            new_total = float(others @ column)
            if new_total < total:
                factors[i], E[:, i], total = candidate, column, new_total
        if not math.isfinite(total) or before - total <= tol * total:
            break
    if not math.isfinite(total):
        raise StrategyError("no Kronecker strategy answers every block of this workload")
    return _finish(factors, total, rounds, norm)


def separate_kron(union: UnionWorkload, norm: str = "l2") -> tuple[list, np.ndarray, float]:
    """One OPT⊗ per block with the budget split: (strategies, shares, total error).

    Block k's strategy is scaled by ``c_k``; ``shares`` are ``c_k²`` (L2: ``c_k² ∝ √E_k``,
    total ``(Σ √E_k)²``) or ``c_k`` (L1: ``c_k ∝ E_k^{1/3}``, total ``(Σ E_k^{1/3})³``), each
    summing to 1, so the stacked strategy keeps sensitivity 1."""
    _check_norm(norm)
    strategies = [opt_kron(b, norm) for b in union.blocks]
    power = 0.5 if norm == "l2" else 1.0 / 3.0
    root = np.array([s.error for s in strategies]) ** power
    return strategies, root / root.sum(), float(root.sum() ** (1.0 / power))

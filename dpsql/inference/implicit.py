"""Answers and exact standard errors block by block, never on the full cell product.

Two measurement families (public inputs only; ``y`` is the noisy output of the kernel):

**Residual measurements** (Xiao, Gao et al., *An Optimal and Scalable Matrix Mechanism for
Noisy Marginals under Convex Loss Functions*, NeurIPS 2023, §4–5; NOTES "Marginals in the
residual basis"). For each attribute set A the strategy measured
``y_A = √a_A · (⊗_{i∈A} H_i ⊗_{i∉A} 1ᵀ/√n_i) x + N(0, σ²)``, ``H_i`` the Helmert rows
(:func:`dpsql.workload.blocks.helmert`): ``y_A`` is a tensor over A's attributes with
``n_i − 1`` entries each, computed from the marginal of x on A. Those rows are an
orthonormal basis of the range of ``P_A`` scaled by ``√a_A``, so the least-squares estimate
has ``P_A x̂ = H_Aᵀ y_A / √a_A`` and ``Cov(x̂) = σ² Σ_A P_A / a_A``. The marginal ``Q_B`` has
``Q_B P_A = 0`` unless ``A ⊆ B``, hence

    Q_B x̂ = Σ_{A⊆B} Π_{i∉B} √n_i · (⊗_{i∈B} F_i) y_A / √a_A,
    F_i = H_iᵀ (i ∈ A),  F_i = 1/√n_i as an n_i x 1 column (i ∈ B∖A),

a Kronecker product on B's attributes only, and every cell of B has the same variance
``σ² Σ_{A⊆B} c(B, A) / a_A`` with
``c(B, A) = Π_{i∉B} n_i · Π_{i∈A} (n_i − 1)/n_i · Π_{i∈B∖A} 1/n_i``.

**Kronecker measurements** ``y = (⊗A_i) x + N(0, σ²)`` of a block ``W = ⊗W_i`` (McKenna et
al., HDMM, VLDB 2018, §4): ``x̂ = (⊗A_i⁺) y``, answers ``(⊗ W_i A_i⁺) y`` and covariance
``σ² ⊗ W_i (A_iᵀA_i)⁺ W_iᵀ``; the per-answer variances are the Kronecker product of the
per-factor diagonals. Every row of ``W_i`` must lie in the row space of ``A_i`` (checked).
"""

from __future__ import annotations

import math

import numpy as np

from dpsql import cancel
from dpsql.workload import limits as planning
from dpsql.workload.blocks import KronBlock, apply_along, helmert

#: a row of W_i further than this (relative) from the row space of A_i is refused
ROW_SPACE_TOL = 1e-8


def _sorted_set(cols) -> tuple:
    return tuple(sorted(int(c) for c in cols))


def residual_coefficient(sizes, B, A) -> float:
    """``c(B, A)``: the per-cell variance of marginal B contributed by ``P_A`` at ``a_A = 1``."""
    B, A = set(B), set(A)
    if not A <= B:
        return 0.0
    c = 1.0
    for i, n in enumerate(sizes):
        if i not in B:
            c *= n
        elif i in A:
            c *= (n - 1) / n
        else:
            c /= n
    return c


def residual_cell_variance(sizes, a: dict, B) -> float:
    """Variance (σ = 1) of every cell of marginal B under residual weights ``a`` (A -> a_A).

    Every subset of B must have a weight (the closure): otherwise B is not estimable."""
    B = _sorted_set(B)
    total = 0.0
    for A in _subsets(B):
        if A not in a:
            raise ValueError(f"marginal {B} needs a measurement of the subset {A}")
        total += residual_coefficient(sizes, B, A) / a[A]
    return total


def _subsets(B: tuple):
    for mask in range(1 << len(B)):
        yield tuple(B[j] for j in range(len(B)) if mask >> j & 1)


def residual_answer(sizes, a: dict, y: dict, B) -> np.ndarray:
    """``Q_B x̂`` from the residual measurements ``y`` (A -> tensor over A's attributes,
    ``n_i − 1`` per axis): an array shaped by B's sizes, built on B's attributes only."""
    B = _sorted_set(B)
    sizes = tuple(int(n) for n in sizes)
    out = np.zeros(tuple(sizes[i] for i in B))
    outside = math.prod(sizes[i] for i in range(len(sizes)) if i not in B)
    for A in _subsets(B):
        if A not in a or A not in y:
            raise ValueError(f"marginal {B} needs the measurement of the subset {A}")
        T = np.asarray(y[A], dtype=float)
        if T.shape != tuple(sizes[i] - 1 for i in A):
            raise ValueError(f"measurement {A} has shape {T.shape}, expected "
                             f"{tuple(sizes[i] - 1 for i in A)}")
        T = T.reshape(tuple(sizes[i] - 1 if i in A else 1 for i in B))
        for axis, i in enumerate(B):
            F = helmert(sizes[i]).T if i in A else np.full((sizes[i], 1), 1 / math.sqrt(sizes[i]))
            T = apply_along(T, F, axis)
        out += T * (math.sqrt(outside) / math.sqrt(a[A]))
    return out


def gram_pinv(A: np.ndarray) -> np.ndarray:
    """``(AᵀA)⁺`` by a symmetric eigendecomposition (a Kronecker factor: one column's
    domain), in a killable worker during a request's planning when predicted to take long
    (``2·p·n²`` for the Gram, ``9·n³`` for ``eigh``, ``2·n³`` for the product)."""
    p, n = np.shape(A)
    return cancel.run_cancellable(_gram_pinv, A, seconds=(2.0 * p * n * n + 11.0 * n ** 3)
                                  / planning.FLOPS)


def _gram_pinv(A: np.ndarray) -> np.ndarray:
    lam, U = np.linalg.eigh(A.T @ A)
    keep = lam > 1e-12 * max(float(lam.max(initial=0.0)), 1e-300)
    return (U[:, keep] / lam[keep]) @ U[:, keep].T


def _check_row_space(W: np.ndarray, A: np.ndarray) -> None:
    G = gram_pinv(A)
    resid = W - W @ G @ (A.T @ A)
    if np.abs(resid).max(initial=0.0) > ROW_SPACE_TOL * max(np.abs(W).max(initial=0.0), 1.0):
        raise ValueError("a workload factor has rows outside its strategy factor's row space; "
                         "its answers are not estimable from this Kronecker strategy")


def kron_variances(W_factors, A_factors) -> np.ndarray:
    """Per-answer variances (σ = 1) of ``(⊗W_i) x̂``: ``⊗ diag(W_i (A_iᵀA_i)⁺ W_iᵀ)``."""
    out = np.ones(1)
    for W, A in zip(W_factors, A_factors, strict=True):
        W, A = np.asarray(W, dtype=float), np.asarray(A, dtype=float)
        _check_row_space(W, A)
        out = np.kron(out, np.einsum("ij,jk,ik->i", W, gram_pinv(A), W))
    return out


def kron_answers(W_factors, A_factors, y) -> np.ndarray:
    """``(⊗ W_i A_i⁺) y``: the block's answers from its Kronecker measurements ``y``."""
    mats = []
    for W, A in zip(W_factors, A_factors, strict=True):
        W, A = np.asarray(W, dtype=float), np.asarray(A, dtype=float)
        _check_row_space(W, A)
        mats.append(W @ gram_pinv(A) @ A.T)
    T = np.asarray(y, dtype=float).reshape(tuple(M.shape[1] for M in mats))
    for axis, M in enumerate(mats):
        T = apply_along(T, M, axis)
    return T.reshape(-1)


def residual_block_answers(sizes, a: dict, y: dict, block: KronBlock,
                           sigma: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Answers of any Kronecker block on a measured clique, with exact standard errors.

    The block's rows are ``√w ⊗_i F_i``; on its used columns B they act on the marginal of
    x on B, so the answers are ``√w (⊗_{i∈B} F_i) Q_B x̂`` (ones rows elsewhere sum
    exactly). Residuals with ``a_A = 0`` were not measured: the plan only leaves out those
    every block annihilates (:func:`dpsql.strategies.residual.blocks_plan`), so they enter
    as zeros and add no variance (:func:`residual_block_stderr`)."""
    sizes = tuple(int(n) for n in sizes)
    if block.sizes != sizes:
        raise ValueError(f"block sizes {block.sizes} differ from the plan's {sizes}")
    answers = block.answer(residual_marginal(sizes, a, y, block.used))
    return answers, residual_block_stderr(sizes, a, block, sigma)


def residual_marginal(sizes, a: dict, y: dict, B) -> np.ndarray:
    """``Q_B x̂`` (:func:`residual_answer`) with the residuals not measured (``a_A = 0``)
    entering as zeros."""
    sizes = tuple(int(n) for n in sizes)
    a_eff, y_eff = dict(a), dict(y)
    for A in _subsets(_sorted_set(B)):
        if a.get(A, 0.0) <= 0 or A not in y:
            a_eff[A] = 1.0
            y_eff[A] = np.zeros(tuple(sizes[i] - 1 for i in A))
    return residual_answer(sizes, a_eff, y_eff, B)


def residual_block_stderr(sizes, a: dict, block: KronBlock, sigma: float = 1.0) -> np.ndarray:
    """Each answer's exact standard error under the residual measurements (no data).

    With ``Cov(Q_B x̂) = σ² Σ_{A⊆B} (1/a_A) Π_{i∉B} n_i ⊗_{i∈B} P_{i,A}`` (``P_{i,A}`` = P1
    if i ∈ A else P0), each answer's variance is
    ``σ² w Σ_{A⊆B} (1/a_A) Π_{i∉B} n_i ⊗_{i∈B} diag(F_i P_{i,A} F_iᵀ)``: per-factor
    diagonals, never the full product."""
    sizes = tuple(int(n) for n in sizes)
    B = block.used
    outside = math.prod(n for i, n in enumerate(sizes) if i not in B)
    variance = np.zeros(block.shape[0])
    for A in _subsets(B):
        if a.get(A, 0.0) <= 0:
            continue
        term = np.full(1, outside / a[A])
        for i in B:
            F = block.factors[i]
            mean = F.sum(axis=1) / sizes[i]
            ones = mean * mean * sizes[i]                       # diag(F P0 Fᵀ)
            term = np.kron(term, np.einsum("ij,ij->i", F, F) - ones if i in A else ones)
        variance += term
    return float(sigma) * np.sqrt(block.weight * np.maximum(variance, 0.0))

"""Answers and exact standard errors of a union-of-Kronecker plan, block by block
(the plans of :mod:`dpsql.strategies.union_kron`; public inputs and the noisy ``y`` only).

Group g measured ``c_g (⊗_{i∈Γ} A_i) ⊗ R_g`` on the marginals of Γ ∪ (its other columns).
Least squares within the group is the Kronecker product of the parts' own: ``(A_iᵀA_i)⁺A_iᵀ``
on each general column, and on the other columns the residual reconstruction
(:func:`dpsql.inference.implicit.residual_answer`; L2) or the measured clique's marginal
summed down (L1). A block ``√w ⊗_i W_i`` of the group therefore answers, on its used
columns only,

    L2:  √w Σ_{A⊆B} √(outside_B / a_A) / c_g · (⊗_{i∈Γ} M_i) ⊗ (⊗_{i∈B} F_i G_{i,A}) y_A,
    L1:  √w / u_C · (⊗_{i∈Γ} M_i) ⊗ (⊗_{i∈B} F_i) ⊗ (⊗_{i∈C∖B} 1ᵀ) y_C,

with ``M_i = W_i (A_iᵀA_i)⁺ A_iᵀ``, ``G_{i,A} = H_iᵀ`` (i ∈ A) or ``1/√n_i`` (i ∈ B∖A), and its
answers' variances are the Kronecker products of per-column diagonals
(``diag(W_i (A_iᵀA_i)⁺ W_iᵀ)``; ``diag(F P_{1|0} Fᵀ)``; ``Σ_j F_ij²``) — never the product of
the domains.
"""

from __future__ import annotations

import math

import numpy as np

from dpsql.workload.blocks import apply_along, helmert


def multiplicity(sizes, A) -> int:
    """``Π_{i∈A} (n_i − 1)``: the rank of the residual ``P_A`` (0: nothing measured)."""
    return math.prod(int(sizes[i]) - 1 for i in A)


def home(cliques: tuple, used: tuple, sizes) -> tuple:
    """The smallest measured clique holding the columns ``used`` (ties: the first)."""
    return min((C for C in cliques if set(used) <= set(C)),
               key=lambda C: (math.prod(sizes[i] for i in C), C))


def _subsets(B: tuple):
    for mask in range(1 << len(B)):
        yield tuple(B[j] for j in range(len(B)) if mask >> j & 1)


def _layout(p, j: int, block):
    """(group, used columns, the block's other columns as group-local indices)."""
    g = p.groups[j]
    used = block.used
    return g, used, tuple(g.rest.index(i) for i in used if i in g.rest)


def _general_map(g, i: int, W: np.ndarray) -> np.ndarray:
    return W @ g.pinv[i] @ g.A[i].T


def block_answers(p, j: int, block, tensors: dict) -> np.ndarray:
    """The block's answers (C order over its used columns) from group j's measurements
    ``tensors[(j, set)]`` (axes in column order)."""
    g, used, B = _layout(p, j, block)
    sizes = p.union.sizes
    out = 0.0
    if p.norm == "l2":
        rest_sizes = tuple(sizes[i] for i in g.rest)
        outside = math.prod(n for t, n in enumerate(rest_sizes) if t not in B)
        terms = [(A, math.sqrt(outside / g.a[A]) / g.scale) for A in _subsets(B)
                 if g.a.get(A, 0.0) > 0 and multiplicity(rest_sizes, A) > 0]
    else:
        C = home(g.cliques, B, tuple(sizes[i] for i in g.rest))
        terms = [(C, 1.0 / p.shares[(j, C)])]
    for A, factor in terms:
        cols = tuple(sorted(g.gamma + tuple(g.rest[t] for t in A)))
        T = np.asarray(tensors[(j, A)], dtype=float)
        if p.norm == "l1":                       # sum the clique down to the block's columns
            T = T.sum(axis=tuple(a for a, i in enumerate(cols) if i not in used))
            cols = tuple(i for i in cols if i in used)
        T = T.reshape([T.shape[cols.index(i)] if i in cols else 1 for i in used])
        for axis, i in enumerate(used):
            F = block.factors[i]
            if i in g.gamma:
                M = _general_map(g, i, F)
            elif p.norm == "l1":
                M = F
            elif i in cols:
                M = F @ helmert(sizes[i]).T
            else:
                M = F @ np.full((sizes[i], 1), 1 / math.sqrt(sizes[i]))
            T = apply_along(T, M, axis)
        out = out + factor * T
    return math.sqrt(block.weight) * np.asarray(out).reshape(-1)


def block_variance(p, j: int, block) -> np.ndarray:
    """Each answer's variance at unit noise (σ = 1; Laplace: b = 1, without the factor 2)."""
    g, used, B = _layout(p, j, block)
    sizes = p.union.sizes
    diag = {}
    for i in used:
        F = block.factors[i]
        if i in g.gamma:
            diag[i] = np.einsum("ij,jk,ik->i", F, g.pinv[i], F)
        else:
            ones = np.square(F.sum(axis=1)) / sizes[i]
            diag[i] = (np.einsum("ij,ij->i", F, F) - ones, ones)
    if p.norm == "l1":
        C = home(g.cliques, B, tuple(sizes[i] for i in g.rest))
        term = np.full(1, math.prod(sizes[g.rest[t]] for t in C if t not in B)
                       / p.shares[(j, C)] ** 2)
        for i in used:
            term = np.kron(term, diag[i] if i in g.gamma else np.square(block.factors[i])
                           .sum(axis=1))
        return block.weight * term
    rest_sizes = tuple(sizes[i] for i in g.rest)
    outside = math.prod(n for t, n in enumerate(rest_sizes) if t not in B)
    variance = np.zeros(block.shape[0])
    for A in _subsets(B):
        if g.a.get(A, 0.0) <= 0 or multiplicity(rest_sizes, A) == 0:
            continue
        term = np.full(1, outside / (g.a[A] * g.scale ** 2))
        for i in used:
            d = diag[i]
            if i not in g.gamma:
                d = d[0] if g.rest.index(i) in A else d[1]
            term = np.kron(term, d)
        variance += term
    return block.weight * np.maximum(variance, 0.0)


def block_max_weight(p, j: int, block) -> np.ndarray:
    """L1: each answer's largest absolute weight on one noisy measurement, at ``b = 1``
    (``max |kron(rows)| = Π max |row|``), for the Laplace interval bound."""
    g, used, B = _layout(p, j, block)
    C = home(g.cliques, B, tuple(p.union.sizes[i] for i in g.rest))
    term = np.full(1, 1.0 / p.shares[(j, C)])
    for i in used:
        F = block.factors[i]
        M = _general_map(g, i, F) if i in g.gamma else F
        term = np.kron(term, np.abs(M).max(axis=1))
    return math.sqrt(block.weight) * term

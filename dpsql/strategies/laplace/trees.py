"""Weighted hierarchical trees for L1 (one weight per level of a nested chain of block sizes)
and their p-Identity refinement; used by the L1 ``eigen`` strategy
(:mod:`dpsql.strategies.laplace.candidates`). One column's chain search is in
:mod:`.chains`; this module holds the chains' matrices, the search over several columns
(coordinate descent, :func:`choose_chains`) and the refinement (HDMM's p-Identity, McKenna et
al., VLDB 2018). Public inputs only.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import scipy.linalg as sla
import scipy.optimize as so
import scipy.sparse as sp

from dpsql.workload.matrix import WorkloadInfo
from dpsql.strategies.kron import contract
from dpsql.strategies.laplace.chains import (  # noqa: F401  (re-exported: the tree's API)
    MAX_CHAIN_LEVELS, CoarseColumn, _nested, best_chain, chain_sizes, weighted_tree_error)

#: at most this many coordinate-descent sweeps over the columns (tree bases, hierarchical)
MAX_SWEEPS = 4


def chain_matrix(k: int, sizes, u) -> sp.csr_matrix:
    """Rows: every block of every level with weight ``u_l > 0`` (entries ``u_l``)."""
    if not _nested(k, tuple(sizes)):
        raise ValueError(f"chain {tuple(sizes)!r} is not nested over {k} cells")
    rows, cols, vals = [], [], []
    r = 0
    cells = np.arange(k)
    for size, weight in zip(sizes, u):
        if weight <= 0:
            continue
        rows.append(r + cells // size)
        cols.append(cells)
        vals.append(np.full(k, float(weight)))
        r += -(-k // size)
    return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                         shape=(r, k))


def chain_gram_inverse(k: int, sizes, u) -> np.ndarray:
    """``(AᵀA)⁻¹`` of :func:`chain_matrix` (dense; used for the other columns' contraction)."""
    A = chain_matrix(k, sizes, u)
    return np.linalg.inv((A.T @ A).toarray())


def choose_chains(V: np.ndarray, shape: tuple) -> tuple:
    """Per-column weighted chains minimising ``(Π_c Σu_c)² tr(V ⊗ X_c⁻¹)``.

    One column: :func:`best_chain`. Several: coordinate descent (each column's chain given
    the others', on ``V`` contracted with their ``X⁻¹``) from the leaves everywhere and from
    ``[1, k]`` everywhere, keeping the better. Returns ``(chains, error)`` with chains
    ``(sizes, u)``. A column's search is a function of its contracted ``M`` alone, and the
    two descents (and a sweep after which the other columns did not move) meet the same
    ``M`` again: each is searched once (:func:`_memo_best_chain`).
    """
    V = np.asarray(V, dtype=float)
    if len(shape) == 1:
        error, sizes, u = best_chain(V, shape[0])
        return ((sizes, u),), float(error)
    best = _memo_best_chain()

    def cost(chain):
        return float(np.sum(chain[1])) ** 2

    def descend(chains):
        chains = list(chains)
        inverse = {c: chain_gram_inverse(k, *ch) for c, (k, ch) in enumerate(zip(shape, chains))}
        error = math.inf
        for _ in range(MAX_SWEEPS):
            improved = False
            for c, k in enumerate(shape):
                M = contract(V, shape, {o: inverse[o] for o in range(len(shape)) if o != c})
                others = math.prod(cost(chains[o]) for o in range(len(shape)) if o != c)
                current = cost(chains[c]) * weighted_tree_error(M, chains[c][0],
                                                                np.square(chains[c][1]))
                value, sizes, u = best(M, k)
                if value < current * (1 - 1e-9):
                    chains[c], improved = (sizes, u), True
                    inverse[c] = chain_gram_inverse(k, sizes, u)
                error = others * min(value, current)
            if not improved:
                break
        return float(error), tuple(chains)

    leaves = [((1,), np.array([1.0]))] * len(shape)
    totals = [((1, k), np.array([1.0, 1.0])) if k > 1 else ((1,), np.array([1.0]))
              for k in shape]
    error, chains = min((descend(s) for s in (leaves, totals)), key=lambda t: t[0])
    return chains, error


def _memo_best_chain():
    """:func:`best_chain`, remembering its result per ``(k, M)`` (a BLAKE2b digest of ``M``'s
    exact bytes, not the bytes: a column may have thousands of parts): a deterministic
    search gives the same chain for the same matrix, so a repeat is free."""
    seen: dict = {}

    def best(M: np.ndarray, k: int) -> tuple:
        M = np.ascontiguousarray(M, dtype=float)
        key = (int(k), M.shape, hashlib.blake2b(M.tobytes(), digest_size=32).digest())
        if key not in seen:
            seen[key] = best_chain(M, k)
        error, sizes, u = seen[key]
        return error, sizes, u.copy()

    return best


# --- refinement: the p-Identity parametrisation, seeded by the weighted tree ----------------

def p_identity_error(V: np.ndarray, theta: np.ndarray) -> tuple:
    """``(tr(V (AᵀA)⁻¹), gradient)`` for ``A = [I; Θ] D⁻¹``, ``D = diag(1 + 1ᵀΘ)``, ``Θ >= 0``.

    Every column of ``A`` has L1 norm 1 (``Δ₁ = 1``). ``AᵀA = D⁻¹(I + ΘᵀΘ)D⁻¹``, so the error
    is ``tr(Ṽ Y)`` with ``Ṽ = D V D`` and, by Woodbury, ``Y = (I + ΘᵀΘ)⁻¹ = I − ΘᵀK⁻¹Θ``,
    ``K = I + ΘΘᵀ`` (``p x p``): ``tr(Ṽ) − Σ (ΘṼ) ∘ (K⁻¹Θ)``. Gradient: ``−2 K⁻¹Θ Ṽ Y`` (using
    ``ΘY = K⁻¹Θ``) plus, through ``d``, ``2 (V D Y)_kk`` on every row of column ``k``.
    ``O(p n²)`` per evaluation.
    """
    theta = np.asarray(theta, dtype=float)
    d = 1.0 + theta.sum(axis=0)
    K = np.eye(theta.shape[0]) + theta @ theta.T
    factor = sla.cho_factor(K)
    KiT = sla.cho_solve(factor, theta)                   # K⁻¹Θ
    TdV = (theta * d) @ V                                # ΘDV (p x n)
    TVt = TdV * d                                        # ΘṼ
    diagV = np.diag(V)
    value = float((diagV * d * d).sum() - (TVt * KiT).sum())
    KTVt = ((KiT * d) @ V) * d                           # K⁻¹ΘṼ
    grad = -2.0 * (KTVt - (KTVt @ theta.T) @ KiT)        # −2 K⁻¹ΘṼY
    through_d = 2.0 * (diagV * d - (TdV * KiT).sum(axis=0))
    return value, grad + through_d[None, :]


def refine_p_identity(V: np.ndarray, theta: np.ndarray, iterations: int) -> tuple:
    """At most ``iterations`` L-BFGS-B steps on :func:`p_identity_error` from ``theta``.

    The p-Identity strategies of HDMM (McKenna, Miklau, Hay & Machanavajjhala, VLDB 2018),
    for L1 sensitivity. The problem is not convex; starting from a good design (the weighted
    tree, which is a p-Identity strategy) and keeping the better of start and end, the
    result is never worse than the start. Returns ``(theta, error)``.
    """
    V = np.ascontiguousarray(V, dtype=float)
    shape = theta.shape
    start = float(p_identity_error(V, theta)[0])
    if iterations <= 0:
        return theta, start

    def f(x):
        value, grad = p_identity_error(V, x.reshape(shape))
        return value / start, grad.reshape(-1) / start

    res = so.minimize(f, theta.reshape(-1), jac=True, method="L-BFGS-B",
                      bounds=so.Bounds(0.0, np.inf),
                      options={"maxiter": int(iterations), "maxcor": 10})
    error = float(res.fun) * start
    if not error < start:
        return theta, start
    return np.maximum(res.x, 0.0).reshape(shape), error


def _identity_rows(shape: tuple, chains) -> np.ndarray:
    """Mask of the rows of ``⊗ chain_matrix`` that are the leaves of every column."""
    mask = np.ones(1, dtype=bool)
    for k, (sizes, u) in zip(shape, chains):
        rows = sum(-(-k // s) for s, w in zip(sizes, u) if w > 0)
        mask = np.kron(mask, np.arange(rows) < k)
    return mask


def refine_tree(workload: WorkloadInfo, A, chains, iterations: int) -> tuple:
    """The tree design ``A`` (leaves rows first per column) refined as a p-Identity strategy.

    ``Θ`` = the non-leaf rows divided by the leaves' weight. Skipped (``None``) when ``Θ``
    has more than ``n / 2`` rows (Woodbury no longer pays). Returns ``(A, error, note)``.
    """
    n = workload.n
    A = sp.csr_matrix(A)
    mask = _identity_rows(workload.shape, chains)
    if mask.size != A.shape[0] or (~mask).sum() > n // 2 or (~mask).sum() == 0:
        return None
    leaves = A[np.flatnonzero(mask)]
    weight = float(leaves.diagonal().min())
    theta0 = A[np.flatnonzero(~mask)].toarray() / weight
    theta, error = refine_p_identity(workload.V, theta0, iterations)
    d = 1.0 + theta.sum(axis=0)
    refined = np.vstack([np.diag(1.0 / d), theta / d])
    return refined, error, theta.shape[0]

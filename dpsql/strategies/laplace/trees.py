"""Weighted hierarchical trees for L1 (one weight per level of a nested chain of block sizes)
and their p-Identity refinement; used by the L1 ``eigen`` strategy
(:mod:`dpsql.strategies.laplace.candidates`). Public inputs only.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import scipy.linalg as sla
import scipy.optimize as so
import scipy.sparse as sp

from dpsql.workload.matrix import WorkloadInfo
from dpsql.strategies.hierarchical import _block_quadratics
from dpsql.strategies.kron import contract

#: at most this many coordinate-descent sweeps over the columns (tree bases, hierarchical)
MAX_SWEEPS = 4
#: the chain search extends this many of the best chains of each length by one more level
EXTEND_BEST = 4
#: this many of the best extensions of each length are refined by Nelder–Mead
POLISH_BEST = 6
#: longest chain (levels, the leaves included) the search builds
MAX_CHAIN_LEVELS = 4
#: log-weight range searched for a level relative to the leaves, and the grid step of starts
LOG_WEIGHT_RANGE = (-12.0, 6.0)
GRID_STEP = 1.5


# --- weighted trees: nested chains of block sizes with one weight per level -----------------

def chain_sizes(k: int) -> list:
    """Block sizes a chain may use on a column of ``k`` parts: ``b^i < k`` (b = 2 … 16), k."""
    if k < 2:
        return []
    sizes = {k}
    for b in range(2, 17):
        p = b
        while p < k:
            sizes.add(p)
            p *= b
    return sorted(sizes)


def _nested(k: int, sizes) -> bool:
    """Every block of a level lies in one block of the next (sizes ascending from 1)."""
    return bool(sizes) and sizes[0] == 1 and all(
        b > a and (b % a == 0 or b >= k) for a, b in zip(sizes, sizes[1:]))


class CoarseColumn:
    """A column's ``M`` summed over blocks of ``size`` cells: all a chain's error needs.

    In a chain ``1 = s₀ < s₁ < …`` every vector of the Sherman–Morrison recursion is constant
    on each block of ``s₁`` (the leaves are, and each level divides its children's vectors by
    one number per node), so ``tr(M X⁻¹)`` depends on ``M`` only through ``tr(M)`` and the
    block sums ``Mc = P M Pᵀ`` (``P``: the ``⌈k/s₁⌉ x k`` block indicator).
    """

    def __init__(self, M: np.ndarray, size: int):
        k = len(M)
        idx = np.arange(k) // size
        P = sp.csr_matrix((np.ones(k), (idx, np.arange(k))), shape=(int(idx[-1]) + 1, k))
        self.k, self.size = k, int(size)
        self.trace = float(np.trace(M))
        self.sums = np.ascontiguousarray((P @ (P @ M).T).T)
        self.diag = np.diag(self.sums).copy()
        self.counts = np.bincount(idx).astype(float)
        self.first = np.arange(len(self.counts)) * self.size   # each block's first cell


def weighted_tree_error(M, sizes, v) -> float:
    """``tr(M X⁻¹)`` for ``X = Σ_l v_l Σ_{blocks of size s_l} 1 1ᵀ`` (``v_0 > 0``: the leaves).

    ``M``: the column's matrix, or its :class:`CoarseColumn` for ``sizes[1]``.
    Sherman–Morrison bottom-up as in :mod:`.hierarchical`, with weights: the leaves give
    ``X⁻¹ = I / v_0`` and ``u = X⁻¹1 = 1 / v_0``; a block ``B`` of level ``l`` with children's
    vectors ``g = concat(u_child)``, ``t = 1ᵀg``, updates ``X⁻¹ −= v_l g gᵀ / (1 + v_l t)`` and
    ``u_B = g / (1 + v_l t)``. Levels with ``v_l = 0`` add nothing. Cost ``O(k²/s₁)`` from
    the block sums (computed here in ``O(k²)`` unless given).
    """
    sizes, v = tuple(int(s) for s in sizes), np.asarray(v, dtype=float)
    col = M if isinstance(M, CoarseColumn) else None
    k = col.k if col is not None else len(M)
    if not _nested(k, sizes) or len(v) != len(sizes):
        raise ValueError(f"chain {sizes!r} (weights {len(v)}) is not nested over {k} cells")
    if not v[0] > 0 or (v < 0).any():
        raise ValueError("the leaves need a positive weight and no level a negative one")
    if len(sizes) == 1:
        return (col.trace if col is not None else float(np.trace(M))) / v[0]
    if col is None or col.size != sizes[1]:
        col = CoarseColumn(np.asarray(M, dtype=float), sizes[1])
    return _coarse_error(col, sizes, v)


def _coarse_error(col: CoarseColumn, sizes: tuple, v: np.ndarray) -> float:
    """:func:`weighted_tree_error` from the block sums (no checks: the search's inner loop)."""
    total = col.trace / v[0]
    # level 1: node j holds counts[j] leaves, each with u = 1 / v_0
    den = 1.0 + v[1] * (col.counts / v[0])
    total -= v[1] * float((col.diag / den).sum()) / (v[0] * v[0])
    gamma = (1.0 / v[0]) / den                 # u on each level-1 node (constant there)
    nodes = len(gamma)
    for size, weight in zip(sizes[2:], v[2:]):
        parent = col.first // size
        block = size // sizes[1] if size % sizes[1] == 0 else nodes
        den = 1.0 + weight * np.bincount(parent, weights=col.counts * gamma)   # 1 + v t
        if weight > 0:
            quads = _block_quadratics(col.sums, gamma, min(block, nodes))
            total -= weight * float((quads / den).sum())
        gamma = gamma / den[parent]
    return total


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


def _line_search(f, lo: float, hi: float) -> tuple:
    """``(min, argmin)`` of a scalar function on ``[lo, hi]`` (bounded Brent)."""
    res = so.minimize_scalar(f, bounds=(lo, hi), method="bounded", options={"xatol": 1e-3})
    return float(res.fun), float(res.x)


def best_chain(M: np.ndarray, k: int) -> tuple:
    """A good weighted chain for one column: ``(error, sizes, u)`` with ``u[0] = 1``.

    ``error = (Σu)² tr(M X⁻¹)``, minimised over chains of at most :data:`MAX_CHAIN_LEVELS`
    levels whose sizes come from :func:`chain_sizes`, and their log-weights
    ``z = log(u_l / u_0)``. Greedy: the leaves alone; every ``[1, s]`` by a bounded scalar
    search; then, level by level, every nested one-level extension of the
    :data:`EXTEND_BEST` best chains so far, from the best of several starts (the new
    level's log-weight on a grid — the cost is not unimodal in it — and a neighbouring
    level's weight split between the two, since the valleys run diagonally); the
    :data:`POLISH_BEST` best of each length are refined by Nelder–Mead on all log-weights. A
    heuristic for a non-convex problem; ties go to the fewer levels.
    """
    M = np.ascontiguousarray(M, dtype=float)
    lo, hi = LOG_WEIGHT_RANGE
    cost = _chain_cost(M, lo, hi)
    found = [(float(np.trace(M)), (1,), np.zeros(0))]
    frontier = []
    for s in chain_sizes(k):
        sizes = (1, s)
        value, z = _line_search(lambda t: cost(sizes, np.array([t])), lo, hi)
        frontier.append((value, sizes, np.array([z])))
    found += frontier
    for _ in range(2, MAX_CHAIN_LEVELS):
        frontier = sorted(frontier, key=lambda t: (t[0], t[1]))[:EXTEND_BEST]
        extended = _extend(frontier, k, cost, lo, hi)
        _polish(extended, cost, lo, hi)
        frontier = list(extended.values())
        found += frontier
        if not frontier:
            break
    error, sizes, z = min(found, key=lambda t: (t[0], len(t[1])))
    return error, sizes, np.concatenate([[1.0], np.exp(z)])


def _chain_cost(M: np.ndarray, lo: float, hi: float):
    """``cost(sizes, z) = (Σu)² tr(M X⁻¹)`` of the chain ``sizes`` with log-weights ``z``
    (clipped to ``[lo, hi]``, ``u_0 = 1``); one :class:`CoarseColumn` per first block size,
    built on first use and shared by every chain that starts with it."""
    columns: dict = {}

    def cost(sizes, z) -> float:
        if sizes[1] not in columns:
            columns[sizes[1]] = CoarseColumn(M, sizes[1])
        u = np.exp(np.concatenate([[0.0], np.clip(z, lo, hi)]))
        return float(u.sum() ** 2 * _coarse_error(columns[sizes[1]], sizes, u * u))

    return cost


def _starts(z: np.ndarray, i: int, lo: float, hi: float) -> list:
    """Starting log-weights for a chain given a new level at place ``i`` of ``z``: the new
    level's log-weight on a grid (the cost is not unimodal in it), and a neighbouring level's
    weight split between the two (the valleys run diagonally)."""
    starts = [np.insert(z, i, t) for t in np.arange(lo, hi + 0.5, GRID_STEP)]
    for j in (i - 1, i):                    # old neighbours (indices in z)
        if 0 <= j < len(z):
            for f in (0.2, 0.4, 0.6, 0.8):
                y = np.insert(z, i, z[j] + math.log(f))
                y[j if j < i else j + 1] = z[j] + math.log(1 - f)
                starts.append(y)
    return starts


def _extend(frontier: list, k: int, cost, lo: float, hi: float) -> dict:
    """Every nested one-level extension of the chains in ``frontier``, each at its best
    start (:func:`_starts`): ``{sizes: (cost, sizes, z)}``."""
    extended: dict = {}
    for _, sizes, z in frontier:
        for s in chain_sizes(k):
            new = tuple(sorted(set(sizes) | {s}))
            if s in sizes or new in extended or not _nested(k, new):
                continue
            starts = _starts(z, new.index(s) - 1, lo, hi)     # the new level's place in z
            costs = [cost(new, y) for y in starts]
            at = int(np.argmin(costs))
            extended[new] = (float(costs[at]), new, starts[at])
    return extended


def _polish(extended: dict, cost, lo: float, hi: float) -> None:
    """Refine the :data:`POLISH_BEST` best of ``extended`` by Nelder–Mead on all their
    log-weights, in place (an entry is replaced only when the refinement is better)."""
    for start, new, y in sorted(extended.values(), key=lambda t: (t[0], t[1]))[:POLISH_BEST]:
        simplex = np.vstack([y, y + 0.5 * np.eye(len(y))])
        res = so.minimize(lambda x: cost(new, x), y, method="Nelder-Mead",
                          options={"initial_simplex": simplex, "xatol": 1e-3,
                                   "fatol": 1e-9 * start, "maxfev": 60 * len(y)})
        if res.fun < start:
            extended[new] = (float(res.fun), new, np.clip(res.x, lo, hi))


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

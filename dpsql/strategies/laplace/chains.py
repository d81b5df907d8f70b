"""The chain search of the L1 weighted tree (:mod:`.trees`): nested chains of block sizes on one
column, one weight per level, the error ``tr(M X⁻¹)`` of each from the column's block sums,
and the greedy search over chains and log-weights (:func:`best_chain`). Public inputs only.

Design: Li & Miklau, *Eigen-Design* §3.5 (ε-DP, L1 sensitivity), with the hierarchical
basis's level weights as the design variables (:mod:`dpsql.strategies.laplace.candidates`
describes the tree basis and why its search is a heuristic).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.optimize as so
import scipy.sparse as sp


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


def weighted_tree_error(M, sizes, v) -> float:
    """``tr(M X⁻¹)`` for ``X = Σ_l v_l Σ_{blocks of size s_l} 1 1ᵀ`` (``v_0 > 0``: the leaves).

    ``M``: the column's matrix, or its :class:`CoarseColumn` for ``sizes[1]``.
    Sherman–Morrison bottom-up as in :mod:`.hierarchical`, with weights: the leaves give
    ``X⁻¹ = I / v_0`` and ``u = X⁻¹1 = 1 / v_0``; a block ``B`` of level ``l`` with children's
    vectors ``g = concat(u_child)``, ``t = 1ᵀg``, updates ``X⁻¹ −= v_l g gᵀ / (1 + v_l t)`` and
    ``u_B = g / (1 + v_l t)``. Levels with ``v_l = 0`` add nothing. Cost ``O(k²/s₁)`` from
    the block sums (computed here in ``O(k²)`` unless given); :class:`ChainLevels` evaluates.
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
    return float(ChainLevels(col, sizes).errors(v[None, 1:] / v[0])[0]) / v[0]


class ChainLevels:
    """One chain's :func:`weighted_tree_error` on one :class:`CoarseColumn`, for many weight
    vectors at once (the search's inner loop: the structure is built once per chain).

    In level-1 node space (node ``j``: cells ``[j s₁, (j+1) s₁)``) a level of size ``s``
    groups ``s / s₁`` consecutive nodes (all of them when ``s`` is the whole column), the
    last group possibly shorter. Each level keeps views, never copies, of the block sums
    ``Mc``: the full groups' diagonal blocks (one strided view) and the last group's.
    """

    def __init__(self, col: CoarseColumn, sizes: tuple):
        self.col, self.levels = col, []
        nodes = len(col.counts)
        S = col.sums
        row, item = S.strides
        for size in sizes[2:]:
            block = min(size // sizes[1] if size % sizes[1] == 0 else nodes, nodes)
            full = nodes // block
            a = full * block
            diagonal = np.lib.stride_tricks.as_strided(
                S, shape=(full, block, block), strides=(block * (row + item), row, item),
                writeable=False)
            self.levels.append((block, a, col.counts[:a].reshape(full, block), diagonal,
                                col.counts[a:], S[a:, a:]))

    def errors(self, w: np.ndarray) -> np.ndarray:
        """``tr(M X⁻¹)`` for every row of ``w``: the weights ``v_l / v₀`` of levels 1, 2, …
        relative to the leaves (``m x`` levels − 1; no checks). Sherman–Morrison bottom-up
        as in :func:`weighted_tree_error` with ``v₀ = 1``: the leaves give ``X⁻¹ = I``; level
        1's node ``j`` holds ``counts[j]`` leaves with ``u = 1``; a group ``B`` of a higher
        level with children's vectors ``g``, ``t = 1ᵀg``, subtracts
        ``v_l gᵀ Mc_BB g / (1 + v_l t)`` and divides its ``g`` by ``1 + v_l t``."""
        col = self.col
        den = 1.0 + w[:, :1] * col.counts
        total = col.trace - w[:, 0] * (col.diag / den).sum(axis=1)
        gamma = 1.0 / den                          # u on each level-1 node (constant there)
        m, nodes = gamma.shape
        for (block, a, counts, diagonal, rest, last), weight in zip(self.levels, w[:, 1:].T):
            G = gamma[:, :a].reshape(m, a // block, block)
            t = np.einsum("mgs,gs->mg", G, counts)
            quads = np.einsum("mgs,gst,mgt->mg", G, diagonal, G)
            if a < nodes:                          # the shorter last group
                g = gamma[:, a:]
                t = np.concatenate([t, (g @ rest)[:, None]], axis=1)
                quads = np.concatenate([quads, np.einsum("ms,st,mt->m", g, last, g)[:, None]],
                                       axis=1)
            den = 1.0 + weight[:, None] * t        # 1 + v t
            total = total - weight * (quads / den).sum(axis=1)
            gamma = gamma / np.repeat(den, block, axis=1)[:, :nodes]
        return total


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
    (clipped to ``[lo, hi]``, ``u_0 = 1``), and ``cost(sizes, Z)`` for the rows of a 2-D
    ``Z`` at once (an array). One :class:`CoarseColumn` per first block size and one
    :class:`ChainLevels` per chain, built on first use and kept."""
    columns: dict = {}
    chains: dict = {}

    def cost(sizes, z):
        levels = chains.get(sizes)
        if levels is None:
            if sizes[1] not in columns:
                columns[sizes[1]] = CoarseColumn(M, sizes[1])
            levels = chains[sizes] = ChainLevels(columns[sizes[1]], sizes)
        Z = np.asarray(z, dtype=float)
        u = np.exp(np.minimum(np.maximum(Z.reshape(1, -1) if Z.ndim == 1 else Z, lo), hi))
        total = 1.0                                # Σu, the leaves' u₀ = 1 first
        for j in range(u.shape[1]):
            total = total + u[:, j]
        values = total * total * levels.errors(u * u)
        return float(values[0]) if Z.ndim == 1 else values

    return cost


def _starts(z: np.ndarray, i: int, lo: float, hi: float) -> np.ndarray:
    """Starting log-weights (rows) for a chain given a new level at place ``i`` of ``z``: the
    new level's log-weight on a grid (the cost is not unimodal in it), and a neighbouring
    level's weight split between the two (the valleys run diagonally)."""
    grid = np.arange(lo, hi + 0.5, GRID_STEP)
    base = np.insert(z, i, 0.0)
    starts = [np.tile(base, (len(grid), 1))]
    starts[0][:, i] = grid
    for j in (i - 1, i):                    # old neighbours (indices in z)
        if 0 <= j < len(z):
            y = np.tile(base, (len(_SPLITS), 1))
            y[:, i] = z[j] + _SPLITS[:, 0]
            y[:, j if j < i else j + 1] = z[j] + _SPLITS[:, 1]
            starts.append(y)
    return np.concatenate(starts)


#: the split starts' (log f, log(1 − f)) for f = 0.2, 0.4, 0.6, 0.8
_SPLITS = np.array([(math.log(f), math.log(1 - f)) for f in (0.2, 0.4, 0.6, 0.8)])


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
            costs = cost(new, starts)                          # every start at once
            at = int(np.argmin(costs))
            extended[new] = (float(costs[at]), new, starts[at].copy())
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

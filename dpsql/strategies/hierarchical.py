"""``hierarchical``: a b-ary tree of range counts over each column, branching chosen per batch.

Hay, Rastogi, Miklau & Suciu, *Boosting the accuracy of differentially private histograms
through consistency* (VLDB 2010), §3–4: measure the counts of the nodes of a tree whose
leaves are the cells and whose internal nodes count contiguous ranges, then make the
answers consistent (here: least squares, which is exactly their constrained inference for
complete trees). Qardaji, Yang & Li, *Understanding hierarchical methods for differentially
private histograms* (VLDB 2013), §4, choose the branching factor from the error it yields;
we do the same, exactly, for the batch at hand.

Tree: level ``l`` (``l = 0`` the leaves) has nodes ``[j·b^l, min(n, (j+1)·b^l))``; the top
level is the first with ``b^l >= n`` (one node: the total). No phantom cells: ranges simply
end at ``n``. Candidates for ``b``: ``2 … min(16, n)`` and ``n`` (leaves + total), plus the
plain leaves (the identity) so that a column the tree does not help is left alone.

Privacy: every cell lies in exactly one node per level, so every column of the 0/1 matrix
``A`` has ``L`` ones and the L2 sensitivity is ``√L`` (``L`` = number of levels). With
several columns ``A`` is the Kronecker product of the per-column trees and the
sensitivity is ``Π √L_c`` (see ``kron.py``). The tree contains the leaves, so ``A`` has full
column rank and least squares answers every query (unbiased).

Selection (public inputs only): the expected total squared error is proportional to
``L · tr(V X⁻¹)`` with ``X = AᵀA``. For one tree ``X = Σ_nodes 1_v 1_vᵀ``; adding the nodes
bottom-up, one Sherman–Morrison step each, gives ``X⁻¹ = I − Σ_v g_v g_vᵀ / (1 + t_v)`` over
the internal nodes, where ``g_v = concat(u_c)`` over the children ``c`` of ``v``,
``t_v = 1ᵀg_v``, and ``u_v = X_v⁻¹ 1 = g_v / (1 + t_v)`` (a leaf: ``u = 1``). Hence
``tr(V X⁻¹) = tr(V) − Σ_v g_vᵀ V[v, v] g_v / (1 + t_v)``: ``O(n²)`` per
candidate instead of an ``O(n³)`` Cholesky solve (tests check it against a dense
pseudo-inverse). Several columns: coordinate descent on the full Kronecker error — each
column's ``b`` minimises ``L_c · tr(M_c X_c⁻¹)`` where ``M_c`` is ``V`` contracted with the
other columns' current ``X⁻¹``; sweeps repeat until no choice changes (at most 4), from
two starts (leaves everywhere; a total on every column), keeping the better.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from dpsql.workload.matrix import Plan, WorkloadInfo, make_plan
from dpsql.strategies.kron import check_size, contract, kron_all

#: largest branching factor tried besides b = n
MAX_BRANCHING = 16
#: at most this many coordinate-descent sweeps over the columns
MAX_SWEEPS = 4


def level_sizes(k: int, b: int | None) -> list:
    """Node sizes per level, leaves first: ``[1, b, b², …]`` up to the first ``>= k``."""
    sizes = [1]
    while b is not None and sizes[-1] < k:
        sizes.append(sizes[-1] * b)
    return sizes


def tree_matrix(k: int, b: int | None) -> sp.csr_matrix:
    """The 0/1 tree strategy over ``k`` cells (``b=None``: the leaves only, ``I``)."""
    rows, cols = [], []
    r = 0
    for size in level_sizes(k, b):
        cells = np.arange(k)
        rows.append(r + cells // size)
        cols.append(cells)
        r += -(-k // size)
    data = np.ones(sum(len(c) for c in cols))
    return sp.csr_matrix((data, (np.concatenate(rows), np.concatenate(cols))), shape=(r, k))


def _updates(k: int, b: int | None):
    """Yield ``(size, g, denominators)`` per internal level: ``X⁻¹ = I − Σ g_v g_vᵀ / den_v``.

    ``g`` (length ``k``) is the concatenation of the node vectors ``g_v`` of that level (the
    nodes partition the cells); ``denominators[v] = 1 + t_v``.
    """
    u = np.ones(k)                   # u_c of the current level's nodes, concatenated
    s = np.ones(k)                   # 1ᵀu_c per node of the current level (leaves: 1)
    prev = 1
    for size in level_sizes(k, b)[1:]:
        parent = np.arange(len(s)) // (size // prev)
        s_node = np.bincount(parent, weights=s)
        den = 1.0 + s_node
        yield size, u, den
        u = u / den[np.arange(k) // size]
        s = s_node / den
        prev = size


def _block_quadratics(M: np.ndarray, g: np.ndarray, size: int) -> np.ndarray:
    """``g_vᵀ M[v, v] g_v`` for every node ``v = [j·size, min(k, (j+1)·size))``."""
    k = len(g)
    full = k // size
    out = []
    if full:
        blocks = M[:full * size, :full * size].reshape(full, size, full, size)   # a view
        G = g[:full * size].reshape(full, size)
        out.append(np.einsum("is,isit,it->i", G, blocks, G))
    if full * size < k:
        t = g[full * size:]
        out.append(np.array([t @ M[full * size:, full * size:] @ t]))
    return np.concatenate(out)


def tree_error(M: np.ndarray, b: int | None) -> float:
    """``tr(M X⁻¹)`` for the tree with branching ``b`` over ``len(M)`` cells (exact)."""
    M = np.ascontiguousarray(M, dtype=float)
    total = float(np.trace(M))
    for size, g, den in _updates(len(M), b):
        total -= float((_block_quadratics(M, g, size) / den).sum())
    return total


def tree_gram_inverse(k: int, b: int | None) -> np.ndarray:
    """``(AᵀA)⁻¹`` of the tree over ``k`` cells, dense, from the same closed form."""
    Y = np.eye(k)
    for size, g, den in _updates(k, b):
        for j, start in enumerate(range(0, k, size)):
            t = g[start:start + size]
            Y[start:start + size, start:start + size] -= np.outer(t, t) / den[j]
    return Y


def candidates(k: int) -> list:
    """Branching factors tried on a column of ``k`` parts (``None``: the leaves only)."""
    if k < 2:
        return [None]
    return [None] + sorted(set(range(2, min(MAX_BRANCHING, k) + 1)) | {k})


def _best(M: np.ndarray, k: int) -> tuple:
    """The ``(L · tr(M X⁻¹), b)`` of the best candidate (ties: the earlier candidate)."""
    return min(((len(level_sizes(k, b)) * tree_error(M, b), i, b)
                for i, b in enumerate(candidates(k))), key=lambda t: (t[0], t[1]))[::2]


def _descend(V: np.ndarray, shape: tuple, choice: list) -> tuple:
    """Coordinate descent from ``choice``: each column in turn takes its best ``b`` given
    the others, until a sweep changes nothing. Returns ``(error, branchings)``."""
    d = len(shape)
    choice = list(choice)
    inverse = {c: tree_gram_inverse(k, b) for c, (k, b) in enumerate(zip(shape, choice))}
    error = math.inf
    for _ in range(MAX_SWEEPS):
        changed = False
        for c, k in enumerate(shape):
            M = contract(V, shape, {o: inverse[o] for o in range(d) if o != c})
            others = math.prod(len(level_sizes(shape[o], choice[o])) for o in range(d) if o != c)
            value, b = _best(M, k)
            error = others * value
            if b != choice[c]:
                choice[c], inverse[c], changed = b, tree_gram_inverse(k, b), True
        if not changed or d == 1:
            break
    return float(error), tuple(choice)


def choose_branching(V: np.ndarray, shape: tuple) -> tuple:
    """Per-column branching factors minimising the Kronecker tree's expected error.

    Returns ``(branchings, error)`` where ``error = (Π L_c) · tr(V (AᵀA)⁻¹)`` is the expected
    total squared error divided by ``σ₁²`` (the noise variance at sensitivity 1). One
    column: the exact best candidate. Several: coordinate descent from two starts, the
    leaves everywhere and a total (``b = k``) on every column (a tree on one column only
    pays off for marginals once the other columns are summed too), keeping the better.
    """
    if len(shape) == 1:
        error, b = _best(np.asarray(V, dtype=float), shape[0])
        return (b,), float(error)
    starts = ([None] * len(shape), [k if k > 1 else None for k in shape])
    error, choice = min((_descend(V, shape, start) for start in starts), key=lambda t: t[0])
    return choice, error


def tree_plan(name: str, shape, branching, error: float, l1: bool = False) -> Plan:
    """The plan of uniform b-ary trees per column (one Kronecker factor each) and its notes;
    ``l1``: the branching was chosen for the L1 error (Δ₁ = Π levels) rather than L2."""
    A = kron_all([tree_matrix(k, b) for k, b in zip(shape, branching)])
    levels = tuple(len(level_sizes(k, b)) for k, b in zip(shape, branching))
    shown = tuple("leaves" if b is None else b for b in branching)
    if l1:
        notes = (f"branching {shown} per column (levels {levels}), chosen for L1 sensitivity",
                 f"expected total squared error {error:.6g} (2/epsilon^2) "
                 f"(L1 sensitivity {math.prod(levels)}, squared, included)")
    else:
        notes = (f"branching {shown} per column (levels {levels})",
                 f"expected total squared error {error:.6g} sigma_1^2 "
                 f"(sensitivity^2 {math.prod(levels)} included)")
    return make_plan(name, A, notes)


class HierarchicalStrategy:
    name = "hierarchical"

    def plan(self, workload: WorkloadInfo) -> Plan:
        check_size(self.name, workload)
        branching, error = choose_branching(workload.V, workload.shape)
        return tree_plan(self.name, workload.shape, branching, error)

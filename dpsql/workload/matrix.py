"""The strategy interface: a strategy maps a workload ``W`` to a measurement plan ``A``.

Every strategy is a pure function of public inputs (the workload); none may import the
engine or the kernel. A plan knows its matrix ``A`` (``None`` stands for the identity) and its
L2 sensitivity ``max_j ||A[:, j]||_2`` under add/remove-one-row neighbours (one row moves one
cell count by 1, so ``A x`` moves by one column of ``A``). Li & Miklau, *Eigen-Design*, §2.
"""

from __future__ import annotations

import math
import weakref
from fractions import Fraction
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import scipy.sparse as sp


#: strategy entries are multiples of 2**-QUANTUM_BITS with |entry| <= 1 (see make_plan)
QUANTUM_BITS = 20
#: with such entries, A @ x is exact in float64 while the table has fewer rows than this
EXACT_ROWS = 2 ** (52 - QUANTUM_BITS)


@dataclass(frozen=True)
class Plan:
    """A measurement plan: ``y = A x + noise``, answered by least squares.

    Build it with :func:`make_plan`, which puts ``A`` on the exact grid the kernel needs.
    """

    strategy: str
    n: int                                  # number of cells
    A: sp.csr_matrix | np.ndarray | None    # None: the identity on the n cells
    sensitivity: float                      # L2: largest column norm of A (rounded up)
    integral: bool = True                   # entries on the 2**-20 grid, |entry| <= 1
    notes: tuple = field(default=())
    l1_sensitivity: float = math.nan        # L1: largest column L1 norm of A (exact)

    @property
    def n_measurements(self) -> int:
        return self.n if self.A is None else self.A.shape[0]

    def measure(self, x: np.ndarray) -> np.ndarray:
        """``A x`` (called by the kernel only)."""
        if self.A is None:
            return np.array(x, dtype=np.float64, copy=True)
        return np.asarray(self.A @ x, dtype=np.float64).reshape(-1)


def make_plan(strategy: str, A, notes: tuple = ()) -> Plan:
    """A plan for any real strategy matrix, made exact for the kernel.

    ``A`` is scaled so its largest entry has magnitude 1 (the matrix mechanism's error does
    not depend on the scale of ``A``: σ scales with the sensitivity and ``A⁺`` inversely)
    and rounded to multiples of 2**-20. The rounded matrix *is* the strategy from then on:
    its sensitivity, least squares and error are all computed for it. With entries
    ``m·2**-20``, ``|m| <= 2**20``, and integer counts summing to fewer than 2**32, every
    partial sum of ``A @ x`` is a multiple of 2**-20 below 2**52 in magnitude, so float64
    computes it exactly, in any order: the sampler's rounding argument (noise.py) needs that.
    """
    dense = not sp.issparse(A)
    M = np.asarray(A, dtype=float) if dense else sp.csr_matrix(A, dtype=float)
    data = M if dense else M.data
    if data.size == 0 or not np.all(np.isfinite(data)):
        raise ValueError(f"strategy {strategy!r}: the matrix is empty or not finite")
    top = float(np.abs(data).max())
    if top == 0:
        raise ValueError(f"strategy {strategy!r}: the matrix is zero")
    q = float(2 ** QUANTUM_BITS)
    if dense:
        M = np.round(M / top * q) / q
        M = M[np.any(M != 0, axis=1)]           # rows rounded to zero measure nothing
    else:
        M = M.multiply(1.0 / top).tocsr()
        M.data = np.round(M.data * q) / q
        M.eliminate_zeros()
        M = M[np.diff(M.indptr) > 0]
    return Plan(strategy, M.shape[1], M, exact_l2_sensitivity(M), integral=True, notes=notes,
                l1_sensitivity=exact_l1_sensitivity(M))


def exact_l2_sensitivity(A) -> float:
    """Largest column L2 norm of a matrix on the 2**-20 grid, computed exactly, rounded up."""
    q = 2 ** QUANTUM_BITS
    if sp.issparse(A):
        C = sp.csc_matrix(A)
        best = 0
        for j in range(C.shape[1]):
            col = np.rint(C.data[C.indptr[j]:C.indptr[j + 1]] * q).astype(np.int64)
            best = max(best, int(np.dot(col, col)))  # < 2**62 for fewer than 2**22 rows
    else:
        M = np.rint(np.asarray(A) * q).astype(np.int64)
        best = int((M * M).sum(axis=0, dtype=np.int64).max()) if M.size else 0
    if best == 0:
        return 0.0
    root = math.sqrt(best)                       # then the smallest double with root² >= best
    while Fraction(root) ** 2 < best:
        root = math.nextafter(root, math.inf)
    return root / q                              # exact: q is a power of two


def exact_l1_sensitivity(A) -> float:
    """Largest column L1 norm of a matrix on the 2**-20 grid, computed exactly.

    Under add/remove-one-row neighbours ``A x`` moves by one column of ``A``, so this is the
    L1 sensitivity that Laplace noise is calibrated to (Li & Miklau, Eigen-Design, §3.5).
    The integer column sums are below 2**63 for fewer than 2**42 rows; the result
    ``total / 2**20`` is exact in float64 while ``total < 2**53``, and rounded up otherwise.
    """
    q = 2 ** QUANTUM_BITS
    if sp.issparse(A):
        R = sp.csr_matrix(A)
        sums = np.zeros(R.shape[1], dtype=np.int64)
        np.add.at(sums, R.indices, np.abs(np.rint(R.data * q).astype(np.int64)))
        best = int(sums.max()) if sums.size else 0
    else:
        M = np.abs(np.rint(np.asarray(A) * q).astype(np.int64))
        best = int(M.sum(axis=0, dtype=np.int64).max()) if M.size else 0
    value = float(best)
    if Fraction(value) < best:
        value = math.nextafter(value, math.inf)
    return value / q


def l2_sensitivity(A) -> float:
    """Largest column L2 norm of ``A`` (dense or sparse)."""
    if sp.issparse(A):
        col = np.sqrt(np.asarray(A.multiply(A).sum(axis=0)).reshape(-1))
    else:
        col = np.sqrt((np.asarray(A) ** 2).sum(axis=0))
    return float(col.max()) if col.size else 0.0


class WorkloadInfo:
    """What a strategy may know about a workload: public structure only.

    ``shape`` is the number of parts per used column (cells in C order, first column
    slowest; ``prod(shape) == n``). ``W`` holds the explicit rows when there are any (from
    SQL); a synthetic workload (benchmarks) may give only its Gram matrix ``V = WᵀW`` and
    ``m``. ``V`` is computed once, on first use.
    """

    def __init__(self, n: int, shape: tuple = (), W=None, V=None, m: int | None = None):
        self.n = int(n)
        self.shape = tuple(int(k) for k in shape) if shape else (self.n,)
        if int(np.prod(self.shape, dtype=np.int64)) != self.n:
            raise ValueError(f"shape {self.shape} does not multiply to n = {self.n}")
        self.W = None if W is None else sp.csr_matrix(W, dtype=float)
        if self.W is None and V is None:
            raise ValueError("a workload needs its rows W or its Gram matrix V")
        self._V = None if V is None else np.asarray(V, dtype=float)
        self.m = int(m if m is not None else self.W.shape[0])

    @classmethod
    def from_matrix(cls, W, shape: tuple = ()) -> "WorkloadInfo":
        return cls(W.shape[1], shape, W=W)

    @property
    def V(self) -> np.ndarray:
        """The Gram matrix ``WᵀW`` (dense n x n)."""
        if self._V is None:
            self._V = gram(self.W)
        return self._V


def gram(W) -> np.ndarray:
    """``WᵀW`` (dense n x n) of a sparse ``W``, by the cheaper of two exact routes.

    Ranges and points are short in differences: with ``B[:, a] = W[:, a] − W[:, a−1]`` a
    range row has two entries, and ``W = B S`` (``S`` upper-triangular ones), so ``WᵀW`` is
    ``BᵀB`` cumulated down and across. For integer ``W`` whose partial sums stay below 2**53
    every step is exact integer arithmetic in float64, the same numbers as ``(WᵀW)`` formed
    directly; the cost is ``Σ_r nnz(B_r)² + n²`` instead of ``Σ_r nnz(W_r)²`` (1,024 points
    plus 1,500 random ranges at n = 1,024: 0.6-1.0 s direct, ~0.03 s by differences). The
    route is :func:`gram_route`'s, which the planning model prices too.
    """
    W = sp.csr_matrix(W, dtype=float)
    n = W.shape[1]
    if gram_route(W)[0] == "differences":
        B = (W @ (sp.eye(n, format="csr") - sp.eye(n, k=1, format="csr"))).tocsr()
        B.eliminate_zeros()
        G = (B.T @ B).toarray()
        np.cumsum(G, axis=0, out=G)               # in place: one n x n array at a time
        return np.cumsum(G, axis=1, out=G)
    return np.asarray((W.T @ W).toarray(), dtype=float)


#: the last :func:`gram_route` answer, for the W it was computed on (planning asks once per
#: candidate): one tuple (weak reference to W, answer), replaced whole (thread-safe)
_ROUTE: list = [None]


def gram_route(W) -> tuple[str, float]:
    """``("direct" | "differences", multiply-adds)``: how :func:`gram` forms ``WᵀW``.

    Direct: ``Σ_r nnz(W_r)²``. Differences (integer ``W`` only, when cheaper and exact):
    ``Σ_r nnz(B_r)² + 4n²`` (the product of the differences, and the dense passes: the two
    cumulative sums and the conversion). The difference rows are counted from ``W``'s
    entries in ``O(nnz)`` without forming ``B``: an entry starts a difference unless its left
    neighbour in the row holds the same value, and ends one unless its right neighbour is
    stored (or it is in the last column)."""
    memo = _ROUTE[0]
    if memo is not None and memo[0]() is W:
        return memo[1]
    W = sp.csr_matrix(W, dtype=float) if not sp.isspmatrix_csr(W) else W
    m, n = W.shape
    counts = np.diff(W.indptr)
    direct = float(np.square(counts, dtype=float).sum())
    answer = ("direct", direct)
    if n > 1 and direct > 4.0 * n * n and np.all(W.data == np.rint(W.data)):
        rows, l1 = _difference_rows(W)
        ops = float(np.square(rows, dtype=float).sum()) + 4.0 * n * n
        if ops < direct and float(np.square(l1).sum()) < 2.0 ** 52:
            answer = ("differences", ops)
    try:
        _ROUTE[0] = (weakref.ref(W), answer)
    except TypeError:                             # not weakly referable: no memo
        pass
    return answer


def _difference_rows(W) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``W``, the non-zeros and the L1 norm of ``B_r`` (``B = W (I − shift)``)."""
    if not W.has_canonical_format or not np.all(W.data != 0):
        W = W.copy()
        W.sum_duplicates()                        # canonical: sorted, no repeated indices
        W.eliminate_zeros()
    col, v, ptr = W.indices, W.data, W.indptr
    joined = np.zeros(v.size, dtype=bool)         # the left neighbour is stored
    joined[1:] = col[1:] == col[:-1] + 1
    joined[ptr[:-1][np.diff(ptr) > 0]] = False    # (not across rows)
    starts = ~joined
    starts[1:] |= v[1:] != v[:-1]                 # B[r, col] = v − (stored left neighbour)
    ends = np.ones(v.size, dtype=bool)            # the right neighbour is not stored ...
    ends[:-1] = ~joined[1:]
    ends &= col < W.shape[1] - 1                  # ... and exists: B[r, col + 1] = −v
    at = np.flatnonzero(starts)
    step = np.abs(v[at] - np.where(joined[at], v[np.maximum(at - 1, 0)], 0.0))
    at_row = np.searchsorted(ptr, at, side="right") - 1
    tail = np.flatnonzero(ends)
    tail_row = np.searchsorted(ptr, tail, side="right") - 1
    m = W.shape[0]
    rows = np.bincount(at_row, minlength=m) + np.bincount(tail_row, minlength=m)
    l1 = (np.bincount(at_row, weights=step, minlength=m)
          + np.bincount(tail_row, weights=np.abs(v[tail]), minlength=m))
    return rows, l1


class Strategy(Protocol):
    """What every strategy offers: a name and ``plan(workload)``.

    ``plan`` takes a :class:`WorkloadInfo` and returns a :class:`Plan` built with
    :func:`make_plan` (or the identity). It raises :class:`dpsql.errors.StrategyError` when
    the strategy does not apply (``auto`` then skips it). Pure: public inputs only.
    """

    name: str

    def plan(self, workload: WorkloadInfo) -> Plan: ...

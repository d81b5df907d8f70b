"""Implicit workload operators over many columns: Kronecker blocks and their weighted unions.

A batch over columns ``1..d`` (sizes ``n_i`` = parts per column, cells in C order, first
column slowest, as in :mod:`dpsql.strategies.kron`) is a union of *blocks*; each block is a
Kronecker product ``W_k = F_{k,1} ⊗ … ⊗ F_{k,d}`` of small per-column factors:

- a predicate factor: rows of 0/1 (or weights) over the column's parts (a range, an IN list);
- the identity ``I_n`` for a GROUP BY column;
- ``[I_k | 0]`` for a GROUP BY column whose last ``n - k`` parts (implicit ``other``, NULL) are
  counted by totals but not returned as groups (NOTES, "Cells a GROUP BY does not return");
- a single row of ones for a column the block does not use.

A :class:`UnionWorkload` stacks blocks with *Gram weights* ``w_k``: its Gram matrix is
``V = Σ_k w_k ⊗_i F_{k,i}ᵀ F_{k,i}`` (the form of NOTES, "Kronecker blocks"), so its rows are
``√w_k W_k``. Nothing here allocates an array the size of the full product ``N = Π n_i``
unless ``N`` is at most :data:`MAX_VECTOR_CELLS` (``matvec`` on a full data vector) or the
dense matrix has at most :data:`MAX_DENSE_ENTRIES` entries (``dense``, for tests). Above
those sizes everything works on marginals: a block only ever touches the marginal of the data
on the columns it uses (:meth:`KronBlock.answer`). Public inputs only.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from dpsql.errors import DomainTooLarge

#: largest full product a data vector may have for matvec / rmatvec / marginal of a full x
MAX_VECTOR_CELLS = 1 << 24
#: largest number of entries (rows x cells) ``dense()`` builds
MAX_DENSE_ENTRIES = 1 << 24


def ones_factor(n: int) -> np.ndarray:
    """The factor of a column a block does not use: one row of ones (it sums the column)."""
    return np.ones((1, _size(n)))


def identity_factor(n: int) -> np.ndarray:
    """The factor of a GROUP BY column that returns every one of its ``n`` parts."""
    return np.eye(_size(n))


def grouped_factor(returned: int, excluded: int) -> np.ndarray:
    """``[I_returned | 0]``: a GROUP BY that does not return the last ``excluded`` parts."""
    return np.hstack([np.eye(_size(returned)), np.zeros((returned, int(excluded)))])


@functools.lru_cache(maxsize=256)
def helmert(n: int) -> np.ndarray:
    """The ``(n-1) x n`` Helmert rows: orthonormal, orthogonal to ``1`` (row ``k`` compares
    part ``k`` with the mean of the parts before it). ``HᵀH = I - 11ᵀ/n``. Read-only (cached)."""
    n = _size(n)
    H = np.zeros((n - 1, n))
    for k in range(1, n):
        H[k - 1, :k] = 1.0
        H[k - 1, k] = -float(k)
        H[k - 1] /= math.sqrt(k * (k + 1.0))
    H.setflags(write=False)
    return H


def _size(n) -> int:
    n = int(n)
    if n < 1:
        raise ValueError(f"a column needs at least one part, got {n}")
    return n


def _check_factor(F) -> np.ndarray:
    F = np.array(F, dtype=float, ndmin=2, copy=True)
    if F.ndim != 2 or F.shape[0] < 1 or F.shape[1] < 1 or not np.all(np.isfinite(F)):
        raise ValueError(f"a factor must be a finite non-empty matrix, got shape {F.shape}")
    F.setflags(write=False)
    return F


def apply_along(T: np.ndarray, F: np.ndarray, axis: int) -> np.ndarray:
    """Multiply the tensor ``T`` by the matrix ``F`` along ``axis`` (``T ×_axis F``)."""
    return np.moveaxis(np.tensordot(F, T, axes=([1], [axis])), 0, axis)


def _kron(mats) -> np.ndarray:
    out = np.ones((1, 1))
    for M in mats:
        out = np.kron(out, M)
    return out


@dataclass(frozen=True, eq=False)
class KronBlock:
    """``weight · (F_1 ⊗ … ⊗ F_d)ᵀ(F_1 ⊗ … ⊗ F_d)`` in the Gram; rows ``√weight ⊗ F_i``."""

    factors: tuple
    weight: float = 1.0

    def __post_init__(self):
        factors = tuple(_check_factor(F) for F in self.factors)
        if not factors:
            raise ValueError("a Kronecker block needs at least one column factor")
        weight = float(self.weight)
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"a block weight must be finite and > 0, got {self.weight!r}")
        object.__setattr__(self, "factors", factors)
        object.__setattr__(self, "weight", weight)

    @property
    def sizes(self) -> tuple:
        return tuple(F.shape[1] for F in self.factors)

    @property
    def row_sizes(self) -> tuple:
        return tuple(F.shape[0] for F in self.factors)

    @property
    def shape(self) -> tuple:
        return (math.prod(self.row_sizes), math.prod(self.sizes))

    @property
    def used(self) -> tuple:
        """Columns whose factor is not a single row of ones (the block's clique)."""
        return tuple(i for i, F in enumerate(self.factors)
                     if not (F.shape[0] == 1 and np.all(F == 1.0)))

    def marginal_set(self) -> tuple | None:
        """The attribute set B when the block is the marginal ``Q_B`` (identity on B, ones
        elsewhere), else None."""
        used = self.used
        if all(np.array_equal(self.factors[i], np.eye(self.sizes[i])) for i in used):
            return used
        return None

    def gram_factors(self) -> tuple:
        """``(F_1ᵀF_1, …, F_dᵀF_d)``: the block's Gram is ``weight · ⊗`` of these."""
        return tuple(F.T @ F for F in self.factors)

    def matvec(self, x) -> np.ndarray:
        """``√weight · (⊗F_i) x`` for a full data vector ``x`` (small products only)."""
        T = np.asarray(x, dtype=float).reshape(_full_shape(self.sizes))
        for i, F in enumerate(self.factors):
            T = apply_along(T, F, i)
        return math.sqrt(self.weight) * T.reshape(-1)

    def rmatvec(self, y) -> np.ndarray:
        """``√weight · (⊗F_i)ᵀ y`` (a vector over the full product: small products only)."""
        _full_shape(self.sizes)
        T = np.asarray(y, dtype=float).reshape(self.row_sizes)
        for i, F in enumerate(self.factors):
            T = apply_along(T, F.T, i)
        return math.sqrt(self.weight) * T.reshape(-1)

    def answer(self, marginal: np.ndarray) -> np.ndarray:
        """The block's rows applied to ``x`` given only the marginal of ``x`` on
        :attr:`used` (axes in column order): never touches the full product."""
        used = self.used
        T = np.asarray(marginal, dtype=float)
        if T.shape != tuple(self.sizes[i] for i in used):
            raise ValueError(f"marginal shape {T.shape} does not match the block's columns "
                             f"{used} of sizes {tuple(self.sizes[i] for i in used)}")
        for axis, i in enumerate(used):
            T = apply_along(T, self.factors[i], axis)
        return math.sqrt(self.weight) * T.reshape(-1)

    def dense(self) -> np.ndarray:
        """The explicit matrix ``√weight ⊗F_i`` (refused above MAX_DENSE_ENTRIES entries)."""
        rows, cells = self.shape
        _check_dense(rows, cells)
        return math.sqrt(self.weight) * _kron(self.factors)


def _full_shape(sizes) -> tuple:
    N = math.prod(sizes)
    if N > MAX_VECTOR_CELLS:
        raise DomainTooLarge(
            f"the full product of the columns has {N} cells (sizes {tuple(sizes)}); at most "
            f"{MAX_VECTOR_CELLS} are ever built. Work on marginals (KronBlock.answer, "
            "UnionWorkload.answers) instead of a full data vector")
    return tuple(sizes)


def _check_dense(rows: int, cells: int) -> None:
    if rows * cells > MAX_DENSE_ENTRIES:
        raise DomainTooLarge(
            f"a dense {rows} x {cells} matrix has more than {MAX_DENSE_ENTRIES} entries; "
            "dense() is for small domains (tests). Use the implicit operators")


@dataclass(frozen=True, eq=False)
class UnionWorkload:
    """A weighted stack of Kronecker blocks over the same columns (Gram ``Σ_k w_k ⊗ V_{k,i}``)."""

    columns: tuple
    sizes: tuple
    blocks: tuple

    def __post_init__(self):
        columns = tuple(str(c) for c in self.columns)
        sizes = tuple(_size(n) for n in self.sizes)
        blocks = tuple(self.blocks)
        if len(columns) != len(sizes) or len(set(columns)) != len(columns):
            raise ValueError(f"columns {columns} must be distinct, one per size {sizes}")
        if not blocks:
            raise ValueError("a union workload needs at least one block")
        for k, b in enumerate(blocks):
            if not isinstance(b, KronBlock) or b.sizes != sizes:
                raise ValueError(f"block {k} must be a KronBlock over sizes {sizes}")
        object.__setattr__(self, "columns", columns)
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "blocks", blocks)

    @property
    def N(self) -> int:
        return math.prod(self.sizes)

    @property
    def shape(self) -> tuple:
        return (sum(b.shape[0] for b in self.blocks), self.N)

    def cliques(self) -> tuple:
        """The distinct sets of columns the blocks use, largest first."""
        found = {b.used for b in self.blocks}
        return tuple(sorted(found, key=lambda c: (-len(c), c)))

    def gram_factors(self) -> list:
        """``[(w_k, (V_{k,1}, …, V_{k,d}))]``: ``V = Σ_k w_k ⊗_i V_{k,i}``."""
        return [(b.weight, b.gram_factors()) for b in self.blocks]

    def matvec(self, x) -> np.ndarray:
        return np.concatenate([b.matvec(x) for b in self.blocks])

    def rmatvec(self, y) -> np.ndarray:
        _full_shape(self.sizes)
        y = np.asarray(y, dtype=float).reshape(-1)
        if y.size != self.shape[0]:
            raise ValueError(f"rmatvec needs {self.shape[0]} values, got {y.size}")
        out, start = np.zeros(self.N), 0
        for b in self.blocks:
            out += b.rmatvec(y[start:start + b.shape[0]])
            start += b.shape[0]
        return out

    def answers(self, data) -> np.ndarray:
        """``W x`` from a full ``x`` (small products) or a dict of marginals (:func:`marginal`)."""
        return np.concatenate([b.answer(marginal(data, b.used, self.sizes)) for b in self.blocks])

    def dense(self) -> np.ndarray:
        _check_dense(self.shape[0], self.N)
        return np.vstack([b.dense() for b in self.blocks])


def marginal(data, cols, sizes) -> np.ndarray:
    """The marginal of the data on the columns ``cols`` (axes in increasing column order).

    ``data`` is either the full data vector (small products only) or a dict mapping sorted
    tuples of column indices to marginals on them (arrays shaped by those columns' sizes);
    the smallest stored superset of ``cols`` is summed down.
    """
    cols = tuple(sorted(int(c) for c in cols))
    sizes = tuple(int(n) for n in sizes)
    if not isinstance(data, dict):
        T = np.asarray(data, dtype=float).reshape(_full_shape(sizes))
        return T.sum(axis=tuple(i for i in range(len(sizes)) if i not in cols))
    supersets = [k for k in data if set(cols) <= set(k)]
    if not supersets:
        raise ValueError(f"no marginal given covers the columns {cols}; have {sorted(data)}")
    key = min(supersets, key=lambda k: (math.prod(sizes[i] for i in k), k))
    T = np.asarray(data[key], dtype=float)
    if T.shape != tuple(sizes[i] for i in key):
        raise ValueError(f"marginal {key} has shape {T.shape}, expected "
                         f"{tuple(sizes[i] for i in key)}")
    return T.sum(axis=tuple(a for a, i in enumerate(key) if i not in cols))


def marginal_workload(columns, sizes, cliques, weights=None) -> UnionWorkload:
    """The union of marginals ``Q_B`` (identity on B, ones elsewhere) for B in ``cliques``."""
    sizes = tuple(_size(n) for n in sizes)
    cliques = [tuple(sorted(int(i) for i in B)) for B in cliques]
    weights = [1.0] * len(cliques) if weights is None else [float(w) for w in weights]
    if len(weights) != len(cliques):
        raise ValueError(f"{len(weights)} weights for {len(cliques)} marginals")
    blocks = [KronBlock(tuple(identity_factor(n) if i in B else ones_factor(n)
                              for i, n in enumerate(sizes)), w)
              for B, w in zip(cliques, weights)]
    return UnionWorkload(tuple(columns), sizes, tuple(blocks))

"""``fourier``: measure the Fourier coefficients the workload needs (marginal workloads).

Barak, Chaudhuri, Dwork, Kale, McSherry & Talwar, *Privacy, accuracy, and consistency too: a
holistic solution to contingency table release* (PODS 2007), §4: a marginal over the columns
``S`` depends only on the Fourier coefficients supported on subsets of ``S``, so releasing
those few coefficients (noisily) answers every such marginal, consistently.

Basis: per column of ``k`` parts an orthonormal real basis whose first vector is constant —
the Walsh–Hadamard basis when ``k`` is a power of two (the Fourier basis of ``{0,1}^h``, as in
the paper) and the DCT-II basis otherwise. The product basis vectors are
``f_j = f_{1,j_1} ⊗ … ⊗ f_{d,j_d}``. Coefficient ``j`` is *needed* when
``f_jᵀ V f_j > 1e-9 · tr(V) / n`` (``‖W f_j‖²``: the workload sees it); all the quadratic forms
come from one separable transform ``F V Fᵀ`` (fast Walsh–Hadamard / FFT-based DCT along
each axis: ``O(n² Σ log k_c)``).

Exact rows: the kernel needs entries on the 2**-20 grid (``make_plan``). Every basis vector
is scaled to max |entry| 1 (the constant vector becomes all ones, Hadamard rows ±1 exactly)
and DCT vectors are rounded to ``2^-q`` with ``q = 20 // (number of DCT columns)``, so the
product rows are exact and ``make_plan`` changes nothing. Rounding moves a DCT vector off
``1^⊥``, so on DCT columns the kept set is closed downwards: a kept ``j`` with ``j_c ≠ 0``
brings in every coefficient with any value on column ``c`` (same values elsewhere). The
kept rows then span exactly the span of the exact orthonormal ``f_j`` they stand for (per
pattern ``⊗ R^{k_c} ⊗ 1 …``), which we check contains the workload's row space: the
least-squares residual of ``V`` on the kept coefficients, ``‖(I − P) V‖_F``, must be below
``1e-8 ‖V‖_F`` (else StrategyError). For marginal workloads the closure adds nothing.

Privacy: ``y = A x + N(0, σ² I)`` with σ calibrated to the L2 sensitivity of ``A``, its
largest column norm, computed exactly by ``make_plan`` (for ``k`` a power of two and every
coefficient kept, each column of the ±1 matrix has norm ``√n``). Least squares is
post-processing.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.fft
import scipy.linalg

from dpsql.errors import StrategyError
from dpsql.workload.matrix import QUANTUM_BITS, Plan, WorkloadInfo, make_plan
from dpsql.strategies.kron import check_size

#: a coefficient is needed when f_jᵀ V f_j exceeds this times tr(V) / n
NEEDED = 1e-9
#: the kept coefficients must explain V up to this relative Frobenius residual
RESIDUAL = 1e-8
#: fewest bits a rounded DCT vector may keep (more DCT columns than 20 // this: refuse)
MIN_BITS = 4


def _power_of_two(k: int) -> bool:
    return k >= 1 and k & (k - 1) == 0


def orthonormal_basis(k: int) -> np.ndarray:
    """Rows: the orthonormal basis of column size ``k`` (row 0 constant)."""
    if _power_of_two(k):
        return scipy.linalg.hadamard(k).astype(float) / math.sqrt(k)
    return scipy.fft.dct(np.eye(k), type=2, norm="ortho", axis=0)


def _transform(T: np.ndarray, axis: int, k: int) -> np.ndarray:
    """Apply the orthonormal basis of size ``k`` (rows) along ``axis`` of ``T``."""
    if _power_of_two(k):                      # fast Walsh–Hadamard: h butterflies
        shape = T.shape
        h = int(math.log2(k))
        T = T.reshape(shape[:axis] + (2,) * h + shape[axis + 1:])
        for bit in range(h):
            a = axis + bit
            lo, hi = np.take(T, 0, axis=a), np.take(T, 1, axis=a)
            T = np.stack([lo + hi, lo - hi], axis=a)
        return T.reshape(shape) / math.sqrt(k)
    return scipy.fft.dct(T, type=2, norm="ortho", axis=axis)


def scaled_rows(k: int, bits: int) -> tuple:
    """The basis rows scaled to max |entry| 1: ``(rounded to 2^-bits, exact)``.

    Hadamard rows are ±1 already; only DCT rows move. Weyl's inequality keeps the rounded
    basis invertible: the exact scaled rows are orthogonal with norms ``>= min_norm``, so
    rounding errors of Frobenius norm below ``min_norm`` cannot make it singular.
    """
    F = orthonormal_basis(k)
    F = F / np.abs(F).max(axis=1, keepdims=True)
    if _power_of_two(k):
        return np.rint(F), F
    q = 2.0 ** bits
    B = np.round(F * q) / q
    min_norm = float(np.sqrt((F ** 2).sum(axis=1)).min())
    if float(np.linalg.norm(B - F)) >= 0.5 * min_norm:
        raise StrategyError(f"the fourier strategy's rounded basis for a column of {k} "
                            "parts is too coarse to be invertible; use another strategy")
    return B, F


def coefficient_energies(V: np.ndarray, shape: tuple) -> np.ndarray:
    """``F V Fᵀ`` for the product basis ``F`` (as an ``n x n`` matrix, coefficient order C)."""
    d = len(shape)
    T = np.asarray(V, dtype=float).reshape(tuple(shape) * 2)
    for c, k in enumerate(shape):
        T = _transform(T, c, k)
        T = _transform(T, d + c, k)
    n = int(np.prod(shape, dtype=np.int64))
    return T.reshape(n, n)


def close_downwards(keep: np.ndarray, shape: tuple) -> np.ndarray:
    """On every DCT column ``c``: a kept ``j`` with ``j_c ≠ 0`` keeps all values of ``j_c``."""
    keep = keep.reshape(shape).copy()
    for c, k in enumerate(shape):
        if _power_of_two(k) or k == 1:
            continue
        nonzero = np.take(keep, np.arange(1, k), axis=c).any(axis=c, keepdims=True)
        keep = keep | nonzero                 # broadcast over every value of column c
    return keep.reshape(-1)


def fourier_rows(shape: tuple, keep: np.ndarray) -> np.ndarray:
    """The kept product rows ``⊗_c B_c[j_c]`` (dense, exact on the 2**-20 grid)."""
    dct_columns = sum(1 for k in shape if not _power_of_two(k))
    bits = QUANTUM_BITS // max(1, dct_columns)
    if dct_columns and bits < MIN_BITS:
        raise StrategyError(
            f"the fourier strategy cannot build exact rows for {dct_columns} columns whose "
            "sizes are not powers of two; use another strategy")
    index = np.unravel_index(np.flatnonzero(keep), shape)
    A = np.ones((len(index[0]), 1))
    for c, k in enumerate(shape):
        B, _ = scaled_rows(k, bits)
        A = (A[:, :, None] * B[index[c]][:, None, :]).reshape(len(index[0]), -1)
    return A


class FourierStrategy:
    name = "fourier"

    def plan(self, workload: WorkloadInfo) -> Plan:
        check_size(self.name, workload)
        shape, n, V = workload.shape, workload.n, workload.V
        trace = float(np.trace(V))
        if not trace > 0:
            raise StrategyError("the fourier strategy cannot measure a batch whose queries "
                                "select no cell; use strategy='identity'")
        coef = coefficient_energies(V, shape)
        needed = np.diag(coef) > NEEDED * trace / n
        keep = close_downwards(needed, shape)
        residual = math.sqrt(float((coef[~keep] ** 2).sum()))
        if residual > RESIDUAL * float(np.linalg.norm(V)):
            raise StrategyError(
                "the fourier strategy's needed coefficients do not span this batch's queries "
                f"(relative residual {residual / float(np.linalg.norm(V)):.1e}); use another "
                "strategy")
        A = fourier_rows(shape, keep)
        notes = (f"{int(needed.sum())} of {n} Fourier coefficients needed, "
                 f"{int(keep.sum())} measured",)
        return make_plan(self.name, A, notes)

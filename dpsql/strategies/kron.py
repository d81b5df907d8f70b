"""Kronecker helpers shared by the structured strategies (hierarchical, wavelet, fourier).

A domain with several used columns has cells in C order (first column slowest), so a
strategy built per column is the Kronecker product ``A = A_1 ⊗ … ⊗ A_d`` of the columns'
strategies. Three facts make such plans cheap to reason about (Li & Miklau, Eigen-Design
§2; McKenna et al., HDMM §4, for the idea — no code is taken from either):

- sensitivity: column ``(i_1, …, i_d)`` of ``A`` is the Kronecker product of the columns
  ``A_c[:, i_c]``, so its L2 norm is the product of theirs and the largest column norm is
  the product of the per-column largest norms;
- Gram: ``AᵀA = ⊗ A_cᵀA_c``, so ``(AᵀA)⁻¹ = ⊗ (A_cᵀA_c)⁻¹``;
- error: ``tr(V ⊗ Y_c)`` is ``V`` viewed as a tensor with axes ``(i_1…i_d, j_1…j_d)``,
  contracted with each ``Y_c`` over its pair of axes (``O(n²)`` work per column, never an
  ``n x n`` Kronecker product).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dpsql.errors import StrategyError
from dpsql.workload.matrix import WorkloadInfo

#: largest number of cells for which the structured strategies do dense n x n work
MAX_CELLS = 8192


def check_size(name: str, workload: WorkloadInfo) -> None:
    """Refuse domains too large for dense ``n x n`` work (before ``V`` is ever formed)."""
    if workload.n > MAX_CELLS:
        raise StrategyError(
            f"strategy {name!r} works with dense {workload.n} x {workload.n} matrices; it "
            f"supports at most {MAX_CELLS} cells. Use strategy='identity' or coarser "
            "predicates (fewer cells)")


def contract(V: np.ndarray, shape: tuple, factors: dict) -> np.ndarray:
    """Contract ``V`` (as a tensor over ``shape x shape``) with ``factors[c]`` on column ``c``.

    ``factors`` maps a column index to a ``k_c x k_c`` matrix ``Y_c``; the result is the
    matrix over the columns left out (``1 x 1`` if none is): the entry ``(I, J)`` of the
    result is ``Σ V[(I, i), (J, j)] · Π_c Y_c[i_c, j_c]``. With every column contracted it
    is ``tr(V (⊗ Y_c)ᵀ)``, which equals ``tr(V ⊗ Y_c)`` for symmetric ``Y_c``.
    """
    d = len(shape)
    T = np.asarray(V, dtype=float).reshape(tuple(shape) + tuple(shape))
    left = list(range(d))
    for c in sorted(factors, reverse=True):
        p, r = left.index(c), len(left)
        T = np.tensordot(T, np.asarray(factors[c], dtype=float), axes=([p, p + r], [0, 1]))
        left.remove(c)
    size = int(np.prod([shape[c] for c in left], dtype=np.int64))
    return np.asarray(T).reshape(size, size)


def kron_all(mats: list) -> sp.csr_matrix:
    """``mats[0] ⊗ mats[1] ⊗ …`` as a sparse CSR matrix (first column slowest, C order)."""
    out = sp.csr_matrix(mats[0], dtype=float)
    for M in mats[1:]:
        out = sp.kron(out, sp.csr_matrix(M, dtype=float), format="csr")
    return out


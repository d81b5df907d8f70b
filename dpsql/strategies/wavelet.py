"""``wavelet``: the Haar wavelet strategy (Privelet), Kronecker over the used columns.

Xiao, Wang & Gehrke, *Differential privacy via wavelet transforms* (ICDE 2010), §4 (the
Haar wavelet transform of a 1-D histogram) and §5 (multi-dimensional: the transform applied
along every dimension, i.e. a Kronecker product). As in Li & Miklau's comparisons
(*Eigen-Design*, §5, the "wavelet" baseline) the matrix mechanism uses the unnormalised
0/±1 Haar matrix and least squares; the weights Privelet chooses by hand are not needed,
because least squares combines the measurements optimally for the given rows.

Haar matrix over ``N = 2^h >= k`` cells: the total, then for every dyadic block
``[s, s + 2t)`` of ``N`` (``t = N/2, N/4, …, 1``) the row ``+1`` on ``[s, s + t)`` and ``−1`` on
``[s + t, s + 2t)``. For ``k`` cells that are not a power of two we keep the first ``k``
columns of that matrix and drop the rows that became zero: no phantom cells.

Privacy: every cell lies in the total and in exactly one block per level (with ``±1``), so
every column of ``A`` has ``h + 1`` entries of magnitude 1: L2 sensitivity ``√(h + 1)``, and
``Π_c √(h_c + 1)`` for the Kronecker product over several columns (see ``kron.py``). The
``N x N`` Haar matrix is invertible and the kept columns are ``k`` of its columns, so ``A`` has
full column rank: least squares answers every query, unbiased, whatever the workload.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from dpsql.workload.matrix import Plan, WorkloadInfo, make_plan
from dpsql.strategies.kron import check_size, kron_all


def haar_height(k: int) -> int:
    """``h`` with ``2^h`` the smallest power of two ``>= k``."""
    return (k - 1).bit_length()


def haar_matrix(k: int) -> sp.csr_matrix:
    """The 0/±1 Haar matrix of ``2^h >= k`` cells restricted to its first ``k`` columns."""
    N = 2 ** haar_height(k)
    rows, cols, vals = [np.zeros(k, dtype=np.int64)], [np.arange(k)], [np.ones(k)]
    r = 1
    t = N // 2
    while t >= 1:
        for s in range(0, k, 2 * t):         # blocks starting past k would be all zero
            left = np.arange(s, min(s + t, k))
            right = np.arange(s + t, min(s + 2 * t, k))
            rows.append(np.full(len(left) + len(right), r))
            cols.append(np.concatenate([left, right]))
            vals.append(np.concatenate([np.ones(len(left)), -np.ones(len(right))]))
            r += 1
        t //= 2
    return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                         shape=(r, k))


class WaveletStrategy:
    name = "wavelet"

    def plan(self, workload: WorkloadInfo) -> Plan:
        check_size(self.name, workload)
        shape = workload.shape
        A = kron_all([haar_matrix(k) for k in shape])
        heights = tuple(haar_height(k) for k in shape)
        notes = (f"Haar over {tuple(2 ** h for h in heights)} (padded) cells per column, "
                 f"sensitivity^2 {math.prod(h + 1 for h in heights)}",)
        return make_plan(self.name, A, notes)

"""Standard synthetic workloads (public structure only), for benchmarks, tests and users.

Range workloads are given by their Gram matrix ``V = WᵀW`` in closed form, so that all
n(n+1)/2 range queries over thousands of cells never have to be materialised.
"""

from __future__ import annotations

import numpy as np

from dpsql.workload.matrix import WorkloadInfo


def all_range_gram(n: int) -> np.ndarray:
    """``V`` of all ranges [a, b] over n ordered cells: ``V[i,j] = (min+1)·(n − max)``."""
    i = np.arange(n)
    return (np.minimum.outer(i, i) + 1.0) * (n - np.maximum.outer(i, i))


def all_range(n: int) -> WorkloadInfo:
    """All n(n+1)/2 range queries over n cells (Gram matrix only)."""
    return WorkloadInfo(n, (n,), V=all_range_gram(n), m=n * (n + 1) // 2)


def prefix(n: int) -> WorkloadInfo:
    """The n prefix (CDF) queries [0, b] over n cells (Gram matrix only)."""
    i = np.arange(n)
    return WorkloadInfo(n, (n,), V=(n - np.maximum.outer(i, i)).astype(float), m=n)


def range_rows(n: int) -> np.ndarray:
    """The explicit 0/1 rows of all ranges over n cells (small n only)."""
    i = np.arange(n)
    return np.array([((a <= i) & (i <= b)).astype(float)
                     for a in range(n) for b in range(a, n)])

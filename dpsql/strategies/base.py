"""The strategy interface: a strategy maps a workload ``W`` to a measurement plan ``A``.

Every strategy is a pure function of public inputs (the workload); none may import the
engine or the kernel. A plan knows its matrix ``A`` (``None`` stands for the identity) and its
L2 sensitivity ``max_j ||A[:, j]||_2`` under add/remove-one-row neighbours (one row moves one
cell count by 1, so ``A x`` moves by one column of ``A``). Li & Miklau, *Eigen-Design*, §2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True)
class Plan:
    """A measurement plan: ``y = A x + noise``, answered by least squares."""

    strategy: str
    n: int                                  # number of cells
    A: sp.csr_matrix | np.ndarray | None    # None: the identity on the n cells
    sensitivity: float                      # L2: largest column norm of A
    integral: bool = True                   # A has integer entries, so A @ x is exact
    notes: tuple = field(default=())

    @property
    def n_measurements(self) -> int:
        return self.n if self.A is None else self.A.shape[0]

    def measure(self, x: np.ndarray) -> np.ndarray:
        """``A x`` (called by the kernel only)."""
        if self.A is None:
            return np.array(x, dtype=np.float64, copy=True)
        return np.asarray(self.A @ x, dtype=np.float64).reshape(-1)


def l2_sensitivity(A) -> float:
    """Largest column L2 norm of ``A`` (dense or sparse)."""
    if sp.issparse(A):
        col = np.sqrt(np.asarray(A.multiply(A).sum(axis=0)).reshape(-1))
    else:
        col = np.sqrt((np.asarray(A) ** 2).sum(axis=0))
    return float(col.max()) if col.size else 0.0


class Strategy(Protocol):
    """What every strategy offers: a name and ``plan(W)``."""

    name: str

    def plan(self, W: sp.csr_matrix) -> Plan: ...

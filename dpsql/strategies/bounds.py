"""Lower bounds on the error of any matrix-mechanism strategy. Public inputs only.

``svdb`` is the singular value bound of Li & Miklau (*Optimal error of query sets under the
differentially private matrix mechanism*, ICDT 2013; restated in Eigen-Design §3): for a
workload with Gram matrix ``V = WᵀW`` over ``n`` cells, every strategy ``A`` satisfies

    ‖A‖₂² · tr(V (AᵀA)⁺)  >=  (Σᵢ √λᵢ(V))² / n,

``‖A‖₂`` its L2 sensitivity (largest column norm). Multiplied by the Gaussian mechanism's
``σ²`` per unit of sensitivity, it bounds the total squared error of every strategy; ``explain``
reports a plan's ratio to it. It is the value of the COA dual (NOTES, Yuan et al. §3) at uniform
weights, so the optimum of ``min tr(V X⁻¹) s.t. diag(X) = 1`` always lies at or above it.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as la


def svdb(V, n: int | None = None) -> float:
    """``(Σᵢ √λᵢ)² / n`` over the eigenvalues ``λᵢ`` of the Gram matrix ``V`` (dense, n x n).

    Tiny negative eigenvalues (rounding in a positive semidefinite ``V``) count as 0. ``n``
    defaults to the size of ``V``; it is the number of cells, including cells no query uses.
    """
    V = np.asarray(V, dtype=float)
    if V.ndim != 2 or V.shape[0] != V.shape[1]:
        raise ValueError(f"svdb needs a square Gram matrix, got shape {V.shape}")
    n = V.shape[0] if n is None else int(n)
    if n < 1 or n < V.shape[0]:
        raise ValueError(f"svdb: n = {n} must be at least the size of V ({V.shape[0]})")
    if not np.all(np.isfinite(V)):
        raise ValueError("svdb: the Gram matrix has non-finite entries")
    if V.size == 0:
        return 0.0
    lam = la.eigvalsh((V + V.T) / 2, check_finite=False)
    return svdb_from_eigenvalues(lam, n)


def svdb_from_eigenvalues(eigenvalues, n: int) -> float:
    """The same bound from eigenvalues of ``V`` already computed (negatives count as 0)."""
    lam = np.clip(np.asarray(eigenvalues, dtype=float), 0.0, None)
    return float(np.sqrt(lam).sum() ** 2 / int(n))

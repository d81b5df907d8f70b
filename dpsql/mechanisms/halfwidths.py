"""What a selection reports besides its standard errors, from public inputs only: the 95%
interval half-widths of the answers, and the singular value bound no strategy can beat.

The singular value bound (svdb) gives the smallest total error of any strategy:
``P · svdb(W)`` with ``P`` the variance at sensitivity 1. For Laplace, ``Δ₁ ≥ Δ₂`` column by
column, so ``2 (Δ₁/ε)² tr(V (AᵀA)⁻¹) ≥ (2/ε²) svdb``: the same bound holds with
``P = 2/ε²``.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from dpsql import cancel
from dpsql.store import selection_cache
from dpsql.inference.least_squares import LeastSquares
from dpsql.noise.gaussian import calibrate_with_rounding
from dpsql.store.results import Z95, Explanation
from dpsql.sql.compile import Workload
from dpsql.strategies import WorkloadInfo, bounds


def interval_halfwidths(con, expl: Explanation, solver: LeastSquares,
                        workload: Workload) -> np.ndarray:
    """Half-widths of the 95% intervals of the answers (public: no data).

    Gaussian noise: the answers' errors are Gaussian, so ``z_0.975 · stderr``. Laplace noise:
    each answer's error is ``Σ_k c_k L_k`` with ``c`` its row of ``W A⁺`` and ``L_k`` iid
    Laplace(b); :func:`dpsql.inference.intervals.laplace_interval_halfwidth` bounds its 95% quantile.
    Since ``L_k = b · Laplace(1)``, the half-width is ``b`` times the one at ``b = 1``,
    which depends on ``W`` and the plan only: it is computed once per (plan, workload) and
    kept in the selection cache (``con``), so a repeated release does not redo it.
    """
    if expl.mechanism != "laplace":
        return Z95 * expl.stderr
    W = workload.W
    units, name = None, None
    if con is not None and solver.key is not None:
        name = selection_cache.halfwidth_key(solver.key, selection_cache.cached_hash(workload),
                                             Z95)
        units = selection_cache.load_units(con, name, W.shape[0])
    if units is None:
        from dpsql.inference.intervals import laplace_interval_halfwidth

        units = _identity_halfwidths(W) if solver.plan.A is None else None
        step = max(1, int(4e7 // max(1, solver.plan.n_measurements)))  # ≤ 320 MB per chunk
        for start in range(0, W.shape[0] if units is None else 0, step):
            cancel.check()
            if start == 0:
                units = np.empty(W.shape[0])
            C = solver.coefficients(W[start:start + step])
            units[start:start + step] = laplace_interval_halfwidth(C, 1.0)
        if name is not None:
            selection_cache.store_units(con, name, units)
    return units * float(expl.sigma)


def _identity_halfwidths(W) -> np.ndarray | None:
    """Under the identity plan a 0/1 row's coefficients are its k ones, so its half-width
    (at b = 1) depends on k alone: one computation per distinct k instead of densifying
    every row (a CUBE over a million cells), or None when ``W`` is not 0/1."""
    from dpsql.inference.intervals import laplace_interval_halfwidth

    W = sp.csr_matrix(W)
    if W.nnz and not np.all(W.data == 1.0):
        return None
    counts = np.diff(W.indptr)
    units = np.zeros(W.shape[0])
    for k in np.unique(counts[counts > 0]):
        units[counts == k] = laplace_interval_halfwidth(np.ones((1, int(k))), 1.0)[0]
    return units


def svdb(info: WorkloadInfo) -> float:
    """Singular value bound on ``tr(V (AᵀA)⁻¹)·||A||²`` (:func:`strategies.bounds.svdb`).

    With few queries the eigenvalues come from the m x m matrix ``W Wᵀ`` (same non-zero
    spectrum), else from ``V``.
    """
    if info.W is not None and info.W.shape[0] < info.n:
        lam = np.linalg.eigvalsh((info.W @ info.W.T).toarray())
        return bounds.svdb_from_eigenvalues(lam, info.n)
    return bounds.svdb(info.V, info.n)


def bound_rmse(family: str, eps, dlt, calibration: str, bound_total: float,
               n_queries: int) -> float:
    """The RMSE no strategy of ``family`` can beat (the variance at sensitivity 1 × svdb)."""
    if family == "laplace":
        from dpsql.noise.laplace import laplace_scale

        b = laplace_scale(eps, 1.0, 1)
        variance = 2.0 * b * b
    else:
        variance = calibrate_with_rounding(float(eps), float(dlt), 1.0, 1, calibration) ** 2
    return math.sqrt(variance * bound_total / max(1, n_queries))

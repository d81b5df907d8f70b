"""Least-squares inference and exact error factors for a measurement plan. Public inputs only.

For ``y = A x + N(0, σ² I)`` the least-squares estimate is ``x̂ = A⁺ y`` and the answers are
``W x̂``. When every row of ``W`` lies in the row space of ``A`` these answers are unbiased
with covariance ``σ² W (AᵀA)⁺ Wᵀ`` (Li & Miklau, Eigen-Design §2). The *error factors* are
the diagonal of ``W (AᵀA)⁺ Wᵀ``: per-answer variance in units of σ².

The identity plan has closed forms (``x̂ = y``; factor = ``||W_i||²``). Other plans use one
thin SVD ``A = U S Vᵀ``: ``x̂ = V S⁻¹ Uᵀ y`` and ``W (AᵀA)⁺ Wᵀ = (W V S⁻¹)(W V S⁻¹)ᵀ``.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .errors import StrategyError
from .strategies.base import Plan

#: largest p * n * min(p, n) for which a dense SVD of A is attempted (about 10 s on 2 cores)
MAX_SVD_WORK = 2e10


class LeastSquares:
    """The least-squares solver of one plan, with its factorisation computed once."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self._svd = None
        if plan.A is not None:
            p, n = plan.A.shape
            if float(p) * n * min(p, n) > MAX_SVD_WORK:
                raise StrategyError(
                    f"strategy {plan.strategy!r}: a {p} x {n} strategy is too large for dense "
                    "least squares here; use strategy='identity' or a smaller batch")
            dense = plan.A.toarray() if sp.issparse(plan.A) else np.asarray(plan.A, float)
            U, s, Vt = np.linalg.svd(dense, full_matrices=False)
            tol = s.max(initial=0.0) * max(dense.shape) * np.finfo(float).eps
            keep = s > tol
            self._svd = (U[:, keep], s[keep], Vt[keep])

    def _check_support(self, W) -> None:
        """Every query must be estimable: its row lies in the row space of A."""
        if self._svd is None:
            return
        _, _, Vt = self._svd
        Wd = W.toarray() if sp.issparse(W) else np.asarray(W, float)
        resid = Wd - (Wd @ Vt.T) @ Vt
        scale = max(1.0, float(np.abs(Wd).max(initial=0.0)))
        if np.abs(resid).max(initial=0.0) > 1e-8 * scale * max(1, Wd.shape[1]):
            raise StrategyError(
                f"strategy {self.plan.strategy!r} does not measure enough to answer every "
                "query of this batch (a query lies outside the strategy's row space)")

    def error_factors(self, W) -> np.ndarray:
        """Diagonal of ``W (AᵀA)⁺ Wᵀ``: per-answer variance divided by σ²."""
        if self._svd is None:
            Ws = sp.csr_matrix(W)
            return np.asarray(Ws.multiply(Ws).sum(axis=1), dtype=float).reshape(-1)
        self._check_support(W)
        _, s, Vt = self._svd
        B = np.asarray(W @ Vt.T) / s
        return (B ** 2).sum(axis=1)

    def answers(self, W, y: np.ndarray) -> np.ndarray:
        """``W x̂`` with ``x̂ = A⁺ y``."""
        if self._svd is None:
            return np.asarray(W @ y, dtype=float).reshape(-1)
        U, s, Vt = self._svd
        x_hat = Vt.T @ ((U.T @ y) / s)
        return np.asarray(W @ x_hat, dtype=float).reshape(-1)

"""Least-squares inference and exact error factors for a measurement plan. Public inputs only.

For ``y = A x + N(0, σ² I)`` the least-squares estimate is ``x̂ = A⁺ y`` and the answers are
``W x̂``. When every row of ``W`` lies in the row space of ``A`` these answers are unbiased
with covariance ``σ² W (AᵀA)⁺ Wᵀ`` (Li & Miklau, Eigen-Design §2). The *error factors* are
the diagonal of ``W (AᵀA)⁺ Wᵀ``: per-answer variance in units of σ².

Three paths, chosen by the plan:

- identity: ``x̂ = y``; factor = ``||W_i||²``;
- full column rank (most optimised strategies): Cholesky ``AᵀA = R Rᵀ``; then
  ``x̂ = (AᵀA)⁻¹ Aᵀ y`` and the factors are the squared row norms of ``W R⁻ᵀ``;
- otherwise one thin SVD ``A = U S Vᵀ``: ``x̂ = V S⁻¹ Uᵀ y``, factors from ``W V S⁻¹``,
  with a check that ``W`` lies in the row space of ``A``.

The factorisation is computed once per solver. A solver may instead be given a stored
Cholesky factor (the selection cache keeps the chosen plan's): it is then read only when
the solver is first used, and checked (:func:`valid_factor`) before it is trusted.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as la
import scipy.optimize as so
import scipy.sparse as sp

from dpsql import cancel
from dpsql.errors import StrategyError
from dpsql.inference import runs
from dpsql.workload import limits as planning
from dpsql.workload.matrix import Plan

#: largest p * n * min(p, n) for which a dense SVD of A is attempted (about 10 s on 2 cores)
MAX_SVD_WORK = 2e10
#: largest n for the Cholesky path (an n x n dense Gram matrix)
MAX_DENSE_CELLS = 8192


def _dense(A) -> np.ndarray:
    return A.toarray() if sp.issparse(A) else np.asarray(A, dtype=float)


class LeastSquares:
    """The least-squares solver of one plan, with its factorisation computed once."""

    def __init__(self, plan: Plan, factor=None, key: str | None = None):
        """``factor``: optional callable returning a stored ``(L, lower)`` Cholesky factor of
        ``AᵀA`` (or None); then nothing is factorised until the solver is first used, and
        the stored factor is used only if :func:`valid_factor` accepts it. ``key``: the
        plan's name in the strategy cache, when it has one (caches derived from the plan
        use it)."""
        self.plan = plan
        self.key = key
        self._svd = None
        self._chol = None
        self._factor = factor
        self._ready = factor is None
        if factor is None:
            self._factorise()

    def _ensure(self) -> None:
        if self._ready:
            return
        try:
            loaded = self._factor()
        except Exception:           # an unreadable cache entry is recomputed, never fatal
            loaded = None
        if loaded is not None and valid_factor(self.plan, loaded[0], loaded[1]):
            self._chol = loaded
        else:
            self._factorise()
        self._ready = True
        self._factor = None

    @property
    def cholesky(self):
        """``(c, lower)`` of the Cholesky path, or None (identity or SVD path)."""
        self._ensure()
        return self._chol

    def _factorise(self) -> None:
        """The factorisation (:func:`_factors`): in a killable worker when predicted to take
        long (:func:`factorise_seconds`) during a request's planning, so a cancel never
        waits for LAPACK (e.g. a stored factor found invalid, refactorised at release)."""
        if self.plan.A is None:
            return
        self._chol, self._svd = cancel.run_cancellable(
            _factors, self.plan, seconds=factorise_seconds(self.plan.A))

    def _check_support(self, W) -> None:
        """Every query must be estimable: its row lies in the row space of A."""
        self._ensure()
        if self._svd is None:
            return
        _, _, Vt = self._svd
        Wd = _dense(W)
        resid = Wd - (Wd @ Vt.T) @ Vt
        scale = max(1.0, float(np.abs(Wd).max(initial=0.0)))
        if np.abs(resid).max(initial=0.0) > 1e-8 * scale * max(1, Wd.shape[1]):
            raise StrategyError(
                f"strategy {self.plan.strategy!r} does not measure enough to answer every "
                "query of this batch (a query lies outside the strategy's row space)")

    def error_factors(self, W) -> np.ndarray:
        """Diagonal of ``W (AᵀA)⁺ Wᵀ``: per-answer variance divided by σ²."""
        self._ensure()
        if self.plan.A is None:
            Ws = sp.csr_matrix(W)
            return np.asarray(Ws.multiply(Ws).sum(axis=1), dtype=float).reshape(-1)
        if self._chol is not None:
            c, low = self._chol
            # squared norms of the columns of R⁻¹ Wᵀ (R the lower Cholesky factor), by
            # prefix sums of R⁻¹ over each row's runs of cells (:mod:`dpsql.inference.runs`)
            return runs.error_factors(c, low, W)
        self._check_support(W)
        _, s, Vt = self._svd
        B = np.asarray(W @ Vt.T) / s
        return (B ** 2).sum(axis=1)

    def total_error_factor(self, V: np.ndarray) -> float:
        """``tr(V (AᵀA)⁺)``: the workload's total squared error divided by σ² (from V alone)."""
        self._ensure()
        if self.plan.A is None:
            return float(np.trace(V))
        if self._chol is not None:
            c, low = self._chol
            return float(np.trace(la.cho_solve((c, low), V, check_finite=False)))
        _, s, Vt = self._svd
        return float(np.trace((Vt / s[:, None] ** 2).T @ Vt @ V))

    def coefficients(self, W) -> np.ndarray:
        """``W A⁺`` (dense, rows of W by measurements): each answer's weights on ``y``."""
        self._ensure()
        if self.plan.A is None:
            return _dense(W)
        if self._chol is not None:
            X = la.cho_solve(self._chol, _dense(W).T, check_finite=False)   # (AᵀA)⁻¹ Wᵀ
            return np.asarray(self.plan.A @ X).T
        self._check_support(W)
        U, s, Vt = self._svd
        return (np.asarray(W @ Vt.T) / s) @ U.T

    def answers(self, W, y: np.ndarray) -> np.ndarray:
        """``W x̂`` with ``x̂ = A⁺ y``."""
        self._ensure()
        if self.plan.A is None:
            return np.asarray(W @ y, dtype=float).reshape(-1)
        if self._chol is not None:
            x_hat = la.cho_solve(self._chol, np.asarray(self.plan.A.T @ y).reshape(-1),
                                 check_finite=False)
            return np.asarray(W @ x_hat, dtype=float).reshape(-1)
        U, s, Vt = self._svd
        x_hat = Vt.T @ ((U.T @ y) / s)
        return np.asarray(W @ x_hat, dtype=float).reshape(-1)


def factorise_seconds(A) -> float:
    """Predicted seconds of :func:`_factors` for a ``p x n`` strategy ``A``: its Gram
    ``AᵀA`` (dense: ``2·p·n²`` flops at :data:`~dpsql.workload.limits.FLOPS`; sparse:
    about ``nnz²/n`` multiply-adds at ``SPARSE_SECONDS_PER_OP``) and its Cholesky factor
    (``n³/3``), or a thin SVD (about 15·p·n·min(p, n): ``MAX_SVD_WORK`` takes about 10 s)."""
    p, n = A.shape
    if p >= n and n <= MAX_DENSE_CELLS:
        gram = (planning.SPARSE_SECONDS_PER_OP * A.nnz * A.nnz / max(n, 1) if sp.issparse(A)
                else 2.0 * p * n * n / planning.FLOPS)
        return gram + n ** 3 / 3.0 / planning.FLOPS
    return 15.0 * p * n * min(p, n) / planning.FLOPS


def solve_seconds(plan: Plan, W) -> float:
    """Predicted seconds of a plan's solver and the error factors of ``W``'s ``m`` rows:
    :func:`factorise_seconds` and, as an upper bound, a dense solve of every row (``m·n²``;
    :mod:`dpsql.inference.runs` makes most count queries' rows ``O(n)``)."""
    if plan.A is None:
        return 0.0
    return factorise_seconds(plan.A) + float(W.shape[0]) * plan.n * plan.n / planning.FLOPS


def _factors(plan: Plan) -> tuple:
    """``(cholesky, svd)`` of ``plan.A``, one of them None: the Cholesky factor of ``AᵀA``
    when it is well conditioned (full column rank), else the thin SVD ``(U, s, Vt)`` over the
    nonzero singular values."""
    p, n = plan.A.shape
    if p >= n and n <= MAX_DENSE_CELLS:
        G = _gram(plan.A)
        try:
            c, low = la.cho_factor(G, lower=True, check_finite=False)
            # a Cholesky factor of an ill-conditioned Gram matrix is not trusted
            d = np.abs(np.diag(c))
            if d.min() > 1e-7 * d.max():
                return (c, low), None
        except la.LinAlgError:
            pass
    if float(p) * n * min(p, n) > MAX_SVD_WORK:
        raise StrategyError(
            f"strategy {plan.strategy!r}: a rank-deficient {p} x {n} strategy is too large "
            "for dense least squares here; use strategy='identity' or a smaller batch")
    dense = _dense(plan.A)
    U, s, Vt = np.linalg.svd(dense, full_matrices=False)
    tol = s.max(initial=0.0) * max(dense.shape) * np.finfo(float).eps
    keep = s > tol
    return None, (U[:, keep], s[keep], Vt[keep])


def _gram(A) -> np.ndarray:
    """``AᵀA`` dense; for a dense ``A`` only its lower triangle (all ``cho_factor(lower=True)``
    reads), by one symmetric rank-k update (BLAS syrk: half the multiplications of the
    product; 0.02 s instead of 0.045 s at 1,024 x 1,024 on one thread)."""
    if sp.issparse(A):
        return (A.T @ A).toarray()
    A = np.asarray(A, dtype=np.float64)
    if not A.flags.c_contiguous:
        A = np.ascontiguousarray(A)
    # A.T is A's memory read in Fortran order: syrk(Aᵀ) = Aᵀ (Aᵀ)ᵀ, no copy
    return la.blas.dsyrk(1.0, A.T, trans=0, lower=1)


def valid_factor(plan: Plan, c, lower) -> bool:
    """Whether ``c`` (a stored Cholesky factor) factorises ``AᵀA`` of ``plan``: the right
    shape, finite, a well-conditioned diagonal (the test the factorisation itself applies)
    and a probe: ``L Lᵀ v`` equals ``Aᵀ (A v)`` to 1e-8 for a fixed positive ``v``."""
    if plan.A is None or lower is not True or not isinstance(c, np.ndarray):
        return False
    p, n = plan.A.shape
    if c.shape != (n, n) or p < n or n > MAX_DENSE_CELLS or not np.all(np.isfinite(c)):
        return False
    d = np.abs(np.diag(c))
    if n == 0 or not d.min() > 1e-7 * d.max():
        return False
    v = 1.5 + np.cos(np.arange(n) * 0.7)
    L = np.tril(c)
    lhs = L @ (L.T @ v)
    rhs = np.asarray(plan.A.T @ np.asarray(plan.A @ v).reshape(-1)).reshape(-1)
    scale = float(np.linalg.norm(rhs))
    return scale > 0 and float(np.linalg.norm(lhs - rhs)) <= 1e-8 * scale


def consistent(plan, W, y, answers, nonnegative: bool, integer: bool):
    """Post-processed answers and the note that says how (public inputs and ``y`` only).

    ``nonnegative``: the cell estimates minimise ``||A x − y||`` subject to ``x ≥ 0``
    (scipy's bounded least squares; for the identity strategy, ``max(y, 0)``) and the
    answers are ``W x``; ``integer``: answers rounded to the nearest integer. Neither spends
    privacy (post-processing). Their errors are no longer the reported ones: the standard
    errors describe the unconstrained least-squares estimate.
    """
    notes = []
    if nonnegative:
        if plan.A is None:
            x_hat = np.maximum(np.asarray(y, dtype=float), 0.0)
        else:
            x_hat = so.lsq_linear(plan.A, np.asarray(y, dtype=float), bounds=(0.0, np.inf),
                                  lsmr_tol="auto", method="trf").x
        answers = np.asarray(W @ x_hat, dtype=float).reshape(-1)
        notes.append("non-negative least squares on the cell estimates")
    if integer:
        answers = np.rint(answers)
        notes.append("rounded to integers")
    return answers, ("dpsql post-processing: " + "; ".join(notes) + ". stderr, ci_low and "
                     "ci_high describe the unconstrained least-squares estimate.")

"""Newton steps for the dual fixed point of :mod:`~dpsql.strategies.gaussian.optimal`.

The ascent drives ``x = diag X(w)`` to 1 over ``u = log w``. With ``M = Q Λ Qᵀ``, ``r = √λ``
and ``N = diag(M^½) = w h x``, the Daleckii–Krein formula (``d M^½`` is ``Qᵀ dM Q / (r_k +
r_l)`` in the eigenbasis, ``dM = ½ (diag(du) M + M diag(du))``) gives the Jacobian

    d log x = −D_N⁻¹ A du,   A = K + N Nᵀ / (2h),
    K_jm = Σ_kl Q_jk Q_mk Q_jl Q_ml r_k r_l / (r_k + r_l),

``A`` symmetric positive definite (``K`` is a sum of Schur products of positive semidefinite
matrices). Newton's step for ``log x = 0`` solves ``A δ = N ∘ log x``; the plain fixed point
``u <- u + 2 log x`` is the same step with ``K`` replaced by ``diag(N) / 2`` (as if ``M`` were
diagonal). ``K`` is built from ``1/s = ∫ e^{−ts} dt``: ``K = ∫ F_t ∘ F_t dt`` with ``F_t = Q
diag(r e^{−tr}) Qᵀ``, by a quadrature on nodes geometric in ``t`` (a few float32 symmetric
rank-k products; relative error a few percent, which only slows convergence), and factored once
(Cholesky). Later steps reuse the factor with the new point's ``x``: chord steps.

Measured on 1,024 points + 1,500 random ranges (n = 1,024): from uniform ``w`` (its float32
eigendecomposition) one step takes ``max |x − 1|`` from 0.69 to 0.01-0.1 (the fixed point's
step: 0.049), and the chord step after the next float64 evaluation to 3e-4-4e-3 (certified
gap 2e-9-4e-8, where the Anderson-mixed fixed point needed four more evaluations).

Only ``w`` moves: every bound still comes from a float64 evaluation in
:mod:`~dpsql.strategies.gaussian.optimal`, so a poor Jacobian (a float32 or even a wrong
eigendecomposition) costs steps, never the certificate. Pure numerics on the public workload.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.linalg as la
from scipy import optimize

#: largest step in log t between the quadrature nodes of 1/s (4 nodes on points + ranges at
#: n = 1,024; 3 nodes cost a fourth float64 evaluation there, 5 or 6 saved none)
STEP = 2.5
#: square roots below this fraction of the largest are raised to it in the Jacobian only
RATIO_FLOOR = 1e-4
#: a chord step must shrink max |log x| at least this much, else the Jacobian is rebuilt
CONTRACTION = 0.25
#: Jacobians built at most (each about two fifths of a float64 evaluation at n = 1,024)
BUILDS = 3


def nodes(smin: float, smax: float) -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``t`` and weights ``ω >= 0`` with ``Σ ω e^{−t s} ≈ 1/s`` on ``[smin, smax]``:
    ``t smin`` geometric from ``1/(2R)`` to 1 (``R = smax/smin``) in steps of at most
    e^:data:`STEP`, ``ω`` by nonnegative least squares on the relative error (a tiny
    problem: 200 x a handful). Relative error 15% at R = 563 with 4 nodes, 7% at 1,515 with
    5, 18% at 10⁴ (the largest :data:`RATIO_FLOOR` lets through) with 5."""
    ratio = max(smax / smin, 1.0)
    count = 1 + math.ceil(math.log(2 * ratio) / STEP)
    t = np.geomspace(0.5 / ratio, 1.0, count)
    s = np.geomspace(1.0, ratio, 200)
    weights = optimize.nnls(np.exp(-np.outer(s, t)) * s[:, None], np.ones(s.size))[0]
    return t / smin, weights / smin


def schur_sum(Q: np.ndarray, r: np.ndarray, power: float) -> np.ndarray:
    """``Σ_kl (Q_jk Q_mk)(Q_jl Q_ml) (r_k r_l)^power / (r_k + r_l)`` (float32, Fortran order,
    upper triangle): ``∫ F_t ∘ F_t dt`` with ``F_t = Q diag(r^power e^{−t r}) Qᵀ`` on the nodes
    of :func:`nodes`, one symmetric rank-k product each. ``power`` 1: this module's ``K``;
    −1: the factored dual's Hessian (:mod:`~dpsql.strategies.gaussian.projected`). Roots
    below :data:`RATIO_FLOOR` of the largest are raised to it."""
    r = np.maximum(r, RATIO_FLOOR * r.max())
    Qs = np.asfortranarray(Q, dtype=np.float32)
    out = None
    for t, weight in zip(*nodes(2 * float(r.min()), 2 * float(r.max()))):
        B = Qs * np.sqrt(math.sqrt(weight) * r ** power * np.exp(-t * r)).astype(np.float32)
        F = la.blas.ssyrk(1.0, B)                # F_t, upper triangle
        F *= F
        out = F if out is None else out + F
    return out


class Jacobian:
    """``A = K + N Nᵀ / (2h)`` at one point, Cholesky-factored in float32 (see module doc)."""

    def __init__(self, Q: np.ndarray, r: np.ndarray, N: np.ndarray, h: float):
        A = schur_sum(Q, r, 1.0)                 # K, upper triangle (all potrf reads)
        A += np.outer(N / math.sqrt(2 * h), N / math.sqrt(2 * h)).astype(np.float32)
        self.factor, info = la.lapack.spotrf(A, lower=0, overwrite_a=1)
        self.ok = info == 0 and bool(np.all(np.isfinite(np.diag(self.factor))))
        self.N = N

    def step(self, x: np.ndarray) -> np.ndarray | None:
        """``δ`` with ``A δ = N ∘ log x`` (``u <- u + δ``; ``A`` and ``N`` of the point the
        Jacobian was built at: ``−D_N⁻¹ A`` is the Jacobian), or None when it is not finite."""
        b = (self.N * np.log(x)).astype(np.float32)
        delta, info = la.lapack.spotrs(self.factor, b, lower=0)
        delta = np.asarray(delta, dtype=float)
        return delta if info == 0 and np.all(np.isfinite(delta)) else None


class Chord:
    """Newton's step from the first point, chord steps with its Jacobian after, while each
    shrinks ``max |log x|`` by :data:`CONTRACTION`. When one does not, the Jacobian is rebuilt
    at the current float64 point (at most :data:`BUILDS` Jacobians in all), unless the step
    that failed was Newton's own from a float64 point; then (or when a factorisation fails)
    the Newton phase ends: ``None``, and the caller's fixed point takes over."""

    def __init__(self):
        self.jacobian, self.residual, self.off = None, math.inf, False
        self.builds, self.fresh_exact = 0, False

    def step(self, point, w: np.ndarray, x: np.ndarray) -> np.ndarray | None:
        if self.off:
            return None
        residual = float(np.abs(np.log(x)).max())
        if self.jacobian is not None and residual > CONTRACTION * self.residual:
            if self.fresh_exact or not point.exact or self.builds >= BUILDS:
                self.off = True
                return None
            self.jacobian = None                     # rebuild at this point
        self.fresh_exact = False
        if self.jacobian is None:
            Q, r = point.eigen()
            self.jacobian = Jacobian(Q, r, w * point.h * x, point.h)
            self.builds += 1
            self.fresh_exact = point.exact
            if not self.jacobian.ok:
                self.off = True
                return None
        self.residual = residual
        return self.jacobian.step(x)

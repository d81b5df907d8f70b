"""The dual of the certified optimum, evaluated: one eigendecomposition per point.

For weights ``w`` on the simplex (``D = diag(w)``, ``M = D^½ V D^½``) a :class:`Point` holds
``h(w) = tr(M^½)`` (``h²`` is a lower bound on ``min tr(V X⁻¹)``), the diagonal ``x`` of the
matching primal ``X(w) = D^-½ M^½ D^-½ / h`` and a factor of it; see
:mod:`dpsql.strategies.gaussian.optimal` for the certificate built from them and the ascent
that drives ``x`` to 1. Two forms of ``V``:

- :class:`FullForm`: dense ``V`` of full rank, eigendecomposing ``M`` itself (halved when
  ``V`` is invariant under reversing the cell order);
- :class:`FactoredForm`: ``V = F Fᵀ`` of rank ``r``, eigendecomposing the ``r x r`` matrix
  ``K = Fᵀ D F``, with an L-BFGS-B ascent for the many zero weights of low-rank workloads.

Speed: every step is one float64 LAPACK eigendecomposition; :func:`blas_threads` runs them
on :data:`THREADS` BLAS thread(s). On the shared 2-core machine the default two OpenBLAS
threads spin-wait on each other: ``optimal`` on all ranges at n = 2048 took 7.9 s of process
CPU time with two threads and 1.9 s with one (and 11.7 s against 3.4 s of wall time), so one
thread is the default. Pure numerics on the public workload: no data, no noise.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg as la
from scipy import optimize

from dpsql import cancel
from dpsql.errors import StrategyError

#: eigenvalues of M (or K) are floored at this fraction of the largest (see roots)
FLOOR = 1e-24
#: BLAS threads for the eigendecompositions (None: leave the process's setting alone)
THREADS: int | None = 1
#: the rescaled primal's value (one extra matrix product) is computed once max x − 1 is
#: below this: its excess over h² is about 2 (max x − 1)², useless before
RESCALE_FROM = 0.02


def blas_threads():
    """A context limiting BLAS to :data:`THREADS` threads (threadpoolctl, when installed).
    The controller, which finds the loaded BLAS libraries by reading the process's maps
    (3-12 ms a time), is made once per process: the libraries are loaded with numpy."""
    if THREADS is None:
        return contextlib.nullcontext()
    if not _CONTROLLER:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:                      # a dependency; absent only in odd installs
            return contextlib.nullcontext()
        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0].limit(limits=THREADS, user_api="blas")


_CONTROLLER: list = []        # the process's threadpoolctl controller, once made


def eigh(M: np.ndarray, single: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Eigenpairs of a symmetric matrix: LAPACK's divide and conquer driver (syevd), MRRR
    (syevr) on failure. syevd was 10% faster than syevr at n = 1,024 on one thread (0.24-0.26
    against 0.28-0.32 s CPU) and as fast at 2,048, with residuals and orthogonality ~1e-15.

    ``single``: in float32 (half the time: 0.15 s at n = 1,024), returned as float64. Only
    for a step's direction, never for a bound: see :meth:`FullForm.evaluate`."""
    if single:
        lam, Q = la.eigh(M.astype(np.float32), check_finite=False, driver="evd",
                         overwrite_a=True)
        if np.all(np.isfinite(lam)) and np.all(np.isfinite(Q)):
            return lam.astype(float), Q.astype(float)
    for driver in ("evd", "evr"):
        try:
            return la.eigh(M, check_finite=False, driver=driver)
        except (la.LinAlgError, ValueError):
            continue
    raise StrategyError("the optimal strategy's eigensolver failed on this workload (non-finite "
                        "or degenerate Gram matrix); use another strategy")


def eigh_scratch(build, single: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """:func:`eigh` of the matrix ``build()`` makes, which LAPACK may overwrite (no copy of
    n² floats, nor the page faults of a fresh one); built again for the fallback drivers."""
    if not single:
        try:
            return la.eigh(build(), check_finite=False, driver="evd", overwrite_a=True)
        except (la.LinAlgError, ValueError):
            pass
    return eigh(build(), single)


@dataclass
class Point:
    """One evaluation of the dual at w (on the simplex)."""

    low: float         # h(w) = Σ √λ⁺: h² is a lower bound on the optimum
    h: float           # the same with eigenvalues floored at FLOOR · λmax (what X(w) uses)
    x: np.ndarray      # diag X(w); h² · max x bounds tr(V X(w)⁻¹) / max x from above
    factor: object     # callable -> B (k x n_support) with BᵀB = X(w)
    cond: float        # upper bound on cond(X(w)); inf when X(w) has rank < n_support
    rescaled: float = math.inf   # tr(V X'⁻¹) for X' = D_x^-½ X(w) D_x^-½ (unit diagonal)
    exact: bool = True  # float64: low, h and rescaled are bounds (False: a direction only)
    eigen: object = None  # callable -> (Q, r): M = Q diag(r²) Qᵀ, r floored (FullForm only)


def roots(lam: np.ndarray) -> tuple[np.ndarray, float]:
    """√λ floored at √(FLOOR λmax), and Σ √λ⁺ (unfloored, for the lower bound).

    The floor keeps X(w) invertible on range(V): with λ_k <= r_k², tr(V X(w)⁻¹) =
    h Σ λ_k / r_k <= h², so the upper bound stays valid, and a direction that the weights
    starve shows up as a large X_jj instead of silently vanishing."""
    lam = np.asarray(lam, dtype=float)
    top = max(float(lam.max(initial=0.0)), 1e-300)
    return np.sqrt(np.maximum(lam, FLOOR * top)), float(np.sqrt(np.maximum(lam, 0.0)).sum())


class FullForm:
    """Dense ``V`` (n x n, full rank): eigendecompose ``M = D^½ V D^½`` each step."""

    def __init__(self, V: np.ndarray, symmetry: bool):
        n = self.n = V.shape[0]
        self.split = bool(symmetry and n >= 8 and reversal_invariant(V))
        if not self.split:
            self.blocks = (V,)
            return
        p, c = n // 2, n % 2
        R = V[:p, n - p:][:, ::-1]                  # R[i, k] = V[i, n-1-k]
        E = np.empty((p + c, p + c))
        E[:p, :p] = V[:p, :p] + R                   # on (e_i + e_i') / √2
        if c:
            E[:p, p] = E[p, :p] = math.sqrt(2.0) * V[:p, p]
            E[p, p] = V[p, p]
        self.blocks = (E, V[:p, :p] - R)            # ... and on (e_i - e_i') / √2
        self.p, self.c = p, c

    def evaluate(self, w: np.ndarray, single: bool = False, tol: float = 0.0) -> Point:
        """The dual at ``w``. ``single``: a float32 eigendecomposition, for the first step of a
        cold start only: its ``x`` sets the next ``w`` (any ``w`` is a valid dual point), its
        values are marked inexact and never enter the certificate (2.5e-3 error in ``x`` at
        uniform ``w`` on ranges, where ``x`` is 0.3-1.2; near the optimum 0.2: useless).

        ``tol`` (> 0): the rescaled primal's value is skipped when it cannot reach that gap
        (see :func:`rescaled_hopeless`)."""
        s = np.sqrt(w)
        parts = []
        for block, si in zip(self.blocks, self._block_scales(s)):
            lam, Q = eigh_scratch(lambda: np.multiply(block, np.outer(si, si)), single)
            r, low = roots(lam)
            parts.append((r, low, Q, np.square(Q) @ r, np.maximum(lam, 0.0)))
        r = np.concatenate([part[0] for part in parts])
        h = float(r.sum())
        x = self._combine([part[3] for part in parts]) / (w * h)
        cond = float(r.max() / r.min() * w.max() / w.min())
        rescaled = math.inf
        if (not single and x.min() > 0 and x.max() - 1 <= RESCALE_FROM
                and not rescaled_hopeless(w, x, tol)):
            # tr(E M E M^-½) = Σ_kl C_kl² λ_l / r_k with C = Qᵀ E Q, E = D_x^½
            rescaled = 0.0
            for (rb, _, Q, _, lam), e in zip(parts, self._block_scales(np.sqrt(x))):
                rescaled += _congruence_value(Q, e, lam, 1 / rb)
            rescaled *= h

        def factor() -> np.ndarray:
            Q = self._vectors([part[2] for part in parts])
            return (Q * np.sqrt(r)).T / (s * math.sqrt(h))   # Λ^¼ Qᵀ D^-½ / √h

        def eigen() -> tuple[np.ndarray, np.ndarray]:
            return self._vectors([part[2] for part in parts]), r

        return Point(sum(part[1] for part in parts), h, x, factor, cond, rescaled,
                     exact=not single, eigen=eigen)

    def _block_scales(self, s):
        if not self.split:
            return (s,)
        return (s[: self.p + self.c], s[: self.p])

    def _combine(self, diags):
        if not self.split:
            return diags[0]
        p, c, n = self.p, self.c, self.n
        d = np.empty(n)
        d[:p] = (diags[0][:p] + diags[1]) / 2
        d[n - p:] = d[:p][::-1]
        if c:
            d[p] = diags[0][p]
        return d

    def _vectors(self, Qs) -> np.ndarray:
        if not self.split:
            return np.asarray(Qs[0], dtype=float)
        p, c, n = self.p, self.c, self.n
        QE, QO = (np.asarray(Q, dtype=float) / math.sqrt(2.0) for Q in Qs)
        Q = np.zeros((n, n))
        Q[:p, : p + c] = QE[:p]
        Q[n - p:, : p + c] = QE[:p][::-1]
        if c:
            Q[p, : p + c] = QE[p] * math.sqrt(2.0)
        Q[:p, p + c:] = QO
        Q[n - p:, p + c:] = -QO[::-1]
        return Q


class FactoredForm:
    """``V = F Fᵀ`` with ``F`` n x r of full column rank r: eigendecompose ``K = Fᵀ D F``.

    ``h(w) = tr(K^½)`` and ``X(w) = F K^-½ Fᵀ / h`` (the nonzero spectrum of ``M`` is that of
    ``K``), so a step costs ``O(n r² + r³)``. With ``a_j = f_jᵀ K^-½ f_j``, the function
    ``Φ(w) = 2 h(w) − Σ_j w_j`` on ``w >= 0`` is concave, has gradient ``a − 1`` and maximum
    ``h*²`` at ``h*² · w*``: a smooth bound-constrained problem that L-BFGS-B solves in a few
    dozen cheap steps even when most optimal weights are 0 (where the fixed point crawls).
    """

    def __init__(self, F: np.ndarray):
        self.F = np.ascontiguousarray(F, dtype=float)
        self.n, self.r = F.shape
        self.split = False

    def _parts(self, w: np.ndarray):
        F = self.F
        # K's lower triangle by a symmetric rank-n product (half gemm's flops), which LAPACK
        # may overwrite: 0.19 of 0.7 s an evaluation at rank 1,441 over 2,048 cells
        mu, P = eigh_scratch(
            lambda: la.blas.dsyrk(1.0, (F * np.sqrt(np.maximum(w, 0.0))[:, None]).T, lower=1))
        r, low = roots(mu)
        g = F @ P                                           # g_jk = f_jᵀ p_k
        return r, low, g, np.square(g) @ (1 / r)            # a_j = f_jᵀ K^-½ f_j

    def evaluate(self, w: np.ndarray) -> Point:
        r, low, g, a = self._parts(w)
        h = float(r.sum())
        cond = math.inf if self.r < self.n else float(r.max() / r.min() * w.max() / w.min())
        return Point(low, h, a / h, lambda: (g / np.sqrt(r)).T / math.sqrt(h), cond)

    def ascend(self, w: np.ndarray, max_evaluations: int,
               gap: float = 0.0) -> tuple[np.ndarray, int]:
        """Maximise Φ from ``w`` (on the simplex) with L-BFGS-B; returns (w / Σw, evaluations).

        ``gap`` (> 0): stop at the first evaluated ``v`` whose own :class:`Certificate` is
        that good (the caller's float64 evaluation at the returned ``w`` then certifies it). Without it L-BFGS-B ran
        to its tolerance: 80 evaluations, 4.9 s, on 1,536 ranges over 512 cells."""
        seen, certificate = {"v": None, "calls": 1}, Certificate(gap)

        def negative(v):
            cancel.check()                       # inline (a short solve), a token lands here
            seen["calls"] += 1
            r, low, _, a = self._parts(v)
            if gap > 0 and certificate.holds(v, r, low, a):
                seen["v"] = np.array(v, dtype=float)
                raise _Certified
            return float(v.sum() - 2 * r.sum()), 1 - a

        h = float(self._parts(w)[0].sum())
        options = dict(maxfun=max_evaluations, maxiter=max_evaluations, maxcor=20, ftol=0.0,
                       gtol=1e-13)
        try:
            res = optimize.minimize(negative, w * h * h, jac=True, method="L-BFGS-B",
                                    bounds=[(0, None)] * self.n, options=options)
            v = np.maximum(np.asarray(res.x, dtype=float), 0.0)
        except _Certified:
            v = seen["v"]
        used = seen["calls"]
        if not np.all(np.isfinite(v)) or v.sum() <= 0:
            return w, used
        return v / v.sum(), used


class Certificate:
    """The certificate of an unnormalised point ``v`` of the factored dual, for the ascents
    of :meth:`FactoredForm.ascend` and :mod:`~dpsql.strategies.gaussian.projected`: at ``w =
    v/Σv``, ``h(w)² = h(v)²/Σv`` and ``x(w) = a(v) Σv / h(v)``, so ``X(w)/max x`` has value
    ``h(v) max a(v)``, against the largest lower bound ``low(v)²/Σv`` seen."""

    def __init__(self, gap: float):
        self.gap, self.lower = gap, 0.0

    def holds(self, v: np.ndarray, rho: np.ndarray, low: float, a: np.ndarray) -> bool:
        """Record ``v``'s lower bound; whether ``v`` certifies ``gap``."""
        total, h = float(v.sum()), float(rho.sum())
        if total <= 0 or h <= 0:
            return False
        self.lower = max(self.lower, low * low / total)
        return h * float(a.max()) <= (1 + self.gap) * self.lower


class _Certified(Exception):
    """Raised inside L-BFGS-B's objective to stop it (see :meth:`FactoredForm.ascend`)."""


def _congruence_value(Q: np.ndarray, e: np.ndarray, b: np.ndarray, a: np.ndarray) -> float:
    """``Σ_kl C_kl² a_k b_l`` for ``C = Qᵀ diag(e) Q`` (``e > 0``): ``C`` by one symmetric
    rank-k update (BLAS syrk) of ``diag(√e) Q``, half the multiplications of the general
    product, its upper triangle ``U`` only (syrk leaves the lower one at 0):
    ``Σ_{k<=l} U_kl² (a_k b_l + a_l b_k)`` minus the diagonal counted twice."""
    U = la.blas.dsyrk(1.0, Q * np.sqrt(e)[:, None], trans=1)
    S = np.square(U)
    return float(a @ (S @ b) + b @ (S @ a) - (np.diag(S) * a * b).sum())


def rescaled_hopeless(w: np.ndarray, x: np.ndarray, tol: float) -> bool:
    """True when the rescaled primal ``X'`` of :meth:`FullForm.evaluate` cannot certify a gap
    ``<= tol`` (``tol > 0``), so its matrix product is skipped. With ``e = x − 1``,
    ``Σ_j w_j e_j = 0`` and ``(V X(w)⁻¹)_jj = h² w_j x_j``, expanding ``D_x^½ = I + E/2 −
    E²/8 + …`` in ``tr(D_x^½ V D_x^½ X(w)⁻¹)`` gives an excess over ``h²`` of ``h² (¾ Σ_j w_j
    e_j² + ¼ tr(E V E X⁻¹)/h²) + O(e³)``, the second term ``>= 0``: at least ``¾ Σ w e²``
    (relative) to leading order; measured 1.5-10 times ``Σ w e²`` on ranges, points and
    prefixes. A wrong skip costs one more step, never the certificate."""
    return tol > 0 and 0.75 * float(np.dot(w, np.square(x - 1))) > tol


def reversal_invariant(V: np.ndarray) -> bool:
    """``V[i, j] == V[n-1-i, n-1-j]`` (to rounding): reversing the flat array reverses both."""
    V = np.ascontiguousarray(V)
    if not V.size:
        return True
    scale = 1e-13 * max(float(V.max()), -float(V.min()))       # (no n² temporary)
    if float(np.abs(V[0] - V[-1, ::-1]).max()) > scale:
        return False                   # most workloads differ in the first row already
    flat = V.reshape(-1)
    half = flat.size // 2
    diff = np.abs(flat[:half] - flat[::-1][:half]).max()
    return bool(diff <= scale)


def anderson(U: list, R: list) -> np.ndarray:
    """Type-II Anderson step for the fixed point u <- u + r(u), from the last iterates."""
    u, r = U[-1], R[-1]
    if len(R) < 2:
        return u + r
    dR = np.stack([R[i + 1] - R[i] for i in range(len(R) - 1)], axis=1)
    dU = np.stack([U[i + 1] - U[i] for i in range(len(U) - 1)], axis=1)
    coef = np.linalg.lstsq(dR, r, rcond=1e-10)[0]
    step = r - (dU + dR) @ coef
    plain = float(np.abs(r).max())
    if not np.all(np.isfinite(step)) or float(np.abs(step).max()) > 10 * plain + 1e-300:
        return u + r
    return u + step

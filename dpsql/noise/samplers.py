"""The samplers that draw release noise.

* :class:`SecureGaussianSampler` -- OpenDP's exact discrete Gaussian on a fine grid (and, for
  pure ε-DP, OpenDP's exact discrete Laplace and exponential mechanism).
* :class:`SeededTestSampler` -- reproducible numpy noise, for tests only; its releases are
  recorded as non-private.

Calibration lives in :mod:`dpsql.noise.gaussian` and :mod:`dpsql.noise.laplace`; the samplers
import both, neither imports the samplers (no cycle).
"""

from __future__ import annotations

import functools
import math
from typing import Protocol

import numpy as np

from dpsql.errors import InternalFailure, PrivacyParameterError
from dpsql.noise.gaussian import (_MAX_SAMPLER_SIGMA, _MIN_SAMPLER_SIGMA, _positive_finite, grid_exponent, rounding_slack, zcdp_rho)
from dpsql.noise.laplace import (secure_exponential, secure_laplace, seeded_exponential,
                                 seeded_laplace)

class GaussianSampler(Protocol):
    """What the kernel needs from a sampler."""

    private: bool

    def sample(self, values: np.ndarray, sigma: float, *,
               sensitivity: float | None = None) -> tuple[np.ndarray, float]: ...


def _finite_values(values: np.ndarray) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(x)):
        raise InternalFailure("values to privatize must all be finite; refusing to add noise")
    return x


@functools.lru_cache(maxsize=64)
def _gaussian_measurement(sigma: float, k: int, size: int):
    """OpenDP's discrete Gaussian on 2^k Z^size with scale sigma (cached; ~1 ms to build)."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    return dp.m.make_gaussian(
        dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size),
        dp.l2_distance(T=float),
        scale=sigma,
        k=k,
    )


class SecureGaussianSampler:
    """Release noise from OpenDP's exact sampler: ``values + N_Z(0, sigma^2)`` on a fine grid.

    Privacy argument. OpenDP's ``make_gaussian(..., k)`` rounds each input coordinate to the
    nearest multiple of 2^k and adds exact discrete Gaussian noise on 2^k Z (the sampler of
    Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS
    2020; only integer and rational arithmetic, no floating-point noise).

    1. Rounding moves each coordinate by at most 2^(k-1), so neighbours at L2 distance D are
       at distance at most D' = D + 2^k sqrt(p) after rounding (:func:`rounding_slack`).
    2. The discrete Gaussian on the lattice 2^k Z^p is rho = D'^2 / (2 sigma^2)-zCDP
       (CKS 2020, Theorem 14, multivariate discrete Gaussian; OpenDP's proof of
       ``make_gaussian``). :meth:`sample` checks OpenDP's own privacy map against this. The
       zCDP guarantee is exact.
    3. The (epsilon, delta) guarantee uses the analytic Gaussian calibration (Balle & Wang
       2018) for sensitivity D' (:func:`calibrate_with_rounding`), applied to the lattice
       Gaussian with spacing about sigma * 2^-40. That step is not a theorem of this code:
       it relies on CKS 2020's analysis that the discrete Gaussian's privacy matches the
       continuous one's up to a term that is negligible at this spacing.

    The output is rounded to the nearest double, which is post-processing.
    """

    private = True

    def sample(self, values: np.ndarray, sigma: float, *,
               sensitivity: float | None = None) -> tuple[np.ndarray, float]:
        """Return ``(values + noise, grid spacing 2^k)``.

        When ``sensitivity`` is given, OpenDP's privacy map must report
        ``rho <= zcdp_rho(sigma, sensitivity + rounding_slack) * (1 + 1e-9)``; otherwise the
        same consistency check runs with sensitivity 1. Measured: about 20 microseconds per
        value (10,000 values in about 0.2 s; the first call also imports OpenDP).
        """
        sigma = _positive_finite(sigma, "sigma")
        if not _MIN_SAMPLER_SIGMA <= sigma <= _MAX_SAMPLER_SIGMA:
            raise PrivacyParameterError(
                f"the secure sampler accepts {_MIN_SAMPLER_SIGMA:g} <= sigma <= "
                f"{_MAX_SAMPLER_SIGMA:g}, got {sigma!r}; rescale the strategy"
            )
        check_at = 1.0 if sensitivity is None else _positive_finite(sensitivity, "sensitivity")
        x = _finite_values(values)
        k = grid_exponent(sigma)
        spacing = math.ldexp(1.0, k)
        if x.size == 0:
            return x.copy(), spacing
        try:
            measurement = _gaussian_measurement(sigma, k, int(x.size))
            rho = float(measurement.map(check_at))
        except Exception as error:  # OpenDP's message names no data: only parameters
            raise InternalFailure(f"OpenDP refused the Gaussian measurement: {error}") from error
        bound = zcdp_rho(sigma, check_at + rounding_slack(sigma, x.size)) * (1.0 + 1e-9)
        if not rho <= bound:
            raise InternalFailure(
                f"OpenDP's privacy map gives rho={rho!r} above the expected bound {bound!r} "
                f"for sigma={sigma!r}, sensitivity={check_at!r}, dimension={x.size}; "
                f"refusing to release"
            )
        try:
            noisy = measurement(x.ravel().tolist())
        except Exception:
            # Never chain or show the engine's text here: it could reflect the input values.
            raise InternalFailure("OpenDP failed while sampling Gaussian noise") from None
        return np.asarray(noisy, dtype=float).reshape(x.shape), spacing

    @staticmethod
    def laplace(values: np.ndarray, scale: float, *, sensitivity: float,
                epsilon: float | None = None) -> tuple[np.ndarray, float]:
        """Pure ε-DP noise: OpenDP's exact discrete Laplace (:func:`dpsql.noise.laplace.secure_laplace`)."""

        return secure_laplace(values, scale, sensitivity=sensitivity, epsilon=epsilon)

    @staticmethod
    def exponential(scores: np.ndarray, epsilon: float, *, sensitivity: float) -> int:
        """The exponential mechanism by exact Gumbel report-noisy-max
        (:func:`dpsql.noise.laplace.secure_exponential`)."""

        return secure_exponential(scores, epsilon, sensitivity)


#: the kernel's default sampler: Gaussian, Laplace and exponential-mechanism noise, all exact
SecureSampler = SecureGaussianSampler


class SeededTestSampler:
    """Reproducible continuous Gaussian noise from a seeded numpy generator -- FOR TESTS ONLY.

    Not a secure or exact sampler (floating-point noise; see Mironov, CCS 2012), hence
    ``private = False``: the kernel records its releases as non-private in the ledger. The
    returned grid spacing is 0.0 (no grid).
    """

    private = False

    def __init__(self, seed: int):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise PrivacyParameterError(f"seed must be an integer >= 0, got {seed!r}")
        self._rng = np.random.default_rng(int(seed))  # test-only

    def sample(self, values: np.ndarray, sigma: float, *,
               sensitivity: float | None = None) -> tuple[np.ndarray, float]:
        """Return ``(values + N(0, sigma^2), 0.0)``; ``sensitivity`` is accepted and ignored."""
        sigma = _positive_finite(sigma, "sigma")
        x = _finite_values(values)
        noise = self._rng.normal(0.0, sigma, size=x.shape)  # test-only
        return x + noise, 0.0

    def laplace(self, values: np.ndarray, scale: float, *, sensitivity: float,
                epsilon: float | None = None) -> tuple[np.ndarray, float]:
        """``values + Laplace(scale)`` from the seeded generator (continuous; tests only)."""

        return seeded_laplace(self._rng, _finite_values(values), scale), 0.0  # test-only

    def exponential(self, scores: np.ndarray, epsilon: float, *, sensitivity: float) -> int:
        """The exponential mechanism from the seeded generator (tests only)."""

        return seeded_exponential(self._rng, scores, epsilon, sensitivity)  # test-only

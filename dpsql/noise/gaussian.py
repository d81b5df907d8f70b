"""Gaussian noise: calibration of sigma (the samplers are in :mod:`dpsql.noise.samplers`).

Calibration
    * :func:`analytic_gaussian_sigma` -- the analytic Gaussian mechanism of Balle & Wang,
      "Improving the Gaussian Mechanism for Differential Privacy: Analytical Calibration and
      Optimal Denoising" (ICML 2018), Theorem 8 / Algorithm 1: the smallest sigma whose exact
      privacy profile :func:`gaussian_delta` is at most delta.
    * :func:`classic_gaussian_sigma` -- Dwork & Roth (2014), Theorem A.1; an explicit option
      only, and only for epsilon < 1 (DESIGN.md, "Honest calibration").
    * :func:`calibrate_with_rounding` -- sigma calibrated for the sensitivity plus the extra
      sensitivity that rounding to the sampler's grid can add.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.special import erfcx, log_ndtr

from fractions import Fraction

from dpsql.noise.accounting import (CALIBRATIONS, MAX_EPSILON, float_down, validate_delta,
                                   validate_epsilon)
from dpsql.errors import PrivacyParameterError

__all__ = [
    "CALIBRATIONS", "GRID_BITS_BELOW_SIGMA", "analytic_gaussian_sigma", "calibrate_with_rounding",
    "classic_gaussian_sigma", "exact_zcdp_rho", "gaussian_delta", "gaussian_shortfall",
    "gaussian_sigma", "grid_exponent", "rounding_slack", "zcdp_rho",
]

#: The sampler's grid is 2^k with k = floor(log2 sigma) - GRID_BITS_BELOW_SIGMA.
GRID_BITS_BELOW_SIGMA = 40

#: The analytic calibration solves for delta * (1 - _DELTA_MARGIN) rather than delta, so that
#: the floating-point error of evaluating the privacy profile (measured below 5e-13 relative
#: against 50-digit mpmath for 1e-9 <= epsilon <= 100, delta >= 1e-300; see
#: tests/test_noise.py) can only err against the spender.
_DELTA_MARGIN = 1e-9

#: Below this |gap| the privacy profile is evaluated by quadrature (see _log_gaussian_delta).
_QUADRATURE_BELOW = -0.25
_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(48)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)

#: Sigmas the secure sampler accepts; outside this the grid exponent leaves OpenDP's range.
_MIN_SAMPLER_SIGMA = 1e-100
_MAX_SAMPLER_SIGMA = 1e100


# --- Input checks ---

def _positive_finite(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise PrivacyParameterError(f"{name} must be a real number, got {type(value).__name__}")
    result = float(value)
    if not math.isfinite(result) or result <= 0:
        raise PrivacyParameterError(f"{name} must be finite and > 0, got {result!r}")
    return result


def _epsilon(value: object) -> float:
    """ε as a float, rounded DOWN from its exact value (``0.1`` means 1/10): a σ calibrated
    for the smaller ε is private at the exact one. The kernel's check rounds the same way."""
    return float_down(validate_epsilon(value))


def _positive_delta(value: object) -> float:
    delta = validate_delta(value)
    if delta == 0:
        raise PrivacyParameterError(
            "the Gaussian mechanism needs delta > 0, got delta = 0; choose 0 < delta < 1 "
            "(e.g. 1e-6) or a pure-DP mechanism"
        )
    return float_down(delta)        # rounded against the spender, like epsilon


def _dimension(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise PrivacyParameterError(f"dimension must be an integer >= 0, got {value!r}")
    return int(value)


# --- Privacy profile and calibration ---

def _log_gaussian_delta(sigma: float, epsilon: float, sensitivity: float) -> float:
    """log of the Gaussian privacy profile, -inf when it underflows.

    delta(eps) = Phi(a - b) - e^eps Phi(-a - b),  a = D/(2 sigma), b = eps sigma/D
    (Balle & Wang 2018, Theorem 8). Written as ``Phi(a - b) * (1 - e^gap)`` with
    ``gap = eps + log Phi(-a - b) - log Phi(a - b) <= 0``, everything in log space
    (``log_ndtr``) so e^eps never overflows and tiny probabilities keep their digits.

    When ``gap`` is near 0 (small epsilon, tiny delta) the two logs nearly cancel. There we use
    the identity ``gap = -integral_{-b-a}^{-b+a} (lambda(t) + t) dt`` with the inverse Mills
    ratio ``lambda = phi/Phi = sqrt(2/pi)/erfcx(-t/sqrt 2)`` (it follows from ``eps = 2ab`` and
    ``d/dt log Phi = lambda``); the integrand is smooth and positive, so Gauss-Legendre
    quadrature gives ``gap`` to full relative precision.
    """
    a = sensitivity / (2.0 * sigma)
    b = epsilon * sigma / sensitivity
    l1 = float(log_ndtr(a - b))
    if l1 == -math.inf:
        return -math.inf
    gap = epsilon + float(log_ndtr(-a - b)) - l1
    if gap < _QUADRATURE_BELOW:
        return l1 + math.log(-math.expm1(gap))
    t = -b + a * _GL_NODES
    integrand = _SQRT_2_OVER_PI / erfcx(-t / math.sqrt(2.0)) + t
    integral = a * float(np.dot(_GL_WEIGHTS, integrand))
    if not integral > 0.0:  # delta is mathematically > 0; this only guards underflow
        return -math.inf
    return l1 + math.log(-math.expm1(-integral))


def gaussian_delta(sigma: float, epsilon: float, sensitivity: float) -> float:
    """The exact privacy profile delta(epsilon) of the Gaussian mechanism N(0, sigma^2 I).

    For L2 sensitivity ``sensitivity`` the mechanism is (epsilon, delta)-DP exactly for
    ``delta >= gaussian_delta(sigma, epsilon, sensitivity)`` (Balle & Wang 2018, Theorem 8).
    ``epsilon = 0`` gives the total variation distance.
    """
    sigma = _positive_finite(sigma, "sigma")
    sensitivity = _positive_finite(sensitivity, "sensitivity")
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.integer, np.floating)):
        raise PrivacyParameterError(f"epsilon must be a real number, got {type(epsilon).__name__}")
    epsilon = float(epsilon)
    if not math.isfinite(epsilon) or epsilon < 0 or epsilon > float(MAX_EPSILON):
        raise PrivacyParameterError(
            f"epsilon must be finite and in [0, {float(MAX_EPSILON):g}], got {epsilon!r}"
        )
    return math.exp(_log_gaussian_delta(sigma, epsilon, sensitivity))


@functools.lru_cache(maxsize=1024)
def _analytic_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    target = delta * (1.0 - _DELTA_MARGIN)
    log_target = math.log(target)

    def too_leaky(log_ratio: float) -> bool:  # sigma = sensitivity * e^log_ratio
        sigma = sensitivity * math.exp(log_ratio)
        return _log_gaussian_delta(sigma, epsilon, sensitivity) > log_target

    # The profile depends on sigma / sensitivity only and decreases in it. Bracket the
    # crossing in t = log(sigma / sensitivity), then bisect to adjacent doubles.
    lo = hi = 0.0
    if too_leaky(0.0):
        while too_leaky(hi):
            lo, hi = hi, hi + 1.0
            if hi > 200.0:
                raise PrivacyParameterError(
                    f"cannot calibrate the Gaussian mechanism for epsilon={epsilon!r}, "
                    f"delta={delta!r}: sigma would exceed e^200 times the sensitivity"
                )
    else:
        while not too_leaky(lo):
            lo, hi = lo - 1.0, lo
            if lo < -200.0:
                raise PrivacyParameterError(
                    f"cannot calibrate the Gaussian mechanism for epsilon={epsilon!r}, "
                    f"delta={delta!r}: sigma would fall below e^-200 times the sensitivity"
                )
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if too_leaky(mid):
            lo = mid
        else:
            hi = mid
    sigma = sensitivity * math.exp(hi)

    # Verify on the final float sigma and round against the spender: inflate by tiny relative
    # steps (doubling each time) until the computed profile is within the target.
    step = 2.0**-52
    for _ in range(100):
        if gaussian_delta(sigma, epsilon, sensitivity) <= target:
            return sigma
        sigma *= 1.0 + step
        step *= 2.0
    raise PrivacyParameterError(  # unreachable in practice: bisection already bracketed it
        f"analytic Gaussian calibration failed to verify for epsilon={epsilon!r}, "
        f"delta={delta!r}, sensitivity={sensitivity!r}"
    )


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Smallest sigma making N(0, sigma^2 I) (epsilon, delta)-DP for this L2 sensitivity.

    Balle & Wang (ICML 2018), Algorithm 1 (the analytic Gaussian mechanism): solve
    ``Phi(D/(2s) - eps s/D) - e^eps Phi(-D/(2s) - eps s/D) <= delta`` for sigma. Solved by
    bracketing and bisection on ``log(sigma/D)`` in log space (:func:`_log_gaussian_delta`),
    so large epsilon and tiny delta work. The result is then verified with
    :func:`gaussian_delta` and inflated until ``gaussian_delta(sigma) <= delta * (1 - 1e-9)``:
    rounding goes against the spender. Refuses ``delta = 0``.
    """
    return _analytic_sigma(_epsilon(epsilon), _positive_delta(delta),
                           _positive_finite(sensitivity, "sensitivity"))


def classic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """sigma = D sqrt(2 ln(1.25/delta)) / epsilon (Dwork & Roth 2014, Theorem A.1).

    The theorem holds only for epsilon < 1; larger epsilon is refused. Always at least the
    analytic sigma; provided as an explicit option for comparison with other systems.
    """
    eps = _epsilon(epsilon)
    if eps >= 1.0:
        raise PrivacyParameterError(
            f"the classic Gaussian calibration is valid only for epsilon < 1 "
            f"(Dwork & Roth, Thm A.1), got epsilon={eps!r}; use calibration='analytic'"
        )
    d = _positive_delta(delta)
    sensitivity = _positive_finite(sensitivity, "sensitivity")
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / d)) / eps


def gaussian_sigma(epsilon: float, delta: float, sensitivity: float,
                   calibration: str = "analytic") -> float:
    """Dispatch to the ``"analytic"`` (default) or ``"classic"`` calibration."""
    if calibration == "analytic":
        return analytic_gaussian_sigma(epsilon, delta, sensitivity)
    if calibration == "classic":
        return classic_gaussian_sigma(epsilon, delta, sensitivity)
    raise PrivacyParameterError(
        f"unknown Gaussian calibration {calibration!r}; allowed: {', '.join(CALIBRATIONS)}"
    )


def zcdp_rho(sigma: float, sensitivity: float) -> float:
    """rho = D^2 / (2 sigma^2): the Gaussian mechanism is rho-zCDP (Bun & Steinke, TCC 2016,
    Proposition 1.6). Recorded in the ledger for later zCDP accounting."""
    sigma = _positive_finite(sigma, "sigma")
    sensitivity = _positive_finite(sensitivity, "sensitivity")
    return sensitivity * sensitivity / (2.0 * sigma * sigma)


# --- Grid rounding ---

def grid_exponent(sigma: float) -> int:
    """k = floor(log2 sigma) - 40: the secure sampler works on the lattice 2^k Z^p."""
    _, exponent = math.frexp(_positive_finite(sigma, "sigma"))  # sigma = m 2^e, 0.5 <= m < 1
    return exponent - 1 - GRID_BITS_BELOW_SIGMA


def rounding_slack(sigma: float, dimension: int) -> float:
    """2^k sqrt(p): how much rounding a p-vector to the grid 2^k can add to an L2 distance.

    Each coordinate moves by at most 2^(k-1), so two neighbours' rounded vectors differ by at
    most their original distance plus 2^k per coordinate, i.e. plus 2^k sqrt(p) in L2.
    """
    p = _dimension(dimension)
    if p == 0:
        return 0.0
    return math.ldexp(math.nextafter(math.sqrt(p), math.inf), grid_exponent(sigma))


def _add_up(a: float, b: float) -> float:
    """``a + b`` rounded up (a sensitivity plus its grid slack is never understated)."""
    total = a + b
    if Fraction(total) < Fraction(a) + Fraction(b):
        total = math.nextafter(total, math.inf)
    return total


def sensitivity_with_slack(sigma: float, sensitivity: float, dimension: int) -> float:
    """``sensitivity + rounding_slack(sigma, dimension)``, rounded up: the L2 distance between
    neighbours after the secure sampler rounds them to its grid (the sensitivity σ must be
    calibrated for, and the one the zCDP ρ is recorded for)."""
    return _add_up(_positive_finite(sensitivity, "sensitivity"),
                   rounding_slack(sigma, dimension))


def calibrate_with_rounding(epsilon: float, delta: float, sensitivity: float, dimension: int,
                            calibration: str = "analytic") -> float:
    """sigma calibrated for ``sensitivity + rounding_slack(sigma, dimension)``.

    The slack depends on sigma (through the grid), so iterate
    ``sigma <- gaussian_sigma(eps, delta, D + slack(sigma))`` from sigma(D). The sequence
    increases and stops at the first sigma that is calibrated for its own slack; typically
    after one or two steps, since the slack is about sigma * 2^-40 * sqrt(p).
    """
    p = _dimension(dimension)
    sensitivity = _positive_finite(sensitivity, "sensitivity")
    sigma = gaussian_sigma(epsilon, delta, sensitivity, calibration)
    for _ in range(60):
        needed = gaussian_sigma(epsilon, delta, sensitivity_with_slack(sigma, sensitivity, p),
                                calibration)
        if needed <= sigma:
            return sigma
        sigma = needed
    raise PrivacyParameterError(
        f"cannot calibrate sigma for sensitivity {sensitivity!r} in dimension {p}: the grid's "
        f"rounding slack grows as fast as sigma (epsilon too small for this many "
        f"measurements); raise epsilon or reduce the number of measurements"
    )


# --- The kernel's check of a given sigma ---

def exact_zcdp_rho(sigma: float, sensitivity: float) -> Fraction:
    """``Δ² / 2σ²`` exactly (both read as the exact values of their doubles)."""
    return Fraction(sensitivity) ** 2 / (2 * Fraction(sigma) ** 2)


def gaussian_shortfall(sigma: float, epsilon, delta, sensitivity: float, dimension: int,
                       calibration: str = "analytic") -> str | None:
    """Why ``sigma`` is NOT enough for this charge, or None when it is.

    The kernel's check of a σ it did not compute (issue 15, "the kernel owns noise scales").
    ``sensitivity`` is the plan's exact L2 sensitivity (the kernel recomputes it from the
    rounded plan), ``dimension`` the number of measurements; the sampler's grid slack at this
    σ is added (rounded up, :func:`sensitivity_with_slack`). Two conditions:

    1. the privacy itself, for either calibration: the exact privacy profile of the Gaussian
       mechanism (Balle & Wang 2018, Thm 8; it characterises (ε, δ)-DP exactly) at σ,
       ``gaussian_delta(σ, ε↓, Δ') <= δ↓ (1 − 1e-9)`` with ε, δ rounded down from their exact
       charged values: the very test :func:`analytic_gaussian_sigma` verifies its result
       with, on the same doubles, so a σ it calibrated passes bit for bit; the 1e-9 margin
       covers the profile's float evaluation error (below 5e-13 relative, see there);
    2. ``calibration="classic"``: the charge says classic, so σ must also be at least
       :func:`classic_gaussian_sigma` for ``Δ'`` (and ε < 1): the ledger's record is true.
    """
    if calibration not in CALIBRATIONS:
        return f"unknown Gaussian calibration {calibration!r}"
    try:
        sigma = _positive_finite(sigma, "sigma")
        sensitivity = _positive_finite(sensitivity, "sensitivity")
        p = _dimension(dimension)
        eps = _epsilon(epsilon)
        dlt = _positive_delta(delta)
    except PrivacyParameterError as error:
        return str(error)
    if not _MIN_SAMPLER_SIGMA <= sigma <= _MAX_SAMPLER_SIGMA:
        return f"sigma={sigma!r} is outside the secure sampler's range"
    full = sensitivity_with_slack(sigma, sensitivity, p)
    leak = gaussian_delta(sigma, eps, full)
    if not leak <= dlt * (1.0 - _DELTA_MARGIN):
        try:
            needed = f"needs sigma >= {calibrate_with_rounding(epsilon, delta, sensitivity, p)!r}"
        except PrivacyParameterError:
            needed = "no sigma can be calibrated for it"
        return (f"Gaussian sigma={sigma!r} for L2 sensitivity {sensitivity!r} is "
                f"(epsilon={eps!r}, delta={leak:.6g})-DP, not within the charged "
                f"delta={dlt!r} ({needed})")
    if calibration == "classic":
        if eps >= 1.0:
            return "the classic Gaussian calibration is valid only for epsilon < 1"
        needed = classic_gaussian_sigma(epsilon, delta, full)
        if sigma < needed:
            return (f"Gaussian sigma={sigma!r} is below the classic calibration's "
                    f"{needed!r} recorded with the charge")
    return None

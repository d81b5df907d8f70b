"""Pure-DP primitives: Laplace calibration and sampler, exponential mechanism, intervals.

Statistical tests have a false-alarm rate <= 1e-6 and known power: each also checks that the
same samples REJECT a reference that is wrong by 30 %.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import optimize, stats

import dpsql.noise.laplace as laplace
from dpsql.errors import DpsqlError, PrivacyParameterError
from dpsql.inference.intervals import laplace_interval_halfwidth
from dpsql.noise.laplace import (
    laplace_grid_exponent,
    laplace_scale,
    secure_exponential,
    secure_laplace,
    seeded_exponential,
    seeded_laplace,
)

ALPHA = 1e-6
BAD_EPSILONS = [0, -1, float("nan"), float("inf"), True, "1"]


# --- helpers -----------------------------------------------------------------------------------

def laplace_cdf(x: np.ndarray, scale: float) -> np.ndarray:
    return np.where(x < 0, 0.5 * np.exp(np.minimum(x, 0) / scale),
                    1.0 - 0.5 * np.exp(-np.maximum(x, 0) / scale))


def ks_distance(sample: np.ndarray, scale: float) -> float:
    """sup |F_n - F| against continuous Laplace(scale), exact for ties (F continuous)."""
    x = np.sort(sample)
    n = x.size
    f = laplace_cdf(x, scale)
    return float(max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n)))


def dkw_threshold(n: int, alpha: float = ALPHA) -> float:
    """Massart's DKW: P(sup |F_n - F| > t) <= 2 exp(-2 n t^2), for ANY F (discrete included)."""
    return math.sqrt(math.log(2.0 / alpha) / (2.0 * n))


def em_probabilities(scores, epsilon: float, sensitivity: float) -> np.ndarray:
    a = epsilon * np.asarray(scores, dtype=float) / (2.0 * sensitivity)
    w = np.exp(a - a.max())
    return w / w.sum()


def chi_square(counts: np.ndarray, probabilities: np.ndarray) -> float:
    expected = counts.sum() * probabilities
    return float(np.sum((counts - expected) ** 2 / expected))


# --- laplace_scale -----------------------------------------------------------------------------

CALIBRATION_GRID = [(e, d, p) for e in (0.01, 0.1, 0.5, 1, 3.7, 100)
                    for d in (2.0**-20, 0.75, 1, 5.5) for p in (0, 1, 17, 10**6)]


@pytest.mark.parametrize("epsilon, sensitivity, dimension", CALIBRATION_GRID)
def test_laplace_scale_agrees_with_opendp_and_is_smallest(epsilon, sensitivity, dimension):
    b = laplace_scale(epsilon, sensitivity, dimension)
    exact_eps = Fraction(repr(float(epsilon)))
    k = laplace_grid_exponent(b)
    measurement = laplace._laplace_measurement(b, k, dimension)
    got = measurement.map(sensitivity)
    # OpenDP's own map at D is within the budget (largest double <= epsilon, read exactly).
    assert Fraction(got) <= exact_eps
    # The exact formula OpenDP charges: (D + p 2^k) / b.
    assert (Fraction(sensitivity) + dimension * Fraction(2) ** k) / Fraction(b) <= exact_eps
    assert got == pytest.approx((sensitivity + dimension * 2.0**k) / b, rel=1e-14)
    # Smallest: the next double down fails OpenDP's map or the exact formula.
    smaller = math.nextafter(b, 0.0)
    fails_exact = laplace._exact_laplace_epsilon(smaller, sensitivity, dimension) > exact_eps
    fails_opendp = (laplace._opendp_laplace_epsilon(smaller, sensitivity, dimension)
                    > laplace._float_down(exact_eps))
    assert fails_exact or fails_opendp
    # And it is the textbook D / epsilon up to the grid's negligible slack.
    assert b == pytest.approx(sensitivity / epsilon, rel=1e-9)
    assert k <= -20


def test_laplace_scale_is_monotone():
    epsilons = [1e-3, 0.01, 0.1, 0.3, 1, 2, 10, 100]
    scales = [laplace_scale(e, 1.0, 100) for e in epsilons]
    assert all(a > b for a, b in zip(scales, scales[1:]))
    sensitivities = [2.0**-20, 0.1, 1, 1.5, 40]
    scales = [laplace_scale(1.0, d, 100) for d in sensitivities]
    assert all(a < b for a, b in zip(scales, scales[1:]))
    dims = [0, 1, 10, 10**4, 10**8]
    scales = [laplace_scale(1e-6, 1.0, p) for p in dims]
    assert all(a <= b for a, b in zip(scales, scales[1:]))
    assert scales[-1] > scales[0]  # the rounding slack is charged


def test_laplace_scale_reads_epsilon_exactly():
    # 0.1 means exactly 1/10 (as the ledger charges it), not the double above it.
    b = laplace_scale(0.1, 1.0, 1)
    assert Fraction(laplace._opendp_laplace_epsilon(b, 1.0, 1)) <= Fraction(1, 10)
    assert laplace_scale(Fraction(1, 10), 1.0, 1) == b


@pytest.mark.parametrize("bad", BAD_EPSILONS)
def test_laplace_scale_refuses_bad_epsilon(bad):
    with pytest.raises(PrivacyParameterError):
        laplace_scale(bad, 1.0, 3)


@pytest.mark.parametrize("bad", BAD_EPSILONS)
def test_laplace_scale_refuses_bad_sensitivity(bad):
    with pytest.raises(PrivacyParameterError):
        laplace_scale(1.0, bad, 3)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3", None])
def test_laplace_scale_refuses_bad_dimension(bad):
    with pytest.raises(PrivacyParameterError):
        laplace_scale(1.0, 1.0, bad)


def test_laplace_scale_refuses_out_of_range_epsilon_and_scale():
    with pytest.raises(PrivacyParameterError, match="allowed range"):
        laplace_scale(1e-12, 1.0, 1)
    with pytest.raises(PrivacyParameterError, match="allowed range"):
        laplace_scale(101, 1.0, 1)
    with pytest.raises(PrivacyParameterError, match="scale would leave"):
        laplace_scale(1.0, 1e-200, 1)


# --- secure_laplace ----------------------------------------------------------------------------

@pytest.mark.parametrize("scale", [0.5, 1.0, 7.3, 1e3])
def test_secure_laplace_goodness_of_fit_with_known_power(scale):
    """KS distance vs Laplace(scale) below the DKW threshold at alpha = 1e-6; the same samples
    must exceed it against Laplace(0.7 scale) and Laplace(1.3 scale).

    The sampler is the discrete Laplace on 2^k Z, k = floor(log2 b) - 80: its CDF is within
    (1 - e^(-2^k / b)) / 2 <= 2^-81 of the continuous one, and rounding the output to a
    double moves a sample by <= 1e-13 b; both are covered by the 1e-9 added to the threshold.
    Power: sup |F_b - F_0.7b| = 0.066 and sup |F_b - F_1.3b| = 0.048, versus a threshold of
    0.019 at n = 20,000, so a miss needs a DKW deviation > 0.029: probability < 1e-14.
    """
    n = 20_000
    rng = np.random.default_rng(7)
    values = rng.integers(-1000, 1000, size=n) * 2.0**-20 * 977  # multiples of 2^-20
    values[: n // 4] = 0.0
    noisy, grid = secure_laplace(values, scale, sensitivity=1.0)
    assert grid == 2.0 ** laplace_grid_exponent(scale) and grid <= 2.0**-20
    noise = noisy - values
    threshold = dkw_threshold(n) + 1e-9
    assert ks_distance(noise, scale) <= threshold
    assert ks_distance(noise, 0.7 * scale) > threshold
    assert ks_distance(noise, 1.3 * scale) > threshold


def test_secure_laplace_keeps_shape_and_is_centred_on_values():
    values = np.arange(12, dtype=float).reshape(3, 4) * 2.0**-20 + 5e6
    noisy, _ = secure_laplace(values, 1e-3, sensitivity=1.0)
    assert noisy.shape == (3, 4)
    assert np.all(np.abs(noisy - values) < 0.1)  # P(|L| > 100 b) per value = e^-100
    empty, grid = secure_laplace(np.array([]), 2.0, sensitivity=1.0)
    assert empty.size == 0 and grid > 0


def test_secure_laplace_checks_opendp_map_against_epsilon():
    b = laplace_scale(0.5, 1.0, 5)
    secure_laplace(np.zeros(5), b, sensitivity=1.0, epsilon=0.5)
    with pytest.raises(DpsqlError, match="refusing to release"):
        secure_laplace(np.zeros(5), b, sensitivity=1.0, epsilon=0.4999)
    with pytest.raises(DpsqlError, match="refusing to release"):
        secure_laplace(np.zeros(5), b, sensitivity=1.01, epsilon=0.5)
    with pytest.raises(DpsqlError, match="refusing to release"):
        secure_laplace(np.zeros(5), math.nextafter(b, 0.0), sensitivity=1.0, epsilon=0.5)


def test_secure_laplace_default_check_uses_opendp_formula(monkeypatch):
    secure_laplace(np.zeros(3), 2.0, sensitivity=1.0)
    # A sampler whose map disagrees with (D + p 2^k) / b must be refused.
    monkeypatch.setattr(laplace, "_opendp_laplace_epsilon", lambda *args: 0.6)
    with pytest.raises(DpsqlError, match="refusing to release"):
        secure_laplace(np.zeros(3), 2.0, sensitivity=1.0)


def test_secure_laplace_refuses_bad_input_without_showing_values():
    secret = 123456.75
    for values in ([secret, float("nan")], [secret, float("inf")], ["x", secret]):
        with pytest.raises(DpsqlError) as info:
            secure_laplace(values, 1.0, sensitivity=1.0)
        assert "123456" not in str(info.value)
        assert info.value.__cause__ is None
    for bad in (0, -1.0, float("nan"), True, "1", 1e101, 1e-101):
        with pytest.raises(PrivacyParameterError):
            secure_laplace([1.0], bad, sensitivity=1.0)
    for bad in (0, -1.0, float("inf"), True):
        with pytest.raises(PrivacyParameterError):
            secure_laplace([1.0], 1.0, sensitivity=bad)


def test_secure_laplace_sampling_failure_hides_engine_text(monkeypatch):
    class Broken:
        def __call__(self, data):
            raise RuntimeError(f"bad input {data}")

        def map(self, d_in):
            return 0.0

    monkeypatch.setattr(laplace, "_laplace_measurement", lambda *args: Broken())
    with pytest.raises(DpsqlError) as info:
        secure_laplace([424242.0], 1.0, sensitivity=1.0)
    assert "424242" not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


# --- secure_exponential ------------------------------------------------------------------------

SCORES = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 3 * 2.0**-20])


def test_secure_exponential_frequencies_with_known_power():
    """Chi-square at alpha = 1e-6 against exp(eps s / (2 D)); the same draws must reject the
    probabilities for 0.7 eps and 1.3 eps. Power (noncentral chi-square) is checked first."""
    epsilon, sensitivity, n = 2.0, 2.0, 4000  # eps / (2 D) = 1/2
    crit = stats.chi2.isf(ALPHA, SCORES.size - 1)
    p = em_probabilities(SCORES, epsilon, sensitivity)
    alternatives = [em_probabilities(SCORES, f * epsilon, sensitivity) for f in (0.7, 1.3)]
    for q in alternatives:
        power = stats.ncx2.sf(crit, SCORES.size - 1, n * np.sum((p - q) ** 2 / q))
        assert power > 1 - 1e-6
    draws = [secure_exponential(SCORES, epsilon, sensitivity) for _ in range(n)]
    counts = np.bincount(draws, minlength=SCORES.size)
    assert counts.size == SCORES.size
    assert chi_square(counts, p) <= crit
    for q in alternatives:
        assert chi_square(counts, q) > crit


def test_seeded_exponential_matches_the_same_distribution():
    rng = np.random.default_rng(3)
    epsilon, sensitivity, n = 1.0, 0.5, 10_000
    counts = np.bincount([seeded_exponential(rng, SCORES, epsilon, sensitivity)
                          for _ in range(n)], minlength=SCORES.size)
    crit = stats.chi2.isf(ALPHA, SCORES.size - 1)
    p = em_probabilities(SCORES, epsilon, sensitivity)
    assert chi_square(counts, p) <= crit
    for f in (0.7, 1.3):
        q = em_probabilities(SCORES, f * epsilon, sensitivity)
        assert stats.ncx2.sf(crit, SCORES.size - 1, n * np.sum((p - q) ** 2 / q)) > 1 - 1e-6
        assert chi_square(counts, q) > crit
    again = [seeded_exponential(np.random.default_rng(9), SCORES, 1.0, 1.0) for _ in range(3)]
    assert len(set(again)) == 1


@pytest.mark.parametrize("epsilon, sensitivity", [(0.01, 1.0), (0.1, 3.0), (1, 1.0),
                                                  (2.5, 2.0**-20), (100, 7.0)])
def test_exponential_mechanism_opendp_maps(epsilon, sensitivity):
    """Scale s: 2 D / s <= epsilon exactly; OpenDP's pure-DP map (range / s, range = 2 D for a
    non-monotonic L-inf metric) is <= epsilon; its zCDP map for the Gumbel sampler is
    (2 D / s)^2 / 8 <= epsilon^2 / 8."""
    eps = Fraction(repr(float(epsilon)))
    s = laplace._exponential_scale(eps, sensitivity)
    assert 2 * Fraction(sensitivity) / Fraction(s) <= eps
    rho, pure = laplace._selection_maps(s, sensitivity)
    assert Fraction(pure) <= eps
    assert pure == pytest.approx(2 * sensitivity / s, rel=1e-14)
    assert rho == pytest.approx((2 * sensitivity / s) ** 2 / 8, rel=1e-14)
    assert rho <= float(eps) ** 2 / 8 * (1 + 1e-12)
    # Smallest: the next double down would be charged more than epsilon by OpenDP.
    assert laplace._selection_maps(math.nextafter(s, 0.0), sensitivity)[1] > \
        laplace._float_down(eps) or 2 * Fraction(sensitivity) / Fraction(
            math.nextafter(s, 0.0)) > eps


def test_secure_exponential_refuses_bad_inputs():
    assert secure_exponential([5.0], 1.0, 1.0) == 0
    for bad in BAD_EPSILONS:
        with pytest.raises(PrivacyParameterError):
            secure_exponential([0.0, 1.0], bad, 1.0)
        with pytest.raises(PrivacyParameterError):
            secure_exponential([0.0, 1.0], 1.0, bad)
    for scores in ([], [[0.0, 1.0]], [0.0, float("nan")], [1.0, float("inf")]):
        with pytest.raises(DpsqlError):
            secure_exponential(scores, 1.0, 1.0)


def test_secure_exponential_refuses_when_opendp_disagrees(monkeypatch):
    monkeypatch.setattr(laplace, "_selection_maps", lambda s, d: (0.0, 2 * d / s * 1.01))
    with pytest.raises(DpsqlError, match="refusing to select"):
        secure_exponential([0.0, 1.0], 1.0, 1.0)


# --- laplace_interval_halfwidth ------------------------------------------------------------------

def test_interval_zero_and_single_term_rows_are_exact():
    C = np.array([[0.0, 0.0, 0.0], [0.0, -3.0, 0.0], [2.0**-20, 0.0, 0.0]])
    for level in (0.5, 0.95, 0.999):
        h = laplace_interval_halfwidth(C, 2.0, level)
        assert h[0] == 0.0
        assert h[1] == pytest.approx(2.0 * 3.0 * math.log(1 / (1 - level)), rel=1e-11)
        assert h[2] == pytest.approx(2.0 * 2.0**-20 * math.log(1 / (1 - level)), rel=1e-11)
        assert h[1] >= 6.0 * -math.log1p(-level)


def test_interval_two_equal_terms_against_the_exact_quantile():
    # L1 + L2 (scale 1) has P(|S| > h) = e^-h (2 + h) / 2.
    for level in (0.5, 0.9, 0.95, 0.999):
        exact = optimize.brentq(lambda h: math.exp(-h) * (2 + h) / 2 - (1 - level), 0, 60,
                                xtol=1e-14)
        h = laplace_interval_halfwidth(np.array([[1.0, -1.0], [0.5, 0.5]]), 1.0, level)
        assert h[0] >= exact and h[0] <= exact * 1.004
        assert h[1] == pytest.approx(h[0] / 2, rel=1e-9)


def test_interval_nearly_single_term_row():
    # A second, negligible coefficient: the quantile is the single-term one to ~1e-9.
    h = laplace_interval_halfwidth(np.array([[1.0, 1e-9]]), 1.0)[0]
    assert math.log(20) <= h <= math.log(20) * 1.004


def test_interval_against_monte_carlo():
    """Coverage of h by 400,000 seeded draws is >= level (within 5 standard errors), and the
    coverage of 0.98 h is below level: h is valid and within 2 % of the true quantile."""
    rng = np.random.default_rng(11)
    m = 12
    C = np.array([
        rng.normal(size=m),                                  # dense, mixed signs
        np.r_[1.0, np.full(m - 1, 0.01)],                    # one dominant term
        np.r_[1.0, 1.0, np.zeros(m - 2)] * 3.0,              # two terms
        np.abs(rng.standard_cauchy(size=m)),                 # spread magnitudes
        np.r_[1.0, 0.5, 0.25, 0.125, np.zeros(m - 4)],
    ])
    scale, n = 1.7, 400_000
    for level in (0.9, 0.95):
        h = laplace_interval_halfwidth(C, scale, level)
        sums = rng.laplace(0.0, scale, size=(n, m)) @ C.T
        se = math.sqrt(level * (1 - level) / n)
        coverage = np.mean(np.abs(sums) <= h, axis=0)
        assert np.all(coverage >= level - 5 * se), coverage
        assert np.all(np.mean(np.abs(sums) <= 0.98 * h, axis=0) < level)


def test_interval_is_close_to_the_normal_limit_for_many_equal_terms():
    # 2,000 equal terms: the quantile is 1.95996 sd up to a kurtosis correction of +1e-4.
    h = laplace_interval_halfwidth(np.ones((1, 2000)), 1.0)[0]
    sd = math.sqrt(2 * 2000)
    assert 1.9600 * sd <= h <= 1.9601 * sd * 1.003


def test_interval_scales_linearly():
    rng = np.random.default_rng(5)
    C = rng.normal(size=(4, 30))
    h = laplace_interval_halfwidth(C, 1.0)
    assert laplace_interval_halfwidth(C, 3.0) == pytest.approx(3 * h, rel=1e-9)
    assert laplace_interval_halfwidth(-2 * C, 1.0) == pytest.approx(2 * h, rel=1e-9)


def test_interval_refuses_bad_inputs():
    for level in (0, 1, 1.5, -0.1, float("nan"), True, "0.95"):
        with pytest.raises(PrivacyParameterError):
            laplace_interval_halfwidth(np.ones((2, 2)), 1.0, level)
    for scale in (0, -1, float("inf"), True):
        with pytest.raises(PrivacyParameterError):
            laplace_interval_halfwidth(np.ones((2, 2)), scale)
    for C in (np.ones(3), np.ones((2, 2, 2)), np.array([[1.0, np.nan]]), [["a"]]):
        with pytest.raises(DpsqlError):
            laplace_interval_halfwidth(C, 1.0)
    assert laplace_interval_halfwidth(np.zeros((3, 0)), 1.0).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.slow
def test_intervals_of_a_large_batch_approach_the_normal_limit():
    rng = np.random.default_rng(2)
    C = rng.normal(size=(500, 2000))
    h = laplace_interval_halfwidth(C, 1.0)
    sd = math.sqrt(2) * np.linalg.norm(C, axis=1)
    assert np.all((h / sd > 1.959) & (h / sd < 1.9601 * 1.004))


# --- seeded_laplace ------------------------------------------------------------------------------

def test_seeded_laplace_is_reproducible_and_laplace():
    values = np.zeros(20_000)
    a = seeded_laplace(np.random.default_rng(4), values, 2.5)
    b = seeded_laplace(np.random.default_rng(4), values, 2.5)
    assert np.array_equal(a, b)
    threshold = dkw_threshold(values.size)
    assert ks_distance(a, 2.5) <= threshold
    assert ks_distance(a, 0.7 * 2.5) > threshold and ks_distance(a, 1.3 * 2.5) > threshold
    with pytest.raises(DpsqlError):
        seeded_laplace(np.random.default_rng(0), [float("nan")], 1.0)

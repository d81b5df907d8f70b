"""Gaussian calibration (analytic and classic) and the samplers."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import dpsql.noise.gaussian as noise
import dpsql.noise.samplers as samplers
from dpsql.errors import DpsqlError, PrivacyParameterError
from dpsql.noise.gaussian import analytic_gaussian_sigma, calibrate_with_rounding, classic_gaussian_sigma, gaussian_delta, gaussian_sigma, grid_exponent, rounding_slack, zcdp_rho
from dpsql.noise.samplers import SecureGaussianSampler, SeededTestSampler

EPSILONS = [0.01, 0.1, 0.5, 1, 2, 5, 10]
DELTAS = [1e-3, 1e-6, 1e-10]
SENSITIVITIES = [0.5, 1, 3]
GRID = [(e, d, s) for e in EPSILONS for d in DELTAS for s in SENSITIVITIES]


# --- analytic calibration ---------------------------------------------------------------------

@pytest.mark.parametrize("epsilon, delta, sensitivity", GRID)
def test_analytic_sigma_is_valid_and_tight(epsilon, delta, sensitivity):
    sigma = analytic_gaussian_sigma(epsilon, delta, sensitivity)
    assert gaussian_delta(sigma, epsilon, sensitivity) <= delta
    assert gaussian_delta(sigma * (1 - 1e-6), epsilon, sensitivity) > delta


def test_analytic_sigma_scales_linearly_with_sensitivity():
    for epsilon, delta, _ in GRID[::3]:
        unit = analytic_gaussian_sigma(epsilon, delta, 1)
        assert analytic_gaussian_sigma(epsilon, delta, 3) == pytest.approx(3 * unit, rel=1e-12)


def test_privacy_profile_matches_high_precision_reference():
    """gaussian_delta against 50-digit mpmath, including the regimes where the naive formula
    cancels (tiny epsilon, tiny delta) or overflows (large epsilon)."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50

    def reference(sigma, epsilon, sensitivity):
        s, e, d = mpmath.mpf(sigma), mpmath.mpf(epsilon), mpmath.mpf(sensitivity)
        a, b = d / (2 * s), e * s / d
        return float(mpmath.ncdf(a - b) - mpmath.exp(e) * mpmath.ncdf(-a - b))

    worst = 0.0
    for epsilon in [1e-9, 1e-4, 0.01, 1, 10, 100]:
        for delta in [0.5, 1e-6, 1e-30, 1e-300]:
            sigma = analytic_gaussian_sigma(epsilon, delta, 1)
            assert reference(sigma, epsilon, 1) <= delta
            for factor in [0.5, 0.999, 1, 1.001, 2]:
                exact = reference(sigma * factor, epsilon, 1)
                if exact > 1e-300:
                    ours = gaussian_delta(sigma * factor, epsilon, 1)
                    worst = max(worst, abs(ours - exact) / exact)
    assert worst < 1e-11  # noise._DELTA_MARGIN (1e-9) covers this with room to spare


def _brute_force_sigma(epsilon, delta, sensitivity, lo, hi, step):
    """Independent check: the textbook formula with scipy.stats, scanned on a grid."""
    sigmas = np.arange(lo, hi, step)
    a = sensitivity / (2 * sigmas)
    b = epsilon * sigmas / sensitivity
    profile = stats.norm.cdf(a - b) - math.exp(epsilon) * stats.norm.cdf(-a - b)
    ok = np.nonzero(profile <= delta)[0]
    return sigmas[ok[0]]


def test_known_value_epsilon_1_delta_1e5():
    sigma = analytic_gaussian_sigma(1, 1e-5, 1)
    brute = _brute_force_sigma(1, 1e-5, 1, 3.0, 4.5, 1e-6)
    assert abs(sigma - brute) <= 1e-6
    assert sigma == pytest.approx(3.7306, abs=1e-4)


@pytest.mark.parametrize("epsilon, delta", [(0.1, 1e-6), (5, 1e-10), (0.01, 1e-3)])
def test_analytic_sigma_matches_brute_force_scan(epsilon, delta):
    sigma = analytic_gaussian_sigma(epsilon, delta, 1)
    step = sigma * 1e-6
    brute = _brute_force_sigma(epsilon, delta, 1, sigma * 0.9, sigma * 1.1, step)
    assert abs(sigma - brute) <= step


@pytest.mark.parametrize("epsilon", [e for e in EPSILONS if e < 1])
def test_analytic_beats_classic_below_epsilon_one(epsilon):
    for delta in DELTAS:
        for sensitivity in SENSITIVITIES:
            analytic = analytic_gaussian_sigma(epsilon, delta, sensitivity)
            classic = classic_gaussian_sigma(epsilon, delta, sensitivity)
            assert analytic < classic
            assert gaussian_delta(classic, epsilon, sensitivity) <= delta


def test_classic_formula_value():
    expected = 2 * math.sqrt(2 * math.log(1.25 / 1e-6)) / 0.5
    assert classic_gaussian_sigma(0.5, 1e-6, 2) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("epsilon", [1, 1.0, 2, 10])
def test_classic_refused_for_epsilon_at_least_one(epsilon):
    with pytest.raises(PrivacyParameterError, match="epsilon < 1"):
        classic_gaussian_sigma(epsilon, 1e-6, 1)
    with pytest.raises(PrivacyParameterError, match="epsilon < 1"):
        gaussian_sigma(epsilon, 1e-6, 1, calibration="classic")


@pytest.mark.parametrize("function", [analytic_gaussian_sigma, classic_gaussian_sigma])
def test_delta_zero_refused(function):
    with pytest.raises(PrivacyParameterError, match="delta > 0"):
        function(0.5, 0, 1)


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(epsilon=0, delta=1e-6, sensitivity=1), "epsilon"),
    (dict(epsilon=5e-324, delta=1e-6, sensitivity=1), "allowed range"),
    (dict(epsilon=1, delta=1, sensitivity=1), "delta"),
    (dict(epsilon=1, delta=float("nan"), sensitivity=1), "delta"),
    (dict(epsilon=1, delta=1e-6, sensitivity=0), "sensitivity"),
    (dict(epsilon=1, delta=1e-6, sensitivity=math.inf), "sensitivity"),
    (dict(epsilon=1, delta=1e-6, sensitivity=True), "sensitivity"),
])
def test_analytic_refuses_bad_parameters(kwargs, fragment):
    with pytest.raises(PrivacyParameterError, match=fragment):
        analytic_gaussian_sigma(**kwargs)


def test_extreme_parameters_calibrate():
    for epsilon, delta in [(100, 1e-300), (1e-9, 1e-300), (1e-9, 0.999), (100, 0.999)]:
        sigma = analytic_gaussian_sigma(epsilon, delta, 1)
        assert math.isfinite(sigma) and sigma > 0
        assert gaussian_delta(sigma, epsilon, 1) <= delta


def test_gaussian_sigma_dispatch():
    assert gaussian_sigma(0.5, 1e-6, 1) == analytic_gaussian_sigma(0.5, 1e-6, 1)
    assert gaussian_sigma(0.5, 1e-6, 1, "classic") == classic_gaussian_sigma(0.5, 1e-6, 1)
    with pytest.raises(PrivacyParameterError, match="unknown Gaussian calibration"):
        gaussian_sigma(0.5, 1e-6, 1, "moments")


def test_zcdp_rho():
    assert zcdp_rho(2.0, 1.0) == 0.125
    assert zcdp_rho(3.0, 3.0) == 0.5


# --- grid rounding ----------------------------------------------------------------------------

def test_grid_exponent_and_slack():
    assert grid_exponent(3.0) == 1 - 40
    assert grid_exponent(4.0) == 2 - 40
    assert grid_exponent(math.nextafter(4.0, 0)) == 1 - 40
    assert grid_exponent(0.3) == -2 - 40
    assert rounding_slack(3.0, 0) == 0.0
    assert rounding_slack(3.0, 100) == pytest.approx(2.0**-39 * 10, rel=1e-15)
    assert rounding_slack(3.0, 100) >= 2.0**-39 * 10


def test_calibrate_with_rounding_covers_its_own_slack():
    for epsilon, delta, sensitivity in GRID[::5]:
        for dimension in [1, 1000, 10**6]:
            sigma = calibrate_with_rounding(epsilon, delta, sensitivity, dimension)
            slack = rounding_slack(sigma, dimension)
            assert sigma >= analytic_gaussian_sigma(epsilon, delta, sensitivity)
            assert gaussian_delta(sigma, epsilon, sensitivity + slack) <= delta
    classic = calibrate_with_rounding(0.5, 1e-6, 1, 10, calibration="classic")
    assert classic >= classic_gaussian_sigma(0.5, 1e-6, 1)


def test_calibrate_with_rounding_refuses_when_slack_outgrows_sigma():
    with pytest.raises(PrivacyParameterError, match="rounding slack"):
        calibrate_with_rounding(1e-9, 1e-12, 1, 10**8)


# --- samplers: statistical tests with known power ---------------------------------------------

def _matches_normal(noise_values: np.ndarray, sigma: float) -> bool:
    """Does the sample look like N(0, sigma^2)? Strict thresholds (false-alarm rate ~1e-6).

    With n = 20,000 the relative standard error of the sample variance is sqrt(2/n) = 1%; a
    30% mis-scale moves the variance by 41% (x1.3^-2) or 69% (x1.3^2), i.e. >40 standard
    errors against a 5-standard-error threshold, so the power is essentially 1.
    """
    n = noise_values.size
    mean_z = abs(noise_values.mean()) / (sigma / math.sqrt(n))
    variance_z = abs(noise_values.var(ddof=1) / sigma**2 - 1) / math.sqrt(2 / (n - 1))
    ks_p = stats.kstest(noise_values, stats.norm(scale=sigma).cdf).pvalue
    return mean_z < 5 and variance_z < 5 and ks_p > 1e-6


@pytest.fixture(scope="module")
def secure_draw():
    sigma = 3.0
    values = np.zeros(20_000)
    noisy, spacing = SecureGaussianSampler().sample(values, sigma, sensitivity=1.0)
    return sigma, noisy, spacing


def test_secure_sampler_scale_with_known_power(secure_draw):
    sigma, noisy, spacing = secure_draw
    assert spacing == 2.0**-39
    assert _matches_normal(noisy, sigma)
    assert not _matches_normal(noisy, sigma * 1.3)
    assert not _matches_normal(noisy, sigma / 1.3)


def test_secure_sampler_output_lies_on_its_grid(secure_draw):
    _, noisy, spacing = secure_draw
    multiples = noisy / spacing  # exact: dividing by a power of two
    assert np.all(multiples == np.round(multiples))
    assert len(np.unique(noisy)) > 19_900  # continuous-looking at this spacing


def test_secure_sampler_shifts_values_and_keeps_shape():
    values = np.array([[1_000_000.0, 0.5, -3.0], [7.0, 0.0, 2.0]])
    noisy, _ = SecureGaussianSampler().sample(values, 0.01)
    assert noisy.shape == values.shape
    assert np.all(np.abs(noisy - values) < 0.01 * 8)
    assert np.any(noisy != values)


def test_secure_sampler_edge_cases():
    sampler = SecureGaussianSampler()
    assert sampler.private is True
    empty, spacing = sampler.sample(np.array([]), 3.0)
    assert empty.size == 0 and spacing == 2.0**-39
    for bad in [np.array([1.0, np.nan]), np.array([np.inf])]:
        with pytest.raises(DpsqlError, match="finite"):
            sampler.sample(bad, 3.0)
    for sigma in [0.0, -1.0, math.nan, math.inf, 1e-200, 1e200]:
        with pytest.raises(PrivacyParameterError, match="sigma"):
            sampler.sample(np.zeros(3), sigma)


def test_secure_sampler_refuses_when_opendp_map_disagrees(monkeypatch):
    class Overspending:
        def map(self, distance):
            return 10.0

        def __call__(self, values):
            raise AssertionError("must not sample")

    monkeypatch.setattr(samplers, "_gaussian_measurement", lambda sigma, k, size: Overspending())
    with pytest.raises(DpsqlError, match="privacy map"):
        SecureGaussianSampler().sample(np.zeros(4), 3.0, sensitivity=1.0)


def test_opendp_privacy_map_agrees_with_rounding_slack():
    for sigma, size in [(3.0, 1), (3.0, 10_000), (0.37, 50), (1e12, 2)]:
        measurement = samplers._gaussian_measurement(sigma, grid_exponent(sigma), size)
        expected = zcdp_rho(sigma, 1.0 + rounding_slack(sigma, size))
        assert float(measurement.map(1.0)) == pytest.approx(expected, rel=1e-9)


def test_seeded_sampler_is_reproducible_and_marked_non_private():
    sampler = SeededTestSampler(7)
    assert sampler.private is False
    first, spacing = sampler.sample(np.zeros(20_000), 3.0)
    again, _ = SeededTestSampler(7).sample(np.zeros(20_000), 3.0)
    assert spacing == 0.0
    assert np.array_equal(first, again)
    assert _matches_normal(first, 3.0)
    assert not _matches_normal(first, 3.0 * 1.3)
    assert not _matches_normal(first, 3.0 / 1.3)
    for bad in [-1, True, 1.5]:
        with pytest.raises(PrivacyParameterError, match="seed"):
            SeededTestSampler(bad)


def test_numpy_random_only_on_lines_marked_test_only():
    for path in (noise.__file__, samplers.__file__):
        _only_test_only_randomness(Path(path).read_text())


def _only_test_only_randomness(source: str) -> None:
    tree = ast.parse(source)
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "random" not in imported and "numpy.random" not in imported
    for line in source.splitlines():
        if "np.random" in line or "numpy.random" in line or "_rng" in line:
            assert line.rstrip().endswith("# test-only"), line

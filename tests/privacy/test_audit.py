"""Black-box privacy audit of the Gaussian release path (docs/threat-model.md, item 14).

Method (a distinguishing test on neighbouring data sets, as in Jagielski, Ullman & Oprea,
"Auditing differentially private machine learning", NeurIPS 2020, and Nasr et al.,
"Adversary instantiation", IEEE S&P 2021):

1. Take a real count workload (two statements on the Adult policy), the strategy and the
   noise scale sigma that ``Session.explain`` chooses for it at the declared (epsilon, delta),
   and the real data vector x. The neighbour x' adds one row to the cell whose column of A is
   largest (the worst case for this plan).
2. Draw n = 100,000 releases ``y = A x + noise`` and n from x', the noise from the secure
   sampler (dpsql.noise.samplers.SecureGaussianSampler, exactly as the kernel calls it). Reduce each to
   ``T = <y - A x, u>`` with ``u = A(x' - x) / ||A(x' - x)||``: the likelihood-ratio statistic,
   so the threshold events below are the most powerful ones.
3. For K = 40 thresholds t fixed in advance from the declared sigma, and both directions
   (``T > t`` favours x', ``T < t`` favours x), bound the two event probabilities with
   one-sided Clopper-Pearson intervals and take
   ``eps_lb = max ln((p_hi_side_lower - delta) / p_lo_side_upper)``. (epsilon, delta)-DP
   implies ``P[E | x'] <= e^eps P[E | x] + delta`` for every event, so when the mechanism is
   (epsilon, delta)-DP, ``eps_lb > epsilon`` happens with probability at most alpha = 1e-3
   (union bound over the 4K one-sided intervals).
4. Pass: ``eps_lb <= declared epsilon``. Mutants must fail: the noise halved (a sampler bug),
   and the plan's sensitivity halved (a strategy bug, calibrated through the session's own
   calibrate_with_rounding).

Power (computed from the exact Gaussian tails, and checked by simulation in
``test_audit_method_has_the_claimed_power``): at epsilon = 2, delta = 1e-5, n = 1e5 the
correct mechanism gives eps_lb about 1.1 (it cannot reach 2: the privacy loss beyond
that lives in tails of probability ~1e-5, which 1e5 samples cannot resolve); a factor-2
error in sigma gives about 2.4 +- 0.1, so it is detected essentially always; a 0.7 factor
gives about 1.7 and is NOT detected. A black-box audit at this size is a smoke alarm for
gross errors; the calibration (item 12) and the sampler's goodness of fit (item 13) in
test_calibration_oracle.py catch small ones.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats


from dpsql.engines import duckdb as data_engine
from dpsql.noise.gaussian import analytic_gaussian_sigma, calibrate_with_rounding
from dpsql.noise.samplers import SecureGaussianSampler
from dpsql.sql.compile import compile_workload
from dpsql.sql.parse import parse_batch

from ..conftest import make_adult_db

EPSILON, DELTA = 2.0, 1e-5
N_SAMPLES = 100_000
ALPHA = 1e-3
K_THRESHOLDS = 40
SQL = ("SELECT sex, COUNT(*) FROM adult GROUP BY sex; "
       "SELECT COUNT(*) FROM adult WHERE sex = 'Female'")


def clopper_pearson(k, n: int, alpha: float):
    """One-sided Clopper-Pearson bounds (lower, upper) on a binomial p, each at level alpha.
    ``k`` may be an array."""
    k = np.asarray(k)
    lower = np.where(k == 0, 0.0, stats.beta.ppf(alpha, np.maximum(k, 1), n - k + 1))
    upper = np.where(k == n, 1.0, stats.beta.isf(alpha, k + 1, np.maximum(n - k, 1)))
    return lower, upper


def epsilon_lower_bound(t_x: np.ndarray, t_neighbour: np.ndarray, shift: float, sigma: float,
                        delta: float, alpha: float = ALPHA, k: int = K_THRESHOLDS) -> float:
    """The audit's empirical lower bound on epsilon at ``delta`` (module docstring, step 3).

    ``t_x``, ``t_neighbour``: the statistic T under x and x' (mean 0 and ``shift``);
    thresholds span the declared ``sigma`` around them, fixed before looking at the data.
    """
    thresholds = np.linspace(shift / 2 - 6 * sigma, shift / 2 + 6 * sigma, k)
    level = alpha / (4 * k)
    a, b = np.sort(t_x), np.sort(t_neighbour)
    n_a, n_b = a.size, b.size
    above_a = n_a - np.searchsorted(a, thresholds, side="right")   # #{T > t} under x
    above_b = n_b - np.searchsorted(b, thresholds, side="right")   # ... under x'
    best = -math.inf
    for hits_more, n_more, hits_less, n_less in (
            (above_b, n_b, above_a, n_a),                  # T > t: likelier under x'
            (n_a - above_a, n_a, n_b - above_b, n_b)):     # T <= t: likelier under x
        more_lo, _ = clopper_pearson(hits_more, n_more, level)
        _, less_hi = clopper_pearson(hits_less, n_less, level)
        ok = more_lo - delta > 0
        if ok.any():
            best = max(best, float(np.max(np.log((more_lo[ok] - delta) / less_hi[ok]))))
    return best


# --------------------------------------------------------------------------- the method

def test_clopper_pearson_matches_scipy():
    """Passing: our one-sided bounds at level a are scipy's exact two-sided 1 - 2a interval."""
    for k, n in [(0, 50), (3, 50), (50, 50), (120, 100_000), (99_990, 100_000)]:
        lo, hi = clopper_pearson(k, n, 0.01)
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.98, method="exact")
        assert lo == pytest.approx(ci.low, abs=1e-12) and hi == pytest.approx(ci.high,
                                                                               abs=1e-12)


def test_audit_method_has_the_claimed_power():
    """The estimator on exact continuous Gaussian draws (numpy, seeded: a test of the method,
    not of dpsql's sampler). Passing: the correctly calibrated sigma stays below epsilon, and
    sigma / 2 (what both mutants amount to) exceeds it, in each of 5 repetitions."""
    rng = np.random.default_rng(7)   # test data only
    sigma = analytic_gaussian_sigma(EPSILON, DELTA, 1.0)
    for _ in range(5):
        for factor, exceeds in ((1.0, False), (0.5, True)):
            t_x = rng.normal(0.0, sigma * factor, N_SAMPLES)
            t_n = rng.normal(1.0, sigma * factor, N_SAMPLES)
            eps_lb = epsilon_lower_bound(t_x, t_n, 1.0, sigma, DELTA)
            assert (eps_lb > EPSILON) == exceeds, (factor, eps_lb)


# --------------------------------------------------------------------------- the audit

@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """(plan, sigma the session uses, x, x') for SQL on the Adult extract."""
    db = make_adult_db(str(tmp_path_factory.mktemp("audit") / "adult.duckdb"))
    e = db.explain(SQL, epsilon=EPSILON, delta=DELTA, strategy="workload")
    (candidate,) = e.candidates
    plan = candidate.plan
    assert e.sigma == calibrate_with_rounding(EPSILON, DELTA, plan.sensitivity,
                                              plan.n_measurements)
    policy = db.policies()["adult"]
    w = compile_workload(parse_batch(SQL, lambda name, node: policy), policy)
    with db.db.connect() as con:
        cols = [(p.column, policy.column(p.column), p.unit_to_part) for p in w.partitions]
        x = data_engine.data_vector(con, "adult", cols, w.n_cells)
    db.close()
    A = plan.A.toarray() if hasattr(plan.A, "toarray") else np.asarray(plan.A)
    worst = int(np.argmax((A ** 2).sum(axis=0)))
    neighbour = x.copy()
    neighbour[worst] += 1
    return plan, e.sigma, x, neighbour


def _statistic(plan, x, neighbour, sigma, n, sampler):
    """n releases of plan on x and on its neighbour, each reduced to T (module docstring)."""
    base = plan.measure(x)
    shift_vector = plan.measure(neighbour) - base
    shift = float(np.linalg.norm(shift_vector))
    u = shift_vector / shift
    out = []
    for vector in (base, plan.measure(neighbour)):
        y, _ = sampler(np.tile(vector, n), sigma)
        out.append((y.reshape(n, -1) - base) @ u)
    return out[0], out[1], shift


def secure(values, sigma):
    return SecureGaussianSampler().sample(values, sigma, sensitivity=1.0)


def noise_halved(values, sigma):
    """Mutant sampler: draws at half the requested scale."""
    return SecureGaussianSampler().sample(values, sigma / 2)


@pytest.mark.slow
@pytest.mark.parametrize("mutant", [None, "noise halved", "sensitivity halved"])
def test_black_box_audit_of_the_gaussian_release(pipeline, mutant):
    """Passing: the audit's empirical epsilon (at the declared delta) does not exceed the
    declared epsilon for dpsql as it is, and exceeds it for each mutant."""
    plan, sigma, x, neighbour = pipeline
    sampler = secure
    if mutant == "noise halved":
        sampler = noise_halved
    elif mutant == "sensitivity halved":
        lying = dataclasses.replace(plan, sensitivity=plan.sensitivity / 2)
        sigma = calibrate_with_rounding(EPSILON, DELTA, lying.sensitivity,
                                        lying.n_measurements)
    t_x, t_n, shift = _statistic(plan, x, neighbour, sigma, N_SAMPLES, sampler)
    assert shift == pytest.approx(plan.sensitivity, rel=1e-9)
    declared_sigma = pipeline[1]
    eps_lb = epsilon_lower_bound(t_x, t_n, shift, declared_sigma, DELTA)
    if mutant is None:
        assert eps_lb <= EPSILON, eps_lb
        assert eps_lb > 0.4 * EPSILON, f"the audit lost its power: {eps_lb}"
    else:
        assert eps_lb > EPSILON, (mutant, eps_lb)

"""Pure ε-DP releases (δ = 0): Laplace noise through the real pipeline.

The empirical check has known power: over R releases of m answers the mean squared error
estimates the expected MSE with relative standard deviation about sqrt(Var(e²))/E(e²)/sqrt(Rm)
≤ sqrt(5/(R m)) for Laplace-sum errors (kurtosis at most 6): with R = 150 releases of m = 10
answers that is 5.8% of the MSE, so 2.9% of the RMSE (more if answers within a release are
correlated: at most one release's worth, 4.1% with the 5 independent groups counted alone).
The check accepts an RMSE ratio within 15% of 1: at the right scale that is over 3.6 standard
deviations (false alarm below 2e-4), and a noise scale off by 30% (ratio 1.3, or 0.77) misses
the band by as many. (An earlier version ran 60 releases with a 10% band, about 2 standard
deviations: it failed a few runs in a hundred.)
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dpsql.errors import BudgetExceededError, PrivacyParameterError, StrategyError
from dpsql.noise.samplers import SeededTestSampler

from ..conftest import make_adult_db, snapshot
from .test_statistical import exact_answers

BATCH = """
SELECT sex, COUNT(*) FROM adult GROUP BY sex;
SELECT COUNT(*) FROM adult WHERE age < 30;
SELECT COUNT(*) FROM adult WHERE age BETWEEN 30 AND 49;
SELECT COUNT(*) FROM adult WHERE age >= 50 AND income = '>50K';
SELECT race, COUNT(*) FROM adult WHERE age < 40 GROUP BY race;
"""


def _answers(release):
    counts = np.concatenate([[row[-4] for row in t.rows] for t in release.results])
    stderr = np.concatenate([[row[-3] for row in t.rows] for t in release.results])
    low = np.concatenate([[row[-2] for row in t.rows] for t in release.results])
    high = np.concatenate([[row[-1] for row in t.rows] for t in release.results])
    return counts, stderr, low, high


def _check(errors, expected_rmse, scale=1.0):
    return abs(float(np.sqrt(np.mean((scale * errors) ** 2))) / expected_rmse - 1) <= 0.15


@pytest.mark.slow   # ~18 s of repeated releases; test_laplace_scale_is_the_l1_sensitivity_over_epsilon keeps a power check in the default run
def test_laplace_releases_match_their_reported_error_and_intervals(tmp_path):
    """Secure sampler, 150 releases of 10 answers: RMSE within 15% and 95% intervals cover.

    The ``hierarchical`` strategy keeps each release fast and makes every answer a sum of
    several Laplace terms (the intervals' nontrivial case)."""
    db = make_adult_db(str(tmp_path / "a.duckdb"), reuse=False, epsilon=10_000, delta=0)
    truth = exact_answers(db, BATCH)
    errors, inside, expected = [], [], None
    for _ in range(150):
        r = db.answer(BATCH, epsilon=0.5, delta=0, strategy="hierarchical")
        counts, stderr, low, high = _answers(r)
        errors.append(counts - truth)
        inside.append((low <= truth) & (truth <= high))
        expected = r.expected_rmse
        assert r.private
    errors = np.array(errors)
    assert _check(errors, expected)
    assert not _check(errors, expected, 1.3) and not _check(errors, expected, 1 / 1.3)
    coverage = float(np.mean(inside))
    assert 0.92 <= coverage <= 0.98
    entry = db.ledger()[-1]
    assert entry["mechanism"] == "laplace" and entry["delta"] == 0.0
    assert entry["calibration"] is None


def test_laplace_scale_is_the_l1_sensitivity_over_epsilon(tmp_path):
    db = make_adult_db(str(tmp_path / "a.duckdb"), epsilon=100, delta=0,
                       sampler=SeededTestSampler(3))
    e = db.explain(BATCH, epsilon=0.5, delta=0, strategy="identity")
    assert e.mechanism == "laplace"
    chosen = e.candidates[0]
    assert chosen.sensitivity == 1.0
    assert chosen.sigma == pytest.approx(2.0, rel=1e-9)        # b = 1 / 0.5
    assert chosen.sigma >= 2.0                                  # never rounded down
    r = db.answer(BATCH, epsilon=0.5, delta=0, strategy="workload")
    entry = db.ledger()[-1]
    assert entry["strategy"] == "workload"
    # the workload strategy's L1 sensitivity: a cell lies in at most 3 of the queries
    # (a sex group, one age range, and a race group when age < 40)
    assert entry["sensitivity"] == pytest.approx(3.0)
    assert entry["sigma"] == pytest.approx(6.0, rel=1e-9)
    assert r.expected_rmse == pytest.approx(np.sqrt(2) * 6.0, rel=1e-9)


def test_pure_budget_accepts_only_pure_requests(tmp_path):
    db = make_adult_db(str(tmp_path / "a.duckdb"), reuse=False, epsilon=1, delta=0,
                       sampler=SeededTestSampler(1))
    before = snapshot(db)
    with pytest.raises(BudgetExceededError, match="delta"):    # Gaussian noise asked for
        db.answer(BATCH, epsilon=0.1, delta=1e-9, strategy="identity")
    assert snapshot(db) == before
    r = db.answer(BATCH, epsilon=0.1, delta=1e-9)    # auto: only Laplace fits, none spent
    assert r.delta == 0 and db.ledger()[-1]["mechanism"] == "laplace"
    db.answer(BATCH, epsilon=Fraction(1, 10), delta=0)
    assert db.budget("adult")["epsilon_spent"] == Fraction(2, 10)
    assert db.budget("adult")["delta_spent"] == 0


def test_gaussian_only_strategies_are_refused_under_pure_dp(tmp_path):
    db = make_adult_db(str(tmp_path / "a.duckdb"), epsilon=1, delta=0)
    before = snapshot(db)
    for name in ("optimal", "coa"):
        with pytest.raises(StrategyError, match="delta > 0|Gaussian"):
            db.answer(BATCH, epsilon=0.1, delta=0, strategy=name)
    with pytest.raises(PrivacyParameterError, match="delta = 0"):
        db.answer(BATCH, epsilon=0.1, delta=1e-6, strategy="mwem")
    assert snapshot(db) == before


def test_auto_under_pure_dp_picks_the_smallest_expected_error(tmp_path):
    db = make_adult_db(str(tmp_path / "a.duckdb"), epsilon=1, delta=0)
    ranges = ";\n".join(f"SELECT COUNT(*) FROM adult WHERE age BETWEEN {a} AND {b}"
                        for a in range(17, 90, 3) for b in range(a + 2, 91, 3))
    e = db.explain(ranges, epsilon=0.5, delta=0)
    usable = [c for c in e.candidates if np.isfinite(c.rmse)]
    assert {c.strategy for c in usable} >= {"identity", "hierarchical", "wavelet"}
    assert e.rmse == min(c.rmse for c in usable)
    assert all(c.mechanism == "laplace" for c in usable)
    assert e.bound_rmse <= e.rmse


@pytest.mark.parametrize("delta, family", [(1e-6, "laplace"), (0.2, "gaussian")])
def test_auto_compares_both_families_and_picks_the_smaller_error(tmp_path, delta, family):
    """Under an (ε, δ) budget auto weighs the best Gaussian and the best Laplace candidate;
    which wins depends on δ (a large δ makes Gaussian noise cheap). Passing: both families
    are candidates, the choice has the smallest expected RMSE of all, and the expected
    family wins."""
    db = make_adult_db(str(tmp_path / "a.duckdb"), epsilon=10, delta=0.5)
    e = db.explain(BATCH, epsilon=0.5, delta=delta)
    usable = [c for c in e.candidates if np.isfinite(c.rmse)]
    assert {c.mechanism for c in usable} == {"gaussian", "laplace"}
    assert e.rmse == min(c.rmse for c in usable)
    assert e.mechanism == family

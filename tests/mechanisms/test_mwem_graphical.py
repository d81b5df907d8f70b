"""MWEM over a graphical model (issue 16): wide connected batches, the kernel's marginal
oracle (scores, sensitivities, noise scales, with known power), one charge, refusals
before the charge, and DuckDB as the oracle for the answers."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import duckdb
import numpy as np
import pytest

import dpsql
from dpsql.errors import DpsqlError, PrivacyParameterError, StrategyError
from dpsql.inference import pgm
from dpsql.kernel.marginal_oracle import MarginalOracle
from dpsql.mechanisms.mwem import graphical
from dpsql.mechanisms.mwem.options import MWEMOptions
from dpsql.noise.laplace import laplace_scale
from dpsql.noise.samplers import SecureSampler, SeededTestSampler
from dpsql.workload.blocks import marginal_workload
from dpsql.workload.marginals import MarginalMeasurement

from ..sql.test_implicit import COLS, _database

#: all 2-way marginals over eight demo columns: one connected group of 73,366,560 cells
EIGHT = [f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}"
         for a, b in itertools.combinations(COLS + ["age"], 2)]


class _Recording:
    """A test sampler: exact measurements, the best score selected, every call recorded."""

    private = False

    def __init__(self):
        self.calls = []

    def laplace(self, values, scale, *, sensitivity=None, epsilon=None):
        self.calls.append(("laplace", float(scale), sensitivity, epsilon))
        return np.asarray(values, dtype=float), 0.0

    def exponential(self, scores, epsilon, *, sensitivity):
        self.calls.append(("exponential", np.array(scores, dtype=float), epsilon,
                           sensitivity))
        return int(np.argmax(scores))


def _answers_against_duckdb(path, batch, release) -> np.ndarray:
    """Every answer minus DuckDB's own (0 for a declared group with no rows)."""
    con = duckdb.connect(path)
    errors = []
    for sql, table in zip(batch, release.tables):
        names = [c[0] for c in con.execute(f"DESCRIBE {table}").fetchall()]
        k = names.index("stderr") - 1
        truth = {tuple(r[:-1]): r[-1] for r in con.execute(sql).fetchall()}
        errors += [row[k] - truth.get(tuple(row[:k]), 0)
                   for row in con.execute(f"SELECT * FROM {table}").fetchall()]
    con.close()
    return np.array(errors, dtype=float)


def test_a_wide_connected_batch_is_answered_with_one_charge():
    """Over the dense limit the factored form cannot hold the one connected group: the
    graphical form answers every declared group, charging the ledger once, exactly ε."""
    db, _ = _database(SeededTestSampler(5))
    release = db.answer(EIGHT, epsilon=Fraction(1, 2), delta=0, strategy="mwem(rounds=6)")
    ledger = db.ledger()
    assert len(ledger) == 1 and ledger[0]["mechanism"] == "mwem"
    assert ledger[0]["epsilon_exact"] == "1/2" and ledger[0]["delta"] == 0
    assert ledger[0]["status"] == "released" and ledger[0]["n_cells"] > 4_000_000
    assert len(release.tables) == len(EIGHT)
    assert all(row[-3] is None for t in release.results for row in t.rows)
    db.close()


#: a chain of pairs over the same eight columns: connected, the same 73,366,560 cells
CHAIN = [f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}"
         for a, b in zip(COLS + ["age"], COLS[1:] + ["age"])]


@pytest.mark.parametrize("batch, rounds", [
    (CHAIN, 8), pytest.param(EIGHT, 30, marks=pytest.mark.slow)])
def test_exact_measurements_give_duckdbs_answers(batch, rounds):
    """With exact measurements and the best-scored selection, every candidate marginal is
    measured within T rounds and the last estimate fits them: every answer is DuckDB's,
    declared-but-empty groups included (the limit of large ε, without its noise)."""
    db, path = _database(_Recording())
    release = db.answer(batch, epsilon=100, delta=0, strategy=f"mwem(rounds={rounds})")
    db.close()
    errors = _answers_against_duckdb(path, batch, release)
    assert errors.size > 100 * len(batch) and np.max(np.abs(errors)) < 0.5


@pytest.mark.slow
def test_large_epsilon_answers_approach_duckdbs():
    """Seeded noise at ε = 100 (the policy's budget): RMSE about 1 on counts up to 30,000."""
    db, path = _database(SeededTestSampler(3))
    release = db.answer(EIGHT, epsilon=100, delta=0, strategy="mwem(rounds=30)")
    db.close()
    errors = _answers_against_duckdb(path, EIGHT, release)
    assert math.sqrt(np.mean(errors ** 2)) < 5 and np.max(np.abs(errors)) < 100


# ------------------------------------------------------------------- the kernel's oracle

SIZES = (2, 3, 4)
COUNTS = {(0, 1): np.arange(6, dtype=float).reshape(2, 3),
          (1, 2): np.array([[1, 0, 2, 0], [3, 1, 1, 0], [0, 4, 2, 1]], dtype=float)}
CANDIDATES = ((0, 1), (1, 2), (0,))


def test_oracle_scores_are_l1_errors_of_full_marginals_at_sensitivity_one():
    sampler = _Recording()
    oracle = MarginalOracle(COUNTS, SIZES, CANDIDATES, sampler, Fraction(1))
    estimates = [np.zeros(6), np.ones(12), np.array([3.0, 12.0])]
    k = oracle.select(estimates, [1.0, 2.0, 0.5], Fraction(1, 4))
    _, scores, eps, sensitivity = sampler.calls[-1]
    truth_0 = COUNTS[(0, 1)].sum(axis=1)                 # summed down: [3, 12]
    want = [15.0 - 1.0, float(np.abs(1 - COUNTS[(1, 2)]).sum()) - 2.0,
            float(np.abs(np.array([3.0, 12.0]) - truth_0).sum()) - 0.5]
    assert np.allclose(scores, want) and k == int(np.argmax(want))
    assert sensitivity == 1.0 and eps == Fraction(1, 4) and oracle.spent == Fraction(1, 4)


def test_oracle_measures_k_marginals_at_l1_sensitivity_k_and_refuses_overspending():
    sampler = _Recording()
    oracle = MarginalOracle(COUNTS, SIZES, CANDIDATES, sampler, Fraction(1))
    noisy, b = oracle.measure([(1,), (0, 1), ()], Fraction(1, 2))
    _, scale, sensitivity, eps = sampler.calls[-1]
    assert sensitivity == 3.0 and scale == b == laplace_scale(Fraction(1, 2), 3.0, 3 + 6 + 1)
    assert np.array_equal(noisy[0], [3, 5, 7]) and noisy[2][0] == 15.0
    with pytest.raises(StrategyError, match="more than its charged epsilon"):
        oracle.measure([(0,)], Fraction(3, 4))
    with pytest.raises(StrategyError, match="not in a clique the kernel read"):
        oracle.measure([(0, 2)], Fraction(1, 4))
    assert oracle.spent == Fraction(1, 2)


def _scale_within_ten_percent(errors: np.ndarray, b: float) -> bool:
    """The mean absolute error of Laplace(b) is b (sd b/√n): within ±10% of b."""
    return abs(float(np.mean(np.abs(errors))) / b - 1.0) < 0.10


def test_measurement_noise_has_the_derived_scale_known_power():
    """10,000 cells measured once by the secure sampler at ε = 1/2: the empirical scale is
    b = 1/ε within 10% (sd 1%: a false alarm needs 10 sd); the same check rejects noise
    30% too small or too large (30 sd away), so a kernel off by 30% fails."""
    counts = {(0, 1): np.full((100, 100), 7.0)}
    oracle = MarginalOracle(counts, (100, 100), ((0, 1),), SecureSampler(), Fraction(1, 2))
    noisy, b = oracle.measure([(0, 1)], Fraction(1, 2))
    assert 2.0 <= b < 2.0 * (1 + 1e-3)
    assert _scale_within_ten_percent(noisy[0] - 7.0, 2.0)
    rng = np.random.default_rng(0)                        # the test's own power check
    for off in (0.7, 1.3):
        assert not _scale_within_ten_percent(rng.laplace(0, off * 2.0, 10_000), 2.0)


def _selection_share(p_hat: float, p: float, n: int) -> bool:
    return abs(p_hat - p) < 4 * math.sqrt(p * (1 - p) / n)


def test_selection_follows_the_exponential_mechanism_known_power():
    """Two candidates whose scores differ by 4, ε' = 1 each draw: the better is picked with
    p = 1/(1 + e^-2) = 0.881 (exp(ε'·score/2)); 4,000 secure draws within 4 sd (0.020).
    At a temperature off by 30% p would be 0.823 or 0.946, over 10 sd away: refused."""
    counts = {(0,): np.array([10.0, 0.0])}
    oracle = MarginalOracle(counts, (2,), ((0,), ()), SecureSampler(), Fraction(4000))
    estimates = [np.array([14.0, 0.0]), np.array([10.0])]       # scores 4 and 0
    n = 4000
    picks = [oracle.select(estimates, [0.0, 0.0], 1) for _ in range(n)]
    p_hat = 1.0 - float(np.mean(picks))
    assert _selection_share(p_hat, 1 / (1 + math.exp(-2)), n)
    for off in (1.3, 0.7):
        assert not _selection_share(1 / (1 + math.exp(-2 / off)), 1 / (1 + math.exp(-2)), n)


# ------------------------------------------------------------------ refused, nothing charged

def test_over_the_time_limit_is_refused_before_any_charge():
    db, _ = _database(SeededTestSampler(1))
    with dpsql.planning_limits(time_limit=0.05):
        with pytest.raises(DpsqlError, match="graphical model.*over time_limit.*nothing was "
                                             "charged"):
            db.answer(EIGHT, epsilon=1, delta=0, strategy="mwem")
    assert db.ledger() == []
    db.close()


@pytest.mark.parametrize("spec, error, match", [
    ("mwem(rounds=auto)", StrategyError, "does not take rounds=auto"),
    ("mwem(rounds=4, iterate=average)", StrategyError, "iterate=average"),
    ("mwem(rounds=4, measure=query)", StrategyError, "measure=query"),
])
def test_options_not_carried_over_are_refused_before_any_charge(spec, error, match):
    db, _ = _database(SeededTestSampler(1))
    with pytest.raises(error, match=match):
        db.answer(EIGHT, epsilon=1, delta=0, strategy=spec)
    with pytest.raises(PrivacyParameterError, match="delta = 0"):
        db.answer(EIGHT, epsilon=1, delta=1e-6, strategy="mwem")
    assert db.ledger() == []
    e = db.explain(EIGHT, epsilon=1, delta=0, strategy="mwem")
    assert "graphical model" in e.candidates[0].note and db.ledger() == []
    db.close()


def test_the_estimate_holds_regions_no_measurement_reads():
    """``pgm.estimate(regions=...)``: a region never measured is consistent with the
    measured ones (its one-column marginals) and non-negative."""
    sizes = (2, 3, 2)
    mu = np.arange(1.0, 13.0).reshape(sizes)
    ms = [MarginalMeasurement((0, 1), (np.eye(2), np.eye(3)), 1.0),
          MarginalMeasurement((2,), (np.eye(2),), 1.0)]
    y = np.concatenate([mu.sum(axis=2).ravel(), mu.sum(axis=(0, 1))])
    tables, _ = pgm.estimate(sizes, ms, y, regions=[(1, 2)], tolerance=1e-10,
                             max_rounds=3000)
    assert set(tables) == {(0, 1), (1, 2)}
    assert np.allclose(tables[(1, 2)].sum(axis=1), mu.sum(axis=(0, 2)), atol=1e-6)
    assert np.allclose(tables[(1, 2)].sum(axis=0), mu.sum(axis=(0, 1)), atol=1e-6)
    assert np.all(tables[(1, 2)] >= 0)


@pytest.mark.parametrize("options", [
    MWEMOptions(rounds=3, total=400.0),
    MWEMOptions(rounds=4, init_share=Fraction(1, 4)),
])
def test_the_run_spends_exactly_epsilon_and_fits_exact_measurements(options):
    """The algorithm alone, on a 3-column cycle of pairs: with exact measurements and the
    best-scored selection every pair is measured (ε high enough that each pair's error is
    over its noise penalty b·n_r until it is measured), the spends sum to ε exactly
    (public N, or N and the 1-way start measured), and the answers are the data's."""
    rng = np.random.default_rng(4)
    sizes = (2, 3, 4)
    x = rng.integers(0, 40, size=sizes).astype(float)
    x *= 400.0 / x.sum() if options.total is not None else 1.0
    union = marginal_workload(("a", "b", "c"), sizes, [(0, 1), (1, 2), (0, 2)])
    counts = {(0, 1): x.sum(axis=2), (1, 2): x.sum(axis=0), (0, 2): x.sum(axis=1)}
    oracle = MarginalOracle(counts, sizes, graphical.candidates_of(union), _Recording(),
                            Fraction(30))
    result = graphical.run_mwem_graphical(union, Fraction(30), oracle, options, 100, 3000)
    assert sum(e for _, e in result.spends) == Fraction(30) == oracle.spent
    assert set(result.selected) == {(0, 1), (1, 2), (0, 2)}
    want = [x.sum(axis=2).ravel(), x.sum(axis=0).ravel(), x.sum(axis=1).ravel()]
    for got, truth in zip(result.answers, want):
        assert np.allclose(got, truth, atol=1e-3 * max(1.0, truth.max()))


def test_a_pair_never_measured_is_answered_by_independence():
    """Independent data, two of the three pairs measured exactly: the third pair's region
    starts from the product of the model's one-column marginals (the maximum-entropy
    completion), which is then exact; the local polytope alone would leave it additive."""
    a, b, c = np.array([0.7, 0.3]), np.array([0.5, 0.3, 0.2]), np.array([0.1, 0.2, 0.3, 0.4])
    x = 1000.0 * np.multiply.outer(np.multiply.outer(a, b), c)
    sizes = x.shape
    union = marginal_workload(("a", "b", "c"), sizes, [(0, 1), (1, 2), (0, 2)])
    counts = {(0, 1): x.sum(axis=2), (1, 2): x.sum(axis=0), (0, 2): x.sum(axis=1)}
    oracle = MarginalOracle(counts, sizes, graphical.candidates_of(union), _Recording(),
                            Fraction(30))
    result = graphical.run_mwem_graphical(union, Fraction(30), oracle,
                                          MWEMOptions(rounds=2, total=1000.0), 100, 3000)
    assert len(set(result.selected)) == 2
    want = [x.sum(axis=2).ravel(), x.sum(axis=0).ravel(), x.sum(axis=1).ravel()]
    for got, truth in zip(result.answers, want):
        assert np.allclose(got, truth, atol=0.05)

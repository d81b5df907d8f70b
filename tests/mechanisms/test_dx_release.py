"""Metric (d_X) releases through the session: separate budget, refusals, accuracy."""

from __future__ import annotations

import copy
from fractions import Fraction

import numpy as np
import pytest

from dpsql.errors import BudgetExceededError, PolicyError, PrivacyParameterError, StrategyError
from dpsql.noise.samplers import SeededTestSampler

from ..conftest import ADULT_POLICY, make_adult_db, snapshot
from ..privacy.test_statistical import exact_answers

METRIC = {"epsilon": 2, "columns": {"age": {"weight": 0.1}, "sex": {"different": 1}}}
BATCH = ";\n".join(
    [f"SELECT COUNT(*) FROM adult WHERE age BETWEEN {a} AND {a + 9}" for a in range(20, 80, 10)]
    + ["SELECT sex, COUNT(*) FROM adult WHERE age >= 60 GROUP BY sex"])


def _db(tmp_path, seed=1, file="a.duckdb", **extra):
    db = make_adult_db(str(tmp_path / file), sampler=SeededTestSampler(seed))
    policy = copy.deepcopy(ADULT_POLICY)
    policy.update(epsilon=1, delta=1e-6, metric=METRIC, **extra)
    db.protect("adult", policy, replace=True)
    return db


def test_metric_release_charges_only_the_metric_budget(tmp_path):
    db = _db(tmp_path)
    r = db.answer(BATCH, epsilon=Fraction(1, 2), delta=0, model="metric")
    b = db.budget("adult")
    assert b["epsilon_spent"] == 0 and b["delta_spent"] == 0
    assert b["metric_epsilon_spent"] == Fraction(1, 2)
    assert b["metric_epsilon_remaining"] == Fraction(3, 2)
    entry = db.ledger()[-1]
    assert entry["mechanism"] == "dx_laplace" and entry["metric_epsilon"] == 0.5
    assert r.strategy == "dx_laplace"
    before = snapshot(db)
    with pytest.raises(BudgetExceededError, match="metric epsilon"):
        db.answer(BATCH, epsilon=Fraction(3, 2) + Fraction(1, 10**9), delta=0,
                  model="metric")
    assert snapshot(db) == before
    db.answer(BATCH, epsilon=Fraction(3, 2), delta=0, model="metric")   # exactly the rest


def test_metric_requests_are_validated_before_anything_is_charged(tmp_path):
    db = make_adult_db(str(tmp_path / "a.duckdb"))
    before = snapshot(db)
    with pytest.raises(PolicyError, match="no metric model"):
        db.answer(BATCH, epsilon=0.5, delta=0, model="metric")
    with pytest.raises(PrivacyParameterError, match="delta = 0"):
        db.answer(BATCH, epsilon=0.5, delta=1e-6, model="metric")
    with pytest.raises(StrategyError, match="dx_laplace"):
        db.answer(BATCH, epsilon=0.5, delta=0, model="metric", strategy="identity")
    with pytest.raises(PrivacyParameterError, match="model must be"):
        db.answer(BATCH, epsilon=0.5, delta=0, model="local")
    assert snapshot(db) == before


def test_total_counts_need_a_public_row_count(tmp_path):
    db = _db(tmp_path)
    before = snapshot(db)
    with pytest.raises(StrategyError, match="rows"):
        db.answer("SELECT COUNT(*) FROM adult; " + BATCH, epsilon=0.5, delta=0,
                  model="metric")
    assert snapshot(db) == before
    db2 = _db(tmp_path, file="b.duckdb", rows=32561)
    r = db2.answer("SELECT COUNT(*) FROM adult; " + BATCH, epsilon=0.5, delta=0,
                   model="metric")
    total = r.results[0].rows[0]
    assert total[-3] == 0.0                       # released exactly: stderr 0
    assert total[0] == exact_answers(db2, "SELECT COUNT(*) FROM adult")[0]


def test_d_x_errors_match_the_expected_error(tmp_path):
    """30 seeded releases of 45 answers, each error divided by its reported standard error:
    the mean square of these z-scores estimates 1 with relative sd about sqrt(5/1350) ≈ 6.1%
    (Laplace kurtosis 6), i.e. 3% on the root, so 10% holds at the right scales (3.3σ) and
    fails when they are off by 30%."""
    batch = BATCH + ";\n" + ";\n".join(
        f"SELECT COUNT(*) FROM adult WHERE age BETWEEN {a} AND {a + 4}" for a in range(17, 90, 2))
    db = _db(tmp_path, seed=5)
    db.protect("adult", dict(copy.deepcopy(ADULT_POLICY), epsilon=1, delta=1e-6,
                             metric=dict(METRIC, epsilon=10_000)), replace=True)
    truth = exact_answers(db, batch)
    expl = db.explain(batch, epsilon=1, delta=0, model="metric")
    assert expl.candidates[1].rmse > 0                 # the vanilla baseline is shown
    z = []
    for _ in range(30):
        r = db.answer(batch, epsilon=1, delta=0, model="metric")
        counts = np.concatenate([[row[-4] for row in t.rows] for t in r.results])
        stderr = np.concatenate([[row[-3] for row in t.rows] for t in r.results])
        assert np.allclose(stderr, expl.stderr)
        z.append((counts - truth) / stderr)
    root = float(np.sqrt(np.mean(np.square(z))))
    assert abs(root - 1) <= 0.10
    assert abs(1.3 * root - 1) > 0.10 and abs(root / 1.3 - 1) > 0.10


def test_policy_with_a_metric_round_trips(tmp_path):
    db = _db(tmp_path)
    p = db.policies()["adult"]
    assert p.metric is not None and p.metric.epsilon_per_unit == 2
    bad = copy.deepcopy(ADULT_POLICY)
    bad["metric"] = {"epsilon": 1, "columns": {"race": {
        "matrix": [[0, 1, 5, 1, 1], [1, 0, 1, 1, 1], [5, 1, 0, 1, 1], [1, 1, 1, 0, 1],
                   [1, 1, 1, 1, 0]], "other": 1}}}
    with pytest.raises(PolicyError, match="triangle"):
        db.protect("adult", bad, replace=True)

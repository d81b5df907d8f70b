"""Consistency post-processing: non-negative cell estimates and integer answers."""

from __future__ import annotations

import numpy as np
import pytest

from dpsql.errors import DpsqlError
from dpsql.noise.samplers import SeededTestSampler

from ..conftest import make_adult_db, snapshot

SQL = ("SELECT race, COUNT(*) FROM adult WHERE age > 85 GROUP BY race; "
       "SELECT COUNT(*) FROM adult WHERE age BETWEEN 20 AND 30")


@pytest.mark.parametrize("strategy", ["identity", "hierarchical", "optimal"])
def test_nonnegative_integer_answers_cost_nothing_extra_and_say_so(tmp_path, strategy):
    db = make_adult_db(str(tmp_path / "a.duckdb"), reuse=False, epsilon=10, delta=1e-3,
                       sampler=SeededTestSampler(3))
    plain = db.answer(SQL, epsilon=0.05, delta=1e-6, strategy=strategy)
    assert any(row[1] < 0 for row in plain.results[0].rows)      # sparse: noise goes below 0
    r = db.answer(SQL, epsilon=0.05, delta=1e-6, strategy=strategy, nonnegative=True,
                  integer=True)
    counts = [row[-4] for t in r.results for row in t.rows]
    assert all(c >= 0 and c == int(c) for c in counts)
    # the reported errors are those of the unconstrained estimate, and the tables say so
    assert [row[-3] for row in r.results[0].rows] == [row[-3] for row in plain.results[0].rows]
    with db.db.connect() as con:
        comments = {name: c for name, c in con.execute(
            "SELECT view_name, comment FROM duckdb_views() WHERE NOT internal").fetchall()}
    assert all("unconstrained" in comments[t] for t in r.tables)
    assert comments[plain.tables[0]] is None
    assert db.budget("adult")["epsilon_spent"] <= 0.1


def test_named_replays_match_the_post_processing_asked_for(tmp_path):
    db = make_adult_db(str(tmp_path / "a.duckdb"), epsilon=10, delta=1e-3,
                       sampler=SeededTestSampler(4))
    db.answer(SQL, epsilon=0.05, delta=1e-6, nonnegative=True, name="n")
    assert db.answer(SQL, epsilon=0.05, delta=1e-6, nonnegative=True, name="n").reused
    before = snapshot(db)
    with pytest.raises(DpsqlError, match="already used"):
        db.answer(SQL, epsilon=0.05, delta=1e-6, name="n")
    with pytest.raises(DpsqlError, match="True or False"):
        db.answer(SQL, epsilon=0.05, delta=1e-6, integer="yes")
    assert snapshot(db) == before


def test_nonnegative_least_squares_never_moves_away_from_the_measurements():
    """Against a brute-force check: the constrained fit's residual is the smallest over
    non-negative cell vectors (KKT: gradient >= 0 where x = 0, = 0 where x > 0)."""
    from dpsql.inference.least_squares import consistent
    from dpsql.strategies import REGISTRY
    from dpsql.strategies.synthetic import all_range

    info = all_range(16)
    plan = REGISTRY["hierarchical"].plan(info)
    A = plan.A.toarray()
    rng = np.random.default_rng(0)
    x = np.zeros(16)
    x[3] = 5
    y = A @ x + rng.normal(0, 3, A.shape[0])
    W = np.eye(16)
    answers, note = consistent(plan, W, y, np.zeros(16), True, False)
    grad = A.T @ (A @ answers - y)
    assert np.all(answers >= 0) and "non-negative" in note
    assert np.all(grad[answers <= 1e-9] >= -1e-6)
    assert np.allclose(grad[answers > 1e-9], 0, atol=1e-6)

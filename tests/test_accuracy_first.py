"""Accuracy-first requests: the smallest ε whose expected error meets a target."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dpsql.errors import DpsqlError, PrivacyParameterError, StrategyError

from .conftest import snapshot

SQL = ("SELECT sex, COUNT(*) FROM adult GROUP BY sex; "
       "SELECT COUNT(*) FROM adult WHERE age < 30; "
       "SELECT race, COUNT(*) FROM adult GROUP BY race")


@pytest.mark.parametrize("delta", [1e-6, 0])
def test_the_epsilon_found_is_the_smallest_three_digit_one_meeting_the_target(adult_db, delta):
    e = adult_db.explain(SQL, delta=delta, target_rmse=50)
    assert e.rmse <= 50
    eps = Fraction(repr(e.epsilon))
    assert eps.denominator in (1, 10, 100, 1000, 10**4, 10**5, 10**6)
    # one step lower in the last (third significant) digit misses the target
    lower = adult_db.explain(SQL, delta=delta, epsilon=float(eps - Fraction(1, eps.denominator)))
    assert lower.rmse > 50


def test_max_stderr_bounds_every_answer(adult_db):
    e = adult_db.explain(SQL, delta=1e-6, max_stderr=20)
    assert np.max(e.stderr) <= 20


def test_answer_spends_only_when_confirmed(adult_db):
    before = snapshot(adult_db)
    with pytest.raises(DpsqlError, match="needs epsilon = .*confirm=True"):
        adult_db.answer(SQL, delta=1e-6, target_rmse=80)
    assert snapshot(adult_db) == before
    e = adult_db.explain(SQL, delta=1e-6, target_rmse=80)
    r = adult_db.answer(SQL, delta=1e-6, target_rmse=80, confirm=True)
    assert r.epsilon == e.epsilon and r.expected_rmse <= 80
    assert adult_db.budget("adult")["epsilon_spent"] == Fraction(repr(e.epsilon))


def test_bad_accuracy_requests_are_refused(adult_db):
    before = snapshot(adult_db)
    with pytest.raises(PrivacyParameterError, match="epsilon and target_rmse are both given"):
        adult_db.explain(SQL, epsilon=0.5, delta=1e-6, target_rmse=50)
    with pytest.raises(PrivacyParameterError, match="give epsilon"):
        adult_db.explain(SQL, delta=1e-6)
    with pytest.raises(PrivacyParameterError, match="target_rmse must be a positive number"):
        adult_db.explain(SQL, delta=1e-6, target_rmse=-1)
    with pytest.raises(StrategyError, match="no strategy reaches"):
        adult_db.explain(SQL, delta=1e-6, target_rmse=1e-6)
    with pytest.raises(StrategyError, match="mwem"):
        adult_db.answer(SQL, delta=0, target_rmse=50, strategy="mwem", confirm=True)
    assert snapshot(adult_db) == before

"""The explained lower bound: the ``optimal`` solver's certified dual bound when it planned
the batch (tighter than svdb, and no eigendecomposition of its own), else svdb."""

from __future__ import annotations

import math

import pytest

from dpsql.errors import StrategyError
from dpsql.mechanisms import halfwidths, selection
from dpsql.strategies.gaussian.optimal import Optimal

SQL = ["SELECT age, COUNT(*) FROM adult WHERE age < 60 GROUP BY age",
       "SELECT COUNT(*) FROM adult WHERE age BETWEEN 20 AND 40",
       "SELECT COUNT(*) FROM adult WHERE age BETWEEN 30 AND 70"]
ASK = dict(epsilon=0.5, delta=1e-6)


def svdb_bound(db) -> float:
    """The svdb bound of the same batch, by the same formula: a named non-optimal strategy."""
    again = db.explain(SQL, strategy="hierarchical", **ASK)
    assert again.bound_name == "svdb"
    return again.bound_rmse


def test_optimal_gives_its_certified_bound_without_computing_svdb(adult_db, monkeypatch):
    calls = []
    real = halfwidths.svdb
    monkeypatch.setattr(halfwidths, "svdb", lambda info: calls.append(1) or real(info))
    e = adult_db.explain(SQL, strategy="optimal", **ASK)
    assert calls == []                                   # the solver's bound, not svdb
    assert e.bound_name == selection.CERTIFIED and f"({selection.CERTIFIED})" in str(e)
    (c,) = e.candidates
    # a valid lower bound on the optimum: the chosen optimal plan is within its gap of it
    assert 1 - 1e-9 <= c.bound_ratio <= math.sqrt(1 + c.gap) * (1 + 1e-6)
    svdb = svdb_bound(adult_db)
    assert calls                                         # svdb when optimal did not plan
    assert svdb <= e.bound_rmse * (1 + 1e-9)             # svdb is h at uniform w: weaker
    assert e.bound_rmse > 1.0001 * svdb                  # strictly tighter on this batch


def test_a_cache_hit_gives_the_same_bound_and_name(adult_db):
    cold = adult_db.explain(SQL, strategy="optimal", **ASK)
    hit = adult_db.explain(SQL, strategy="optimal", **ASK)
    assert hit.candidates[0].cached
    assert (hit.bound_rmse, hit.bound_name) == (cold.bound_rmse, cold.bound_name)


def test_auto_falls_back_to_svdb_when_optimal_fails(adult_db, monkeypatch):
    def fail(self, info, weights=None):
        raise StrategyError("the optimal strategy failed (test)")
    totals = []
    real = halfwidths.svdb
    monkeypatch.setattr(halfwidths, "svdb", lambda info: totals.append(real(info)) or totals[-1])
    monkeypatch.setattr(Optimal, "plan", fail)
    e = adult_db.explain(SQL, **ASK)
    assert [c.note for c in e.candidates if c.strategy == "optimal"] == [
        "the optimal strategy failed (test)"]
    assert e.bound_name == "svdb" and "(svdb)" in str(e) and len(totals) == 1
    expected = halfwidths.bound_rmse(e.mechanism, 0.5, 1e-6, "analytic", totals[0],
                                     e.n_queries)
    assert e.bound_rmse == pytest.approx(expected, rel=1e-12)


def test_the_header_says_whose_noise_its_bound_is_for(adult_db):
    """The header's bound is the chosen noise's: under Laplace noise it is not the number the
    Gaussian rows' ``x bound`` column divides by, so the header says so (a new user read the
    Laplace figure as the Gaussian optimum's)."""
    laplace = adult_db.explain(SQL, **ASK)                 # auto: Laplace wins here
    assert laplace.mechanism == "laplace"
    assert f"({laplace.bound_name}) for Laplace noise RMSE" in str(laplace)
    gaussian = adult_db.explain(SQL, strategy="optimal", **ASK)
    assert f"({selection.CERTIFIED}) RMSE" in str(gaussian)

"""MWEM through the session and the kernel's measure callback."""

from __future__ import annotations

from fractions import Fraction

import duckdb
import numpy as np
import pytest
import scipy.sparse as sp

import dpsql
from dpsql.release import adaptive as session_mod
from dpsql.errors import StrategyError
from dpsql.kernel.oracles import MeasureOracle
from dpsql.mechanisms.mwem.groups import CandidateGroups, GroupValues
from dpsql.noise.samplers import SeededTestSampler

from ..conftest import make_adult_db, snapshot
from ..privacy.test_statistical import exact_answers

BATCH = """
SELECT COUNT(*) FROM adult WHERE age < 30;
SELECT COUNT(*) FROM adult WHERE age BETWEEN 30 AND 49;
SELECT sex, COUNT(*) FROM adult GROUP BY sex;
SELECT race, COUNT(*) FROM adult WHERE age >= 40 GROUP BY race;
"""


@pytest.mark.parametrize("spec", ["mwem", "mwem(rounds=3)", "mwem(rounds=4, cuboids=true)",
                                  "mwem(rounds=2, init_share=0.25, iterate=average)",
                                  "mwem(rounds=3, total_share=0.1, replay=0)",
                                  "mwem(rounds=3, init=marginals, init_share=0.5, "
                                  "measure=partition)"])
def test_recorded_cost_is_exactly_the_requested_epsilon(tmp_path, spec):
    db = make_adult_db(str(tmp_path / "a.duckdb"), epsilon=5, delta=0,
                       sampler=SeededTestSampler(7))
    r = db.answer(BATCH, epsilon=Fraction(3, 10), delta=0, strategy=spec)
    assert db.budget("adult")["epsilon_spent"] == Fraction(3, 10)
    entry = db.ledger()[-1]
    assert entry["mechanism"] == "mwem" and entry["status"] == "released"
    assert entry["delta"] == 0 and entry["expected_rmse"] is None
    # data-dependent: no standard errors or intervals are claimed
    assert all(row[-3] is None and row[-2] is None for t in r.results for row in t.rows)


def test_mwem_answers_are_close_at_large_epsilon(tmp_path):
    db = make_adult_db(str(tmp_path / "a.duckdb"), epsilon=100, delta=0,
                       sampler=SeededTestSampler(2))
    truth = exact_answers(db, BATCH)
    r = db.answer(BATCH, epsilon=20, delta=0, strategy="mwem(rounds=30)")
    counts = np.concatenate([[row[-4] for row in t.rows] for t in r.results])
    assert np.max(np.abs(counts - truth)) < 0.02 * truth.max()


def test_explain_states_the_paper_bound_and_spends_nothing(adult_db):
    before = snapshot(adult_db)
    e = adult_db.explain(BATCH, epsilon=0.5, delta=0, strategy="mwem(rounds=5)")
    assert e.mechanism == "mwem" and np.isnan(e.rmse)
    assert "Thm 2.3" in e.candidates[0].note and "data-dependent" in e.candidates[0].note
    assert snapshot(adult_db) == before


@pytest.mark.parametrize("spec, says", [
    ("mwem", "default rule picks T"), ("mwem(rounds=rule)", "default rule picks T"),
    ("mwem(rounds=auto)", "doubling"), ("mwem(rounds=7)", "T = 7")])
def test_explain_names_how_t_is_chosen(adult_db, spec, says):
    """The default (``rounds=rule``) can be spelled, and explain says how T is chosen: by the
    rule (from ε and the noisy row count, since adult's is not declared), by doubling, or
    given."""
    e = adult_db.explain(BATCH, epsilon=0.5, delta=0, strategy=spec)
    assert says in e.candidates[0].note


def test_aborted_run_refunds_nothing(tmp_path, monkeypatch):
    db = make_adult_db(str(tmp_path / "a.duckdb"), epsilon=1, delta=0,
                       sampler=SeededTestSampler(1))

    def crash(blocks, epsilon, oracle, options):
        oracle.measure(0, sp.csr_matrix(np.ones((1, blocks[0].n_cells))), Fraction(1, 100))
        raise RuntimeError("simulated failure mid-run")

    monkeypatch.setattr(session_mod, "run_mwem", crash)
    with pytest.raises(RuntimeError):
        db.answer(BATCH, epsilon=0.5, delta=0, strategy="mwem")
    assert db.budget("adult")["epsilon_spent"] == Fraction(1, 2)
    assert db.ledger()[-1]["status"] == "charged"
    with db.db.connect() as con:
        assert not con.execute("SELECT count(*) FROM information_schema.tables "
                               "WHERE table_name LIKE 'dp_r%'").fetchone()[0]


def test_explain_suggests_the_variants_for_ranges_over_several_columns(adult_db):
    rect = ("SELECT COUNT(*) FROM adult WHERE age BETWEEN 20 AND 40 "
            "AND hours_per_week >= 20 AND hours_per_week < 60")
    plain = adult_db.explain(rect, epsilon=0.5, delta=0, strategy="mwem(rounds=5, measure=query)")
    assert "init=marginals" in plain.candidates[0].note
    tuned = adult_db.explain(rect, epsilon=0.5, delta=0, strategy="mwem(rounds=5, "
                             "init=marginals, init_share=0.5, measure=partition)")
    assert "hint" not in tuned.candidates[0].note
    one = adult_db.explain("SELECT COUNT(*) FROM adult WHERE age < 30", epsilon=0.5,
                           delta=0, strategy="mwem")
    assert "hint" not in one.candidates[0].note


def test_bad_options_are_refused_before_anything_is_charged(adult_db):
    before = snapshot(adult_db)
    for spec, match in [("mwem(rounds=0)", "rounds"), ("mwem(colour=red)", "no option"),
                        ("mwem(init_share=0.99, total_share=0.5)", "share"),
                        ("mwem(cuboids=maybe)", "true or false"),
                        ("mwem(measure=everything)", "'query' or 'partition'"),
                        ("mwem(init=zeros, init_share=0.2)", "'histogram' or 'marginals'")]:
        with pytest.raises(dpsql.DpsqlError, match=match):
            adult_db.answer(BATCH, epsilon=0.5, delta=0, strategy=spec)
    assert snapshot(adult_db) == before


def test_thirty_binary_columns_use_the_factored_form(tmp_path):
    """Queries touching at most two columns each, in disjoint pairs: 15 blocks of 2x2 (plus
    other/NULL) cells instead of 2^30."""
    path = str(tmp_path / "wide.duckdb")
    con = duckdb.connect(path)
    cols = ", ".join(f"(hash(i * {k + 7}) % 2)::INTEGER AS c{k}" for k in range(30))
    con.execute(f"CREATE TABLE wide AS SELECT {cols} FROM range(5000) t(i)")
    con.close()
    db = dpsql.connect(path, sampler=SeededTestSampler(4))
    db.protect("wide", {"epsilon": 10, "delta": 0, "rows": 5000, "columns": {
        f"c{k}": {"type": "categorical", "values": [0, 1]} for k in range(30)}})
    batch = ";\n".join(f"SELECT c{2 * j}, c{2 * j + 1}, COUNT(*) FROM wide "
                       f"GROUP BY c{2 * j}, c{2 * j + 1}" for j in range(15))
    e = db.explain(batch, epsilon=1, delta=0, strategy="mwem(rounds=30)")
    assert e.n_queries == 60
    r = db.answer(batch, epsilon=1, delta=0, strategy="mwem(rounds=30)")
    assert len(r.results) == 15 and all(len(t.rows) == 4 for t in r.results)
    assert db.budget("wide")["epsilon_spent"] == 1


class _Recorder:
    private = False

    def __init__(self):
        self.calls = []

    def exponential(self, scores, epsilon, *, sensitivity):
        self.calls.append(("em", np.array(scores), epsilon, sensitivity))
        return int(np.argmax(scores))

    def laplace(self, values, scale, *, sensitivity, epsilon=None):
        self.calls.append(("lap", np.array(values), scale, sensitivity))
        return np.array(values, dtype=float), 0.0


def test_oracle_scores_and_sensitivity_are_its_own():
    x = np.array([5.0, 0.0, 2.0, 9.0])
    W = sp.csr_matrix(np.array([[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1], [1, 0, 0, 1.0]]))
    rec = _Recorder()
    oracle = MeasureOracle([x], rec, Fraction(1))
    groups = CandidateGroups(W, np.array([0, 2]), np.array([2, 4]),
                             group_sensitivity=np.array([0.01, 0.01]))  # a lie, ignored
    est = GroupValues(np.zeros(4), groups.offsets)
    k = oracle.select(0, groups, est, np.array([0.0, 1.0]), Fraction(1, 4))
    kind, scores, eps, sens = rec.calls[-1]
    assert kind == "em" and sens == 2.0            # rows 0 and 1 share cell 1
    assert scores.tolist() == [5 + 2, 11 + 14 - 1]
    assert k == 1 and eps == 0.25
    noisy, b = oracle.measure(0, W[[0]], Fraction(1, 2))
    assert noisy.tolist() == [5.0] and b == pytest.approx(2.0)
    with pytest.raises(StrategyError, match="more than its charged epsilon"):
        oracle.measure(0, W[[1]], Fraction(1, 2))   # 1/4 + 1/2 + 1/2 > 1
    assert oracle.spent == Fraction(3, 4)
    oracle.close()
    with pytest.raises(StrategyError, match="closed"):
        oracle.measure(0, W[[1]], Fraction(1, 100))

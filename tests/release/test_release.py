"""End-to-end behaviour of explain / answer / budget / ledger on the Adult extract."""

from __future__ import annotations

import math
from fractions import Fraction

import duckdb
import numpy as np
import pytest

import dpsql
from dpsql.store import database as engine
from dpsql.engines import duckdb as data_engine
from dpsql.errors import (BudgetExceededError, EngineError, InputFileError, PolicyError,
                          PrivacyParameterError, StrategyError, UnsupportedQueryError)
from dpsql.noise.samplers import SeededTestSampler

from tests.conftest import ADULT_POLICY, make_adult_db, snapshot

BATCH = """
SELECT sex, COUNT(*) FROM adult WHERE age < 30 GROUP BY sex;
SELECT COUNT(*) AS n FROM adult WHERE hours_per_week >= 40 AND race <> 'White';
CREATE TABLE by_race AS SELECT race, income, COUNT(*) FROM adult GROUP BY CUBE(race, income);
"""


def test_explain_reads_no_data_and_spends_nothing(adult_db, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("explain must not read data")

    monkeypatch.setattr(data_engine, "data_vector", boom)
    before = snapshot(adult_db)
    e = adult_db.explain(BATCH, epsilon=0.5, delta=1e-6)
    assert snapshot(adult_db) == before
    assert e.n_queries == 2 + 1 + 18
    assert len(e.stderr) == e.n_queries
    assert e.rmse == pytest.approx(math.sqrt(np.mean(e.stderr ** 2)))
    from dpsql.strategies import AUTO_CANDIDATES
    assert {c.strategy for c in e.candidates} == set(AUTO_CANDIDATES)
    assert e.strategy == min((c for c in e.candidates), key=lambda c: c.rmse).strategy
    assert "expected RMSE" in str(e)


def test_explain_identity_matches_closed_form(adult_db):
    e = adult_db.explain("SELECT COUNT(*) FROM adult WHERE age < 30", epsilon=1.0,
                         delta=1e-5, strategy="identity")
    # one query over the 2 age parts it selects 1: stderr = sigma * ||W_1|| = sigma
    from dpsql.noise.gaussian import calibrate_with_rounding
    sigma = calibrate_with_rounding(1.0, 1e-5, 1.0, e.n_cells, "analytic")
    assert e.sigma == sigma
    assert e.stderr[0] == pytest.approx(sigma)
    assert 3.73 < sigma < 3.74  # analytic Gaussian, eps=1, delta=1e-5, sensitivity 1


def test_answer_writes_tables_and_ledger(adult_db):
    r = adult_db.answer(BATCH, epsilon=0.25, delta=1e-6)
    assert r.tables[2] == "by_race"
    assert r.tables[0] == f"dp_r{r.release_id}_q1"
    assert r.epsilon == 0.25 and r.delta == 1e-6 and r.private
    from dpsql.strategies import AUTO_CANDIDATES
    assert r.strategy in AUTO_CANDIDATES
    con = duckdb.connect(adult_db.db.path, read_only=True)  # plain DuckDB can read everything
    try:
        cols = [d[0] for d in con.execute("SELECT * FROM by_race").description]
        assert cols == ["race", "income", "grouping_id", "count", "stderr", "ci_low", "ci_high"]
        rows = con.execute("SELECT * FROM by_race").fetchall()
        assert len(rows) == 5 * 2 + 5 + 2 + 1  # every declared group, with roll-ups
        for row in rows:
            c, s, lo, hi = row[3:]
            assert s > 0 and lo == pytest.approx(c - 1.959963984540054 * s)
            assert hi == pytest.approx(c + 1.959963984540054 * s)
        meta = con.execute("SELECT release_id, statement_index, table_name FROM "
                           "dpsql.release_tables ORDER BY statement_index").fetchall()
        assert meta == [(r.release_id, i, t) for i, t in enumerate(r.tables)]
        led = con.execute("SELECT table_name, epsilon, delta, mechanism, strategy, n_queries, "
                          "result_tables, private, status, sql_text FROM dpsql.ledger").fetchall()
        assert led == [("adult", 0.25, 1e-6, "gaussian", r.strategy, 21, r.tables, True,
                        "released", BATCH)]
    finally:
        con.close()


def test_group_by_returns_every_declared_group_with_zeros(adult_db):
    # nobody in the extract is over 90, and few are 88-90: some groups are empty
    r = adult_db.answer("SELECT race, sex, COUNT(*) FROM adult WHERE age >= 89 "
                        "GROUP BY race, sex", epsilon=0.1, delta=1e-7)
    keys = [row[:2] for row in r.results[0].rows]
    assert keys == [(race, sex) for race in ADULT_POLICY["columns"]["race"]["values"]
                    for sex in ("Female", "Male")]


def test_create_table_refuses_to_overwrite_and_charges_nothing(adult_db):
    adult_db.answer("CREATE TABLE t1 AS SELECT COUNT(*) FROM adult", epsilon=0.1, delta=1e-7)
    before = snapshot(adult_db)
    with pytest.raises(UnsupportedQueryError, match="already exists"):
        adult_db.answer("CREATE TABLE t1 AS SELECT COUNT(*) FROM adult", epsilon=0.1,
                        delta=1e-7)
    assert snapshot(adult_db) == before
    r = adult_db.answer("CREATE OR REPLACE TABLE t1 AS SELECT sex, COUNT(*) FROM adult "
                        "GROUP BY sex", epsilon=0.1, delta=1e-7)
    assert r.tables == ["t1"] and len(r.results[0].rows) == 2
    r = adult_db.answer("CREATE TABLE t1 AS SELECT COUNT(*) FROM adult", epsilon=0.1,
                        delta=1e-7, replace=True)
    assert len(r.results[0].rows) == 1
    for bad in ("CREATE TABLE adult AS SELECT COUNT(*) FROM adult",
                "CREATE TABLE dpsql_x AS SELECT COUNT(*) FROM adult"):
        with pytest.raises(UnsupportedQueryError, match="reserved"):
            adult_db.answer(bad, epsilon=0.1, delta=1e-7, replace=True)


def test_budget_exact_fit_then_refusal_charges_nothing(tmp_path):
    """Pure releases (basic composition, exact sums): 0.1 + 0.2 + 0.7 lands exactly on 1."""
    db = make_adult_db(str(tmp_path / "b.duckdb"), reuse=False, epsilon=1.0, delta=0)
    q = "SELECT COUNT(*) FROM adult WHERE sex = 'Female'"
    db.answer(q, epsilon=0.1, delta=0)
    db.answer(q, epsilon=0.2, delta=0)
    db.answer(q, epsilon=0.7, delta=0)            # exactly fits: 0.1 + 0.2 + 0.7 = 1
    b = db.budget("adult")
    assert b["epsilon_spent"] == 1 and b["epsilon_remaining"] == 0
    assert b["delta_spent"] == 0 and b["accounting"] == "basic"
    before = snapshot(db)
    with pytest.raises(BudgetExceededError) as exc:
        db.answer(q, epsilon=1e-9, delta=0)
    msg = str(exc.value)
    assert "spent 1" in msg and "requested 1e-09" in msg and "limit 1" in msg
    assert exc.value.spent == 1 and exc.value.limit == 1
    assert snapshot(db) == before
    db.close()


def test_gaussian_deltas_add_exactly_to_the_limit(tmp_path):
    """Basic composition alone (zcdp_delta = 0) charges all of δ_B = 1e-5, exactly. (On the
    default split it charges δ_B − δ_z and the zCDP route spends ρ, not δ: docs/accounting.md.)"""
    db = make_adult_db(str(tmp_path / "d.duckdb"), reuse=False, epsilon=10.0, delta=1e-5,
                       zcdp_delta=0)
    q = "SELECT COUNT(*) FROM adult WHERE sex = 'Female'"
    for eps, dlt in ((0.1, 1e-6), (0.2, 1e-6), (0.7, 8e-6)):
        db.answer(q, epsilon=eps, delta=dlt, strategy="identity")   # Gaussian pinned
    b = db.budget("adult")
    assert b["delta_spent"] == Fraction(1, 10**5) and b["delta_remaining"] == 0
    assert b["epsilon_spent"] == 1 and b["accounting"] == "basic"
    before = snapshot(db)
    with pytest.raises(BudgetExceededError, match="delta"):
        db.answer(q, epsilon=0.1, delta=1e-12, strategy="identity")
    assert snapshot(db) == before


def test_ledger_and_policy_survive_reopening(tmp_path):
    path = str(tmp_path / "p.duckdb")
    db = make_adult_db(path)
    r = db.answer("SELECT COUNT(*) FROM adult", epsilon=0.3, delta=1e-6)
    db.close()
    db2 = dpsql.connect(path)
    assert db2.budget("adult")["epsilon_spent"] == Fraction(3, 10)
    assert [e["release_id"] for e in db2.ledger()] == [r.release_id]
    assert db2.policies()["adult"].column("age").max == 90
    db2.close()


@pytest.mark.parametrize("epsilon,delta,kwargs,err", [
    (0, 1e-6, {}, PrivacyParameterError),
    (-1, 1e-6, {}, PrivacyParameterError),
    (float("nan"), 1e-6, {}, PrivacyParameterError),
    (float("inf"), 1e-6, {}, PrivacyParameterError),
    (5e-324, 1e-6, {}, PrivacyParameterError),
    ("1", 1e-6, {}, PrivacyParameterError),
    (True, 1e-6, {}, PrivacyParameterError),
    (0.5, -0.1, {}, PrivacyParameterError),
    (0.5, 1, {}, PrivacyParameterError),
    (0.5, 1.5, {}, PrivacyParameterError),
    (0.5, float("nan"), {}, PrivacyParameterError),
    (0.5, 0, {"calibration": "classic"}, PrivacyParameterError),  # Gaussian needs delta > 0
    (0.5, 0, {"strategy": "optimal"}, StrategyError),            # a Gaussian strategy
    (1.0, 1e-6, {"calibration": "classic"}, PrivacyParameterError),
    (0.5, 1e-6, {"calibration": "textbook"}, PrivacyParameterError),
    (0.5, 1e-6, {"strategy": "nope"}, StrategyError),
])
def test_bad_parameters_are_refused_with_nothing_charged(adult_db, epsilon, delta, kwargs, err):
    before = snapshot(adult_db)
    with pytest.raises(err) as exc:
        adult_db.answer("SELECT COUNT(*) FROM adult", epsilon=epsilon, delta=delta, **kwargs)
    assert str(exc.value)
    assert snapshot(adult_db) == before


def test_classic_calibration_allowed_below_one(adult_db):
    e_classic = adult_db.explain("SELECT COUNT(*) FROM adult", epsilon=0.5, delta=1e-6,
                                 calibration="classic", strategy="identity")
    e_analytic = adult_db.explain("SELECT COUNT(*) FROM adult", epsilon=0.5, delta=1e-6,
                                  strategy="identity")
    assert e_classic.sigma > e_analytic.sigma


def test_batch_with_one_bad_statement_releases_nothing(adult_db):
    before = snapshot(adult_db)
    with pytest.raises(UnsupportedQueryError) as exc:
        adult_db.answer("SELECT COUNT(*) FROM adult;\nSELECT COUNT(*) FROM adult "
                        "WHERE nonsense = 1", epsilon=0.1, delta=1e-7)
    assert exc.value.line == 2
    assert snapshot(adult_db) == before


def test_batch_over_budget_releases_nothing(adult_db):
    before = snapshot(adult_db)
    with pytest.raises(BudgetExceededError):
        adult_db.answer(BATCH, epsilon=1.5, delta=1e-7)
    assert snapshot(adult_db) == before


def test_seeded_sampler_marks_release_non_private(tmp_path):
    db = make_adult_db(str(tmp_path / "s.duckdb"), sampler=SeededTestSampler(1))
    r = db.answer("SELECT COUNT(*) FROM adult", epsilon=0.1, delta=1e-7)
    assert not r.private
    assert db.ledger()[0]["private"] is False
    assert "NON-PRIVATE" in str(r)


def test_list_of_statements_is_one_workload(adult_db):
    r = adult_db.answer(["SELECT COUNT(*) FROM adult", "SELECT COUNT(*) FROM adult "
                         "WHERE sex = 'Male'"], epsilon=0.1, delta=1e-7)
    assert len(r.tables) == 2 and len(adult_db.ledger()) == 1


def test_policy_errors(adult_db, tmp_path):
    with pytest.raises(PolicyError, match="no table"):
        adult_db.protect("nope", ADULT_POLICY)
    bad = dict(ADULT_POLICY, columns={"zzz": {"type": "integer", "min": 0, "max": 1}})
    with pytest.raises(PolicyError, match="zzz"):
        adult_db.protect("adult", bad, replace=True)
    with pytest.raises(PolicyError, match="already protected"):
        adult_db.protect("adult", ADULT_POLICY)
    with pytest.raises(InputFileError, match="does not exist"):   # a file, not a policy
        adult_db.protect("adult", str(tmp_path / "missing.toml"))
    with pytest.raises(UnsupportedQueryError, match="not a protected table"):
        adult_db.explain("SELECT COUNT(*) FROM other", epsilon=1, delta=1e-6)


def test_engine_errors_withhold_engine_text():
    con = duckdb.connect()
    with pytest.raises(EngineError) as exc:
        with engine.engine_errors("testing"):
            con.execute("SELECT CAST('secret-value-123' AS INTEGER)")
    assert "secret-value-123" not in str(exc.value)
    assert exc.value.__cause__ is None and exc.value.__suppress_context__


def test_analyst_connections_cannot_touch_files(adult_db, tmp_path):
    with adult_db.db.connect() as con:
        with pytest.raises(duckdb.Error):
            con.execute("SELECT * FROM read_csv('/etc/passwd')")
        with pytest.raises(duckdb.Error):
            con.execute("SET enable_external_access = true")
        with pytest.raises(duckdb.Error):
            con.execute(f"COPY (SELECT 1) TO '{tmp_path / 'x.csv'}'")
    assert not (tmp_path / "x.csv").exists()


def test_in_memory_session_is_refused_gracefully():
    db = dpsql.connect(":memory:")
    with pytest.raises(UnsupportedQueryError, match="not a protected table"):
        db.explain("SELECT COUNT(*) FROM adult", epsilon=1, delta=1e-6)
    assert db.budget() == {}


def test_named_release_returns_recorded_answers_never_fresh_noise(adult_db):
    sql = "SELECT sex, COUNT(*) FROM adult GROUP BY sex"
    first = adult_db.answer(sql, epsilon=0.2, delta=1e-7, name="weekly-1")
    before = snapshot(adult_db)
    again = adult_db.answer(sql, epsilon=0.2, delta=1e-7, name="weekly-1")
    assert again.reused and again.release_id == first.release_id
    assert again.results[0].rows == first.results[0].rows  # the same numbers, not new noise
    assert snapshot(adult_db) == before                     # and nothing charged
    with pytest.raises(dpsql.DpsqlError, match="already used"):
        adult_db.answer(sql, epsilon=0.3, delta=1e-7, name="weekly-1")
    with pytest.raises(dpsql.DpsqlError, match="already used"):
        adult_db.answer("SELECT COUNT(*) FROM adult", epsilon=0.2, delta=1e-7, name="weekly-1")
    assert snapshot(adult_db) == before
    assert adult_db.ledger()[-1]["release_name"] == "weekly-1"


def test_interrupted_named_release_is_never_re_noised(adult_db, monkeypatch):
    from dpsql import session as session_mod

    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash after the charge")

    monkeypatch.setattr(session_mod.Session, "_write", crash)
    with pytest.raises(RuntimeError):
        adult_db.answer("SELECT COUNT(*) FROM adult", epsilon=0.2, delta=1e-7, name="n1")
    monkeypatch.undo()
    assert adult_db.ledger()[-1]["status"] == "charged"
    assert adult_db.budget("adult")["epsilon_spent"] == Fraction(1, 5)
    with pytest.raises(dpsql.DpsqlError, match="never written"):
        adult_db.answer("SELECT COUNT(*) FROM adult", epsilon=0.2, delta=1e-7, name="n1")


def test_ctrl_c_during_the_release_completes_it_first(adult_db, monkeypatch):
    import os
    import signal

    from dpsql import session as session_mod

    real_write = session_mod.Session._write

    def write_after_sigint(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)   # Ctrl-C arrives after the charge
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(session_mod.Session, "_write", write_after_sigint)
    with pytest.raises(dpsql.InterruptedAfterRelease) as exc:
        adult_db.answer("SELECT COUNT(*) FROM adult", epsilon=0.2, delta=1e-7)
    assert isinstance(exc.value, KeyboardInterrupt)
    entry = adult_db.ledger()[-1]
    assert entry["status"] == "released" and exc.value.release.tables == entry["result_tables"]


def test_named_release_refuses_when_its_table_was_replaced(adult_db):
    sql = "CREATE TABLE wk AS SELECT sex, COUNT(*) FROM adult GROUP BY sex"
    adult_db.answer(sql, epsilon=0.1, delta=1e-7, name="a")
    adult_db.answer(sql.replace("CREATE", "CREATE OR REPLACE"), epsilon=0.1, delta=1e-7,
                    name="b")
    with pytest.raises(dpsql.DpsqlError, match="has replaced it"):
        adult_db.answer(sql, epsilon=0.1, delta=1e-7, name="a")
    with pytest.raises(dpsql.DpsqlError, match="already used"):
        adult_db.answer(sql.replace("CREATE", "CREATE OR REPLACE"), epsilon=0.1, delta=1e-7,
                        name="b", calibration="classic")


def test_explain_reports_the_certified_gap_of_the_optimal_strategy(adult_db):
    e = adult_db.explain("SELECT age, COUNT(*) FROM adult WHERE age < 60 GROUP BY age",
                         epsilon=0.5, delta=1e-6, strategy="optimal")
    (c,) = e.candidates
    assert 0 <= c.gap <= 1e-5
    assert "gap" in str(e) and c.bound_ratio >= 1 - 1e-9


def test_result_tables_are_views_over_the_release_stored_answers(adult_db):
    """Each statement's result table is a view in main over its slice of a table shared by
    every release whose answers have the same column types (``dpsql_results.answers_<types>``):
    the rows read back in order, equal to the release's, and a replaced name points at the
    new release's answers; a second release adds rows, not tables."""
    sql = ["SELECT sex, COUNT(*) FROM adult GROUP BY sex",
           "SELECT race, COUNT(*) FROM adult GROUP BY race",
           "SELECT COUNT(*) FROM adult WHERE age > 40"]
    r = adult_db.answer(sql + ["CREATE TABLE mine AS SELECT income, COUNT(*) FROM adult "
                         "GROUP BY income"], epsilon=0.2, delta=1e-6)
    again = adult_db.answer("CREATE OR REPLACE TABLE mine AS SELECT sex, COUNT(*) FROM adult "
                      "GROUP BY sex", epsilon=0.1, delta=1e-6)
    with adult_db.db.connect() as con:
        kinds = dict(con.execute("SELECT table_name, table_type FROM information_schema."
                                 "tables WHERE table_schema = 'main'").fetchall())
        stored = sorted(t for (t,) in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'dpsql_results'"
        ).fetchall())
        for name, result in zip(r.tables[:3], r.results[:3]):
            assert con.execute(f'SELECT * FROM "{name}"').fetchall() == result.rows
        mine = con.execute("SELECT * FROM mine").fetchall()
    assert all(kinds[t] == "VIEW" for t in r.tables) and kinds["adult"] == "BASE TABLE"
    # one stored table per tuple of column types: the groups (VARCHAR key, then DOUBLE count,
    # standard error and interval) and the total (DOUBLE only), shared by both releases
    assert stored == ["answers_dddd", "answers_vdddd"]
    assert mine == again.results[0].rows and again.results[0].columns[0] == "sex"
    assert adult_db.read_results("SELECT * FROM mine").rows == again.results[0].rows

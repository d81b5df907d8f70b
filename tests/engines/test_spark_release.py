"""Releases over tables that live in Spark: the whole path (protect, plan, charge, Spark's
marginals, noise, result tables in the DuckDB control database), and its refusals.

Passing means: a Spark-backed table answers like the same rows in DuckDB (exactly, with
measurements taken without noise; within the reported errors at ε = 100 with the secure
sampler), through the Python API, the DB-API and the command line; ``protect`` refuses a
missing table, missing columns, unreadable types and a Delta source without its connector,
storing nothing; a Spark failure after the charge says nothing of Spark's text (which here
holds a row's value) and the charge stands; a Spark table read without a way to Spark is
refused before the charge; dpsql's settings hold during the query and the caller's come back.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

import dpsql
from dpsql.engines import spark as spark_engine
from dpsql.errors import EngineError, PolicyError

from ..conftest import ADULT_POLICY, raw_adult_file, snapshot
from ..sql.test_implicit import _NoNoise

pytestmark = pytest.mark.spark

SPARK_TABLE = "dpsql_e2e.adult"
DENSE = ["SELECT sex, COUNT(*) FROM adult WHERE age < 30 GROUP BY sex",
         "SELECT race, income, COUNT(*) FROM adult WHERE hours_per_week >= 40 "
         "GROUP BY race, income"]
#: over 1,024 cells: the implicit path, measured through the cliques' marginals
IMPLICIT = ["SELECT age, race, COUNT(*) FROM adult GROUP BY age, race",
            "SELECT race, sex, income, COUNT(*) FROM adult GROUP BY race, sex, income",
            "SELECT age, hours_per_week, COUNT(*) FROM adult GROUP BY age, hours_per_week"]


def _policy(**source) -> dict:
    return dict(ADULT_POLICY, epsilon=100, delta=0.5,
                source=source or {"engine": "spark", "table": SPARK_TABLE})


@pytest.fixture(scope="module")
def spark_adult(spark_session, tmp_path_factory):
    """Adult's rows as the Spark catalog table dpsql_e2e.adult (Parquet) and as CSV."""
    d = tmp_path_factory.mktemp("spark-e2e")
    con = duckdb.connect(raw_adult_file(), read_only=True)
    con.execute(f"COPY adult TO '{d / 'adult.parquet'}' (FORMAT parquet)")
    con.execute(f"COPY adult TO '{d / 'adult_csv'}' (FORMAT csv, HEADER)")
    con.close()
    spark_session.sql("CREATE DATABASE IF NOT EXISTS dpsql_e2e")
    spark_session.sql(f"DROP TABLE IF EXISTS {SPARK_TABLE}")
    spark_session.sql(f"CREATE TABLE {SPARK_TABLE} USING parquet "
                      f"LOCATION '{d / 'adult.parquet'}'")
    return d


def _control(tmp_path, spark, **kwargs):
    return dpsql.connect(str(tmp_path / "control.duckdb"), create=True, spark=spark, **kwargs)


def _truth(sql: str) -> dict:
    con = duckdb.connect(raw_adult_file(), read_only=True)
    try:
        return {tuple(r[:-1]): r[-1] for r in con.execute(sql).fetchall()}
    finally:
        con.close()


def _answers(release) -> list[dict]:
    """Per statement: group key -> (answer, standard error)."""
    out = []
    for result in release.results:
        k = result.columns.index("stderr") - 1
        out.append({tuple(r[:k]): (r[k], r[k + 1]) for r in result.rows})
    return out


def _exact(sql: str, key: tuple, truth: dict) -> float:
    """DuckDB's count of a declared group (hours_per_week keys are bin starts)."""
    if "hours_per_week" not in sql.split("GROUP BY")[1]:
        return truth.get(key, 0)
    edges = ADULT_POLICY["columns"]["hours_per_week"]["edges"]
    age, low = key
    high = edges[edges.index(low) + 1]
    return sum(n for (a, h), n in truth.items()
               if a == age and low <= h and (h < high or high == edges[-1]))


def test_answers_equal_duckdb_exact_counts(spark_adult, spark_session, tmp_path):
    with _control(tmp_path, spark_session, sampler=_NoNoise()) as db:
        db.protect("adult", _policy())
        assert db.policies()["adult"].source.table == SPARK_TABLE
        for batch in (DENSE, IMPLICIT):
            release = db.answer(batch, epsilon=1, delta=1e-6)
            for sql, answers in zip(batch, _answers(release)):
                truth = _truth(sql)
                for key, (answer, _) in answers.items():
                    assert abs(answer - _exact(sql, key, truth)) < 1e-6, (sql, key)
        assert [e["status"] for e in db.ledger()] == ["released", "released"]


def test_secure_noise_at_epsilon_100_stays_within_its_errors(spark_adult, spark_session,
                                                             tmp_path):
    with _control(tmp_path, spark_session) as db:
        db.protect("adult", _policy())
        release = db.answer(DENSE, epsilon=100, delta=1e-6)
    for sql, answers in zip(DENSE, _answers(release)):
        truth = _truth(sql)
        z = [(a - truth.get(k, 0)) / s for k, (a, s) in answers.items()]
        assert max(abs(v) for v in z) < 6, (sql, z)


def test_csv_files_are_read_as_text_by_the_number_grammar(spark_adult, spark_session,
                                                          tmp_path):
    with _control(tmp_path, spark_session, sampler=_NoNoise()) as db:
        db.protect("adult", _policy(engine="spark", path=str(spark_adult / "adult_csv"),
                                    format="csv"))
        release = db.answer(DENSE[1], epsilon=1, delta=1e-6)
    truth = _truth(DENSE[1])
    for key, (answer, _) in _answers(release)[0].items():
        assert abs(answer - truth.get(key, 0)) < 1e-6


@pytest.mark.parametrize("source, columns, error, words", [
    ({"engine": "spark", "table": "dpsql_e2e.nope"}, None, PolicyError,
     ["Spark has no table dpsql_e2e.nope"]),
    ({"engine": "spark", "path": "/nonexistent/dpsql", "format": "parquet"}, None, PolicyError,
     ["no files at /nonexistent/dpsql"]),
    ({"engine": "spark", "table": SPARK_TABLE},
     {"age": {"type": "integer", "min": 17, "max": 90}, "zip": {"type": "integer", "min": 0,
                                                             "max": 9}},
     PolicyError, ["has no column(s) ['zip']"]),
    ({"engine": "spark", "path": "/nonexistent/delta", "format": "delta"}, None, EngineError,
     ["Delta Lake connector"]),
])
def test_protect_refuses_what_spark_cannot_read(spark_adult, spark_session, tmp_path, source,
                                                columns, error, words):
    policy = _policy(**source)
    if columns is not None:
        policy["columns"] = columns
    with _control(tmp_path, spark_session) as db, pytest.raises(error) as info:
        db.protect("adult", policy)
    assert all(w in str(info.value) for w in words), str(info.value)
    with _control(tmp_path, spark_session) as db:
        assert db.policies() == {}


def test_text_categories_over_a_number_column_are_refused_with_a_fix(spark_adult,
                                                                     spark_session, tmp_path):
    """fnlwgt is BIGINT in Spark: text categories over it compare its text form, the same
    in both engines for integers, so that one is accepted; a DOUBLE column is refused."""
    spark_session.sql(f"CREATE OR REPLACE TEMPORARY VIEW adult_double AS SELECT "
                      f"CAST(age AS DOUBLE) AS age FROM {SPARK_TABLE}")
    policy = _policy(engine="spark", table="adult_double")
    policy["columns"] = {"age": {"type": "categorical", "values": ["17.0", "18.0"]}}
    with _control(tmp_path, spark_session) as db:
        with pytest.raises(PolicyError, match="declare a numeric or integer domain"):
            db.protect("adult", policy)
        policy["columns"] = {"age": {"type": "integer", "min": 17, "max": 90}}
        db.protect("adult", policy)


def test_spark_error_text_never_leaks_and_the_charge_stands(spark_adult, spark_session,
                                                            tmp_path, monkeypatch):
    """The query is replaced by one whose failure message quotes a row's value."""
    secret = spark_session.sql(f"SELECT max(fnlwgt) FROM {SPARK_TABLE}").first()[0]
    monkeypatch.setattr(spark_engine, "render", lambda query: (
        f"SELECT raise_error(concat('secret ', CAST(max(fnlwgt) AS STRING))) AS n "
        f"FROM {SPARK_TABLE}"))
    with _control(tmp_path, spark_session) as db:
        db.protect("adult", _policy())
        with pytest.raises(EngineError) as info:
            db.answer("SELECT COUNT(*) FROM adult", epsilon=0.5, delta=1e-6)
        text = str(info.value)
        assert "secret" not in text and str(secret) not in text and "withheld" in text
        assert info.value.__cause__ is None and info.value.__context__ is None
        (entry,) = db.ledger()
        assert entry["status"] == "charged"


def test_a_spark_table_without_spark_is_refused_before_the_charge(spark_adult, spark_session,
                                                                  tmp_path):
    with _control(tmp_path, None) as db:
        with pytest.raises(EngineError, match="--spark-master"):
            db.protect("adult", _policy())
        assert db.policies() == {}
    with _control(tmp_path, spark_session) as db:
        db.protect("adult", _policy())
    with _control(tmp_path, None) as db:
        before = snapshot(db)
        with pytest.raises(EngineError, match="nothing was charged"):
            db.answer("SELECT COUNT(*) FROM adult", epsilon=0.5, delta=1e-6)
        assert snapshot(db) == before


def test_privacy_settings_hold_during_the_query_and_yours_come_back(spark_session):
    mine = {k: spark_session.conf.get(k) for k in spark_engine.FIXED}
    spark_session.conf.set("spark.sql.ansi.enabled", "true")
    spark_session.conf.set("spark.sql.adaptive.enabled", "true")
    try:
        with spark_engine.fixed_settings(spark_session):
            assert {k: spark_session.conf.get(k) for k in spark_engine.FIXED} == \
                spark_engine.FIXED
            # ANSI off: a value that cannot be cast is NULL, never an error
            assert spark_session.sql("SELECT CAST('abc' AS INT) AS v").first().v is None
        assert spark_session.conf.get("spark.sql.ansi.enabled") == "true"
        assert spark_session.conf.get("spark.sql.adaptive.enabled") == "true"
    finally:
        for key, value in mine.items():
            spark_session.conf.set(key, value)


def test_dbapi_and_command_line_reach_spark(spark_adult, spark_session, tmp_path, capsys):
    """``dbapi.connect(..., spark=)``; ``dpsql protect/run --spark-master``: the session
    already running in this process is used, and left running."""
    from dpsql import dbapi
    from dpsql.interfaces import cli

    path = str(tmp_path / "control.duckdb")
    duckdb.connect(path).close()
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[tables.adult]\nepsilon = 100\ndelta = 0.5\nsource = {{ engine = "spark", '
                      f'table = "{SPARK_TABLE}" }}\n[tables.adult.columns]\n'
                      'sex = { type = "categorical", values = ["Female", "Male"] }\n')
    assert cli.main(["protect", path, str(policy), "--spark-master", "local[2]"]) == 0
    script = tmp_path / "report.sql"
    script.write_text("SELECT sex, COUNT(*) FROM adult GROUP BY sex;\n")
    capsys.readouterr()
    assert cli.main(["run", path, str(script), "--epsilon", "50", "--delta", "1e-6",
                     "--spark-master", "local[2]", "--quiet"]) == 0
    assert "released" in capsys.readouterr().out
    with dbapi.connect(path, spark=spark_session, epsilon=50, delta=1e-6) as conn:
        cur = conn.cursor()
        cur.execute("SELECT COUNT(*) FROM adult")
        (total, *_), = cur.fetchall()
    assert abs(total - 32561) < 50
    assert spark_session.range(3).count() == 3         # still running
    assert np.isfinite(total)

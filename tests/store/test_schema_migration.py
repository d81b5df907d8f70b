"""Stored data survives upgrades (dpsql.store.schema).

``tests/fixtures/db_5a7e430.duckdb`` was written by the released dpsql at commit 5a7e430,
before schema versions existed (``tests/fixtures/build_db_5a7e430.py`` says how; what that
version reported at build time is in ``db_5a7e430.json``). Opened with today's dpsql it is
migrated to the current schema version, and everything in it stays usable: the ledger and the
exact budget spent, named releases (asked again: the recorded answers, no charge), cached
strategies (the optimiser is not run again), past measurements (free answers). A database
stamped by a newer dpsql is refused before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from fractions import Fraction
from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql.errors import EngineError, SchemaVersionError
from dpsql.store import schema
from dpsql.strategies import REGISTRY

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE = FIXTURES / "db_5a7e430.duckdb"
RECORD = json.loads((FIXTURES / "db_5a7e430.json").read_text())
RELEASES = RECORD["releases"]


def _fraction(text: str) -> Fraction:
    num, den = text.split("/")
    return Fraction(int(num), int(den))


@pytest.fixture
def old_path(tmp_path) -> str:
    """A private copy of the 5a7e430 database (never opened by today's dpsql yet)."""
    path = tmp_path / "old.duckdb"
    shutil.copyfile(FIXTURE, path)
    return str(path)


@pytest.fixture
def db(old_path):
    session = dpsql.connect(old_path)
    yield session
    session.close()


def _catalog(path: str) -> dict:
    """Every dpsql table's columns (name, type, in order) and row count."""
    con = duckdb.connect(path, read_only=True)
    try:
        return _catalog_of(con)
    finally:
        con.close()


def _catalog_of(con) -> dict:
    out = {}
    for (table,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = "
                                "'dpsql' ORDER BY table_name").fetchall():
        cols = con.execute("SELECT column_name, data_type FROM duckdb_columns() WHERE "
                           "schema_name = 'dpsql' AND table_name = ? ORDER BY column_index",
                           [table]).fetchall()
        (rows,) = con.execute(f"SELECT count(*) FROM dpsql.{table}").fetchone()
        out[table] = (tuple(cols), rows)
    return out


def _snapshot(path: str) -> dict:
    """Catalog and every internal row (as text), to show nothing changed."""
    con = duckdb.connect(path, read_only=True)
    try:
        out = {"catalog": _catalog_of(con),
               "main": con.execute("SELECT table_name FROM information_schema.tables WHERE "
                                   "table_schema = 'main' ORDER BY 1").fetchall()}
        for table in out["catalog"]:
            out[table] = sorted(map(repr, con.execute(f"SELECT * FROM dpsql.{table}")
                                    .fetchall()))
        return out
    finally:
        con.close()


def _sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _ask(db, spec, **extra):
    return db.answer(spec["sql"], epsilon=spec["epsilon"], delta=spec["delta"],
                     strategy=spec["strategy"], name=spec["name"], **extra)


# --------------------------------------------------------------------------- the fixture


def test_the_fixture_is_a_version_0_database_of_5a7e430():
    """The fixture really predates schema versions and holds every kind of stored data."""
    before = _catalog(str(FIXTURE))
    assert "schema_version" not in before
    assert RECORD["commit"] == "5a7e430"
    for table, n in RECORD["internal_rows"].items():
        assert before[table][1] == n, table
    for table in ("ledger", "policies", "release_tables", "measurements", "strategy_cache",
                  "selection_cache", "solver_cache"):
        assert before[table][1] > 0, table


# --------------------------------------------------------------------------- migration


def test_opening_migrates_and_records_the_version(db, old_path):
    assert db.policies()["adult"].table == "adult"        # any operation opens the file
    after = _catalog(old_path)
    con = duckdb.connect(old_path, read_only=True)
    try:
        assert schema.version(con) == schema.SCHEMA_VERSION
        stamps = con.execute("SELECT version, dpsql_version FROM dpsql.schema_version "
                             "ORDER BY version").fetchall()
    finally:
        con.close()
    assert [v for v, _ in stamps] == list(range(1, schema.SCHEMA_VERSION + 1))
    assert all(w == schema.dpsql_version() for _, w in stamps)
    # the migrated tables have exactly the columns of a database created today
    fresh = duckdb.connect()
    schema.ensure(fresh)
    created = _catalog_of(fresh)
    fresh.close()
    assert set(after) == set(created) == set(schema.TABLES)
    for table in created:
        assert after[table][0] == created[table][0], table
    # no stored row was lost or added (only the version stamps)
    for table, n in RECORD["internal_rows"].items():
        assert after[table][1] == n, table


def test_opening_twice_is_idempotent(old_path):
    for _ in range(2):
        with dpsql.connect(old_path) as session:
            session.budget()
    first = _snapshot(old_path)
    with dpsql.connect(old_path) as session:
        session.budget()
        session.ledger()
    assert _snapshot(old_path) == first
    assert first["catalog"]["schema_version"][1] == schema.SCHEMA_VERSION
    con = duckdb.connect(old_path)
    try:       # the migration itself run again on a current database changes nothing
        assert schema.check(con) == schema.ensure(con) == schema.SCHEMA_VERSION
        assert _catalog_of(con) == first["catalog"]
    finally:
        con.close()


BLOBS = {"strategy_cache": ("matrix", "indptr", "indices"), "solver_cache": ("factor",)}


def test_the_plan_caches_are_moved_to_uncompressed_blobs_unchanged(db, old_path, tmp_path):
    """Migration 5: the caches' large BLOB columns are stored uncompressed (a checkpoint no
    longer compresses a new plan or factor); every cached row is kept as it was."""
    before = _snapshot(str(FIXTURE))
    db.budget()                                                   # migrate
    after = _snapshot(old_path)
    for table in BLOBS:
        assert after[table] == before[table] and after[table], table
    fresh = str(tmp_path / "fresh.duckdb")                        # and a new database
    con = duckdb.connect(fresh)
    schema.ensure(con)
    con.execute("INSERT INTO dpsql.strategy_cache (fingerprint, strategy, n, rows, matrix, "
                "notes, seconds) VALUES ('k', 'x', 1, 1, ?, '[]', 0)", [bytes(range(256)) * 64])
    con.execute("INSERT INTO dpsql.solver_cache (solver_key, n, factor) VALUES ('k', 1, ?)",
                [bytes(range(256)) * 64])
    con.close()
    for path in (old_path, fresh):
        con = duckdb.connect(path, read_only=True)
        try:
            for table, columns in BLOBS.items():
                for column in columns:
                    used = {c for (c,) in con.execute(
                        f"SELECT DISTINCT compression FROM pragma_storage_info('dpsql.{table}')"
                        " WHERE column_name = ? AND segment_type = 'BLOB'", [column]).fetchall()}
                    assert used <= {"Uncompressed", "Constant"}, (path, table, column, used)
                    if column in ("matrix", "factor"):
                        assert "Uncompressed" in used, (path, table, column)
        finally:
            con.close()


def test_a_failed_migration_leaves_the_database_as_it_was(old_path, monkeypatch):
    before = _snapshot(old_path)
    broken = schema.Migration(schema.SCHEMA_VERSION + 1, "test: fails half way", (
        "ALTER TABLE dpsql.ledger ADD COLUMN half_way VARCHAR",
        "ALTER TABLE dpsql.no_such_table ADD COLUMN never INTEGER"))
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS + (broken,))
    monkeypatch.setattr(schema, "SCHEMA_VERSION", broken.version)
    with dpsql.connect(old_path) as session, \
            pytest.raises(EngineError, match="nothing was changed"):
        session.budget()
    assert _snapshot(old_path) == before     # migration 1 rolled back with it


# --------------------------------------------------------------------------- stored data


def test_ledger_and_exact_budget_survive(db):
    budget = db.budget("adult")
    recorded = RECORD["budget"]
    assert budget["accounting"] == recorded["accounting"]
    for key in ("epsilon_limit", "delta_limit", "epsilon_spent", "delta_spent",
                "epsilon_remaining", "delta_remaining"):
        assert budget[key] == _fraction(recorded[key]), key
    entries = db.ledger()
    assert len(entries) == len(RECORD["ledger"])
    for entry, old in zip(entries, RECORD["ledger"]):
        for key in ("release_id", "table_name", "epsilon", "delta", "mechanism", "strategy",
                    "calibration", "sigma", "sensitivity", "n_queries", "n_cells",
                    "expected_rmse", "sql_text", "result_tables", "private", "status",
                    "release_name", "bound_ratio", "metric_epsilon", "request",
                    "reused_from"):
            assert entry[key] == old[key], (entry["release_id"], key)


@pytest.mark.parametrize("release_id", [k for k, r in RELEASES.items() if r["name"]])
def test_named_releases_return_the_recorded_answers_without_a_charge(db, release_id):
    spec = RELEASES[release_id]
    before = db.budget("adult")
    again = _ask(db, spec)
    assert again.reused and again.release_id == int(release_id)
    assert [t.name for t in again.results] == [t["name"] for t in spec["results"]]
    for table, old in zip(again.results, spec["results"]):
        assert list(table.columns) == old["columns"]
        assert [list(row) for row in table.rows] == old["rows"]
    assert db.budget("adult") == before
    assert len(db.ledger()) == len(RECORD["ledger"])
    # a different request under a recorded name is still refused
    with pytest.raises(dpsql.DpsqlError):
        db.answer(spec["sql"], epsilon=spec["epsilon"] * 2, delta=spec["delta"],
                  strategy=spec["strategy"], name=spec["name"])


@pytest.mark.parametrize("release_id", ["1", "3"])
def test_cached_strategies_are_used_without_running_the_optimiser(db, monkeypatch,
                                                                     release_id):
    spec = RELEASES[release_id]
    strategy = spec["strategy"]              # optimal (release 1), eigen (release 3)

    def refuse(*args, **kwargs):
        raise AssertionError(f"the {strategy} optimiser ran again: the cache was missed")
    monkeypatch.setattr(REGISTRY[strategy], "plan", refuse)
    e = db.explain(spec["sql"], epsilon=spec["epsilon"], delta=spec["delta"],
                   strategy=strategy, reuse=False)
    assert [(c.strategy, c.cached) for c in e.candidates] == [(strategy, True)]
    # the same plan: the sensitivity recorded by the old release, exactly, and its expected
    # error (to rounding: the calibration of sigma may change in its last bits across versions)
    old = RECORD["ledger"][int(release_id) - 1]
    assert e.candidates[0].sensitivity == old["sensitivity"]
    assert e.rmse == pytest.approx(old["expected_rmse"], rel=1e-9)


def test_a_corrupt_cache_row_of_the_old_database_is_ignored_and_overwritten(db, old_path,
                                                                           monkeypatch):
    spec = RELEASES["1"]
    db.budget()                                                  # migrate
    con = duckdb.connect(old_path)
    try:
        changed = con.execute("UPDATE dpsql.strategy_cache SET matrix = 'garbage'::BLOB "
                              "WHERE strategy = 'optimal' RETURNING fingerprint").fetchall()
    finally:
        con.close()
    assert len(changed) == 1
    cold = db.explain(spec["sql"], epsilon=spec["epsilon"], delta=spec["delta"],
                      strategy="optimal", reuse=False)
    assert [(c.strategy, c.cached) for c in cold.candidates] == [("optimal", False)]
    monkeypatch.setattr(REGISTRY["optimal"], "plan", lambda *a, **k: 1 / 0)
    hit = db.explain(spec["sql"], epsilon=spec["epsilon"], delta=spec["delta"],
                     strategy="optimal", reuse=False)
    assert [(c.strategy, c.cached) for c in hit.candidates] == [("optimal", True)]
    assert hit.rmse == cold.rmse


def test_past_measurements_answer_for_free(db):
    # three of release 1's age ranges, asked at an ε whose fresh noise would be far worse
    sql = RELEASES["1"]["sql"][1:4]
    before = db.budget("adult")
    e = db.explain(sql, epsilon=0.05, delta=1e-6)
    assert e.reused_from == (1,) and set(e.free) == set(range(len(sql)))
    r = db.answer(sql, epsilon=0.05, delta=1e-6)
    assert r.epsilon == 0 and r.delta == 0
    assert db.budget("adult") == before
    # the free answers are the old release's answers (the same measurements, the same GLS)
    old = [row[-4] for t in RELEASES["1"]["results"][1:4] for row in t["rows"]]
    new = [row[-4] for t in r.results for row in t.rows]
    assert new == pytest.approx(old, rel=1e-9)


def test_a_new_release_works_and_is_charged(db):
    before = db.budget("adult")
    r = db.answer("SELECT income, COUNT(*) FROM adult GROUP BY income", epsilon=0.1,
                  delta=0, strategy="identity", name="after_upgrade")
    after = db.budget("adult")
    assert before["epsilon_spent"] < after["epsilon_spent"] <= before["epsilon_spent"] + \
        Fraction(1, 10)
    entry = db.ledger()[-1]
    assert (entry["release_id"], entry["status"], entry["release_name"]) == \
        (r.release_id, "released", "after_upgrade")
    assert r.release_id == len(RECORD["ledger"]) + 1
    again = db.answer("SELECT income, COUNT(*) FROM adult GROUP BY income", epsilon=0.1,
                      delta=0, strategy="identity", name="after_upgrade")
    assert again.reused and db.budget("adult") == after


# --------------------------------------------------------------------------- newer versions


def _stamp(path: str, version: int, writer: str = "9.9.9") -> None:
    con = duckdb.connect(path)
    try:
        con.execute("CREATE TABLE IF NOT EXISTS dpsql.schema_version (version INTEGER NOT NULL,"
                    " dpsql_version VARCHAR NOT NULL, applied_at TIMESTAMP NOT NULL DEFAULT "
                    "current_timestamp)")
        con.execute("INSERT INTO dpsql.schema_version (version, dpsql_version) VALUES (?, ?)",
                    [version, writer])
        con.execute("CHECKPOINT")
    finally:
        con.close()


@pytest.mark.parametrize("migrated_first", [True, False])
def test_a_newer_schema_is_refused_and_nothing_changes(old_path, migrated_first):
    if migrated_first:
        with dpsql.connect(old_path) as session:
            session.budget()
    _stamp(old_path, schema.SCHEMA_VERSION + 1)
    before, digest = _snapshot(old_path), _sha256(old_path)
    session = dpsql.connect(old_path)
    spec = RELEASES["1"]
    attempts = {
        "budget": lambda: session.budget("adult"),
        "ledger": lambda: session.ledger(),
        "policies": lambda: session.policies(),
        "explain": lambda: session.explain(spec["sql"], epsilon=0.1, delta=1e-6),
        "answer": lambda: session.answer(spec["sql"], epsilon=0.1, delta=1e-6),
        "named": lambda: _ask(session, spec),
        "protect": lambda: session.protect("adult", RECORD["policy"], replace=True),
    }
    try:
        for what, attempt in attempts.items():
            with pytest.raises(SchemaVersionError) as info:
                attempt()
            message = str(info.value)
            assert "\n" not in message, what
            assert f"schema version {schema.SCHEMA_VERSION + 1}" in message
            assert "dpsql 9.9.9" in message and "upgrade dpsql" in message
            assert "nothing was changed" in message
    finally:
        session.close()
    assert _snapshot(old_path) == before
    assert _sha256(old_path) == digest


def test_a_newer_in_memory_or_raw_connection_is_refused():
    con = duckdb.connect()
    schema.ensure(con)
    con.execute("INSERT INTO dpsql.schema_version (version, dpsql_version) VALUES (?, 'x')",
                [schema.SCHEMA_VERSION + 5])
    with pytest.raises(SchemaVersionError, match="upgrade dpsql"):
        schema.check(con)
    with pytest.raises(SchemaVersionError, match="upgrade dpsql"):
        schema.ensure(con)
    con.close()


def test_a_database_without_dpsql_tables_is_left_alone_until_protected(tmp_path):
    path = str(tmp_path / "plain.duckdb")
    con = duckdb.connect(path)
    con.execute("CREATE TABLE t AS SELECT range AS x FROM range(10)")
    con.close()
    with dpsql.connect(path) as session:
        assert session.policies() == {} and session.ledger() == []
    assert _catalog(path) == {}
    with dpsql.connect(path) as session:
        session.protect("t", {"epsilon": 1, "delta": 1e-6,
                              "columns": {"x": {"type": "integer", "min": 0, "max": 9}}})
    assert set(_catalog(path)) == set(schema.TABLES)


# --------------------------------------------------------------------------- result views


def test_old_result_tables_are_read_back_and_replaced_by_views(db, old_path):
    """Version 3 writes result tables as views over the release's stored answers. The
    5a7e430 result tables stay base tables: still recognised and read back for free, and a
    release that replaces one (CREATE OR REPLACE TABLE) drops it and writes a view."""
    first = RELEASES["1"]["results"][0]
    read = db.read_results(f"SELECT * FROM {first['name']}")
    assert [list(r) for r in read.rows] == first["rows"]
    r = db.answer(f"CREATE OR REPLACE TABLE {first['name']} AS SELECT sex, COUNT(*) FROM adult "
                  "GROUP BY sex", epsilon=0.1, delta=0, strategy="identity")
    assert r.release_id == len(RECORD["ledger"]) + 1
    db.close()
    con = duckdb.connect(old_path, read_only=True)
    try:
        kinds = dict(con.execute("SELECT table_name, table_type FROM information_schema.tables "
                                 "WHERE table_schema = 'main'").fetchall())
        rows = con.execute(f"SELECT * FROM {first['name']}").fetchall()
        stored = con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = "
                             "'dpsql_results'").fetchall()
    finally:
        con.close()
    assert kinds[first["name"]] == "VIEW" and kinds["dp_r1_q2"] == "BASE TABLE"
    assert rows == [tuple(row) for row in r.results[0].rows]
    assert stored == [("answers_vdddd",)]

"""Fixtures of the adversarial tests (helpers in ``hostile.py``): protected Adult databases
for refusals (``spare_db``, ``mem``) and for charges (``spend``), and the recorder that checks
no charging or result-writing SQL reached DuckDB (``no_charge``)."""

from __future__ import annotations

import pytest

from tests.privacy.hostile import Recorder, build_db, memory_conn, state


@pytest.fixture(scope="module")
def spare_db(tmp_path_factory):
    """A protected Adult database file that only ever sees refusals: its ledger and table
    list must be identical after the module (snapshot, checked here), and each test checks
    that no statement that charges or writes results was sent to it (Recorder.charges)."""
    path = build_db(str(tmp_path_factory.mktemp("spare") / "adult.duckdb"))
    before = state(path)
    yield path
    assert state(path) == before, "a refusal in this module charged or wrote something"


@pytest.fixture
def no_charge(monkeypatch):
    """Asserts, after the test, that no charging or result-writing SQL reached DuckDB."""
    rec = Recorder(monkeypatch)
    yield rec
    assert rec.charges() == []


@pytest.fixture(scope="module")
def mem():
    """An in-memory protected Adult database: a DB-API connection and its Session."""
    conn = memory_conn()
    yield conn
    conn.close()


@pytest.fixture(scope="module")
def spend():
    """An in-memory protected Adult database for tests that charge (a DB-API connection;
    ``.session`` is the Python API)."""
    conn = memory_conn()
    yield conn
    conn.close()

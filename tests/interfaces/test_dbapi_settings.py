"""The DB-API driver's accuracy-first, consistency and reuse settings (dpsql.interfaces.dbapi)."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from dpsql.interfaces import dbapi

from ..conftest import snapshot
from .test_dbapi import RACES, ledger


def test_accuracy_first_spends_only_when_confirmed(path):
    sql = "SELECT race, COUNT(*) FROM adult GROUP BY race"
    with dbapi.connect(path, delta=1e-8, target_rmse=60) as conn:
        cur = conn.cursor()
        found = cur.explain(sql)
        assert found.rmse <= 60
        before = snapshot(conn.session)
        with pytest.raises(dbapi.DatabaseError,
                           match=f"needs epsilon = {found.epsilon:g} .*confirm=True"):
            cur.execute(sql)
        assert snapshot(conn.session) == before and cur.description is None
        conn.confirm = True
        cur.execute(sql)
        assert cur.release.epsilon == found.epsilon and len(cur.fetchall()) == len(RACES)
        assert ledger(conn)[-1]["epsilon"] == found.epsilon
        # max_stderr bounds every answer's standard error
        conn.configure(target_rmse=None, max_stderr=30)
        cur.execute("SELECT sex, COUNT(*) FROM adult GROUP BY sex")
        assert all(row[-3] <= 30 for row in cur.fetchall())
        assert (conn.epsilon, conn.target_rmse, conn.max_stderr) == (None, None, 30.0)


def test_accuracy_and_flag_settings_are_validated_together(conn):
    for changes, match in [(dict(target_rmse=50), "epsilon and target_rmse are both given"),
                           (dict(epsilon=None), "give epsilon, or an accuracy target"),
                           (dict(epsilon=None, target_rmse="fifty"), "target_rmse must be a "
                            "number"),
                           (dict(epsilon=None, max_stderr=-1), "max_stderr must be a positive"),
                           (dict(epsilon=None, target_rmse=50, max_stderr=9), "both given"),
                           (dict(epsilon=None, target_rmse=50, delta=0, strategy="mwem"),
                            "accuracy targets apply to the matrix mechanism"),
                           (dict(confirm="yes"), "confirm must be true or false"),
                           (dict(nonnegative=1), "nonnegative must be true or false"),
                           (dict(integer=None), "integer must be true or false"),
                           (dict(reuse="no"), "reuse must be true or false"),
                           (dict(reuse=0), "reuse must be true or false")]:
        with pytest.raises(dbapi.ProgrammingError, match=match):
            conn.configure(**changes)
    with pytest.raises(dbapi.ProgrammingError, match="both given"):
        conn.max_stderr = 10
    with pytest.raises(dbapi.ProgrammingError, match="reuse must be true or false"):
        conn.reuse = "off"
    assert (conn.epsilon, conn.target_rmse, conn.confirm, conn.nonnegative, conn.reuse) == (
        0.1, None, False, False, True)
    with pytest.raises(dbapi.ProgrammingError, match="epsilon and max_stderr are both given"):
        dbapi.connect(conn.session.db.path, epsilon=0.1, delta=1e-6, max_stderr=5)
    with pytest.raises(dbapi.ProgrammingError, match="reuse must be true or false"):
        dbapi.connect(conn.session.db.path, epsilon=0.1, delta=1e-6, reuse=None)
    assert ledger(conn) == []


def test_consistency_flags_reach_the_release(conn):
    conn.configure(nonnegative=True, integer=True)
    cur = conn.cursor()
    cur.execute("SELECT race, COUNT(*) FROM adult WHERE age > 85 GROUP BY race")
    counts = [row[1] for row in cur.fetchall()]
    assert all(c >= 0 and c == int(c) for c in counts)
    request = json.loads(ledger(conn)[-1]["request"])
    assert (request["nonnegative"], request["integer"]) == (True, True)


def test_a_repeated_execute_is_free_with_reuse_and_charged_without(conn):
    sql = "SELECT race, COUNT(*) FROM adult GROUP BY race"
    cur = conn.cursor()
    assert conn.reuse is True                    # the default
    cur.execute(sql)
    first, counts = cur.release, [row[1] for row in cur.fetchall()]
    # explain says so before anything runs: every answer comes from release 1
    before = snapshot(conn.session)
    found = cur.explain(sql)
    assert (found.mechanism, found.epsilon, found.reused_from) == (
        "reuse", 0.0, (first.release_id,))
    assert snapshot(conn.session) == before
    cur.execute(sql)
    assert (cur.release.epsilon, cur.release.strategy) == (0.0, "reuse")
    assert [row[1] for row in cur.fetchall()] == pytest.approx(counts, rel=1e-6)  # no new noise
    entry = ledger(conn)[-1]
    assert (entry["mechanism"], entry["epsilon"], entry["delta"], entry["reused_from"]) == (
        "reuse", 0.0, 0.0, str(first.release_id))
    assert conn.session.budget("adult")["epsilon_spent"] == Fraction(1, 10)
    # reuse off: explained and answered afresh, and charged
    conn.reuse = False
    assert cur.explain(sql).mechanism != "reuse"
    cur.execute(sql)
    entry = ledger(conn)[-1]
    assert (entry["epsilon"], entry["reused_from"]) == (0.1, None)
    assert conn.session.budget("adult")["epsilon_spent"] == Fraction(2, 10)
    assert len(ledger(conn)) == 3


def test_connect_with_reuse_off(path):
    sql = "SELECT sex, COUNT(*) FROM adult GROUP BY sex"
    with dbapi.connect(path, epsilon=0.1, delta=1e-8, reuse=False) as c:
        cur = c.cursor()
        for _ in range(2):
            cur.execute(sql)
        assert [e["epsilon"] for e in ledger(c)] == [0.1, 0.1]
        assert c.session.budget("adult")["epsilon_spent"] == Fraction(2, 10)
        c.configure(reuse=True, epsilon=0.05)    # less accurate than what is there: free
        cur.execute(sql)
        assert ledger(c)[-1]["mechanism"] == "reuse"
        assert c.session.budget("adult")["epsilon_spent"] == Fraction(2, 10)

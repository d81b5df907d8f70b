"""The ONE workload marker (dpsql.sql.marker): BEGIN WORKLOAD; ... COMMIT; in the DB-API
(the reference behaviour, which the PostgreSQL-wire server routes through) and in scripts.
The shell's pseudo-terminal tests are in test_shell_marker.py."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from dpsql.interfaces import dbapi, scripts
from dpsql.errors import WorkloadBlockError, exit_status
from dpsql.sql.marker import (BEGIN, BEGIN_WORKLOAD, COMMIT, ROLLBACK, WorkloadBlock, pieces,
                              walk)

from ..conftest import ROOT, make_adult_db, snapshot

Q1 = "SELECT sex, COUNT(*) FROM adult GROUP BY sex"
Q2 = "SELECT COUNT(*) FROM adult WHERE age >= 40"
Q3 = "SELECT race, COUNT(*) FROM adult GROUP BY race"


# `path` and `conn` (ε = 0.1, δ = 1e-8): tests/interfaces/conftest.py


# --------------------------------------------------------------------------- recognition
@pytest.mark.parametrize("text, marker", [
    ("BEGIN WORKLOAD", BEGIN_WORKLOAD), ("begin  workload -- note", BEGIN_WORKLOAD),
    ("COMMIT", COMMIT), ("end", COMMIT), ("COMMIT WORK", COMMIT), ("END WORKLOAD", COMMIT),
    ("ROLLBACK", ROLLBACK), ("abort", ROLLBACK), ("BEGIN", BEGIN),
    ("START TRANSACTION", BEGIN), ("BEGIN TRANSACTION", BEGIN),
    ("SELECT COUNT(*) FROM adult", None), ("SELECT 'BEGIN WORKLOAD'", None),
    ("BEGIN WORKLOAD NOW", None),
    # what drivers send to start a transaction with modes: a plain BEGIN (the server's too)
    ("BEGIN ISOLATION LEVEL SERIALIZABLE", BEGIN), ("START TRANSACTION READ ONLY", BEGIN),
    ("begin transaction isolation level read committed", BEGIN),
    ("ROLLBACK TO SAVEPOINT s1", None), ("SAVEPOINT s1", None),
])
def test_markers_are_read_from_tokens(text, marker):
    (piece,) = pieces(text + ";")
    assert piece.marker == marker


def test_walk_collects_releases_and_discards():
    block = WorkloadBlock()
    steps = []
    for step in walk(f"{Q1}; BEGIN WORKLOAD; {Q2}; {Q3}; COMMIT; BEGIN WORKLOAD; {Q1}; "
                     "ROLLBACK; COMMIT; BEGIN;", block):
        if step.kind == "collect":
            block.add(step.text)
        steps.append((step.kind, step.statements or step.text))
    assert [k for k, _ in steps] == ["answer", "collect", "collect", "release", "collect",
                                     "notice", "notice", "notice"]
    assert steps[3][1] == (Q2 + ";", Q3 + ";")
    assert "discarded (1 statement collected)" in steps[5][1]
    assert "COMMIT with no workload block open" in steps[6][1]
    assert "BEGIN alone does not batch" in steps[7][1]
    assert not block.is_open
    block.begin()
    with pytest.raises(WorkloadBlockError, match="blocks do not nest"):
        list(walk("BEGIN WORKLOAD;", block))
    assert block.is_open


# --------------------------------------------------------------------------- DB-API
def test_dbapi_three_executes_in_a_block_are_one_release(conn):
    cur = conn.cursor()
    assert cur.execute("BEGIN WORKLOAD") is cur and cur.description is None
    for sql in (Q1, Q2, Q3):
        cur.execute(sql)
        assert cur.description is None and cur.rowcount == -1
        with pytest.raises(dbapi.ProgrammingError, match="added to the open workload block"):
            cur.fetchall()
    assert conn.workload == (Q1 + ";", Q2 + ";", Q3 + ";")
    assert conn.session.ledger() == []                     # nothing charged yet
    explained = cur.explain()                              # what COMMIT would release
    cur.execute("COMMIT")
    (entry,) = conn.session.ledger()
    assert entry["epsilon"] == 0.1 and entry["n_queries"] == explained.n_queries
    assert conn.workload is None
    assert [d[0] for d in cur.description][:2] == ["sex", "count"]
    assert len(cur.fetchall()) == 2
    assert cur.nextset() and cur.fetchall()[0][0] > 0
    assert cur.nextset() and len(cur.fetchall()) == cur.rowcount > 2      # the races
    assert cur.nextset() is None


def test_dbapi_one_string_with_a_block_and_executemany_inside(conn):
    cur = conn.cursor()
    cur.execute(f"BEGIN WORKLOAD; {Q1}")
    cur.executemany("SELECT COUNT(*) FROM adult WHERE age >= ?", [(30,), (50,)])
    assert len(conn.workload) == 3
    cur.execute("COMMIT")
    (entry,) = conn.session.ledger()
    assert entry["n_queries"] == 4 and len(entry["result_tables"]) == 3
    cur.execute(f"BEGIN WORKLOAD; {Q2}; {Q3}; COMMIT")       # a pasted block: one release
    assert len(conn.session.ledger()) == 2
    assert cur.rowcount == 1 and cur.nextset() and cur.rowcount > 2
    # with parameters: the markers stay markers (sqlglot would write END as "END")
    cur.execute("BEGIN WORKLOAD; SELECT COUNT(*) FROM adult WHERE age >= ?; "
                "SELECT COUNT(*) FROM adult WHERE age < ?; END", (60, 25))
    assert len(conn.session.ledger()) == 3 and conn.workload is None
    assert cur.rowcount == 1 and cur.nextset() and cur.nextset() is None


def test_dbapi_rollback_charges_nothing(conn):
    before = snapshot(conn.session)
    cur = conn.cursor()
    cur.execute("BEGIN WORKLOAD")
    cur.execute(Q1)
    cur.execute(Q2)
    cur.execute("ROLLBACK")
    assert conn.workload is None and snapshot(conn.session) == before
    assert conn.notices[-1].startswith("workload block discarded (2 statements collected)")
    with pytest.raises(dbapi.ProgrammingError, match="no result set"):
        cur.fetchone()


def test_dbapi_errors_inside_a_block(conn):
    before = snapshot(conn.session)
    cur = conn.cursor()
    cur.execute("BEGIN WORKLOAD")
    cur.execute(Q1)
    with pytest.raises(dbapi.ProgrammingError) as bad:
        cur.execute("SELECT name, COUNT(*) FROM adult GROUP BY name")
    message = str(bad.value)
    assert "column 'name'" in message and "\n" not in message
    assert "not added to the open workload block (1 statement collected)" in message
    with pytest.raises(dbapi.ProgrammingError) as nested:
        cur.execute("BEGIN WORKLOAD")
    assert "already open with 1 statement collected; blocks do not nest" in str(nested.value)
    assert isinstance(nested.value.__cause__, WorkloadBlockError)
    assert dbapi.error_class(WorkloadBlockError) is dbapi.ProgrammingError
    assert conn.workload == (Q1 + ";",) and snapshot(conn.session) == before
    cur.execute("COMMIT")                                    # the good statement only
    assert len(conn.session.ledger()) == 1 and cur.rowcount == 2


def test_dbapi_plain_begin_commit_are_noops_with_notices(conn):
    cur = conn.cursor()
    cur.execute("COMMIT")
    cur.execute("ROLLBACK")
    cur.execute("BEGIN")
    assert cur.description is None and conn.workload is None
    assert conn.notices == [
        "COMMIT with no workload block open: nothing to release",
        "ROLLBACK with no workload block open: nothing to discard (releases are charged "
        "when answered and cannot be undone)",
        "BEGIN alone does not batch (dpsql has no transactions): each query is still "
        "released on its own; write BEGIN WORKLOAD; ... COMMIT; to answer several queries "
        "as one workload"]
    cur.execute(Q1)                                          # released on its own
    cur.execute("BEGIN WORKLOAD; COMMIT")
    assert conn.notices[-1].startswith("COMMIT of an empty workload block")
    assert len(conn.session.ledger()) == 1


def test_dbapi_close_with_an_open_block_discards_with_a_warning(path):
    conn = dbapi.connect(path, epsilon=0.1, delta=1e-8)
    cur = conn.cursor()
    cur.execute("BEGIN WORKLOAD")
    cur.execute(Q1)
    with pytest.warns(dbapi.WorkloadDiscarded, match="discarded .1 statement collected.; "
                                                     "nothing was charged"):
        conn.close()
    with dbapi.connect(path, epsilon=0.1, delta=1e-8) as again:
        assert again.session.ledger() == [] and again.workload is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            again.cursor().execute(Q1)                   # no block: no warning on close


def test_dbapi_block_over_budget_at_commit_charges_nothing(tmp_path):
    path = str(tmp_path / "small.duckdb")
    make_adult_db(path, epsilon=0.05, delta=1e-5).close()
    with dbapi.connect(path, epsilon=0.1, delta=1e-8) as conn:
        cur = conn.cursor()
        cur.execute("BEGIN WORKLOAD")
        cur.execute(Q1)
        with pytest.raises(dbapi.BudgetExceeded):
            cur.execute("COMMIT")
        assert conn.session.ledger() == [] and conn.workload is None


# --------------------------------------------------------------------------- scripts
def parse(text, **defaults):
    return scripts.parse_script(text, **({"epsilon": 0.1, "delta": 1e-6} | defaults))


def test_script_block_is_one_workload_and_ends_the_run_of_queries():
    s = parse(f"{Q1};\nBEGIN WORKLOAD;\n{Q2};\n{Q3};\nCOMMIT;\n{Q1};\n{Q2};\n")
    assert [len(w.statements) for w in s.workloads] == [1, 2, 2]
    assert s.workloads[1].lines == "lines 3-4"
    # a block after a SET, plain BEGIN / COMMIT and an empty block change nothing
    s = parse(f"BEGIN;\nSET dpsql.epsilon = 0.2;\nBEGIN WORKLOAD;\n{Q1};\n{Q2};\nEND;\n"
              f"BEGIN WORKLOAD; COMMIT;\nCOMMIT;\n")
    assert [(len(w.statements), float(w.epsilon)) for w in s.workloads] == [(2, 0.2)]
    s = parse(f"BEGIN WORKLOAD;\n{Q1};\nROLLBACK;\n{Q2};\n")
    assert [w.sql for w in s.workloads] == [[Q2]]


@pytest.mark.parametrize("text, message, line", [
    (f"BEGIN WORKLOAD;\n{Q1};\nBEGIN WORKLOAD;\n{Q2};\nCOMMIT;", "blocks do not nest", 3),
    (f"{Q1};\nBEGIN WORKLOAD;\n{Q2};", "is never committed", 2),
    (f"BEGIN WORKLOAD;\n{Q1};\nSET dpsql.epsilon = 0.2;\n{Q2};\nCOMMIT;",
     "a SET inside a workload block", 3),
])
def test_script_block_errors_point_at_their_line(text, message, line):
    with pytest.raises(WorkloadBlockError, match=message) as refused:
        parse(text)
    assert refused.value.line == line and exit_status(refused.value) == 65


def test_dpsql_run_releases_a_block_once(path):
    script = f"BEGIN WORKLOAD;\n{Q1};\n{Q2};\n{Q3};\nCOMMIT;\n"
    done = subprocess.run([sys.executable, "-m", "dpsql", "run", path, "-", "--epsilon",
                           "0.1", "--delta", "1e-6"], input=script, capture_output=True,
                          text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert done.returncode == 0, done.stderr
    with dbapi.connect(path, epsilon=0.1, delta=1e-8) as conn:
        (entry,) = conn.session.ledger()
    assert entry["n_queries"] == 8 and len(entry["result_tables"]) == 3
    nested = subprocess.run([sys.executable, "-m", "dpsql", "run", path, "-", "--epsilon",
                             "0.1", "--delta", "1e-6"], input="BEGIN WORKLOAD;\n" + script,
                            capture_output=True, text=True, cwd=ROOT,
                            env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert nested.returncode == 65 and "Traceback" not in nested.stderr
    assert "blocks do not nest" in nested.stderr and "line 2" in nested.stderr


# ------------------------------------------------------------- collecting is a check only
def test_dbapi_collects_a_block_without_selecting_strategies(conn, monkeypatch):
    """Each statement added is checked (parsed and compiled, against the policies read once
    for the block), not explained: explaining the block at every statement made a block of
    n statements cost n strategy selections (600 through psql: over 10 minutes). A statement
    that does not compile is still refused before it is added."""
    from dpsql import session as session_module
    reads, real = [], session_module.Session.policies
    monkeypatch.setattr(session_module.Session, "policies",
                        lambda self: reads.append(1) or real(self))
    monkeypatch.setattr(session_module.Session, "explain",
                        lambda *a, **k: pytest.fail("a collected statement was explained"))
    cur = conn.cursor()
    cur.execute("BEGIN WORKLOAD")
    for sql in (Q1, Q2, Q3):
        cur.execute(sql)
    with pytest.raises(dbapi.ProgrammingError, match="column 'name'.*not added"):
        cur.execute("SELECT name, COUNT(*) FROM adult GROUP BY name")
    assert reads == [1] and conn.workload == (Q1 + ";", Q2 + ";", Q3 + ";")
    cur.execute("COMMIT")
    (entry,) = conn.session.ledger()
    assert entry["epsilon"] == 0.1 and len(entry["result_tables"]) == 3


def test_a_shell_script_block_is_checked_not_explained(path, tmp_path, monkeypatch, capsys):
    """``dpsql shell -f``: no running cost per statement (no strategy selected until the
    release); a statement that does not compile stops the script, nothing charged."""
    from dpsql import session as session_module
    from dpsql.interfaces.shell import app
    monkeypatch.setattr(session_module.Session, "explain",
                        lambda *a, **k: pytest.fail("a collected statement was explained"))
    script = tmp_path / "block.sql"
    script.write_text(f"BEGIN WORKLOAD;\n{Q1};\n{Q2};\n{Q3};\nCOMMIT;\n")
    assert app.main([path, "--epsilon", "0.1", "--delta", "1e-6", "-f", str(script)]) == 0
    out = capsys.readouterr()
    assert "COMMIT; would spend" not in out.out + out.err        # no running cost
    assert "releasing the workload block: 3 statements as ONE workload" in out.out + out.err
    bad = tmp_path / "bad.sql"
    bad.write_text(f"BEGIN WORKLOAD;\n{Q1};\nSELECT name, COUNT(*) FROM adult GROUP BY name;\n"
                   "COMMIT;\n")
    assert app.main([path, "--epsilon", "0.1", "--delta", "1e-6", "-f", str(bad)]) != 0
    assert "not added to the workload block" in capsys.readouterr().err
    with dbapi.connect(path, epsilon=0.1, delta=1e-8) as conn:
        assert len(conn.session.ledger()) == 1                  # the good block only

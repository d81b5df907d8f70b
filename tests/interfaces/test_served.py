"""A database file owned by a running ``dpsql serve`` (issue 17 item 2): the Python API,
the DB-API and every command-line subcommand say so at once, in one line naming the
server's address and pid and how to connect through it (the busy-database row of the error
table: exit 75, SQLSTATE 55P03, OperationalError), instead of waiting on the lock; a stale
marker is ignored. A real server on loopback (tests/interfaces/server_support.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import dpsql
from dpsql.errors import ERROR_TABLE, LockTimeoutError
from dpsql.interfaces import dbapi
from tests.interfaces.server_support import ROOT, ServerProcess, make_database

psycopg = pytest.importorskip("psycopg")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db_path, users = make_database(tmp_path_factory.mktemp("served"))
    s = ServerProcess(db_path, users)
    yield s
    s.stop()


def _says_served(message: str, server) -> None:
    assert "\n" not in message.strip()
    assert f"127.0.0.1:{server.port}" in message and f"pid {server.proc.pid}" in message
    assert f"port={server.port}" in message and "psql" in message


def test_the_python_api_and_the_dbapi_say_the_server_owns_the_file(server):
    started = time.monotonic()
    with pytest.raises(LockTimeoutError) as info:
        dpsql.connect(server.db_path, lock_timeout=30)
    _says_served(str(info.value), server)
    with pytest.raises(dbapi.OperationalError) as info:
        dbapi.connect(server.db_path, epsilon=0.1, delta=1e-8, lock_timeout=30)
    _says_served(str(info.value), server)
    assert time.monotonic() - started < 10         # no wait on the lock
    assert ERROR_TABLE[LockTimeoutError].sqlstate == "55P03"
    with psycopg.connect(server.dsn("alice"), autocommit=True) as c:   # the way in
        assert c.execute("SELECT count(*) FROM dpsql_budget").fetchone()[0] == 1


@pytest.mark.parametrize("argv", [
    ["budget", "{db}"], ["ledger", "{db}"], ["protect", "{db}", "{policy}"],
    ["run", "{db}", "{script}"], ["explain", "{db}", "{script}"], ["shell", "{db}"],
    ["serve", "{db}", "--users", "{users}", "--port", "0"],
])
def test_every_subcommand_says_the_server_owns_the_file(server, tmp_path, argv):
    script = tmp_path / "q.sql"
    script.write_text("SET dpsql.epsilon = 0.1; SET dpsql.delta = 1e-8;\n"
                      "SELECT sex, COUNT(*) FROM adult GROUP BY sex;\n")
    policy = ROOT / "examples" / "adult_policy.toml"
    args = [a.format(db=server.db_path, script=script, policy=policy, users=server.users)
            for a in argv]
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "dpsql", *args], cwd=ROOT, input="",
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=60)
    assert time.monotonic() - started < 30
    assert done.returncode == ERROR_TABLE[LockTimeoutError].exit_status, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, done.stderr
    _says_served(lines[0], server)


def test_a_stale_marker_is_ignored(tmp_path):
    db_path, _ = make_database(tmp_path)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    marker = db_path + ".dpsql-server"
    with open(marker, "w", encoding="utf-8") as f:
        json.dump({"address": "127.0.0.1:5999", "pid": gone.pid}, f)
    with dpsql.connect(db_path) as db:             # the process is gone: not a server
        assert "adult" in db.policies()
    with open(marker, "w", encoding="utf-8") as f:
        f.write("not json")
    with dbapi.connect(db_path, epsilon=0.1, delta=1e-8) as c:
        assert c.session.ledger() == []


def test_over_the_wire_another_analysts_result_table_stays_unnamed(server):
    """The server reads an analyst's own result tables from its shadow, and its DB-API
    connection does not read result tables back (``read_results = False``): a release
    statement naming another analyst's result table is refused exactly as one naming a
    table that does not exist (the same SQLSTATE and words)."""
    with psycopg.connect(server.dsn("bob", epsilon="0.05", delta="1e-8"),
                         autocommit=True) as bob:
        bob.execute("CREATE TABLE bob_sex AS SELECT sex, count(*) FROM adult GROUP BY sex")
        assert len(bob.execute("SELECT * FROM bob_sex").fetchall()) == 2   # own: free
    errors = []
    with psycopg.connect(server.dsn("alice", epsilon="0.05", delta="1e-8"),
                         autocommit=True) as alice:
        for name in ("bob_sex", "no_such_t"):
            with pytest.raises(psycopg.Error) as info:
                alice.execute(f"SELECT count(*) FROM adult WHERE sex IN "
                              f"(SELECT sex FROM {name})")
            errors.append((info.value.sqlstate, str(info.value).replace(name, "NAME")))
    assert errors[0] == errors[1]

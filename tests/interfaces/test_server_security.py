"""Security of ``dpsql serve``: logins, analysts kept apart, no raw rows or exact counts,
messages without data, malformed protocol, a flood of connections, a client that leaves
mid-release, TLS."""

from __future__ import annotations

import json
import shutil
import socket
import struct
import subprocess
import time

import duckdb
import pytest

from tests.conftest import raw_adult_file
from tests.interfaces.server_support import PASSWORDS, ServerProcess, make_database, refused

psycopg = pytest.importorskip("psycopg")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db, users = make_database(tmp_path_factory.mktemp("security"))
    s = ServerProcess(db, users, "--max-connections", "6")
    yield s
    s.stop()


def connect(server, user, **options):
    opts = {"epsilon": "0.02", "delta": "1e-8"} | options
    return psycopg.connect(server.dsn(user, **opts), autocommit=True)


# --------------------------------------------------------------------------- logins

def test_wrong_missing_and_unknown_logins_are_refused(server):
    for user, password in (("alice", "wrong"), ("alice", ""), ("mallory", "x"),
                           ("owner", PASSWORDS["alice"])):
        with pytest.raises(psycopg.OperationalError) as info:
            psycopg.connect(server.dsn(user, password=password))
        text = str(info.value)
        assert "password authentication failed" in text or "no password" in text
    audit = [json.loads(line) for line in open(server.db_path + ".audit.jsonl")]
    assert any(r["kind"] == "login" and r["user"] == "mallory" for r in audit)


# --------------------------------------------------------------------------- apart

def test_one_analyst_cannot_read_or_spend_what_belongs_to_another(server):
    with connect(server, "alice") as alice, connect(server, "bob") as bob:
        alice.execute("CREATE TABLE alice_private AS SELECT count(*) FROM adult")
        assert alice.execute("SELECT count(*) FROM alice_private").fetchone() == (1,)
        for sql in ("SELECT * FROM alice_private", "SELECT * FROM main.alice_private",
                    "SELECT * FROM dpsql_ledger", "SELECT * FROM dpsql.ledger",
                    "SELECT * FROM dpsql.release_tables"):
            assert refused(bob, sql).sqlstate == "42P01"
        tables = {r[0] for r in bob.execute(
            "SELECT relname FROM pg_catalog.pg_class WHERE relkind = 'r'").fetchall()}
        assert "alice_private" not in tables and "adult" in tables
        # bob's spending never touches alice's allowance
        before = alice.execute("SHOW dpsql.budget").fetchone()
        bob.execute("SELECT count(*) FROM adult WHERE age > 50")
        assert alice.execute("SHOW dpsql.budget").fetchone() == before
        assert refused(bob, "CALL dpsql.allow('bob', 'adult', '1', '1e-6')").sqlstate \
            == "42501"
    with connect(server, "owner") as owner:
        ledger = owner.execute("SELECT analyst, result_tables FROM dpsql_ledger").fetchall()
        assert ("alice", "@alice/alice_private") in ledger     # her namespace
        refusals = owner.execute("SELECT sqlstate FROM dpsql_audit WHERE analyst = 'bob' "
                                 "AND outcome = 'refused'").fetchall()
        assert ("42P01",) in refusals and ("42501",) in refusals


def test_allowances_cap_each_analyst_and_the_table_caps_the_sum(tmp_path):
    # allowances that sum past the table's budget: the table still refuses the overspend
    db, users = make_database(tmp_path, epsilon=0.1, delta=1e-5,
                              allowances={"alice": ("0.06", "0"), "bob": ("0.06", "0")})
    s = ServerProcess(db, users)
    try:
        with connect(s, "alice", epsilon="0.03", delta="0") as a, \
                connect(s, "bob", epsilon="0.03", delta="0") as b:
            a.execute("SELECT count(*) FROM adult")
            a.execute("SELECT count(*) FROM adult WHERE age > 30")
            assert refused(a, "SELECT count(*) FROM adult WHERE age > 40").sqlstate == "53400"
            b.execute("SELECT count(*) FROM adult WHERE age > 60")
            over = refused(b, "SELECT count(*) FROM adult WHERE age > 70")
            assert over.sqlstate == "53400" and "allowance" not in str(over)   # the table's
        with connect(s, "owner") as owner:
            rows = owner.execute("SELECT analyst, epsilon FROM dpsql_ledger").fetchall()
        assert sorted(r[0] for r in rows) == ["alice", "alice", "bob"]
        assert sum(r[1] for r in rows) == pytest.approx(0.09)
    finally:
        s.stop()


# --------------------------------------------------------------------------- no raw data

ATTACKS = [
    "SELECT * FROM adult", "SELECT age FROM adult LIMIT 5", "TABLE adult",
    "SELECT * FROM main.adult", "WITH t AS (SELECT * FROM adult) SELECT * FROM t",
    "SELECT (SELECT count(*) FROM adult)", "SELECT count(*) FROM pg_catalog.pg_class, adult",
    "SELECT * FROM read_csv_auto('/etc/passwd')", "SELECT * FROM '/etc/passwd'",
    "COPY adult TO STDOUT", "ATTACH '{db}' AS raw", "SELECT * FROM raw.adult",
    "PRAGMA table_info('adult')", "INSTALL httpfs", "EXPORT DATABASE '/tmp/x'",
    "CREATE TABLE stolen AS SELECT * FROM adult", "DELETE FROM adult",
    "SELECT count(*) FROM adult UNION SELECT count(*) FROM adult",
]


def test_no_query_path_returns_raw_rows_or_exact_counts(server):
    con = duckdb.connect(raw_adult_file(), read_only=True)
    exact = {str(v) for (v,) in con.execute(
        "SELECT count(*) FROM adult UNION ALL SELECT count(*) FROM adult GROUP BY sex "
        "UNION ALL SELECT count(*) FROM adult WHERE age > 50").fetchall()}
    sample = [str(v) for v in con.execute("SELECT age FROM adult LIMIT 3").fetchone()]
    con.close()
    with connect(server, "bob") as bob:
        for attack in ATTACKS:
            sql = attack.format(db=server.db_path)
            try:
                rows = bob.execute(sql).fetchall()
            except psycopg.Error as exc:
                assert exc.sqlstate and exc.sqlstate != "XX000", (sql, exc)
                text = str(exc)
                assert not any(v in text.split() for v in exact), (sql, text)
                continue
            flat = {str(v) for r in rows for v in r}
            assert not (flat & exact), sql
            assert rows == [] or set(sample) - flat, sql
        # the shadow catalog's sizes are of empty tables
        (size,) = bob.execute("SELECT estimated_size FROM duckdb_tables() "
                              "WHERE table_name = 'adult'").fetchone()
        assert size == 0


# --------------------------------------------------------------------------- robustness

def _raw(server, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_malformed_protocol_messages_do_not_hurt_the_server(server):
    startup = b"\0\3\0\0user\0alice\0\0"
    for payload in (b"garbage!", struct.pack("!i", 2**30) + b"x" * 8,
                    struct.pack("!ii", 8, 12345678), struct.pack("!i", 4),
                    struct.pack("!i", len(startup) + 4) + startup + b"Q\xff\xff\xff\xff",
                    struct.pack("!i", len(startup) + 4) + startup + b"p\0\0\0\x05x",
                    b"\0\0\0\x10\x04\xd2\x16\x2e" + b"\0" * 8):     # cancel, unknown key
        reply = _raw(server, payload)
        assert b"XX000" not in reply
    assert server.alive()
    with connect(server, "alice") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_flood_of_connections_is_refused_past_the_limit(server):
    held = [connect(server, "bob") for _ in range(6)]
    try:
        with pytest.raises(psycopg.OperationalError, match="at most 6 connections"):
            connect(server, "bob")
    finally:
        for c in held:
            c.close()
    for _ in range(3000):             # the closed connections' threads free their slots
        try:
            with connect(server, "bob") as again:
                assert again.execute("SELECT 1").fetchone() == (1,)
            break
        except psycopg.OperationalError:
            time.sleep(0.1)
    else:
        raise AssertionError("the slots of closed connections were never freed")


def test_a_client_that_leaves_mid_release_loses_nothing(server):
    """A disconnect cancels a request not yet charged (nothing charged, nothing written,
    SQLSTATE 57014 in the audit) and never loses one already charged (kept and written):
    whichever happened, the audit, the ledger and the result table agree."""
    conn = connect(server, "alice")
    conn.pgconn.send_query(b"CREATE TABLE left_behind AS SELECT count(*) FROM adult "
                           b"GROUP BY race")
    conn.pgconn.flush()
    socket.socket(fileno=conn.pgconn.socket).close()    # gone, without a Terminate
    outcome = []
    for _ in range(3000):                      # wait for the server to finish with it
        with connect(server, "owner") as owner:
            outcome = owner.execute(
                "SELECT outcome, sqlstate FROM dpsql_audit WHERE kind = 'release' "
                "AND sql_text LIKE '%left_behind%'").fetchall()
        if outcome:
            break
        time.sleep(0.1)
    assert len(outcome) == 1
    with connect(server, "owner") as owner:
        ledger = owner.execute("SELECT analyst FROM dpsql_ledger WHERE result_tables = "
                               "'@alice/left_behind'").fetchall()
    with connect(server, "alice") as again:
        names = {r[0] for r in again.execute(
            "SELECT table_name FROM information_schema.tables").fetchall()}
        if outcome[0][0] == "refused":                      # cancelled before the charge
            assert outcome[0][1] == "57014" and ledger == [] and "left_behind" not in names
        else:                                               # charged: kept and written
            assert ledger == [("alice",)]
            assert len(again.execute("SELECT * FROM left_behind").fetchall()) == 5
    assert server.alive()


# --------------------------------------------------------------------------- TLS

@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_tls_with_a_given_certificate_and_require_tls(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    db, users = make_database(tmp_path)
    s = ServerProcess(db, users, "--certificate", str(cert), "--key", str(key),
                      "--require-tls")
    try:
        with psycopg.connect(s.dsn("alice") + " sslmode=require") as conn:
            assert conn.pgconn.ssl_in_use
            assert conn.execute("SHOW dpsql.budget").fetchone()[0] == "adult"
        with pytest.raises(psycopg.OperationalError, match="TLS"):
            psycopg.connect(s.dsn("alice") + " sslmode=disable")
    finally:
        s.stop()


def test_cancel_requests_never_lose_a_charged_release(server):
    with connect(server, "alice") as conn:
        conn.cancel()                                   # nothing running: no effect
        assert conn.execute("SELECT 1").fetchone() == (1,)
        conn.pgconn.send_query(b"CREATE TABLE cancelled_maybe AS SELECT count(*) FROM adult "
                               b"WHERE age > 25")
        conn.cancel()
        while (result := conn.pgconn.get_result()) is not None:
            state = result.error_field(psycopg.pq.DiagnosticField.SQLSTATE)
            assert state in (None, b"57014")
        names = {r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables").fetchall()}
        with connect(server, "owner") as owner:
            charged = owner.execute("SELECT count(*) FROM dpsql_ledger WHERE result_tables = "
                                    "'@alice/cancelled_maybe'").fetchone()[0]
        assert charged == (1 if "cancelled_maybe" in names else 0)   # charged <=> written


def test_user_command_and_serve_refusals(tmp_path):
    import sys

    users = tmp_path / "u.toml"
    run = [sys.executable, "-m", "dpsql", "user"]
    p = subprocess.run(run + ["add", str(users), "dana", "--allow", "adult=0.1,0"],
                       input="s3cret\n", capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    text = users.read_text()
    assert "s3cret" not in text and "SCRAM-SHA-256$4096:" in text
    assert oct(users.stat().st_mode & 0o777) == "0o600"
    p = subprocess.run(run + ["add", str(users), "dana"], input="x\n", capture_output=True,
                       text=True)
    assert p.returncode == 65 and p.stderr.count("\n") == 1 and "already exists" in p.stderr
    p = subprocess.run([sys.executable, "-m", "dpsql", "serve", str(tmp_path / "none.duckdb"),
                        "--users", str(users)], capture_output=True, text=True)
    assert p.returncode == 66 and "does not exist" in p.stderr and "Traceback" not in p.stderr


def test_a_bound_parameter_never_becomes_sql(server):
    with connect(server, "bob") as bob:
        for value in ("Male'; SELECT * FROM adult; --", "x' OR '1'='1", "$1", "\\'; --"):
            try:
                rows = bob.execute("SELECT count(*) FROM adult WHERE sex = %s",
                                   (value,)).fetchall()
            except psycopg.Error as exc:
                assert exc.sqlstate in ("0A000", "42601", "22023", "42P17"), exc
                continue
            assert len(rows) == 1 and len(rows[0]) == 4      # one noisy count, its error

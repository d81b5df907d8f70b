"""Analysts kept apart over the wire, with psycopg against a real ``dpsql serve``: each
analyst's result tables in a namespace of their own (no overwriting, dropping, reading or
learning of another's), sharing by the owner, reuse limited to one's own releases, and d_X
releases charged to a per-analyst metric allowance."""

from __future__ import annotations

import pytest

from tests.interfaces.server_support import ServerProcess, make_database, refused

psycopg = pytest.importorskip("psycopg")

METRIC = {"epsilon": 1, "columns": {"age": {"weight": 0.1}, "sex": {"different": 1}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db, users = make_database(
        tmp_path_factory.mktemp("apart"), metric=METRIC,
        allowances={"alice": ("0.5", "1e-6", "0.5"), "bob": ("0.3", "1e-6"),
                    "carol": ("0.3", "1e-6", "2")})
    s = ServerProcess(db, users)
    yield s
    s.stop()


def connect(server, user, **options):
    opts = {"epsilon": "0.01", "delta": "1e-8"} | options
    return psycopg.connect(server.dsn(user, **opts), autocommit=True)


def budget(conn) -> tuple:
    return conn.execute("SHOW dpsql.budget").fetchone()


def ledger(server) -> list:
    with connect(server, "owner") as owner:
        return owner.execute("SELECT release_id, analyst, epsilon, metric_epsilon, mechanism, "
                             "result_tables FROM dpsql_ledger ORDER BY 1").fetchall()


# --------------------------------------------------------------------------- namespaces

def test_no_analyst_overwrites_reads_or_learns_of_anothers_table(server):
    with connect(server, "alice") as alice:
        mine = alice.execute("CREATE TABLE mine AS SELECT sex, count(*) FROM adult "
                             "GROUP BY sex").fetchall()
        unnamed = alice.execute("SELECT count(*) FROM adult WHERE age < 25").fetchall()
    auto = ledger(server)[-1][5]
    assert auto.startswith("dp_r")
    with connect(server, "bob") as bob:
        # refused before any charge, whatever the spelling
        before, entries = budget(bob), len(ledger(server))
        for sql, state in (
                ("CREATE OR REPLACE TABLE alice.mine AS SELECT count(*) FROM adult", "42501"),
                ('CREATE OR REPLACE TABLE "alice"."mine" AS SELECT count(*) FROM adult',
                 "42501"),
                ("CREATE TABLE adult.alice.mine AS SELECT count(*) FROM adult", "42501"),
                ('CREATE OR REPLACE TABLE "@alice/mine" AS SELECT count(*) FROM adult',
                 "0A000"),
                (f"CREATE OR REPLACE TABLE {auto} AS SELECT count(*) FROM adult", "0A000"),
                ("CREATE TABLE IF NOT EXISTS mine AS SELECT count(*) FROM adult", "0A000"),
                ("CREATE OR REPLACE TABLE adult AS SELECT count(*) FROM adult", "0A000"),
                ("EXPLAIN CREATE OR REPLACE TABLE alice.mine AS SELECT count(*) FROM adult",
                 "42501"),
                ("DROP TABLE mine", "0A000"), ('DROP TABLE "@alice/mine"', "0A000"),
                ("SELECT * FROM alice.mine", "42P01"), ('SELECT * FROM "@alice/mine"', "42P01"),
                ('SELECT * FROM main."@alice/mine"', "42P01"), (f"SELECT * FROM {auto}", "42P01"),
                ("SELECT * FROM mine", "42P01"), ("SELECT * FROM MINE", "42P01"),
                ("CALL dpsql.share('alice.mine', 'bob')", "42P01")):
            error = refused(bob, sql)
            assert error.sqlstate == state, (sql, str(error))
            # word for word what a name nobody uses gets: nothing tells the table exists
            other = refused(bob, sql.replace("mine", "n0ne").replace(auto, "dp_r999_q1"))
            assert (other.sqlstate, str(other).replace("n0ne", "mine").replace(
                "dp_r999_q1", auto)) == (state, str(error)), sql
        bob.execute("BEGIN WORKLOAD")
        assert refused(bob, "CREATE OR REPLACE TABLE alice.mine AS SELECT count(*) FROM "
                            "adult").sqlstate == "42501"
        bob.execute("ROLLBACK")
        assert budget(bob) == before and len(ledger(server)) == entries
        # the same names in bob's own namespace: his tables, alice's untouched, and no
        # "already exists" that would tell him the name is taken
        for sql in ("CREATE TABLE mine AS SELECT count(*) FROM adult WHERE age > 60",
                    'CREATE OR REPLACE TABLE "MINE" AS SELECT count(*) FROM adult '
                    "WHERE age > 61",
                    "CREATE OR REPLACE TABLE main.Mine AS SELECT count(*) FROM adult "
                    "WHERE age > 62",
                    "BEGIN WORKLOAD; CREATE OR REPLACE TABLE public.mine AS SELECT count(*) "
                    "FROM adult WHERE age > 63; COMMIT"):
            bob.execute(sql)
        assert len(bob.execute("SELECT * FROM mine").fetchall()) == 1
        error = refused(bob, "CREATE TABLE mine AS SELECT count(*) FROM adult")
        assert error.sqlstate == "0A000" and "'mine' already exists" in str(error)   # his own
    with connect(server, "alice") as alice:
        assert alice.execute("SELECT * FROM mine ORDER BY sex").fetchall() == mine
        assert alice.execute(f"SELECT * FROM {auto}").fetchall() == unnamed
    written = [(r[1], r[5]) for r in ledger(server)]
    assert ("alice", "@alice/mine") in written
    assert [t.lower() for u, t in written if u == "bob"] == ["@bob/mine"] * 4


# --------------------------------------------------------------------------- sharing

def test_sharing_lets_the_grantee_read_for_free_and_never_write(server):
    with connect(server, "alice") as alice, connect(server, "bob") as bob, \
            connect(server, "carol") as carol:
        rows = alice.execute("CREATE TABLE shared_ages AS SELECT count(*) FROM adult "
                             "WHERE age BETWEEN 30 AND 39").fetchall()
        assert refused(bob, "SELECT * FROM alice.shared_ages").sqlstate == "42P01"
        alice.execute("CALL dpsql.share('shared_ages', 'bob')")
        before, entries = budget(bob), len(ledger(server))
        assert bob.execute("SELECT * FROM alice.shared_ages").fetchall() == rows
        assert bob.execute("SELECT count(*) FROM alice.shared_ages WHERE ci_low < count"
                           ).fetchone() == (1,)
        assert ("alice", "shared_ages") in bob.execute(
            "SELECT table_schema, table_name FROM information_schema.tables").fetchall()
        assert budget(bob) == before and len(ledger(server)) == entries        # free
        # read only, and not the grantee's to pass on or take back
        for sql, state in (
                ("CREATE OR REPLACE TABLE alice.shared_ages AS SELECT count(*) FROM adult",
                 "42501"),
                ("CALL dpsql.share('alice.shared_ages', 'carol')", "42P01"),
                ("CALL dpsql.unshare('alice.shared_ages', 'bob')", "42P01"),
                ("CALL dpsql.share('shared_ages', 'carol')", "42P01")):
            assert refused(bob, sql).sqlstate == state, sql
        assert refused(carol, "SELECT * FROM alice.shared_ages").sqlstate == "42P01"
        assert budget(bob) == before and len(ledger(server)) == entries
        # the owner writes it again: the grantee reads the new release
        again = alice.execute("CREATE OR REPLACE TABLE shared_ages AS SELECT count(*) FROM "
                              "adult WHERE age BETWEEN 30 AND 40").fetchall()
        assert bob.execute("SELECT * FROM alice.shared_ages").fetchall() == again != rows
        # no share of what is not the caller's, nor with nobody
        assert refused(alice, "CALL dpsql.share('nothing_here', 'bob')").sqlstate == "42P01"
        assert refused(alice, "CALL dpsql.share('shared_ages', 'mallory')").sqlstate == "42P01"
        alice.execute("CALL dpsql.unshare('shared_ages', 'bob')")
        assert refused(bob, "SELECT * FROM alice.shared_ages").sqlstate == "42P01"
    with connect(server, "owner") as owner:       # the data owner shares anyone's table
        owner.execute("CALL dpsql.share('alice.shared_ages', 'carol')")
    with connect(server, "carol") as carol:
        assert carol.execute("SELECT * FROM alice.shared_ages").fetchall() == again


# --------------------------------------------------------------------------- reuse

def test_reuse_draws_only_on_the_analysts_own_releases(server):
    query = "SELECT count(*) FROM adult WHERE hours_per_week >= 40 AND age > 27"
    with connect(server, "alice", epsilon="0.02") as alice, \
            connect(server, "carol", epsilon="0.02") as carol:
        paid = alice.execute(query).fetchall()
        spent = budget(alice)[2]
        assert alice.execute(query).fetchall() == paid            # free: her own release
        assert budget(alice)[2] == spent
        plan = [r[0] for r in carol.execute("EXPLAIN " + query).fetchall()]
        assert not any("past releases" in line for line in plan), plan
        before = budget(carol)[2]
        fresh = carol.execute(query).fetchall()                   # charged, new noise
        assert fresh != paid and budget(carol)[2] == pytest.approx(before + 0.02)
        assert carol.execute(query).fetchall() == fresh           # now free: her own
        plan = [r[0] for r in carol.execute("EXPLAIN " + query).fetchall()]
        assert any("from past releases" in line for line in plan), plan
    rows = [r for r in ledger(server) if r[5] and r[1] in ("alice", "carol")][-4:]
    assert [(r[1], r[2] > 0, r[4] == "reuse") for r in rows] == [
        ("alice", True, False), ("alice", False, True),
        ("carol", True, False), ("carol", False, True)]


# --------------------------------------------------------------------------- d_X

def test_metric_releases_are_charged_to_a_metric_allowance(server):
    ages = "SELECT count(*) FROM adult WHERE age BETWEEN {} AND {}"
    with connect(server, "alice", model="metric", epsilon="0.2", delta="0") as alice:
        standard = budget(alice)[2]
        (count, stderr, _, _), = alice.execute(ages.format(17, 29)).fetchall()
        assert stderr > 0
        assert budget(alice)[7:] == (0.5, 0.2, pytest.approx(0.3))
        alice.execute(ages.format(30, 39))
        over = refused(alice, ages.format(40, 49))
        assert over.sqlstate == "53400" and "metric epsilon" in str(over)
        assert "alice" in str(over) and "allowance" in str(over)
        assert budget(alice)[2] == standard and budget(alice)[8] == pytest.approx(0.4)
    with connect(server, "bob", model="metric", epsilon="0.2", delta="0") as bob:
        before = budget(bob)
        assert before[7:] == (0.0, 0.0, 0.0)          # no metric allowance: refused
        assert refused(bob, ages.format(17, 29)).sqlstate == "53400"
        assert budget(bob) == before
    # carol's metric allowance (2) is more than the table's metric budget (1) has left:
    # the table caps it (alice spent 0.4)
    with connect(server, "carol", model="metric", epsilon="0.5", delta="0") as carol:
        assert budget(carol)[9] == pytest.approx(0.6)
        carol.execute(ages.format(50, 59))
        over = refused(carol, ages.format(60, 69))
        assert over.sqlstate == "53400" and "allowance" not in str(over)
    rows = [r for r in ledger(server) if r[4] == "dx_laplace"]
    assert [(r[1], r[3]) for r in rows] == [("alice", 0.2), ("alice", 0.2), ("carol", 0.5)]
    assert all(r[2] == 0 for r in rows)


def test_the_data_owner_sets_metric_allowances_over_the_wire(server):
    with connect(server, "owner") as owner:
        owner.execute("CALL dpsql.allow('bob', 'adult', '0.3', '1e-6', '0.05')")
    with connect(server, "bob", model="metric", epsilon="0.05", delta="0") as bob:
        assert budget(bob)[7] == 0.05
        bob.execute("SELECT count(*) FROM adult WHERE sex = 'Male'")
        assert budget(bob)[8:] == (0.05, 0.0)
    with connect(server, "owner") as owner:
        owner.execute("CALL dpsql.allow('bob', 'adult', '0.3', '1e-6')")   # metric kept
    with connect(server, "bob") as bob:
        assert budget(bob)[7] == 0.05


# --------------------------------------------------------------------------- command line

def test_serve_and_user_take_their_settings_from_the_declarations(tmp_path, zygote):
    import subprocess
    from fractions import Fraction

    from dpsql.interfaces.server.accounts import load_users
    from dpsql.interfaces.server.analyst import AnalystConnection
    from dpsql.interfaces.server.app import SERVED_SETTINGS, Server
    from dpsql.request.declared import CONNECTION_SETTINGS, SPARK_SETTINGS, settings_for

    # every connection setting of the command line, except Spark's: the server's one Spark
    # link is shared by all analysts (serve --spark-master/--spark-remote), never per analyst
    assert SERVED_SETTINGS == tuple(s.name for s in settings_for("cli", CONNECTION_SETTINGS)
                                    if s.name not in SPARK_SETTINGS)
    assert "lock_timeout" in SERVED_SETTINGS and SPARK_SETTINGS
    assert not set(SPARK_SETTINGS) & set(SERVED_SETTINGS)
    db, users = make_database(tmp_path)
    dpsql = zygote.argv("module", "dpsql")   # python -m dpsql, forked from the fork server
    p = subprocess.run(dpsql + ["serve", db, "--users", users, "--lock-timeout", "soon"],
                       capture_output=True, text=True)
    assert p.returncode == 65 and p.stderr.count("\n") == 1 and "--lock-timeout" in p.stderr
    server = Server(db, users, port=0, lock_timeout=Fraction(5, 2), time_limit=20)
    try:
        assert server.connection_settings == {"lock_timeout": 2.5, "time_limit": 20}
        analyst = AnalystConnection(server, load_users(users)["alice"])
        assert analyst._dbapi.session.db.lock_timeout == 2.5        # what the file waits
        assert analyst._dbapi._limits["time_limit"] == 20
        analyst.close()
    finally:
        server.server_close()
    p = subprocess.run(dpsql + ["user", "add", users, "erin", "--allow", "adult=0.1,0",
                                "--allow-metric", "adult=0.2"],
                       input="pw\n", capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    allowance = load_users(users)["erin"].allowances["adult"]
    assert (allowance.epsilon, allowance.delta, allowance.metric_epsilon) == (
        Fraction(1, 10), 0, Fraction(1, 5))
    for bad in (["--allow-metric", "adult"], ["--allow-metric", "adult=0.1,0"]):
        p = subprocess.run(dpsql + ["user", "add", users, "fay", *bad], input="pw\n",
                           capture_output=True, text=True)
        assert p.returncode == 64 and p.stderr.count("\n") == 1, p.stderr
        assert "TABLE=EPSILON" in p.stderr
    for name in ("main", "pg_me", "a/b", "Alice"):        # schemas, namespaces, case twins
        p = subprocess.run(dpsql + ["user", "add", users, name], input="pw\n",
                           capture_output=True, text=True)
        assert p.returncode == 65 and p.stderr.count("\n") == 1, (name, p.stderr)


# --------------------------------------------------------------------------- OPTIONS

def test_a_statements_options_are_what_the_allowance_is_charged(server):
    """BigQuery's ``SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = ...)`` overrides the
    connection's settings in the release (the DB-API's rule): the analyst's allowance must be
    reserved and charged the statement's epsilon, not the connection's smaller one, or an
    analyst could spend past their allowance."""
    dp = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = {}, delta = 1e-8) "
          "count(*) FROM adult WHERE age > {}")
    with connect(server, "bob", epsilon="0.001") as bob:
        before = budget(bob)
        entries = len(ledger(server))
        over = refused(bob, dp.format(float(before[3]) + 0.05, 61))
        assert over.sqlstate == "53400" and "allowance" in str(over), str(over)
        assert budget(bob) == before and len(ledger(server)) == entries
        bob.execute(dp.format(0.02, 62)).fetchall()
        assert budget(bob)[2] == pytest.approx(float(before[2]) + 0.02)
    assert ledger(server)[-1][1:3] == ("bob", pytest.approx(0.02))

"""``dpsql serve`` with the real clients: the psql binary, psycopg 3, SQLAlchemy + pandas.

Each connects over loopback, authenticates (SCRAM-SHA-256), runs a batch, an EXPLAIN, a
BEGIN WORKLOAD … COMMIT block, a budget look-up, reads its own result table, and gets a
clean SQLSTATE for bad SQL, a bad setting, a wrong password and an exhausted allowance.
"""

from __future__ import annotations

import shutil
import subprocess
import warnings

import pytest

from tests.interfaces.server_support import ServerProcess, make_database

psycopg = pytest.importorskip("psycopg")
PSQL = shutil.which("psql")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db, users = make_database(tmp_path_factory.mktemp("server"))
    s = ServerProcess(db, users)
    yield s
    s.stop()


def psql(server, user, *commands, password=None, **options):
    """Run psql with each command as a -c; (returncode, stdout, stderr)."""
    args = [PSQL, server.dsn(user, password, **options), "-X", "-v", "VERBOSITY=verbose"]
    for c in commands:
        args += ["-c", c]
    p = subprocess.run(args, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr


# --------------------------------------------------------------------------- psql

@pytest.mark.skipif(PSQL is None, reason="the psql binary is not installed")
def test_psql_batch_explain_workload_budget_and_own_results(server):
    opts = dict(epsilon="0.05", delta="1e-8")
    rc, out, err = psql(server, "alice", "SELECT sex, count(*) FROM adult GROUP BY sex",
                        **opts)
    assert rc == 0, err
    assert "Female" in out and "stderr" in out and "ci_low" in out and "(2 rows)" in out
    rc, out, err = psql(server, "alice", "EXPLAIN SELECT count(*) FROM adult WHERE age > 30",
                        **opts)
    assert rc == 0 and "QUERY PLAN" in out and "expected RMSE" in out, err
    rc, out, err = psql(server, "alice", "BEGIN WORKLOAD; CREATE TABLE psql_young AS SELECT "
                        "count(*) FROM adult WHERE age < 30; CREATE TABLE psql_old AS SELECT "
                        "count(*) FROM adult WHERE age >= 30; COMMIT;", **opts)
    assert rc == 0, err
    rc, out, err = psql(server, "alice", "SELECT * FROM psql_old",
                        "SELECT * FROM dpsql_budget", "SHOW dpsql.budget")
    assert rc == 0, err
    assert "count" in out and "epsilon_remaining" in out
    # the batch and the block: two releases of 0.05 each
    assert "0.1 |" in out.replace("  ", " ")


@pytest.mark.skipif(PSQL is None, reason="the psql binary is not installed")
def test_psql_describes_tables(server):
    rc, out, err = psql(server, "alice", r"\dt", r"\d adult")
    assert rc == 0, err
    assert "adult" in out and "dpsql_budget" in out
    for column in ("age", "sex", "race", "income", "hours_per_week"):
        assert column in out
    assert "bigint" in out and "character varying" in out


@pytest.mark.skipif(PSQL is None, reason="the psql binary is not installed")
def test_psql_errors_carry_sqlstates(server):
    rc, _, err = psql(server, "alice", "SELEC count(*) FROM adult", epsilon="0.05",
                      delta="1e-8")
    assert rc == 1 and "ERROR:  42601:" in err
    rc, _, err = psql(server, "alice", "SET dpsql.epsilon = abc")
    assert rc == 1 and "ERROR:  22023:" in err and "dpsql.epsilon" in err
    rc, _, err = psql(server, "alice", "SELECT 1", password="wrong")
    assert rc == 2 and "28P01" in err or "password authentication failed" in err


# --------------------------------------------------------------------------- psycopg

def test_psycopg_releases_params_workload_and_budget(server):
    with psycopg.connect(server.dsn("bob", epsilon="0.05", delta="1e-8")) as conn:
        cur = conn.execute("SELECT count(*) FROM adult WHERE age > %s AND sex = %s",
                           (40, "Female"))
        (count, stderr, low, high), = cur.fetchall()
        assert low < count < high and stderr > 0
        assert [d.name for d in cur.description] == ["count", "stderr", "ci_low", "ci_high"]
        plan = conn.execute("EXPLAIN SELECT count(*) FROM adult GROUP BY race").fetchall()
        assert "table adult" in plan[0][0]
        conn.commit()                       # psycopg's own BEGIN/COMMIT are no-ops
        conn.execute("BEGIN WORKLOAD")
        conn.execute("CREATE TABLE py_young AS SELECT count(*) FROM adult WHERE age < 30")
        conn.execute("CREATE TABLE py_old AS SELECT count(*) FROM adult WHERE age >= 30")
        conn.execute("COMMIT")
        assert len(conn.execute("SELECT * FROM py_young ORDER BY 1").fetchall()) == 1
        (table, eps_allowed, eps_spent, eps_left, *_), = conn.execute(
            "SELECT * FROM dpsql_budget").fetchall()
        assert (table, eps_allowed, eps_spent) == ("adult", 0.3, 0.1)
        assert eps_left == pytest.approx(0.2)
        conn.execute("BEGIN WORKLOAD")
        conn.execute("CREATE TABLE py_dropped AS SELECT count(*) FROM adult")
        conn.execute("ROLLBACK")            # discarded: nothing spent
        assert conn.execute("SHOW dpsql.budget").fetchone()[2] == 0.1


def test_psycopg_errors_carry_sqlstates(server):
    with psycopg.connect(server.dsn("bob"), autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as bad_setting:
            conn.execute("SET dpsql.delta = 2")
        assert bad_setting.value.sqlstate == "22023"
        with pytest.raises(psycopg.Error) as unset:
            conn.execute("SELECT count(*) FROM adult")
        assert unset.value.sqlstate == "22023" and "SET dpsql.delta" in str(unset.value)
        conn.execute("SET dpsql.epsilon = 0.01")
        conn.execute("SET dpsql.delta TO 0")
        with pytest.raises(psycopg.Error) as bad_sql:
            conn.execute("SELECT age FROM adult")
        assert bad_sql.value.sqlstate == "0A000"
        with pytest.raises(psycopg.Error) as unknown:
            conn.execute("SELECT count(*) FROM nowhere")
        assert unknown.value.sqlstate == "42P01"
        assert conn.execute("SELECT 1 + 1").fetchone() == (2,)    # still usable
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(server.dsn("bob", password="not-it"))


def test_an_exhausted_allowance_is_53400_and_charges_nothing(server):
    with psycopg.connect(server.dsn("carol", epsilon="0.015", delta="0"),
                         autocommit=True) as conn:
        conn.execute("SELECT count(*) FROM adult")
        with pytest.raises(psycopg.Error) as over:
            conn.execute("SELECT count(*) FROM adult WHERE sex = 'Male'")
        assert over.value.sqlstate == "53400"
        assert "carol" in str(over.value) and "allowance" in str(over.value)
        assert conn.execute("SHOW dpsql.budget").fetchone()[2] == 0.015


# --------------------------------------------------------------------------- SQLAlchemy

def test_sqlalchemy_and_pandas_read_without_warnings(server):
    sa = pytest.importorskip("sqlalchemy")
    pd = pytest.importorskip("pandas")
    engine = sa.create_engine(server.url("alice"), connect_args={
        "options": "-c dpsql.epsilon=0.05 -c dpsql.delta=1e-8"})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with engine.connect() as c:
                frame = pd.read_sql("SELECT race, count(*) FROM adult GROUP BY race", c)
                assert list(frame.columns) == ["race", "count", "stderr", "ci_low", "ci_high"]
                assert len(frame) == 5
                budget = pd.read_sql("SELECT * FROM dpsql_budget", c)
                assert budget["table_name"].tolist() == ["adult"]
            inspector = sa.inspect(engine)
            names = inspector.get_table_names()
            assert "adult" in names and "dpsql_budget" in names
            columns = {c["name"]: str(c["type"]) for c in inspector.get_columns("adult")}
            assert columns == {"age": "BIGINT", "sex": "VARCHAR", "race": "VARCHAR",
                               "income": "VARCHAR", "hours_per_week": "DOUBLE PRECISION"}
    finally:
        engine.dispose()


def test_every_wire_setting_is_parsed_by_the_one_declaration(server):
    from dpsql.interfaces.server.analyst import WIRE_SETTINGS

    bad = {"number": "abc", "share": "abc", "flag": "maybe", "text": "no-such-thing(1"}
    with psycopg.connect(server.dsn("alice"), autocommit=True) as conn:
        for name, setting in WIRE_SETTINGS.items():
            with pytest.raises(psycopg.Error) as info:
                conn.execute(f"SET dpsql.{name} = '{bad[setting.kind]}'")
            assert info.value.sqlstate == "22023", (name, str(info.value))
            assert f"dpsql.{name}" in str(info.value) or name == "strategy"
        with pytest.raises(psycopg.Error) as unknown:
            conn.execute("SET dpsql.epsilonn = 1")
        assert unknown.value.sqlstate == "22023" and "dpsql.epsilon," in str(unknown.value)
        conn.execute("SET dpsql.strategy = 'identity'")
        assert conn.execute("SHOW dpsql.strategy").fetchone() == ("identity",)


# --------------------------------------------------------------------------- workload blocks

def _spent(conn) -> float:
    return conn.execute("SHOW dpsql.budget").fetchone()[2]


def test_workload_blocks_over_the_wire_are_the_dbapi_blocks(server):
    """The server routes markers through dpsql.sql.marker and the DB-API connection's
    block: nested BEGIN WORKLOAD is 25000, a refused statement is an error but the block
    stays open, COMMIT releases the rest as ONE ledger entry, ROLLBACK charges nothing.
    (Reuse off: alice asked the same counts through psql, and her own past releases would
    answer them free.)"""
    with psycopg.connect(server.dsn("alice", epsilon="0.01", delta="1e-9", reuse="false"),
                         autocommit=True) as conn:
        notices = []
        conn.add_notice_handler(lambda n: notices.append(n.message_primary))
        before = _spent(conn)
        conn.execute("BEGIN WORKLOAD")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.execute("CREATE TABLE wb_young AS SELECT count(*) FROM adult WHERE age < 30")
        with pytest.raises(psycopg.Error) as nested:
            conn.execute("begin /* again */ workload")
        assert nested.value.sqlstate == "25000" and "do not nest" in str(nested.value)
        with pytest.raises(psycopg.Error) as refused:
            conn.execute("SELECT age FROM adult")
        assert refused.value.sqlstate == "0A000"
        assert "not added to the open workload block" in str(refused.value)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.execute("CREATE TABLE wb_old AS SELECT count(*) FROM adult WHERE age >= 30")
        assert _spent(conn) == pytest.approx(before)          # collected, not charged
        cur = conn.execute("COMMIT")
        assert len(cur.fetchall()) == 1                        # the first result set
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert _spent(conn) == pytest.approx(before + 0.01)    # one charge for the block
        conn.execute("BEGIN WORKLOAD; CREATE TABLE wb_gone AS SELECT count(*) FROM adult; "
                      "ROLLBACK")
        assert _spent(conn) == pytest.approx(before + 0.01)    # discarded: nothing spent
        assert any("discarded" in n for n in notices)
        conn.execute("BEGIN")                                  # a driver's: a no-op
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.execute("SAVEPOINT s1")
        conn.execute("ROLLBACK TO SAVEPOINT s1")
        conn.execute("COMMIT")
        conn.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")     # psycopg's, with a level
        conn.execute("ROLLBACK")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert any("BEGIN alone does not batch" in n for n in notices)
    with psycopg.connect(server.dsn("owner"), autocommit=True) as owner:
        rows = owner.execute("SELECT result_tables FROM dpsql_ledger WHERE result_tables "
                             "LIKE '%wb_%'").fetchall()
    assert rows == [("@alice/wb_young, @alice/wb_old",)]     # in alice's namespace


@pytest.mark.skipif(PSQL is None, reason="the psql binary is not installed")
def test_psql_nested_block_is_25000(server):
    rc, _, err = psql(server, "alice", "BEGIN WORKLOAD; BEGIN WORKLOAD;", epsilon="0.01",
                      delta="1e-9")
    assert rc == 1 and "ERROR:  25000:" in err and "do not nest" in err


def test_a_refused_commit_discards_the_block_and_charges_nothing(server):
    with psycopg.connect(server.dsn("carol", epsilon="0.05", delta="0"),
                         autocommit=True) as conn:
        before = _spent(conn)
        conn.execute("BEGIN WORKLOAD")
        conn.execute("SELECT count(*) FROM adult WHERE age < 30")
        with pytest.raises(psycopg.Error) as over:          # over carol's allowance (0.02)
            conn.execute("COMMIT")
        assert over.value.sqlstate == "53400"
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert _spent(conn) == before

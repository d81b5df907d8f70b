"""More clients of ``dpsql serve``: pgcli (scripted with pexpect), the ``dpsql://``
SQLAlchemy dialect in-process, and the connect-time catalog queries of DBeaver and
Metabase (replayed as their public source sends them)."""

from __future__ import annotations

import os
import shutil
import sys
import warnings

import pytest

from tests.conftest import make_adult_db
from tests.interfaces.server_support import PASSWORDS, ServerProcess, make_database

psycopg = pytest.importorskip("psycopg")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db, users = make_database(tmp_path_factory.mktemp("clients"))
    s = ServerProcess(db, users)
    yield s
    s.stop()


PGCLI = shutil.which("pgcli") or os.path.join(os.path.dirname(sys.executable), "pgcli")


@pytest.mark.skipif(not os.path.exists(PGCLI), reason="pgcli is not installed")
def test_pgcli_runs_a_batch_lists_tables_and_reports_errors(server, tmp_path):
    pexpect = pytest.importorskip("pexpect")
    pgcli = PGCLI
    env = dict(os.environ, PGOPTIONS="-c dpsql.epsilon=0.05 -c dpsql.delta=1e-8",
               PGPASSWORD=PASSWORDS["alice"], HOME=str(tmp_path), TERM="dumb")
    child = pexpect.spawn(pgcli, ["-h", "127.0.0.1", "-p", str(server.port), "-U", "alice",
                                  "adult", "--less-chatty"], env=env, encoding="utf-8",
                          dimensions=(50, 200), timeout=None)
    try:
        child.expect("> ")
        child.sendline("SELECT sex, count(*) FROM adult GROUP BY sex")
        child.expect("Female")
        child.expect("> ")
        child.sendline(r"\dt")
        child.expect("dpsql_budget")
        child.expect("> ")
        child.sendline("SELEC 1")
        child.expect("could not parse SQL")
        child.expect("> ")
        child.sendline(r"\q")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)


def test_the_dpsql_dialect_reads_and_inspects_in_process(tmp_path):
    sa = pytest.importorskip("sqlalchemy")
    pd = pytest.importorskip("pandas")
    from sqlalchemy.dialects import registry

    registry.register("dpsql", "dpsql.interfaces.sqlalchemy", "DpsqlDialect")  # no install
    path = str(tmp_path / "adult.duckdb")
    make_adult_db(path).close()
    engine = sa.create_engine(f"dpsql:///{path}?epsilon=0.1&delta=1e-6")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frame = pd.read_sql("SELECT sex, count(*) FROM adult GROUP BY sex", engine)
        assert frame["sex"].tolist() == ["Female", "Male"]
        with engine.connect() as c:
            pd.read_sql(sa.text("CREATE TABLE by_race AS SELECT race, count(*) FROM adult "
                                "GROUP BY race"), c)
        inspector = sa.inspect(engine)
        assert {"adult", "by_race"} <= set(inspector.get_table_names())
        assert [c["name"] for c in inspector.get_columns("adult")] == [
            "age", "sex", "race", "income", "hours_per_week"]
        assert [c["name"] for c in inspector.get_columns("by_race")] == [
            "race", "count", "stderr", "ci_low", "ci_high"]
    with pytest.raises(Exception, match="unknown dpsql setting"):
        sa.create_engine(f"dpsql:///{path}?epsilom=0.1").connect()
    engine.dispose()


#: what DBeaver (plugins/org.jkiss.dbeaver.ext.postgresql: PostgreDataSource, PostgreDatabase,
#: PostgreSchema) and Metabase (src/metabase/driver/postgres.clj, sql_jdbc/sync) send on
#: connect and sync, in the pgjdbc driver's spelling
CONNECT_QUERIES = [
    "SET extra_float_digits = 3",
    "SET application_name = 'DBeaver 24.0.0 - Main'",
    "SELECT current_schema(),session_user",
    "SHOW search_path",
    "SELECT version()",
    "select * from pg_catalog.pg_settings where name=$1",
    "SELECT db.oid,db.* FROM pg_catalog.pg_database db WHERE datname=$1",
    "select oid,nspname from pg_catalog.pg_namespace order by nspname",
    "SELECT n.oid,n.*,d.description FROM pg_catalog.pg_namespace n "
    "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=n.oid AND d.objsubid=0 AND "
    "d.classoid='pg_namespace'::regclass ORDER BY nspname",
    "SELECT c.oid,c.*,d.description FROM pg_catalog.pg_class c LEFT OUTER JOIN "
    "pg_catalog.pg_description d ON d.objoid=c.oid AND d.objsubid=0 AND "
    "d.classoid='pg_class'::regclass WHERE c.relnamespace=$1 AND c.relkind not in ('i','I','c')",
    "SELECT t.oid,t.*,c.relkind FROM pg_catalog.pg_type t LEFT OUTER JOIN pg_catalog.pg_class c "
    "ON c.oid=t.typrelid WHERE typnamespace=$1",
    "select * from pg_catalog.pg_roles",
    "SELECT nspname AS TABLE_SCHEM, NULL AS TABLE_CATALOG FROM pg_catalog.pg_namespace "
    "WHERE nspname <> 'pg_toast' AND (nspname !~ '^pg_temp_' OR nspname = "
    "(pg_catalog.current_schemas(true))[1]) AND (nspname !~ '^pg_toast_temp_' OR nspname = "
    "replace((pg_catalog.current_schemas(true))[1], 'pg_temp_', 'pg_toast_temp_')) "
    "ORDER BY TABLE_SCHEM",
    "SELECT NULL AS TABLE_CAT, n.nspname AS TABLE_SCHEM, c.relname AS TABLE_NAME, "
    "CASE n.nspname ~ '^pg_' OR n.nspname = 'information_schema' WHEN true THEN CASE "
    "WHEN n.nspname = 'pg_catalog' OR n.nspname = 'information_schema' THEN CASE c.relkind "
    "WHEN 'r' THEN 'SYSTEM TABLE' WHEN 'v' THEN 'SYSTEM VIEW' ELSE NULL END ELSE NULL END "
    "ELSE CASE c.relkind WHEN 'r' THEN 'TABLE' WHEN 'p' THEN 'PARTITIONED TABLE' "
    "WHEN 'v' THEN 'VIEW' ELSE NULL END END AS TABLE_TYPE, d.description AS REMARKS "
    "FROM pg_catalog.pg_namespace n, pg_catalog.pg_class c LEFT JOIN "
    "pg_catalog.pg_description d ON (c.oid = d.objoid AND d.objsubid = 0 AND "
    "d.classoid = 'pg_class'::regclass) WHERE c.relnamespace = n.oid AND c.relname LIKE '%' "
    "ORDER BY TABLE_TYPE,TABLE_SCHEM,TABLE_NAME",
    "SELECT a.attname, a.attnum, format_type(a.atttypid, a.atttypmod) FROM "
    "pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON a.attrelid = c.oid "
    "WHERE c.relname = 'adult' AND a.attnum > 0 ORDER BY a.attnum",
    "SELECT table_schema, table_name, column_name, data_type FROM "
    "information_schema.columns WHERE table_name = 'adult' ORDER BY ordinal_position",
    "SELECT has_table_privilege('adult', 'SELECT')",
]


def test_dbeaver_and_metabase_connect_time_catalog_queries(server):
    with psycopg.connect(server.dsn("alice"), autocommit=True) as conn:
        ns = conn.execute("select oid from pg_catalog.pg_namespace where nspname = 'main'"
                          ).fetchone()[0]
        params = {"select * from pg_catalog.pg_settings where name=$1": ("search_path",),
                  "SELECT db.oid,db.* FROM pg_catalog.pg_database db WHERE datname=$1":
                      ("adult",)}
        failures = []
        for sql in CONNECT_QUERIES:
            args = params.get(sql, (ns,) if "$1" in sql else None)
            try:
                if args is None:
                    conn.execute(sql).fetchall() if conn.execute(sql).description else None
                else:
                    conn.cursor().execute(sql.replace("$1", "%s"), args)
            except psycopg.Error as exc:
                failures.append((sql[:60], exc.sqlstate, str(exc)[:200]))
        assert failures == []
        columns = conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'adult' "
            "ORDER BY ordinal_position").fetchall()
        assert [c for (c,) in columns] == ["age", "sex", "race", "income", "hours_per_week"]


POLICY_TOML = """
epsilon = 1.0
delta = 1e-5
[columns.age]
type = "integer"
min = 17
max = 90
[columns.sex]
type = "categorical"
values = ["Female", "Male"]
"""


def test_the_data_owner_protects_and_grants_over_the_wire(tmp_path):
    from dpsql.interfaces.server import accounts

    db = str(tmp_path / "raw.duckdb")
    make_adult_db(db, protect=False).close()
    users = str(tmp_path / "users.toml")
    accounts.add_user(users, "owner", PASSWORDS["owner"], role="admin")
    accounts.add_user(users, "alice", PASSWORDS["alice"], allowances={})
    s = ServerProcess(db, users)
    try:
        with psycopg.connect(s.dsn("alice"), autocommit=True) as alice:
            with pytest.raises(psycopg.Error) as denied:
                alice.execute("CALL dpsql.protect('adult', %s)", (POLICY_TOML,))
            assert denied.value.sqlstate == "42501"
        with psycopg.connect(s.dsn("owner"), autocommit=True) as owner:
            with pytest.raises(psycopg.Error) as early:
                owner.execute("CALL dpsql.allow('alice', 'adult', '0.2', '0')")
            assert early.value.sqlstate == "42P01"              # not protected yet
            owner.execute("CALL dpsql.protect('adult', %s)", (POLICY_TOML,))
            owner.execute("CALL dpsql.allow('alice', 'adult', '0.2', '0')")
            with pytest.raises(psycopg.Error) as bad:
                owner.execute("CALL dpsql.protect('adult', 'epsilon = [')")
            assert bad.value.sqlstate == "42P17"
        with psycopg.connect(s.dsn("alice", epsilon="0.05", delta="0"),
                             autocommit=True) as alice:
            assert alice.execute("SHOW dpsql.budget").fetchone()[:2] == ("adult", 0.2)
            rows = alice.execute("SELECT sex, count(*) FROM adult GROUP BY sex").fetchall()
            assert [r[0] for r in rows] == ["Female", "Male"]
    finally:
        s.stop()

"""Reading result tables back (issue 17 item 6): post-processing of released numbers, free.

A query whose every table is a result table runs on a shadow holding copies of just those
tables (dpsql.store.readback): nothing charged, no ledger row. Anything that mixes one with
the protected table, a table function or an unknown table is refused in one line. The
DB-API, the dpsql:// dialect (pandas) and the shell take the same path.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from dpsql.interfaces import dbapi

from ..conftest import ROOT, snapshot

CREATE = "CREATE TABLE t_sex AS SELECT sex, COUNT(*) FROM adult GROUP BY sex"


@pytest.fixture
def conn(path):
    c = dbapi.connect(path, epsilon=0.1, delta=1e-8)
    c.cursor().execute(CREATE)
    yield c
    if not c.closed:
        c.close()


def test_a_result_table_reads_back_as_released_for_free(conn):
    cur = conn.cursor()
    cur.execute("SELECT * FROM t_sex ORDER BY sex")
    released = {r[0]: r[1] for r in cur.fetchall()}
    before = snapshot(conn.session)
    cur.execute("SELECT * FROM t_sex")
    assert cur.release is None
    assert [d[0] for d in cur.description] == ["sex", "count", "stderr", "ci_low", "ci_high"]
    assert [d[1] for d in cur.description] == ["VARCHAR", "DOUBLE", "DOUBLE", "DOUBLE",
                                               "DOUBLE"]
    assert {r[0]: r[1] for r in cur.fetchall()} == released
    assert snapshot(conn.session) == before           # no ledger row, nothing written
    assert len(conn.session.ledger()) == 1


def test_filters_sorts_and_expressions_on_a_result_table(conn):
    cur = conn.cursor()
    cur.execute("SELECT sex, round(count) AS n FROM T_SEX WHERE sex = ? ORDER BY n DESC",
                ["Male"])
    assert [d[0] for d in cur.description] == ["sex", "n"]
    assert [r[0] for r in cur.fetchall()] == ["Male"]
    cur.execute("WITH s AS (SELECT * FROM main.t_sex) SELECT count(*) FROM s "
                "UNION ALL SELECT max(count) > 0 FROM t_sex")
    assert cur.rowcount == 2
    cur.execute("SELECT * FROM t_sex ORDER BY count DESC LIMIT 1")
    assert cur.fetchone()[0] == "Male"
    assert len(conn.session.ledger()) == 1


@pytest.mark.parametrize("sql, words", [
    ("SELECT * FROM t_sex JOIN adult USING (sex)", "protected table adult"),
    ("SELECT * FROM t_sex WHERE sex IN (SELECT sex FROM adult)", "protected table adult"),
    ("WITH a AS (SELECT * FROM adult) SELECT * FROM t_sex, a", "protected table adult"),
    ("SELECT sex, count FROM t_sex UNION SELECT sex, COUNT(*) FROM adult GROUP BY sex",
     "protected table adult"),
    ("SELECT * FROM t_sex, read_csv('/etc/passwd')", "table function"),
    ("SELECT * FROM t_sex, range(3)", "table function"),
    ("SELECT * FROM t_sex, no_such_table", "neither a result table"),
    ("SELECT * FROM t_sex, dpsql.ledger", "outside the main schema"),
    ("SELECT no_such_column FROM t_sex", "reading result table(s) t_sex"),
])
def test_mixing_a_result_table_with_anything_else_is_refused(conn, sql, words):
    before = snapshot(conn.session)
    with pytest.raises(dbapi.ProgrammingError) as info:
        conn.cursor().execute(sql)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert snapshot(conn.session) == before


def test_a_release_then_a_read_in_one_execute_run_in_order(path):
    with dbapi.connect(path, epsilon=0.1, delta=1e-8) as c:
        cur = c.cursor()
        cur.execute(CREATE + "; SELECT sex FROM t_sex ORDER BY sex")
        assert cur.release is not None and len(c.session.ledger()) == 1
        assert cur.nextset() and cur.fetchall() == [("Female",), ("Male",)]
        with pytest.raises(dbapi.ProgrammingError, match="not a protected table"):
            cur.execute("SELECT * FROM not_a_result_yet")   # unknown alone: as before


def test_pandas_reads_a_result_table_through_the_dialect(path):
    sa = pytest.importorskip("sqlalchemy")
    pd = pytest.importorskip("pandas")
    from sqlalchemy.dialects import registry

    registry.register("dpsql", "dpsql.interfaces.sqlalchemy", "DpsqlDialect")
    engine = sa.create_engine(f"dpsql:///{path}?epsilon=0.1&delta=1e-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with engine.connect() as c:
            pd.read_sql(sa.text(CREATE), c)
        frame = pd.read_sql("SELECT sex, count FROM t_sex ORDER BY sex", engine)
    assert frame["sex"].tolist() == ["Female", "Male"]
    assert frame["count"].dtype.kind == "f"
    with dbapi.connect(path, epsilon=0.1, delta=1e-8) as c:
        assert len(c.session.ledger()) == 1


def test_the_shell_reads_a_result_table(path):
    script = (CREATE + ";\nSELECT sex FROM t_sex ORDER BY sex;\n"
              "SELECT * FROM t_sex UNION SELECT sex, COUNT(*) FROM adult GROUP BY sex;\n")
    done = subprocess.run([sys.executable, "-m", "dpsql", "shell", path, "--epsilon", "0.1",
                           "--delta", "1e-8"], input=script, capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert "Female" in done.stdout.split("t_sex\nsex\n")[-1]
    assert "together with the protected table adult" in done.stderr
    with dbapi.connect(path, epsilon=0.1, delta=1e-8) as c:
        assert len(c.session.ledger()) == 1


def test_a_schema_probe_returns_the_declared_columns_and_no_row(conn):
    """``SELECT * FROM t WHERE 1=0`` / ``LIMIT 0`` (JupySQL's ``%sqlcmd columns``, DBeaver,
    Metabase) returns no row whatever the data: answered from the declared columns, free."""
    cur = conn.cursor()
    before = snapshot(conn.session)
    cur.execute("SELECT * FROM adult WHERE 1=0")
    assert cur.release is None and cur.fetchall() == [] and cur.rowcount == 0
    assert [(d[0], d[1]) for d in cur.description] == [
        ("age", "BIGINT"), ("sex", "VARCHAR"), ("race", "VARCHAR"), ("income", "VARCHAR"),
        ("hours_per_week", "DOUBLE")]
    cur.execute('SELECT "SEX", age FROM adult LIMIT 0')
    assert [d[0] for d in cur.description] == ["sex", "age"] and cur.fetchall() == []
    assert snapshot(conn.session) == before
    for sql in ("SELECT * FROM adult WHERE age > 200", "SELECT undeclared FROM adult LIMIT 0",
                "SELECT * FROM adult LIMIT 1"):
        with pytest.raises(dbapi.Error):           # not a probe: refused as before
            cur.execute(sql)
    assert snapshot(conn.session) == before

"""JupySQL in a real IPython shell (the ``ipython`` program running an ``.ipy`` file):
``%sql`` releases and reads back, ``%sqlcmd tables`` and ``%sqlcmd columns`` list the
protected and result tables, against the embedded ``dpsql://`` dialect and against
``dpsql serve`` (``postgresql+psycopg://``). The column listing's schema probe
(``SELECT * FROM t WHERE 1=0``) is answered from the declared columns and charges nothing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.interfaces.server_support import ServerProcess, make_database

# Looked up, not imported: importing jupysql imports pyspark.sql.connect, whose dependency
# check calls sys.exit(0) in a pytest-xdist worker (its __main__ has no __file__, which
# pyspark takes for a doctest run). The test runs JupySQL in its own IPython process.
for _module in ("sql", "IPython"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is not installed", allow_module_level=True)

SESSION = """%load_ext sql
%sql {url}
r = %sql CREATE TABLE by_sex AS SELECT sex, count(*) FROM adult GROUP BY sex
print("RELEASE", r)
t = %sqlcmd tables
print("TABLES", t)
c = %sqlcmd columns --table adult
print("PROTECTED", c)
c = %sqlcmd columns --table by_sex
print("RESULT", c)
r = %sql SELECT sex, round(count) AS n FROM by_sex ORDER BY n DESC
print("READ", r)
"""


def ipython(tmp_path, url: str) -> str:
    """Run the session in IPython; its standard output (the test fails on any error)."""
    script = tmp_path / "session.ipy"
    script.write_text(SESSION.format(url=url))
    p = subprocess.run([sys.executable, "-m", "IPython", "--no-banner", "--colors=NoColor",
                        str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0 and "Error" not in p.stdout + p.stderr, p.stdout + p.stderr
    return p.stdout


def sections(out: str) -> dict:
    parts, key = {}, None
    for line in out.splitlines():
        word = line.split(" ", 1)[0]
        if word in ("RELEASE", "TABLES", "PROTECTED", "RESULT", "READ"):
            key = word
        if key:
            parts[key] = parts.get(key, "") + line + "\n"
    return parts


def check(out: str) -> None:
    s = sections(out)
    assert "Female" in s["RELEASE"] and "stderr" in s["RELEASE"]
    assert "adult" in s["TABLES"] and "by_sex" in s["TABLES"]
    for column, kind in (("age", "BIGINT"), ("sex", "VARCHAR"),
                         ("hours_per_week", "DOUBLE")):
        assert any(column in ln and kind in ln for ln in s["PROTECTED"].splitlines()), column
    assert all(c in s["RESULT"] for c in ("count", "stderr", "ci_low", "ci_high"))
    rows = [ln for ln in s["READ"].splitlines() if "male" in ln.lower()]
    assert len(rows) == 2 and "Male" in rows[0]          # read back, sorted


def test_jupysql_with_the_embedded_dialect(adult_template, tmp_path):
    import shutil

    import dpsql

    path = str(tmp_path / "adult.duckdb")
    shutil.copyfile(adult_template, path)
    check(ipython(tmp_path, f"dpsql:///{path}?epsilon=0.1&delta=1e-8"))
    with dpsql.connect(path) as db:
        assert len(db.ledger()) == 1            # the release; the probe and reads: free


def test_jupysql_through_the_server(tmp_path):
    db, users = make_database(tmp_path)
    server = ServerProcess(db, users)
    try:
        options = "?options=-c%20dpsql.epsilon%3D0.05%20-c%20dpsql.delta%3D1e-8"
        check(ipython(tmp_path, server.url("alice") + options))
    finally:
        server.stop()
    import dpsql

    with dpsql.connect(db) as session:
        entries = session.ledger()
    assert [e["result_tables"] for e in entries] == [["@alice/by_sex"]]

"""Everything we ship as an example runs: examples/*.py, the reports in sql/*.sql (on one
fresh demo database, built from the shipped data and policy) and the shell and Python
snippets of docs/scripts.md."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import duckdb
import pytest
from sqlglot import exp

from dpsql.interfaces.scripts import parse_script

from ..conftest import ROOT

EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
REPORTS = sorted((ROOT / "sql").glob("*.sql"))  # top level only: not sql/fixtures


def run(args, cwd, **kw):
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, **kw)


def dpsql(*args, cwd=ROOT):
    return run([sys.executable, "-m", "dpsql", *args], cwd)


def test_there_is_something_to_run():
    names = {p.name for p in EXAMPLES} | {p.name for p in REPORTS}
    assert {"quickstart.py", "budget_management.py", "demographics_cube.sql",
            "age_distribution.sql", "ranges_and_predicates.sql"} <= names


def test_the_fork_server_passes_on_what_a_command_did(zygote, tmp_path):
    """The snippets' checks hold through the fork server: a command's exit status, stdout,
    stderr, working directory and arguments are its own (a failing snippet still fails)."""
    env = dict(os.environ, PATH=f"{zygote.bindir}{os.pathsep}{os.environ['PATH']}")
    out = run(["bash", "-e", "-c", "dpsql no-such-command"], tmp_path, env=env)
    assert out.returncode == 64 and "invalid choice" in out.stderr, out
    out = run(["bash", "-c", "dpsql --version"], tmp_path, env=env)
    assert out.returncode == 0 and out.stdout.strip(), out
    out = run(zygote.argv("code", "import os, sys; print(os.getcwd(), sys.argv[1:]); "
                          "sys.exit(3)", "x"), tmp_path)
    assert (out.returncode, out.stdout) == (3, f"{tmp_path} ['x']\n"), out
    out = run(zygote.argv("code", "1 / 0"), tmp_path)
    assert out.returncode == 1 and "ZeroDivisionError" in out.stderr, out


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(example, tmp_path, zygote):
    out = run(zygote.argv("path", example), tmp_path)  # `python example.py`, forked
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory):
    """One fresh demo database (shipped Adult data + shipped policy), as `dpsql demo` makes
    it; the demo's own release is spent too, so the reports must fit next to it."""
    path = tmp_path_factory.mktemp("reports") / "census.duckdb"
    out = dpsql("demo", "--db", path)
    assert out.returncode == 0, out.stderr
    return path


def created_tables(report) -> list[str]:
    script = parse_script(report.read_text(encoding="utf-8"))
    return [st.expr.this.name for w in script.workloads for st in w.statements
            if isinstance(st.expr, exp.Create)]


@pytest.mark.slow   # ~40 s: every sql/ report on a fresh demo database (the suite stays near 12 min)
def test_every_report_runs_on_one_fresh_demo_database(demo_db):
    for report in REPORTS:
        out = dpsql("run", demo_db, report)
        assert out.returncode == 0, f"{report.name}: {out.stderr}"
        assert out.stderr == "" and "released as release" in out.stdout
    con = duckdb.connect(str(demo_db), read_only=True)
    try:
        for report in REPORTS:
            names = created_tables(report)
            assert names, f"{report.name} names no result table"
            for name in names:
                (n,) = con.execute(f'SELECT count(*) FROM "{name}"').fetchone()
                assert n > 0, f"{report.name}: {name} is empty"
    finally:
        con.close()
    # re-running every report returns the recorded answers and charges nothing
    before = dpsql("ledger", demo_db).stdout
    for report in REPORTS:
        out = dpsql("run", demo_db, report, "--quiet")
        assert out.returncode == 0 and out.stderr == "", out.stderr
        assert all("nothing charged" in line for line in out.stdout.splitlines())
    assert dpsql("ledger", demo_db).stdout == before


def _run_doc_blocks(text: str, tmp_path, zygote, before=()) -> None:
    """Run a doc's ```sh / ```python blocks in order in ``tmp_path``, as a reader would: with
    `sql/` and a `dpsql` command available (as in a checkout with dpsql installed)."""
    blocks = re.findall(r"```(sh|python)\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 3
    (tmp_path / "sql").symlink_to(ROOT / "sql")
    env = dict(os.environ, PATH=f"{zygote.bindir}{os.pathsep}{os.environ['PATH']}")
    for lang, code in [("sh", b) for b in before] + blocks:
        args = ["bash", "-e", "-c", code] if lang == "sh" else zygote.argv("code", code)
        out = run(args, tmp_path, env=env)
        assert out.returncode == 0, f"{code}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}"


def test_docs_snippets_run(tmp_path, zygote):
    """The ```sh and ```python blocks of docs/scripts.md, in order, in an empty directory."""
    _run_doc_blocks((ROOT / "docs" / "scripts.md").read_text(encoding="utf-8"), tmp_path,
                    zygote)
    # the refused edit in the walkthrough was really refused, the new edition released
    ledger = run(zygote.argv("module", "dpsql", "ledger", tmp_path / "census.duckdb"),
                 ROOT).stdout
    assert "weekly_seniors" in ledger
    # --csv DIR: one file per result table, one header each; --json: one document
    files = sorted((tmp_path / "weekly").glob("*.csv"))
    assert files and all(f.read_text().startswith("release,") for f in files)
    assert all(f.read_text().count("release,") == 1 for f in files)
    doc = json.loads((tmp_path / "weekly.json").read_text())
    assert doc["workloads"] and all(w["tables"] for w in doc["workloads"])


def test_readme_interface_examples_run(tmp_path, zygote):
    """The blocks of the README's "Three ways in", on the demo database it says to build."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Three ways in", 1)[1].split("\n## ", 1)[0]
    _run_doc_blocks(section, tmp_path, zygote,
                    before=["dpsql demo --db census.duckdb > /dev/null"])
    ledger = run(zygote.argv("module", "dpsql", "ledger", tmp_path / "census.duckdb"),
                 ROOT).stdout
    assert ledger.count("adult") >= 4  # demo, shell, script, two DB-API executes

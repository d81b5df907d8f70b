"""The command line: demo, protect, explain, run, budget, ledger; errors without tracebacks."""

from __future__ import annotations

import subprocess
import sys

import duckdb

from .conftest import ROOT, raw_adult_file

POLICY = """
[tables.adult]
epsilon = 1.0
delta = 1e-5
[tables.adult.columns]
age = { type = "integer", min = 17, max = 90 }
sex = { type = "categorical", values = ["Female", "Male"] }
hours_per_week = { type = "numeric", min = 0, max = 100, edges = [0, 20, 40, 60, 100] }
"""


def dpsql(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "dpsql.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, input=stdin, timeout=300)


def test_demo_runs_from_the_packaged_data(tmp_path):
    out = dpsql("demo", "--db", tmp_path / "demo.duckdb")
    assert out.returncode == 0, out.stderr
    assert "release 1 on adult" in out.stdout
    assert "expected RMSE" in out.stdout and "budget" in out.stdout
    con = duckdb.connect(str(tmp_path / "demo.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM demo_income").fetchone()[0] == 18
    con.close()
    again = dpsql("demo", "--db", tmp_path / "demo.duckdb")
    assert again.returncode == 2 and "already exists" in again.stderr


def test_protect_explain_run_budget_ledger(tmp_path):
    import shutil

    db = tmp_path / "cli.duckdb"
    shutil.copyfile(raw_adult_file(), db)
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    script = tmp_path / "report.sql"
    script.write_text("-- weekly report\nCREATE TABLE by_sex AS SELECT sex, COUNT(*) "
                      "FROM adult GROUP BY sex;\nSELECT COUNT(*) FROM adult WHERE age < 30;\n")

    out = dpsql("protect", db, policy)
    assert out.returncode == 0 and "protected adult" in out.stdout, out.stderr
    out = dpsql("explain", db, script, "--epsilon", 0.5, "--delta", 1e-6)
    assert out.returncode == 0 and "workload" in out.stdout, out.stderr
    out = dpsql("run", db, script, "--epsilon", 0.5, "--delta", 1e-6, "--strategy", "identity")
    assert out.returncode == 0, out.stderr
    assert "by_sex" in out.stdout and "strategy=identity" in out.stdout
    out = dpsql("budget", db)
    assert out.returncode == 0 and "adult" in out.stdout and "0.5" in out.stdout
    out = dpsql("ledger", db)
    assert out.returncode == 0 and "by_sex" in out.stdout
    # over budget: one clear line, exit 2, no traceback, nothing charged
    out = dpsql("run", db, "-", "--epsilon", 0.6, "--delta", 1e-6, stdin="SELECT COUNT(*) FROM adult")
    assert out.returncode == 2
    assert out.stderr.startswith("error: budget exceeded") and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    # a forbidden statement is refused with its position
    out = dpsql("run", db, "-", "--epsilon", 0.1, "--delta", 1e-6,
                stdin="SELECT COUNT(*) FROM adult;\nDROP TABLE adult")
    assert out.returncode == 2 and "DROP" in out.stderr and "line 2" in out.stderr
    out = dpsql("budget", db)
    assert "0.5" in out.stdout


def test_missing_database_is_a_clear_error(tmp_path):
    out = dpsql("budget", tmp_path / "nope.duckdb")
    assert out.returncode == 2 and "does not exist" in out.stderr


def test_shell_subcommand_is_wired(tmp_path):
    out = dpsql("shell", "--help")
    assert out.returncode == 0 and "--epsilon" in out.stdout
    out = dpsql("shell", tmp_path / "missing.duckdb", "-e", "\\budget")
    assert out.returncode == 2 and "does not exist" in out.stderr

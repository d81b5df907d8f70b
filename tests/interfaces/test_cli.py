"""The command line: demo, protect, explain, run, budget, ledger; errors without tracebacks.

The demo runs in a fresh interpreter (``python -m dpsql.interfaces.cli``); every other
command is ``python -m dpsql`` in a process of its own forked from a fork server that has
dpsql imported (tests/interfaces/zygote.py): same argv, streams and exit status, without a
fresh interpreter's seconds of imports per command."""

from __future__ import annotations

import subprocess
import sys

import duckdb
import pytest

from ..conftest import ROOT, raw_adult_file

POLICY = """
[tables.adult]
epsilon = 1.0
delta = 1e-5
[tables.adult.columns]
age = { type = "integer", min = 17, max = 90 }
sex = { type = "categorical", values = ["Female", "Male"] }
hours_per_week = { type = "numeric", min = 0, max = 100, edges = [0, 20, 40, 60, 100] }
"""


def run(argv, stdin=None):
    return subprocess.run([str(a) for a in argv], cwd=ROOT, capture_output=True, text=True,
                          input=stdin, timeout=300)


@pytest.fixture
def dpsql(zygote):
    """``dpsql(*args, stdin=None)``: ``python -m dpsql ARGS``, forked from the fork server."""
    return lambda *args, stdin=None: run(zygote.argv("module", "dpsql", *args), stdin)


def test_demo_runs_from_the_packaged_data(tmp_path, dpsql):
    """A fresh interpreter: the module's own ``__main__`` and every import it needs."""
    out = run([sys.executable, "-m", "dpsql.interfaces.cli", "demo", "--db",
               tmp_path / "demo.duckdb"])
    assert out.returncode == 0, out.stderr
    assert "release 1 on adult" in out.stdout
    assert "expected RMSE" in out.stdout and "budget" in out.stdout
    con = duckdb.connect(str(tmp_path / "demo.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM demo_income").fetchone()[0] == 18
    con.close()
    again = dpsql("demo", "--db", tmp_path / "demo.duckdb")
    assert again.returncode == 65 and "already exists" in again.stderr


def test_protect_explain_run_budget_ledger(tmp_path, dpsql):
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
    # over budget: one clear line, exit 77 (budget exhausted), no traceback, nothing charged
    out = dpsql("run", db, "-", "--epsilon", 0.6, "--delta", 1e-6, stdin="SELECT COUNT(*) FROM adult")
    assert out.returncode == 77
    assert out.stderr.startswith("error: budget exceeded") and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    # a forbidden statement is refused with its position
    out = dpsql("run", db, "-", "--epsilon", 0.1, "--delta", 1e-6,
                stdin="SELECT COUNT(*) FROM adult;\nDROP TABLE adult")
    assert out.returncode == 65 and "DROP" in out.stderr and "line 2" in out.stderr
    out = dpsql("budget", db)
    assert "0.5" in out.stdout


def test_missing_database_is_a_clear_error(tmp_path, dpsql):
    out = dpsql("budget", tmp_path / "nope.duckdb")
    assert out.returncode == 66 and "does not exist" in out.stderr


def test_shell_subcommand_is_wired(tmp_path, dpsql):
    out = dpsql("shell", "--help")
    assert out.returncode == 0 and "--epsilon" in out.stdout
    out = dpsql("shell", tmp_path / "missing.duckdb", "-e", "\\budget")
    assert out.returncode == 66 and "does not exist" in out.stderr


METRIC_POLICY = POLICY + """
[tables.adult.metric]
epsilon = 2
[tables.adult.metric.columns]
age = { weight = 0.1 }
sex = { different = 1 }
"""
AGE_RANGES = ("SELECT COUNT(*) FROM adult WHERE age BETWEEN 17 AND 29;\n"
              "SELECT COUNT(*) FROM adult WHERE age BETWEEN 30 AND 49;\n"
              "SELECT COUNT(*) FROM adult WHERE age >= 50;\n")


def test_pure_dp_strategy_specs_and_the_metric_model(tmp_path, dpsql):
    import shutil

    db = tmp_path / "metric.duckdb"
    shutil.copyfile(raw_adult_file(), db)
    policy = tmp_path / "policy.toml"
    policy.write_text(METRIC_POLICY)
    assert dpsql("protect", db, policy).returncode == 0
    out = dpsql("budget", db)
    assert out.returncode == 0 and "metric_eps_limit" in out.stdout
    # a strategy with options, checked before anything is read; a bad option is refused
    out = dpsql("explain", db, "-", "--epsilon", 0.5, "--delta", 1e-6, "--strategy",
                "eigen(principal_vectors=2)", stdin=AGE_RANGES)
    assert out.returncode == 0 and "eigen(principal_vectors=2)" in out.stdout, out.stderr
    out = dpsql("run", db, "-", "--epsilon", 0.5, "--delta", 1e-6, "--strategy",
                "eigen(principal_vectors=-2)", stdin=AGE_RANGES)
    assert out.returncode == 65 and out.stderr.startswith("error: strategy spec ")
    assert "principal_vectors" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    # pure epsilon-DP (delta 0), then a metric release charged to the metric budget
    out = dpsql("run", db, "-", "--epsilon", 0.25, "--delta", 0, "--quiet", stdin=AGE_RANGES)
    assert out.returncode == 0 and "delta=0" in out.stdout, out.stderr
    out = dpsql("run", db, "-", "--epsilon", 0.5, "--delta", 0, "--model", "metric",
                "--release", "ages", stdin=AGE_RANGES)
    assert out.returncode == 0 and "strategy=dx_laplace" in out.stdout, out.stderr
    out = dpsql("budget", db)
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["table", "eps_spent", "eps_limit", "eps_left", "delta_spent",
                                "delta_limit", "delta_left", "metric_eps_spent",
                                "metric_eps_limit", "metric_eps_left"]
    assert lines[2].split()[1] == "0.25" and lines[2].split()[-3:] == ["0.5", "2", "1.5"]
    out = dpsql("ledger", db)
    assert "laplace" in out.stdout and "dx_laplace" in out.stdout
    out = dpsql("run", db, "-", "--epsilon", 0.5, "--delta", 0, "--model", "sideways",
                stdin=AGE_RANGES)
    assert out.returncode == 65 and "--model" in out.stderr


def test_accuracy_first_options_are_wired(tmp_path, dpsql):
    import shutil

    for command in ("run", "shell"):
        out = dpsql(command, "--help")
        assert out.returncode == 0
        for option in ("--target-rmse", "--max-stderr", "--confirm", "--nonnegative",
                       "--integer", "--no-reuse"):
            assert option in out.stdout, (command, option)
    db = tmp_path / "cli.duckdb"
    shutil.copyfile(raw_adult_file(), db)
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    assert dpsql("protect", db, policy).returncode == 0
    sql = "SELECT sex, COUNT(*) FROM adult GROUP BY sex"
    out = dpsql("explain", db, "-", "--delta", 1e-6, "--target-rmse", 60, stdin=sql)
    assert out.returncode == 0 and "the smallest epsilon for target_rmse = 60" in out.stdout
    out = dpsql("run", db, "-", "--delta", 1e-6, "--target-rmse", 60, stdin=sql)
    assert out.returncode == 65 and out.stderr.startswith("error: workload 1 (line 1) asks "
                                                         "for target_rmse = 60, which needs")
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    out = dpsql("shell", db, "--delta", 1e-6, "--target-rmse", 60, "-e", sql + ";",
                stdin="")
    assert out.returncode == 65 and "no terminal to confirm on" in out.stderr
    assert len(dpsql("ledger", db).stdout.strip().splitlines()) == 2   # header only
    out = dpsql("shell", db, "--delta", 1e-6, "--target-rmse", 60, "--confirm", "-e",
                sql + ";", stdin="")
    assert out.returncode == 0 and "charged epsilon=" in out.stdout, out.stderr


def test_reuse_and_no_reuse_from_the_command_line(tmp_path, dpsql):
    import shutil

    db = tmp_path / "cli.duckdb"
    shutil.copyfile(raw_adult_file(), db)
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    assert dpsql("protect", db, policy).returncode == 0
    sql = "SELECT sex, COUNT(*) FROM adult GROUP BY sex;"
    first = dpsql("run", db, "-", "--epsilon", 0.2, "--delta", 1e-6, "--quiet", stdin=sql)
    assert first.returncode == 0, first.stderr
    # the same query again under another name: answered from release 1, nothing charged
    again = dpsql("run", db, "-", "--epsilon", 0.2, "--delta", 1e-6, "--release", "again",
                  "--quiet", stdin=sql)
    assert again.returncode == 0 and "answered from past releases as release 2" in \
        again.stdout, again.stderr
    fresh = dpsql("run", db, "-", "--epsilon", 0.2, "--delta", 1e-6, "--release", "fresh",
                  "--no-reuse", "--quiet", stdin=sql)
    assert fresh.returncode == 0 and "released as release 3 on adult (epsilon=0.2" in \
        fresh.stdout, fresh.stderr
    shell = dpsql("shell", db, "--epsilon", 0.1, "--delta", 1e-6, "--no-reuse", "-e", sql,
                  "-e", "\\set reuse", stdin="")
    assert shell.returncode == 0 and "charged epsilon=0.1 " in shell.stdout, shell.stderr
    assert "reuse = off" in shell.stdout
    entries = dpsql("ledger", db).stdout.strip().splitlines()[2:]
    assert [line.split()[5] for line in entries] == ["0.2", "0", "0.2", "0.1"]

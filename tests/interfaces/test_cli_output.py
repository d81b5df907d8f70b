"""The command line's outputs and paths (issue 18 items 4 and 5): ``--csv DIR`` (one file per
result table), ``--json`` (one document for jobs), ``--version``; ``dpsql.connect`` and the
DB-API refuse a database path that does not exist unless ``create=True``; the demo leaves no
temporary directory behind and suggests only commands that exist (each is run here)."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import subprocess
import sys
from datetime import datetime
from fractions import Fraction

import pytest

import dpsql
from dpsql import dbapi
from dpsql.errors import InputFileError
from dpsql.interfaces import cli

from ..conftest import ROOT, make_adult_db
from .zygote import Zygote

SCRIPT = """SET dpsql.release = 'out';
CREATE TABLE by_sex AS SELECT sex, COUNT(*) AS people FROM adult GROUP BY sex;
CREATE TABLE young AS SELECT COUNT(*) FROM adult WHERE age < 30;
SET dpsql.epsilon = 0.2;
CREATE TABLE by_race AS SELECT race, income, COUNT(*) FROM adult GROUP BY CUBE(race, income);
"""
EPS = ("--epsilon", "0.1", "--delta", "1e-6")


@pytest.fixture
def files(tmp_path):
    db = str(tmp_path / "adult.duckdb")
    make_adult_db(db, epsilon=10.0, delta=1e-3).close()
    script = tmp_path / "report.sql"
    script.write_text(SCRIPT, encoding="utf-8")
    return {"db": db, "script": str(script), "tmp": tmp_path}


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def ledger(path):
    with dpsql.connect(path) as db:
        return db.ledger()


# --------------------------------------------------------------------------- --csv DIR

def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_csv_dir_writes_one_file_per_result_table(files, capsys):
    out_dir = files["tmp"] / "out"
    code, out, err = run(capsys, "explain", files["db"], files["script"], *EPS, "--csv",
                         out_dir)
    assert code == 0 and err == "", err
    plan = read_csv(out_dir / "plan.csv")
    assert plan[0][:4] == ["workload", "lines", "release", "status"] and len(plan) == 3
    assert [r[2] for r in plan[1:]] == ["out/1", "out/2"] and ledger(files["db"]) == []
    code, out, err = run(capsys, "run", files["db"], files["script"], *EPS, "--csv", out_dir)
    assert code == 0 and err == "", err
    assert len(out.strip().splitlines()) == 2 and "released as release 1" in out  # --quiet
    assert sorted(os.listdir(out_dir)) == ["by_race.csv", "by_sex.csv", "plan.csv",
                                           "young.csv"]
    with dpsql.connect(files["db"]) as db, db.db.connect() as con:
        for name in ("by_sex", "young", "by_race"):
            rows = read_csv(out_dir / f"{name}.csv")
            columns = [c[0] for c in con.execute(f"DESCRIBE {name}").fetchall()]
            assert rows[0] == ["release"] + columns            # one header, nothing else
            assert sum(r == rows[0] for r in rows) == 1
            stored = con.execute(f"SELECT count(*) FROM {name}").fetchone()[0]
            assert len(rows) - 1 == stored and all(len(r) == len(rows[0]) for r in rows)
        assert {r[0] for r in read_csv(out_dir / "by_race.csv")[1:]} == {"out/2"}
    # the path of a file is refused before anything is read or spent
    before = ledger(files["db"])
    again = files["tmp"] / "again.sql"
    again.write_text(SCRIPT.replace("'out'", "'again'"), encoding="utf-8")
    code, out, err = run(capsys, "run", files["db"], again, *EPS, "--csv", out_dir / "young.csv")
    assert code == 64 and out == "" and err.startswith("error: --csv ") and "is a file" in err
    assert len(err.splitlines()) == 1 and ledger(files["db"]) == before


def test_csv_on_stdout_keeps_one_block_per_table(files, capsys):
    code, out, err = run(capsys, "run", files["db"], files["script"], *EPS, "--csv")
    assert code == 0 and err == ""
    blocks = [b.splitlines() for b in out.strip().split("\n\n")]
    assert len(blocks) == 3
    assert all(b[0].startswith("release,table,") for b in blocks)


# --------------------------------------------------------------------------- --json

def test_json_is_one_document_with_answers_errors_and_budget(files, capsys):
    code, out, err = run(capsys, "explain", files["db"], files["script"], *EPS, "--json")
    assert code == 0 and err == ""
    plan = json.loads(out)
    assert plan["dry_run"] is True and [w["status"] for w in plan["workloads"]] == ["new"] * 2
    assert plan["would_charge"]["adult"]["epsilon"]["exact"] == "3/10"
    code, out, err = run(capsys, "run", files["db"], files["script"], *EPS, "--json")
    assert code == 0 and err == "", err
    doc = json.loads(out)                                  # the whole of stdout
    assert doc["dpsql"] == dpsql.__version__ and doc["dry_run"] is False
    entries = ledger(files["db"])
    assert [(w["release_id"], w["epsilon"], w["status"]) for w in doc["workloads"]] == [
        (e["release_id"], e["epsilon"], "released") for e in entries]
    tables = {t["name"]: t for w in doc["workloads"] for t in w["tables"]}
    assert set(tables) == {"by_sex", "young", "by_race"}
    for t in tables.values():
        for row in t["rows"]:
            assert row["stderr"] > 0 and row["ci_low"] < row["ci_high"]
    assert tables["by_sex"]["columns"][:2] == ["sex", "people"]
    budget = doc["budget"]["adult"]
    assert Fraction(budget["epsilon_spent"]["exact"]) == Fraction(3, 10)
    assert budget["epsilon_remaining"]["value"] == pytest.approx(9.7)
    # recorded answers again: nothing charged, said so per workload
    code, out, err = run(capsys, "run", files["db"], files["script"], *EPS, "--json")
    assert [w["status"] for w in json.loads(out)["workloads"]] == ["recorded"] * 2
    assert [w["epsilon"] for w in json.loads(out)["workloads"]] == [0.0, 0.0]


def test_json_excludes_the_other_outputs(files, capsys):
    code, out, err = run(capsys, "run", files["db"], files["script"], *EPS, "--json", "--csv")
    assert code == 64 and "not allowed with argument" in err and ledger(files["db"]) == []


def test_budget_and_ledger_json_for_jobs(files, capsys):
    """``dpsql budget --json`` / ``ledger --json``: the whole of stdout is one document;
    budgets and charges exact (``{"value": float, "exact": "num/den"}``), as ``run --json``
    gives the budget."""
    code, out, err = run(capsys, "ledger", files["db"], "--json")
    assert code == 0 and err == "" and json.loads(out) == {"dpsql": dpsql.__version__,
                                                           "ledger": []}
    code, out, err = run(capsys, "budget", files["db"], "--json")
    assert code == 0 and err == ""
    doc = json.loads(out)
    assert set(doc) == {"dpsql", "budget"} and doc["dpsql"] == dpsql.__version__
    assert doc["budget"]["adult"]["epsilon_limit"] == {"value": 10.0, "exact": "10/1"}
    assert doc["budget"]["adult"]["epsilon_spent"] == {"value": 0.0, "exact": "0/1"}
    # epsilon 1/3, which no float is: exact in the budget and in the ledger
    code, out, err = run(capsys, "run", files["db"], files["script"], "--epsilon", "1/3",
                         "--delta", "1e-6", "--json")
    assert code == 0 and err == "", err
    after_run = json.loads(out)["budget"]
    code, out, err = run(capsys, "budget", files["db"], "--json")
    budget = json.loads(out)["budget"]
    assert code == 0 and err == "" and budget == after_run          # one form of a budget
    spent = budget["adult"]["epsilon_spent"]
    assert Fraction(spent["exact"]) == Fraction(1, 3) + Fraction(1, 5)      # SET 0.2 later
    assert spent["value"] == float(Fraction(8, 15))
    code, out, err = run(capsys, "ledger", files["db"], "--json")
    assert code == 0 and err == ""
    entries = json.loads(out)["ledger"]
    stored = ledger(files["db"])
    assert [e["release_id"] for e in entries] == [e["release_id"] for e in stored] == [1, 2]
    assert [e["release_name"] for e in entries] == ["out/1", "out/2"]
    assert [e["epsilon"]["exact"] for e in entries] == ["1/3", "1/5"]
    assert [e["epsilon"]["value"] for e in entries] == [1 / 3, 0.2]
    first = entries[0]
    assert first["table_name"] == "adult" and first["metric_epsilon"] is None
    assert Fraction(first["delta"]["exact"]) == stored[0]["delta"]
    assert datetime.fromisoformat(first["created_at"]) == stored[0]["created_at"]
    assert first["request"]["epsilon"] == "1/3" and first["result_tables"] == ["by_sex",
                                                                               "young"]
    assert "epsilon_exact" not in first and first["status"] == "released"
    # the text forms are unchanged, and name the same releases
    code, out, err = run(capsys, "ledger", files["db"])
    assert code == 0 and out.splitlines()[0].split()[:2] == ["release_id", "release_name"]
    assert "out/1" in out and "out/2" in out


# --------------------------------------------------------------------------- --version

def test_version(capsys):
    code, out, err = run(capsys, "--version")
    assert code == 0 and err == "" and out.startswith(f"dpsql {dpsql.__version__} (duckdb ")
    assert "--version" in cli.build_parser().format_help()
    p = subprocess.run([sys.executable, "-m", "dpsql", "--version"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and p.stdout == out and p.stderr == ""


# --------------------------------------------------------------------------- paths (item 4)

def test_connect_refuses_a_missing_database_unless_create(tmp_path):
    missing = tmp_path / "typo.duckdb"
    for attempt in (lambda: dpsql.connect(str(missing)), lambda: dpsql.connect(missing),
                    lambda: dbapi.connect(str(missing), epsilon=0.1, delta=1e-6)):
        with pytest.raises((InputFileError, dbapi.OperationalError)) as info:
            attempt()
        message = str(info.value)
        assert "does not exist" in message and "create=True" in message
        assert "\n" not in message and not missing.exists()       # nothing created
    with pytest.raises(InputFileError, match="is a directory"):
        dpsql.connect(str(tmp_path))
    with pytest.raises(dbapi.OperationalError, match="is a directory"):
        dbapi.connect(str(tmp_path), epsilon=0.1, delta=1e-6, create=True)
    with pytest.raises(dpsql.DpsqlError, match="create must be true or false"):
        dpsql.connect(str(missing), create="yes")
    with dpsql.connect(str(missing), create=True) as db:
        assert db.policies() == {}
    with dpsql.connect(":memory:") as db, dpsql.connect() as db2:
        assert db.policies() == db2.policies() == {}
    with dbapi.connect(str(tmp_path / "fresh.duckdb"), epsilon=0.1, delta=1e-6,
                       create=True) as conn:
        assert conn.session.policies() == {}


def test_policy_files_through_python(tmp_path):
    path = str(tmp_path / "adult.duckdb")
    make_adult_db(path, protect=False).close()
    good = "[tables.adult]\nepsilon = 1\ndelta = 0\n[tables.adult.columns]\n" \
           "sex = { type = \"categorical\", values = [\"Female\", \"Male\"] }\n"
    (tmp_path / "latin1.toml").write_bytes(good.replace("Female", "F\xe9male").encode("latin-1"))
    (tmp_path / "bom.toml").write_bytes(b"\xef\xbb\xbf" + good.encode())
    with dpsql.connect(path) as db:
        for name, words in [("missing.toml", "does not exist"), ("", "is a directory"),
                            ("latin1.toml", "not UTF-8")]:
            with pytest.raises(InputFileError, match=words):
                db.protect("adult", str(tmp_path / name))
        assert db.policies() == {}
        db.protect("adult", str(tmp_path / "bom.toml"))            # a BOM is accepted
        assert set(db.policies()) == {"adult"}


# --------------------------------------------------------------------------- the demo

def dpsql_command(line: str, zygote) -> list[str]:
    """A suggested step's command line, run as a process forked from the fork server (which
    has dpsql imported): ``dpsql ARGS`` as ``python -m dpsql ARGS``, ``python -c CODE``."""
    argv = shlex.split(line.split("  #")[0])
    if argv[0] == "dpsql":
        return zygote.argv("module", "dpsql", *argv[1:])
    assert argv[0] == sys.executable and argv[1] == "-c", line   # no `duckdb` program
    return zygote.argv("code", *argv[2:])


def test_demo_cleans_up_and_suggests_commands_that_exist(tmp_path):
    """Both demos are real ``python -m dpsql`` processes (the temporary directory is the
    one TMPDIR names); the suggested steps go through a fork server."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(os.environ, TMPDIR=str(tmpdir))
    p = subprocess.run([sys.executable, "-m", "dpsql", "demo"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert "release 1 on adult" in p.stdout and "has been removed" in p.stdout
    assert os.listdir(tmpdir) == []                       # no temporary directory left
    assert not re.search(r"^\s*duckdb ", p.stdout, re.M)
    # with --db the database is kept, and every suggested command runs
    path = str(tmp_path / "census.duckdb")
    p = subprocess.run([sys.executable, "-m", "dpsql", "demo", "--db", path], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0 and os.path.exists(path), p.stderr
    steps = p.stdout.split("Next:\n", 1)[1].strip().splitlines()
    assert any(s.strip().startswith("dpsql shell ") for s in steps)
    assert os.listdir(tmpdir) == []
    with Zygote(tmp_path / "zygote") as zygote:
        for step in steps:
            q = subprocess.run(dpsql_command(step.strip(), zygote), cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=900,
                               stdin=subprocess.DEVNULL)
            assert q.returncode == 0 and "Traceback" not in q.stdout + q.stderr, (step,
                                                                                 q.stderr)
    assert "18 rows" in q.stdout        # the last step printed the demo_income result table

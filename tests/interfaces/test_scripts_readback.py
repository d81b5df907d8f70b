"""Reporting scripts read result tables back: ``SELECT * FROM <result table> ...`` in a
script is post-processing of released numbers (free, no ledger row), as in the DB-API."""

from __future__ import annotations

import json

import pytest

import dpsql
from dpsql.errors import WorkloadBlockError
from dpsql.interfaces import scripts

from ..conftest import make_adult_db, snapshot
from .test_scripts import run_cli, write  # one copy of the script-running helpers

REPORT = """SET dpsql.epsilon = 0.1; SET dpsql.delta = 1e-6;
CREATE TABLE by_race AS SELECT race, count(*) FROM adult GROUP BY race;
SELECT race, count FROM by_race ORDER BY count DESC LIMIT 2;   -- read: free
SELECT count(*) FROM adult WHERE age > 50;
"""


@pytest.fixture
def db_path(tmp_path):
    path = str(tmp_path / "adult.duckdb")
    make_adult_db(path, epsilon=1.0, delta=1e-5).close()
    return path


def test_a_read_splits_the_workloads_and_costs_nothing(db_path, tmp_path, capsys):
    path = write(tmp_path, REPORT)
    code, out, err = run_cli(capsys, "run", db_path, path, "--dry-run")
    assert (code, err) == (0, "")
    assert "read 1 (line 3): reads result tables back after workload 1: free" in out
    code, out, err = run_cli(capsys, "run", db_path, path, "--json")
    assert (code, err) == (0, ""), err
    doc = json.loads(out)
    assert [w["workload"] for w in doc["workloads"]] == [1, 2]
    (read,) = doc["reads"]
    assert (read["read"], read["after_workload"], read["columns"]) == (1, 1, ["race", "count"])
    released = {r["race"]: r["count"] for r in doc["workloads"][0]["tables"][0]["rows"]}
    top = sorted(released.items(), key=lambda kv: -kv[1])[:2]
    assert [(r["race"], r["count"]) for r in read["rows"]] == top
    with dpsql.connect(db_path) as db:
        assert len(db.ledger()) == 2                          # the read: no ledger row
        assert db.budget("adult")["epsilon_spent"] == pytest.approx(0.2)
        before = snapshot(db)
    code, out, err = run_cli(capsys, "run", db_path, path)        # again: recorded, read
    assert code == 0 and "read 1 (line 3): result tables read back, free" in out
    assert out.count("White") == 2
    with dpsql.connect(db_path) as db:
        assert snapshot(db) == before


def test_reads_are_checked_before_anything_is_spent(db_path, tmp_path, capsys):
    assert run_cli(capsys, "run", db_path, write(tmp_path, REPORT))[0] == 0
    with dpsql.connect(db_path) as db:
        before = snapshot(db)
    bad = ("SET dpsql.epsilon = 0.1; SET dpsql.delta = 0;\n"
           "SELECT count(*) FROM adult WHERE age > 20;\n"
           "SELECT no_such_column FROM by_race;\n")
    code, out, err = run_cli(capsys, "run", db_path, write(tmp_path, bad, "bad.sql"))
    assert code == 65 and err.count("\n") == 1 and "read 1 (line 3)" in err, err
    assert "no_such_column" in err and "Traceback" not in err
    with dpsql.connect(db_path) as db:
        assert snapshot(db) == before                         # nothing charged
    # a script of reads alone needs no privacy setting at all
    code, out, err = run_cli(capsys, "run", db_path,
                             write(tmp_path, "SELECT count(*) AS n FROM by_race;", "r.sql"),
                             "--csv")
    assert (code, err) == (0, "") and out.splitlines() == ["n", "5"]
    with dpsql.connect(db_path) as db:
        assert snapshot(db) == before


def test_a_read_inside_a_workload_block_is_refused(db_path):
    with dpsql.connect(db_path) as db:
        db.answer("CREATE TABLE by_sex AS SELECT sex, count(*) FROM adult GROUP BY sex",
                  epsilon=0.1, delta=0)
        text = ("SET dpsql.epsilon = 0.1; SET dpsql.delta = 0;\nBEGIN WORKLOAD;\n"
                "SELECT count(*) FROM adult;\nSELECT * FROM by_sex;\nCOMMIT;")
        with pytest.raises(WorkloadBlockError, match="after COMMIT") as info:
            scripts.parse_script(text, db.table_names())
        assert info.value.line == 4
        # without the database's tables the same text is one workload (parse is pure)
        assert len(scripts.parse_script(text).workloads) == 1


def test_run_script_hands_each_read_to_its_callback(db_path):
    with dpsql.connect(db_path) as db:
        script = scripts.parse_script(REPORT, db.table_names())
        assert [(r.number, r.after) for r in script.reads] == [(1, 1)]
        seen = []
        outcomes = scripts.run_script(db, scripts.check_script(db, script),
                                      on_read=lambda r, t: seen.append((r.number, t)))
        assert len(outcomes) == 2 and len(seen) == 1
        (number, table), = seen
        assert table.columns == ("race", "count") and len(table.rows) == 2

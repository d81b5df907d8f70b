"""Reporting scripts: accuracy-first workloads, the consistency flags and reuse."""

from __future__ import annotations

import json
from fractions import Fraction

import duckdb
import pytest

import dpsql
from dpsql.interfaces import scripts
from dpsql.errors import DpsqlError

from .conftest import make_adult_db
from .test_scripts import run_cli, write


@pytest.fixture
def db_path(tmp_path):
    path = str(tmp_path / "adult.duckdb")
    make_adult_db(path, epsilon=1.0, delta=1e-5).close()
    return path


ACCURACY = """SET dpsql.release = 'acc';
SET dpsql.delta = 1e-6;
SET dpsql.target_rmse = 60;
SELECT sex, COUNT(*) FROM adult GROUP BY sex;
SET dpsql.max_stderr = 40;
SET dpsql.nonnegative = true;
SET dpsql.integer = TRUE;
SELECT race, COUNT(*) FROM adult GROUP BY race;
"""
SEX = "SELECT sex, COUNT(*) FROM adult GROUP BY sex"
RACE = "SELECT race, COUNT(*) FROM adult GROUP BY race"


def test_accuracy_targets_confirm_and_flags_parse():
    s = scripts.parse_script(ACCURACY + "SET dpsql.epsilon = 0.2;\nSELECT COUNT(*) FROM adult")
    w1, w2, w3 = s.workloads
    assert (w1.epsilon, w1.target, w1.confirm, w1.nonnegative) == (
        None, ("target_rmse", 60.0), False, False)
    assert w1.params() == {"target_rmse": 60.0, "delta": Fraction(1, 10**6),
                           "strategy": "auto", "calibration": "analytic", "model": "dp",
                           "reuse": True}
    # a later target replaces the earlier one; the flags carry over like every setting
    assert (w2.target, w2.target_rmse, w2.nonnegative, w2.integer) == (
        ("max_stderr", 40.0), None, True, True)
    assert w2.answer_params() == dict(w2.params(), confirm=False, nonnegative=True,
                                      integer=True)
    # epsilon replaces the target of the workloads before it
    assert (w3.epsilon, w3.target, w3.integer) == (Fraction(1, 5), None, True)
    assert w3.params()["epsilon"] == Fraction(1, 5) and "max_stderr" not in w3.params()
    # caller defaults (the command line's --target-rmse, --confirm, ...), overridden by SET
    s = scripts.parse_script("SELECT COUNT(*) FROM adult;\nSET dpsql.epsilon = 0.1;\n"
                             "SELECT COUNT(*) FROM adult", delta=1e-6, target_rmse=50,
                             confirm=True, integer=True)
    assert [(w.epsilon, w.target, w.confirm, w.integer) for w in s.workloads] == [
        (None, ("target_rmse", 50.0), True, True), (Fraction(1, 10), None, True, True)]
    for bad, message in [(dict(epsilon=0.1, target_rmse=50), "epsilon and target_rmse are "
                          "both given as defaults"),
                         (dict(target_rmse=-1), "target_rmse must be a positive number"),
                         (dict(max_stderr="ten"), "max_stderr must be a number"),
                         (dict(epsilon=0.1, confirm="yes"), "confirm must be true or false")]:
        with pytest.raises(DpsqlError, match=message):
            scripts.parse_script("SELECT COUNT(*) FROM adult", delta=1e-6, **bad)


# --------------------------------------------------------------------------- accuracy first


def ledger_and_budget(path):
    with dpsql.connect(path) as db:
        return db.ledger(), db.budget("adult")


def test_accuracy_first_workloads_spend_only_when_confirmed(db_path, tmp_path, capsys):
    with dpsql.connect(db_path) as db:
        e1 = db.explain(SEX, delta=1e-6, target_rmse=60)
        e2 = db.explain(RACE, delta=1e-6, max_stderr=40)
    before = ledger_and_budget(db_path)
    script = write(tmp_path, ACCURACY)
    # the dry run shows the epsilon each target needs, and that a run needs confirmation
    code, out, err = run_cli(capsys, "run", db_path, script, "--dry-run", "--quiet")
    assert code == 0 and err == "", err
    assert (f"would charge epsilon={e1.epsilon:g}, delta=" in out
            and "(the smallest epsilon for target_rmse = 60; a run needs SET dpsql.confirm = "
            "true)" in out)
    assert f"would charge epsilon={e2.epsilon:g}, delta=" in out and "max_stderr = 40" in out
    # without SET dpsql.confirm = true: refused before anything is spent, naming the cost
    code, out, err = run_cli(capsys, "run", db_path, script)
    assert code == 65 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: workload 1 (line 4) asks for target_rmse = 60, which "
                          f"needs epsilon = {e1.epsilon:g} (delta = ")
    assert f"strategy {e1.strategy})" in err
    assert f"workload 2 (line 8) asks for max_stderr = 40, which needs epsilon = " \
           f"{e2.epsilon:g}" in err
    assert "put SET dpsql.confirm = true; before its queries" in err
    assert "nothing was charged" in err
    assert ledger_and_budget(db_path) == before
    # confirmed: each workload spends the epsilon found, with its consistency flags
    confirmed = write(tmp_path, ACCURACY.replace("SET dpsql.delta", "SET dpsql.confirm = true;"
                                                 "\nSET dpsql.delta"), "confirmed.sql")
    code, out, err = run_cli(capsys, "run", db_path, confirmed, "--quiet")
    assert code == 0 and err == "", err
    entries, budget = ledger_and_budget(db_path)
    assert [e["epsilon"] for e in entries] == [e1.epsilon, e2.epsilon]
    assert [e["release_name"] for e in entries] == ["acc/1", "acc/2"]
    assert budget["epsilon_spent"] == Fraction(repr(e1.epsilon)) + Fraction(repr(e2.epsilon))
    assert json.loads(entries[1]["request"])["nonnegative"] is True
    con = duckdb.connect(db_path, read_only=True)
    counts = [r[0] for r in con.execute(
        f"SELECT count FROM {entries[1]['result_tables'][0]}").fetchall()]
    con.close()
    assert len(counts) == 5 and all(c >= 0 and c == int(c) for c in counts)
    # re-running the named release returns the recorded answers: nothing charged
    code, out, err = run_cli(capsys, "run", db_path, confirmed, "--quiet")
    assert code == 0 and out.count("nothing charged") == 2, err
    assert ledger_and_budget(db_path) == (entries, budget)
    # the same name with a target the recorded release does not meet is refused
    for old, new, message in [("max_stderr = 40", "max_stderr = 10",
                               "does not meet max_stderr = 10"),
                              ("target_rmse = 60", "target_rmse = 20",
                               "does not meet target_rmse = 20")]:
        stricter = write(tmp_path, ACCURACY.replace(old, new), "stricter.sql")
        code, out, err = run_cli(capsys, "run", db_path, stricter, "--confirm")
        assert code == 65 and message in err and "nothing was charged" in err, err
    assert ledger_and_budget(db_path) == (entries, budget)


def test_accuracy_first_from_the_command_line(db_path, tmp_path, capsys):
    script = write(tmp_path, SEX + ";\n")
    with dpsql.connect(db_path) as db:
        e = db.explain(SEX, delta=1e-6, target_rmse=60)
    before = ledger_and_budget(db_path)
    code, out, err = run_cli(capsys, "run", db_path, script, "--delta", "1e-6",
                             "--target-rmse", "60", "--epsilon", "0.1")
    assert code == 65 and "epsilon and target_rmse are both given" in err
    code, out, err = run_cli(capsys, "run", db_path, script, "--delta", "1e-6",
                             "--target-rmse", "-5")
    assert code == 65 and "--target-rmse must be a positive number" in err
    code, out, err = run_cli(capsys, "run", db_path, script, "--delta", "1e-6",
                             "--target-rmse", "60")
    assert code == 65 and f"needs epsilon = {e.epsilon:g}" in err and "--confirm" in err
    # an accuracy target needs the matrix mechanism: refused with its reason
    code, out, err = run_cli(capsys, "run", db_path, script, "--delta", "0",
                             "--target-rmse", "60", "--strategy", "mwem", "--confirm")
    assert code == 65 and "accuracy targets apply to the matrix mechanism" in err
    assert ledger_and_budget(db_path) == before
    code, out, err = run_cli(capsys, "run", db_path, script, "--delta", "1e-6",
                             "--target-rmse", "60", "--confirm", "--integer", "--quiet")
    assert code == 0 and f"epsilon={e.epsilon:g}" in out, err
    (entry,) = ledger_and_budget(db_path)[0]
    assert entry["epsilon"] == e.epsilon and json.loads(entry["request"])["integer"] is True


# --------------------------------------------------------------------------- reuse


def test_reuse_parses_as_a_flag_and_reaches_explain_and_answer():
    s = scripts.parse_script(f"{SEX};\nSET dpsql.reuse = false;\n{RACE};\n"
                             f"SET dpsql.reuse = TRUE;\n{SEX}", epsilon=0.1, delta=1e-6)
    assert [w.reuse for w in s.workloads] == [True, False, True]      # on by default
    w2 = s.workloads[1]
    assert w2.params()["reuse"] is False and w2.answer_params()["reuse"] is False
    # the caller's default (dpsql run --no-reuse), overridden by SET
    s = scripts.parse_script(f"{SEX};\nSET dpsql.reuse = true;\n{RACE}", epsilon=0.1,
                             delta=1e-6, reuse=False)
    assert [w.reuse for w in s.workloads] == [False, True]
    for bad in ("no", 0, "off"):
        with pytest.raises(DpsqlError, match="reuse must be true or false"):
            scripts.parse_script(SEX, epsilon=0.1, delta=1e-6, reuse=bad)


def test_a_workload_past_releases_answer_is_free_and_not_counted(db_path, tmp_path, capsys):
    first = write(tmp_path, f"SET dpsql.epsilon = 0.9;\n{SEX};\n", "first.sql")
    code, out, err = run_cli(capsys, "run", db_path, first, "--delta", "1e-6", "--quiet")
    assert code == 0, err
    before = ledger_and_budget(db_path)
    # the same query at 0.5 (less accurate than 0.9): answered from release 1. Only 0.1 is
    # left, so counting it would refuse the script
    again = write(tmp_path, f"SET dpsql.release = 'again';\nSET dpsql.epsilon = 0.5;\n{SEX};"
                  "\n", "again.sql")
    code, out, err = run_cli(capsys, "run", db_path, again, "--delta", "1e-6", "--dry-run")
    assert code == 0 and err == "", err
    assert "workload 1/1 (line 3) 'again/1': past releases answer it; nothing would be " \
           "charged" in out
    assert "every answer comes from past releases" in out
    assert "a run would charge nothing" in out
    code, out, err = run_cli(capsys, "run", db_path, again, "--delta", "1e-6", "--csv",
                             "--dry-run")
    assert code == 0 and out.splitlines()[1].split(",")[3] == "free", err
    code, out, err = run_cli(capsys, "run", db_path, again, "--delta", "1e-6", "--quiet")
    assert code == 0 and err == "", err
    assert ("answered from past releases as release 2 on adult, nothing charged; tables: "
            in out)
    entries, budget = ledger_and_budget(db_path)
    assert budget == before[1] and len(entries) == 2
    assert (entries[1]["mechanism"], entries[1]["epsilon"], entries[1]["reused_from"]) == (
        "reuse", 0.0, str(entries[0]["release_id"]))
    # reuse off (--no-reuse, or SET dpsql.reuse = false): measured afresh, so the budget
    # check counts it and refuses the script before anything is spent
    fresh = write(tmp_path, f"SET dpsql.release = 'fresh';\nSET dpsql.epsilon = 0.5;\n{SEX};"
                  "\n", "fresh.sql")
    code, out, err = run_cli(capsys, "run", db_path, fresh, "--delta", "1e-6", "--no-reuse")
    assert code == 77 and "budget exceeded" in err and out == "", err
    code, out, err = run_cli(capsys, "explain", db_path, fresh, "--delta", "1e-6",
                             "--no-reuse", "--quiet")
    assert code == 77 and "would charge epsilon=0.5" in out, err
    off = write(tmp_path, "SET dpsql.reuse = false;\n" + fresh.read_text(), "off.sql")
    code, out, err = run_cli(capsys, "run", db_path, off, "--delta", "1e-6")
    assert code == 77 and "budget exceeded" in err, err
    assert ledger_and_budget(db_path) == (entries, budget)

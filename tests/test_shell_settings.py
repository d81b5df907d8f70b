"""The shell's accuracy-first, consistency and reuse settings, through its Executor (batch
mode, scripted answers to its questions) and as batch subprocesses."""

from __future__ import annotations

import csv
import io
import json
from fractions import Fraction

import pytest

import dpsql
from dpsql.interfaces.shell.executor import Executor, NoTerminal
from dpsql.interfaces.shell.repl import toolbar_text
from dpsql.interfaces.shell.settings import ShellState

from .conftest import make_adult_db
from .test_shell import GROUP_SEX, batch, complete, ledger


@pytest.fixture
def db(tmp_path):
    path = str(tmp_path / "adult.duckdb")
    make_adult_db(path, epsilon=1.0, delta=1e-5).close()
    return path


@pytest.fixture
def policies(db):
    with dpsql.connect(db) as s:
        return s.policies()

RACE = "SELECT race, COUNT(*) FROM adult GROUP BY race;"


def run_executor(path, *submissions, replies=(), **settings):
    """Submissions through the shell's Executor (batch mode) with scripted answers to its
    questions: (reasons asked, stdout, stderr, executor). No answer left: no terminal."""
    replies, reasons = list(replies), []

    def confirm(reason):
        reasons.append(reason)
        if not replies:
            raise NoTerminal(f"{reason}; there is no terminal to confirm on, so nothing "
                             "was spent")
        return replies.pop(0)

    out, err = io.StringIO(), io.StringIO()
    with dpsql.connect(path) as session:
        state = ShellState(session, interactive=False, **settings)
        state.refresh()
        ex = Executor(state, out, err, confirm)
        for text in submissions:
            ex.submit(text)
    return reasons, out.getvalue(), err.getvalue(), ex


def spent(path):
    with dpsql.connect(path) as s:
        return s.ledger(), s.budget("adult")


def test_accuracy_target_shows_the_cost_and_asks_before_spending(db):
    with dpsql.connect(db) as s:
        e = s.explain(GROUP_SEX, delta=1e-6, target_rmse=60)
        before = s.ledger(), s.budget("adult")
    reasons, out, err, ex = run_executor(db, GROUP_SEX, replies=[False],
                                         target_rmse=Fraction(60), delta=Fraction(1, 10**6))
    (reason,) = reasons
    assert reason.startswith(f"target_rmse 60 needs epsilon={e.epsilon:g} delta=")
    assert f"(strategy {e.strategy}, " in reason and f"expected RMSE {e.rmse:.4g}" in reason
    assert "% of the 1 remaining on table 'adult'" in reason
    assert "not answered; nothing was spent" in out and not ex.failed
    assert spent(db) == before
    reasons, out, err, ex = run_executor(db, GROUP_SEX, replies=[True],
                                         target_rmse=Fraction(60), delta=Fraction(1, 10**6))
    assert len(reasons) == 1 and not ex.failed, err
    assert f"charged epsilon={e.epsilon:g}" in out
    (entry,) = spent(db)[0]
    assert entry["epsilon"] == e.epsilon


def test_no_terminal_spends_an_accuracy_target_only_with_confirm(db):
    with dpsql.connect(db) as s:
        e = s.explain(RACE, delta=1e-6, max_stderr=40)
    refused = batch(db, "--delta", "1e-6", "--max-stderr", "40", "-e", RACE, stdin="")
    assert refused.returncode == 65 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith(f"error: max_stderr 40 needs epsilon={e.epsilon:g} ")
    assert ("there is no terminal to confirm on, so nothing was spent; pass --confirm (or "
            "\\set confirm on) to spend it without asking") in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and ledger(db) == []
    done = batch(db, "--delta", "1e-6", "--max-stderr", "40", "--confirm", "--nonnegative",
                 "--integer", "--csv", "-e", RACE, stdin="")
    assert done.returncode == 0, done.stderr
    rows = list(csv.reader(io.StringIO(done.stdout)))
    assert rows[0] == ["race", "count", "stderr", "ci_low", "ci_high"] and len(rows) == 6
    assert all(float(r[1]) >= 0 and float(r[1]) == int(float(r[1])) for r in rows[1:])
    assert all(float(r[2]) <= 40 for r in rows[1:])
    (entry,) = ledger(db)
    assert entry["epsilon"] == e.epsilon
    assert json.loads(entry["request"])["nonnegative"] is True


def test_confirm_on_spends_without_asking_and_explain_shows_the_epsilon(db):
    with dpsql.connect(db) as s:
        e = s.explain(RACE, delta=1e-6, target_rmse=60)
    reasons, out, err, ex = run_executor(
        db, "\\set target_rmse 60\n\\set confirm on\n\\set integer on", "\\explain " + RACE,
        RACE, epsilon=Fraction(1, 10), delta=Fraction(1, 10**6))
    assert reasons == [] and not ex.failed, err
    assert "epsilon 0.1 no longer applies" in out and "confirm = on (spend the epsilon" in out
    assert (f"(the smallest epsilon meeting target_rmse 60 is {e.epsilon:g}; explain reads no "
            "data and spends nothing)") in out
    entries, budget = spent(db)
    assert [x["epsilon"] for x in entries] == [e.epsilon]
    assert json.loads(entries[0]["request"])["integer"] is True


def test_accuracy_and_flag_settings_refuse_bad_values(db):
    reasons, out, err, ex = run_executor(
        db, "\\set target_rmse 50", "\\set target_rmse fifty", "\\set max_stderr -2",
        "\\set target_rmse 0", "\\set nonnegative maybe", "\\set confirm sure",
        "\\set integer", "\\set target_rmse", "\\set epsilon 0.2", "\\set max_stderr 9",
        "\\set max_stderr off", "\\set nonnegative ON", "\\set",
        epsilon=Fraction(1, 10), delta=Fraction(1, 10**6))
    errors = err.splitlines()
    assert errors == [
        "error: target_rmse must be a number such as 50, got 'fifty'",
        "error: max_stderr must be a positive number (an expected error, in counts), got -2",
        "error: target_rmse must be a positive number (an expected error, in counts), got 0",
        "error: nonnegative must be true or false, got 'maybe'",
        "error: confirm must be true or false, got 'sure'"]
    assert ("target_rmse = 50 (each query spends the smallest epsilon whose expected RMSE of "
            "the batch is at most 50, after you confirm it); epsilon 0.1 no longer applies") in out
    assert "integer = off (" in out and "target_rmse = 50 (" in out.split("error")[0]
    assert "epsilon = 0.2; target_rmse 50 no longer applies" in out
    assert "max_stderr = 9 (each query spends" in out and "epsilon 0.2 no longer applies" in out
    listing = out[out.rindex("epsilon is not set"):]   # the final \set: every setting
    assert "target_rmse is not set" in listing and "max_stderr is not set" in listing
    assert "nonnegative = on" in listing and "confirm = off (ask before spending" in listing
    assert ledger(db) == []
    # both ways of asking on the command line; a target with the metric model
    both = batch(db, "--epsilon", "0.1", "--target-rmse", "50", "--delta", "1e-6", "-e",
                 GROUP_SEX)
    assert both.returncode == 65 and both.stderr.startswith(
        "error: --epsilon and --target-rmse are both given; a query asks either by epsilon "
        "or by an accuracy target")
    bad = batch(db, "--target-rmse", "lots", "--delta", "1e-6", "-e", GROUP_SEX)
    assert bad.returncode == 65 and "--target-rmse must be a number such as 50, got 'lots'" in bad.stderr
    reasons, out, err, ex = run_executor(db, GROUP_SEX, target_rmse=Fraction(50),
                                         delta=Fraction(0), model="metric", confirm=True)
    assert "error: accuracy targets apply to the matrix mechanism" in err
    reasons, out, err, ex = run_executor(db, GROUP_SEX, target_rmse=Fraction(50))
    assert err.startswith("error: delta not set") and "--epsilon" not in err
    assert ledger(db) == []


def test_toolbar_and_completion_know_the_accuracy_settings(db, policies):
    with dpsql.connect(db) as s:
        state = ShellState(s, target_rmse=Fraction(50), delta=Fraction(1, 10**6),
                           nonnegative=True)
        state.refresh()
        text = toolbar_text(state)
    assert ("ask target_rmse=50 delta=1e-06 strategy=auto (asks before spending) "
            "nonnegative") in text
    assert list(complete(policies, "\\set nonnegative ")) == ["on", "off"]
    assert list(complete(policies, "\\set target_rmse ")) == ["off"]
    assert {"confirm", "confirm_share"} <= set(complete(policies, "\\set con"))


# --------------------------------------------------------------------------- reuse


def test_a_repeated_query_is_free_with_reuse_and_not_asked_about(db):
    eps = dict(epsilon=Fraction(3, 10), delta=Fraction(1, 10**6))
    # 0.3 of the 1 left is above the 25% confirmation threshold: the first time it asks;
    # asked again, past releases answer it: nothing to spend, no question
    reasons, out, err, ex = run_executor(db, GROUP_SEX, GROUP_SEX, replies=[True], **eps)
    assert len(reasons) == 1 and not ex.failed, err
    assert "strategy=reuse" in out and ("answered from past releases: nothing charged to "
                                        "adult; remaining epsilon 0.7 of 1") in out
    entries, budget = spent(db)
    assert [(e["mechanism"], e["epsilon"]) for e in entries][1] == ("reuse", 0.0)
    assert entries[1]["reused_from"] == str(entries[0]["release_id"])
    assert budget["epsilon_spent"] == Fraction(3, 10)
    # explain says so, and spends nothing
    reasons, out, err, ex = run_executor(db, "\\explain " + GROUP_SEX, **eps)
    assert "every answer comes from past releases" in out and "nothing is charged" in out
    assert spent(db) == (entries, budget)
    # reuse off: measured afresh, asked about (0.3 of 0.7), charged
    reasons, out, err, ex = run_executor(db, GROUP_SEX, replies=[True], reuse=False, **eps)
    assert len(reasons) == 1 and "charged epsilon=0.3 " in out, err
    # --no-reuse on the command line, \set reuse on in a batch
    done = batch(db, "--epsilon", "0.1", "--delta", "1e-6", "--no-reuse", "-e", GROUP_SEX,
                 "-e", "\\set reuse on", "-e", GROUP_SEX)
    assert done.returncode == 0, done.stderr
    assert "reuse = on (answers from past releases" in done.stdout
    entries, budget = spent(db)
    assert [e["epsilon"] for e in entries] == [0.3, 0.0, 0.3, 0.1, 0.0]
    assert entries[-1]["mechanism"] == "reuse" and budget["epsilon_spent"] == Fraction(7, 10)


def test_reuse_setting_refuses_bad_values_and_shows_everywhere(db, policies):
    reasons, out, err, ex = run_executor(db, "\\set reuse maybe", "\\set reuse",
                                         "\\set reuse OFF", "\\set reuse", "\\set",
                                         epsilon=Fraction(1, 10), delta=Fraction(1, 10**6))
    assert err.splitlines() == [
        "error: reuse must be true or false, got 'maybe'"]
    assert ("reuse = on (answers from past releases wherever they are at least as accurate, "
            "at no privacy cost)") in out
    assert out.count("reuse = off (every query is measured afresh and charged)") == 3
    assert ledger(db) == []
    help_ = run_executor(db, "\\help")[1]
    assert "\\set reuse off measures everything afresh" in help_ and "reuse, confirm" in help_
    with dpsql.connect(db) as s:
        state = ShellState(s, epsilon=Fraction(1, 10), delta=Fraction(1, 10**6), reuse=False)
        state.refresh()
        assert toolbar_text(state).endswith("strategy=auto reuse off | \\help ")
        state.set("reuse", "on")
        assert "reuse" not in toolbar_text(state)
    assert list(complete(policies, "\\set reuse ")) == ["on", "off"]
    assert "reuse" in complete(policies, "\\set re")
    bad = batch(db, "--epsilon", "0.1", "--delta", "1e-6", "--no-reuse=yes", "-e", GROUP_SEX)
    assert bad.returncode == 64 and "--no-reuse" in bad.stderr and ledger(db) == []

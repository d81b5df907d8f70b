"""The dpsql shell, driven for real through a pseudo-terminal (pexpect), plus its batch modes
(-e, -f, --csv) as subprocesses and its completer as an object."""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys

import pexpect
import pytest
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document

import dpsql
from dpsql.interfaces.shell.completer import DpsqlCompleter
from dpsql.interfaces.shell.executor import submission_complete
from dpsql.interfaces.shell.repl import toolbar_text
from dpsql.interfaces.shell.settings import ShellState

from ..conftest import ADULT_POLICY, ROOT, make_adult_db, snapshot

TIMEOUT = 60          # generous: the machine is shared
PROMPT = "dpsql> "
GROUP_SEX = "SELECT sex, COUNT(*) FROM adult GROUP BY sex;"

# Slows one step of a request down, printing a marker when it starts, so Ctrl-C lands in it
# deterministically: strategy selection runs before the charge, `Session._write` after it
# (Ctrl-C deferred).
SLOW_HOOK = """
import signal, sys, time
# a test runner started in the background by a non-interactive shell inherits SIGINT ignored
# (and so would this child): the tests below send SIGINT, so take Python's own handler back
signal.signal(signal.SIGINT, signal.default_int_handler)
import dpsql.mechanisms.selection as selection
import dpsql.session as s
phase, seconds = sys.argv.pop(1), float(sys.argv.pop(1))
owner, name = {"select": (selection, "select"), "write": (s.Session, "_write")}[phase]
original = getattr(owner, name)
calls = []
def slow(*args, **kwargs):
    if not calls:
        calls.append(1)
        print(f"[test hook] in {phase}", flush=True)
        time.sleep(seconds)
    return original(*args, **kwargs)
setattr(owner, name, slow)
from dpsql.interfaces.shell import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def db(tmp_path):
    path = str(tmp_path / "adult.duckdb")
    make_adult_db(path, epsilon=1.0, delta=1e-5).close()
    return path


def ledger(path):
    with dpsql.connect(path) as s:
        return s.ledger()


def spawn(path, *args, tmp_path, hook=None, term="dumb"):
    env = dict(os.environ, TERM=term, DPSQL_HISTORY=str(tmp_path / "history"),
               PYTHONPATH=str(ROOT))
    env.pop("PROMPT_TOOLKIT_NO_CPR", None)
    if hook:
        script = tmp_path / "slow_shell.py"
        script.write_text(SLOW_HOOK)
        argv = [str(script), *hook]
    else:
        argv = ["-m", "dpsql.interfaces.shell"]
    child = pexpect.spawn(sys.executable, [*argv, path, *args], env=env, cwd=str(ROOT),
                          encoding="utf-8", timeout=TIMEOUT, dimensions=(50, 250))
    if term == "dumb":
        child.expect_exact(PROMPT)
    return child


def ready(child):
    """Wait until prompt_toolkit has the terminal in raw mode (echo off): typed keys, Ctrl-C
    and Ctrl-D then reach the prompt instead of the line discipline."""
    assert child.waitnoecho(timeout=TIMEOUT)


def type_(child, line):
    ready(child)
    child.sendline(line)


def send(child, line, *expected):
    """Type one line, wait for each expected text in order, then for the next prompt."""
    ready(child)
    child.sendline(line)
    seen = []
    for text in (*expected, PROMPT):
        child.expect_exact(text)
        seen += [child.before, child.after]
    return "".join(seen)


def quit_(child):
    ready(child)
    type_(child, "\\q")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def batch(path, *args, stdin=None):
    return subprocess.run([sys.executable, "-m", "dpsql.interfaces.shell", path, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=TIMEOUT, input=stdin,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


# --------------------------------------------------------------------------- interactive
def test_query_needs_privacy_settings_then_one_submission_is_one_workload(db, tmp_path):
    child = spawn(db, tmp_path=tmp_path)
    send(child, GROUP_SEX, "error: epsilon and delta not set", "\\set epsilon 0.1")
    send(child, "\\set epsilon 0.1", "epsilon = 0.1")
    send(child, "\\set delta 1e-6", "delta = 1e-06")
    # two statements over two lines, entered together: Enter continues the unfinished one
    type_(child, "SELECT sex, COUNT(*) FROM adult GROUP BY sex; SELECT COUNT(*)")
    out = send(child, "FROM adult WHERE age >= 40;", "dp_r1_q2", "remaining epsilon 0.9 of 1")
    assert "dp_r1_q1" in out
    assert "stderr" in out and "ci_low" in out and "ci_high" in out
    assert "Female" in out and "Male" in out
    ready(child)
    child.send("SELECT garbage")
    child.expect_exact("garbage")
    child.sendintr()                       # Ctrl-C at the prompt: clears the line
    child.expect_exact(PROMPT)
    send(child, "\\budget", "eps_spent", "0.1")
    ready(child)
    child.sendeof()                        # Ctrl-D leaves
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    entries = ledger(db)
    assert len(entries) == 1 and entries[0]["n_queries"] == 3
    assert entries[0]["result_tables"] == ["dp_r1_q1", "dp_r1_q2"]
    assert "GROUP BY sex" in (tmp_path / "history").read_text()


def test_explain_spends_nothing(db, tmp_path):
    with dpsql.connect(db) as s:
        before = snapshot(s)
    child = spawn(db, "--epsilon", "0.1", "--delta", "1e-6", tmp_path=tmp_path)
    out = send(child, "\\explain " + GROUP_SEX, "expected RMSE", "<- chosen", "spends nothing")
    assert "identity" in out and "workload" in out
    # typed SQL, then \explain on its own line explains it (and does not answer it)
    type_(child, "SELECT COUNT(*) FROM adult")
    send(child, "\\explain", "1 queries over", "spends nothing")
    send(child, "\\ledger", "the ledger is empty")
    quit_(child)
    with dpsql.connect(db) as s:
        assert snapshot(s) == before


def test_over_budget_refused_nothing_charged_shell_alive(db, tmp_path):
    child = spawn(db, "--epsilon", "2", "--delta", "1e-6", tmp_path=tmp_path)
    send(child, GROUP_SEX, "error: budget exceeded on table 'adult'", "nothing was charged")
    send(child, "\\set epsilon 0.1", "epsilon = 0.1")
    send(child, GROUP_SEX, "ci_high", "remaining epsilon 0.9 of 1")
    quit_(child)
    assert len(ledger(db)) == 1


def test_ctrl_c_during_slow_request_charges_nothing(db, tmp_path):
    child = spawn(db, "--epsilon", "0.1", "--delta", "1e-6", tmp_path=tmp_path,
                  hook=("select", "30"))
    type_(child, GROUP_SEX)
    child.expect_exact("[test hook] in select")
    child.expect(r"answering\.\.\. \d+\.\ds \(Ctrl-C cancels\)")   # the progress line
    child.sendintr()
    child.expect_exact("cancelled; nothing was charged")
    child.expect_exact(PROMPT)
    send(child, "\\ledger", "the ledger is empty")
    send(child, GROUP_SEX, "ci_high")         # still alive, and answers again
    quit_(child)
    entries = ledger(db)
    assert len(entries) == 1 and entries[0]["status"] == "released"


def test_ctrl_c_after_the_charge_completes_the_release(db, tmp_path):
    child = spawn(db, "--epsilon", "0.1", "--delta", "1e-6", tmp_path=tmp_path,
                  hook=("write", "3"))
    type_(child, GROUP_SEX)
    child.expect_exact("[test hook] in write")
    child.sendintr()
    child.expect_exact("ci_high")
    child.expect_exact("release 1 had already been charged")
    child.expect_exact(PROMPT)
    quit_(child)
    entries = ledger(db)
    assert len(entries) == 1 and entries[0]["status"] == "released"


def test_set_errors_are_clear_and_change_nothing(db, tmp_path):
    child = spawn(db, tmp_path=tmp_path)
    send(child, "\\set epsilon -1", "error: epsilon must be > 0")
    send(child, "\\set epsilon lots", "error: epsilon must be a number such as 0.1")
    send(child, "\\set epsilon 1000", "error: epsilon = 1000 is too large")
    send(child, "\\set delta 1", "error: delta must satisfy 0 <= delta < 1")
    send(child, "\\set strategy magic", "error: unknown strategy 'magic'")
    send(child, "\\set strategy eigen(principal_vectors=8, colour=red)",
         "error: unknown option 'colour' for strategy 'eigen'", "principal_vectors (integer")
    send(child, "\\set strategy mwem(rounds=-1)", "error: mwem option 'rounds' needs")
    send(child, "\\set model sideways", "error: model must be 'dp'")
    send(child, "\\set confirm_share 2", "error: confirm_share must be between 0 and 1")
    send(child, "\\set colour red", "error: unknown setting 'colour'")
    send(child, "\\set epsilon", "epsilon is not set")
    send(child, "\\nope", "error: unknown command '\\nope'")
    out = send(child, "\\set", "confirm_share = 0.25")
    assert "epsilon is not set" in out and "strategy = auto" in out and "model = dp" in out
    send(child, "\\set strategy identity;", "strategy = identity")
    send(child, "\\set confirm_share 50%", "confirm_share = 0.5")
    # pure epsilon-DP, specs with options (the whole rest of the line) and the model
    send(child, "\\set delta 0", "delta = 0")
    send(child, "\\set strategy mwem(rounds=20, cuboids=true)",
         "strategy = mwem(rounds=20, cuboids=true)")
    send(child, "\\set strategy eigen(principal_vectors=8)",
         "strategy = eigen(principal_vectors=8)")
    send(child, "\\set model metric", "model = metric (d_X privacy")
    out = send(child, "\\set", "confirm_share = 0.5")
    assert "delta = 0" in out and "strategy = eigen(principal_vectors=8)" in out
    quit_(child)


def test_confirmation_no_spends_nothing_yes_spends(db, tmp_path):
    child = spawn(db, "--epsilon", "0.5", "--delta", "1e-6", tmp_path=tmp_path)
    type_(child, GROUP_SEX)
    child.expect_exact("50% of the 1 remaining on table 'adult'")
    child.expect_exact("Spend it? [y/N]")
    send(child, "n", "not answered; nothing was spent")
    send(child, "\\ledger", "the ledger is empty")
    type_(child, GROUP_SEX)
    child.expect_exact("Spend it? [y/N]")
    send(child, "y", "ci_high", "remaining epsilon 0.5 of 1")
    # asked again, it is answered from that release: nothing to spend, so no question
    send(child, GROUP_SEX, "strategy=reuse", "ci_high",
         "answered from past releases: nothing charged to adult; remaining epsilon 0.5 of 1")
    send(child, "\\set confirm_share 1", "confirm_share = 1")
    send(child, "\\set reuse off", "reuse = off (every query is measured afresh")
    send(child, GROUP_SEX, "ci_high", "remaining epsilon 0 of 1")   # 100% of 0.5: no question
    quit_(child)
    assert [e["epsilon"] for e in ledger(db)] == [0.5, 0.0, 0.5]


def test_accuracy_target_asks_at_the_prompt_no_spends_nothing(db, tmp_path):
    with dpsql.connect(db) as s:
        e = s.explain(GROUP_SEX, delta=1e-6, target_rmse=60)
    child = spawn(db, "--delta", "1e-6", tmp_path=tmp_path)
    send(child, "\\set target_rmse 60", "target_rmse = 60 (each query spends the smallest")
    type_(child, GROUP_SEX)
    child.expect_exact(f"target_rmse 60 needs epsilon={e.epsilon:g} delta=")
    child.expect_exact("Spend it? [y/N]")
    send(child, "n", "not answered; nothing was spent")
    send(child, "\\ledger", "the ledger is empty")
    type_(child, GROUP_SEX)
    child.expect_exact("Spend it? [y/N]")
    send(child, "y", "ci_high", f"charged epsilon={e.epsilon:g}")
    quit_(child)
    (entry,) = ledger(db)
    assert entry["epsilon"] == e.epsilon


def test_meta_commands_tables_domain_help(db, tmp_path):
    child = spawn(db, tmp_path=tmp_path)
    send(child, "\\tables", "age, sex, race, income, hours_per_week")
    send(child, "\\domain adult", "17 .. 90", "'Female', 'Male'")
    send(child, "\\domain nosuch", "error: table 'nosuch' is not protected")
    send(child, "\\help", "ONE workload", "\\explain SQL")
    quit_(child)


def test_toolbar_shows_remaining_budget_in_a_full_terminal(db, tmp_path):
    child = spawn(db, "--epsilon", "0.1", "--delta", "1e-6", tmp_path=tmp_path, term="xterm")
    for sql in (GROUP_SEX, "SELECT race, COUNT(*) FROM adult GROUP BY race;"):  # two charges
        child.expect(r"\x1b\[6n")              # answer prompt_toolkit's cursor query
        child.send("\x1b[5;1R")
        child.expect_exact("remaining")
        child.send(sql + "\r")
    child.expect_exact("ci_high")
    child.expect(r"\x1b\[6n")
    child.send("\x1b[20;1R")
    child.expect_exact("adult: epsilon 0.8 of 1 remaining")
    child.send("\\q\r")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and len(ledger(db)) == 2


# --------------------------------------------------------------------------- batch modes
def test_e_runs_one_workload_per_string(db):
    done = batch(db, "--epsilon", "0.1", "--delta", "1e-6", "-e",
                 GROUP_SEX + " SELECT COUNT(*) FROM adult WHERE income = '>50K';",
                 "-e", "\\budget")
    assert done.returncode == 0, done.stderr
    assert "ci_low" in done.stdout and "dp_r1_q2" in done.stdout
    assert "eps_spent" in done.stdout
    entries = ledger(db)
    assert len(entries) == 1 and len(entries[0]["result_tables"]) == 2


def test_f_and_e_run_in_order_each_one_workload(db, tmp_path):
    script = tmp_path / "batch.sql"
    script.write_text(GROUP_SEX + "\nSELECT race, COUNT(*) FROM adult GROUP BY race;\n")
    done = batch(db, "--epsilon", "0.1", "--delta", "1e-6", "-f", str(script), "-e",
                 "SELECT COUNT(*) FROM adult;")
    assert done.returncode == 0, done.stderr
    assert done.stdout.index("release 1") < done.stdout.index("release 2")
    assert [len(e["result_tables"]) for e in ledger(db)] == [2, 1]
    piped = batch(db, "--epsilon", "0.1", "--delta", "1e-6", stdin=GROUP_SEX)
    assert piped.returncode == 0 and "release 3" in piped.stdout


def test_csv_output(db):
    done = batch(db, "--epsilon", "0.1", "--delta", "1e-6", "--csv", "-e",
                 GROUP_SEX + " SELECT COUNT(*) FROM adult;")
    assert done.returncode == 0, done.stderr
    blocks = done.stdout.strip("\n").split("\n\n")
    assert len(blocks) == 2
    first = list(csv.reader(io.StringIO(blocks[0])))
    second = list(csv.reader(io.StringIO(blocks[1])))
    assert first[0] == ["sex", "count", "stderr", "ci_low", "ci_high"]
    assert sorted(r[0] for r in first[1:]) == ["Female", "Male"]
    assert second[0] == ["count", "stderr", "ci_low", "ci_high"] and len(second) == 2
    float(second[1][0])


@pytest.mark.parametrize("args, message, status", [
    (("-e", GROUP_SEX), "--epsilon", 65),
    (("--epsilon", "0.1", "--delta", "1e-6", "-e", "SELECT name FROM adult;", "-e",
      "SELECT COUNT(*) FROM adult;"), "error: column 'name' is not declared", 65),
    (("--epsilon", "0.1", "--delta", "1e-6", "-e", "SELECT COUNT(*) FROM secrets;"),
     "is not a protected table", 65),
    (("--epsilon", "0.5", "--delta", "1e-6", "-e", GROUP_SEX), "--confirm-share 1", 65),
    (("--epsilon", "0.1", "--delta", "1e-6", "-f", "no/such/file.sql"), "does not exist", 66),
    (("--epsilon", "-3", "-e", GROUP_SEX), "epsilon must be > 0", 65),
])
def test_batch_errors_exit_by_class_one_line_nothing_charged(db, args, message, status):
    done = batch(db, *args)
    assert done.returncode == status     # the first error's row in dpsql.errors.ERROR_TABLE
    assert message in done.stderr and done.stderr.startswith("error: ")
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert ledger(db) == []


def test_batch_ctrl_c_charges_nothing_and_stops(db, tmp_path):
    script = tmp_path / "slow_shell.py"
    script.write_text(SLOW_HOOK)
    proc = subprocess.Popen(
        [sys.executable, str(script), "select", "30", db, "--epsilon", "0.1", "--delta",
         "1e-6", "-e", GROUP_SEX, "-e", "\\budget"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout.readline() == "[test hook] in select\n"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130
    assert "cancelled; nothing was charged" in out and "eps_spent" not in out
    assert "Traceback" not in err and ledger(db) == []


def test_pure_dp_release_in_batch(db):
    done = batch(db, "--epsilon", "0.25", "--delta", "0", "-e", GROUP_SEX, "-e", "\\ledger")
    assert done.returncode == 0, done.stderr
    assert "delta=0 strategy=" in done.stdout and "ci_high" in done.stdout
    assert "charged epsilon=0.25 delta=0 to adult" in done.stdout
    assert "laplace" in done.stdout                  # \ledger shows the mechanism
    (entry,) = ledger(db)
    assert (entry["mechanism"], entry["delta"]) == ("laplace", 0.0)


def test_mwem_release_prints_null_errors_and_no_nan(db):
    done = batch(db, "--epsilon", "0.25", "--delta", "0", "--strategy", "mwem(rounds=5)",
                 "-e", GROUP_SEX + " SELECT COUNT(*) FROM adult WHERE age < 30;")
    assert done.returncode == 0, done.stderr
    assert "strategy=mwem(rounds=5) expected RMSE=n/a" in done.stdout
    assert "NULL" in done.stdout and "nan" not in done.stdout
    csv_run = batch(db, "--epsilon", "0.25", "--delta", "0", "--csv", "--confirm-share", "1",
                    "-e",
                    "\\set strategy mwem(rounds=5)\n" + GROUP_SEX)
    assert csv_run.returncode == 0, csv_run.stderr
    rows = list(csv.reader(io.StringIO(csv_run.stdout)))
    assert rows[0] == ["sex", "count", "stderr", "ci_low", "ci_high"]
    assert [r[2:] for r in rows[1:]] == [["", "", ""]] * 2
    assert "expected RMSE=n/a" in csv_run.stderr
    assert [e["mechanism"] for e in ledger(db)] == ["mwem", "mwem"]


def test_bad_strategy_option_in_batch_is_refused(db):
    done = batch(db, "--epsilon", "0.1", "--delta", "1e-6", "--strategy",
                 "eigen(principal_vectors=0)", "-e", GROUP_SEX)
    assert done.returncode == 65 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: strategy spec 'eigen(principal_vectors=0)': option "
                                  "'principal_vectors' of 'eigen' must be an integer from 1")
    assert ledger(db) == []


METRIC = {"epsilon": 2, "columns": {"age": {"weight": 0.1}, "sex": {"different": 1}}}
AGE_RANGES = ("SELECT COUNT(*) FROM adult WHERE age BETWEEN 17 AND 29; "
              "SELECT COUNT(*) FROM adult WHERE age BETWEEN 30 AND 49; "
              "SELECT COUNT(*) FROM adult WHERE age >= 50;")


@pytest.fixture
def metric_db(tmp_path):
    """Adult under ADULT_POLICY plus a metric (d_X) model with its own budget of 2."""
    path = str(tmp_path / "metric.duckdb")
    with make_adult_db(path, protect=False) as s:
        s.protect("adult", dict(ADULT_POLICY, metric=METRIC))
    return path


def test_metric_model_release_in_batch(metric_db):
    done = batch(metric_db, "--epsilon", "0.5", "--delta", "0", "--model", "metric",
                 "-e", AGE_RANGES, "-e", "\\budget", "-e", "\\set model")
    assert done.returncode == 0, done.stderr
    assert "strategy=dx_laplace" in done.stdout and "dp_r1_q3" in done.stdout
    assert ("charged metric epsilon=0.5 (per unit distance) to adult; remaining metric "
            "epsilon 1.5 of 2") in done.stdout
    lines = done.stdout.splitlines()
    k = next(i for i, line in enumerate(lines) if line.startswith("table  eps_spent"))
    assert lines[k].split()[-3:] == ["metric_eps_spent", "metric_eps_limit", "metric_eps_left"]
    assert lines[k + 2].split()[-3:] == ["0.5", "2", "1.5"]
    assert "model = metric" in done.stdout
    (entry,) = ledger(metric_db)
    assert (entry["mechanism"], entry["metric_epsilon"], entry["epsilon"]) == (
        "dx_laplace", 0.5, 0.0)
    # the model is a setting like the others; metric with delta > 0 is refused
    refused = batch(metric_db, "--epsilon", "0.5", "--delta", "1e-6", "-e",
                    "\\set model metric\n" + AGE_RANGES)
    assert refused.returncode == 65 and "delta = 0" in refused.stderr
    assert len(ledger(metric_db)) == 1


def test_batch_missing_database(tmp_path):
    done = batch(str(tmp_path / "missing.duckdb"), "-e", "\\budget")
    assert done.returncode == 66 and "does not exist" in done.stderr
    assert not (tmp_path / "missing.duckdb").exists()


# --------------------------------------------------------------------------- units
@pytest.fixture
def policies(db):
    with dpsql.connect(db) as s:
        return s.policies()


def complete(policies, text, requested=False):
    completer = DpsqlCompleter(lambda: policies)
    event = CompleteEvent(completion_requested=requested)
    return {c.text: c.start_position for c in completer.get_completions(Document(text), event)}


def test_completer_candidates(policies):
    assert complete(policies, "SELECT se") == {"sex": -2, "select": -2}
    assert "adult" in complete(policies, "SELECT COUNT(*) FROM ad")
    assert set(complete(policies, "SELECT COUNT(*) FROM ")) == {"adult"}
    assert complete(policies, "SELECT COUNT(*) FROM adult WHERE sex = ") == {
        "'Female'": 0, "'Male'": 0}
    assert complete(policies, "SELECT COUNT(*) FROM adult WHERE race IN ('White', 'B") == {
        "'Black'": -2}
    assert complete(policies, "SELECT COUNT(*) FROM adult WHERE income <> '>") == {
        "'>50K'": -2}
    assert "'<=50K'" in complete(policies, "\\explain SELECT COUNT(*) FROM adult WHERE "
                                           "income = ")
    assert "select" in complete(policies, "sel") and "SELECT" in complete(policies, "SEL")
    assert "hours_per_week" in complete(policies, "SELECT COUNT(*) FROM adult WHERE ho")
    assert complete(policies, "SELECT ") == {}
    assert {"age", "adult", "SELECT"} <= set(complete(policies, "SELECT ", requested=True))
    assert complete(policies, "WHERE sex = 'x") == {}
    assert set(complete(policies, "\\se")) == {"\\set"}
    assert "epsilon" in complete(policies, "\\set eps")
    assert complete(policies, "\\set strategy w") == {"workload": -1, "wavelet": -1}
    assert complete(policies, "\\set strategy mw") == {"mwem": -2}
    assert complete(policies, "\\set strategy hier") == {"hierarchical": -4}
    assert complete(policies, "\\set model ") == {"dp": 0, "metric": 0}
    assert complete(policies, "\\domain a") == {"adult": -1}
    assert {"\\budget", "\\ledger", "\\explain", "\\tables", "\\domain", "\\help", "\\q"} <= \
        set(complete(policies, "\\"))


@pytest.mark.parametrize("text, done", [
    ("", True), ("SELECT COUNT(*) FROM adult", False), ("SELECT COUNT(*) FROM adult;", True),
    ("SELECT COUNT(*)\nFROM adult;  ", True), ("SELECT 1; -- note", True),
    ("SELECT 1 -- a; b", False), ("\\budget", True), ("SELECT COUNT(*)\n\\q", True),
    ("SELECT ';' ", False),
])
def test_submission_ends_at_semicolon_or_meta_command(text, done):
    assert submission_complete(text) is done


def test_toolbar_text(db):
    with dpsql.connect(db) as s:
        state = ShellState(s)
        state.refresh()
        text = toolbar_text(state)
    assert "adult: epsilon 1 of 1 remaining" in text and "\\set epsilon 0.1" in text
    assert "metric" not in text


def test_toolbar_text_with_a_metric_budget(metric_db):
    with dpsql.connect(metric_db) as s:
        state = ShellState(s)
        state.set("epsilon", "0.5")
        state.set("delta", "0")
        state.set("model", "metric")
        state.refresh()
        text = toolbar_text(state)
    assert "metric epsilon 2 of 2" in text
    assert "spend metric epsilon=0.5 delta=0 strategy=auto" in text

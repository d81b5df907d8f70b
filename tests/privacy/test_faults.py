"""Faults, races and interruptions: the ledger stays the truth (docs/threat-model.md).

The invariant every test here checks (:func:`check_consistent`), after the fault and after
reopening the database as a new process would:

- **an output exists => its charge is committed**: every result table dpsql wrote belongs to
  a ledger entry whose status is ``released``, with all its tables and all their rows;
- **no partial results**: an entry that is only ``charged`` has no result table;
- **the budget is consistent**: the reported spent total is within the limit and equals the
  exact sum of the ledger's rows (basic composition; an accountant that composes more tightly,
  e.g. through zCDP, may report less, never more); the database opens and answers again.

Items of the "adversarial, fault and statistical test suite" issue covered here: 4 (threads
and processes racing for one budget), 5 (crash injection: an exception or SIGKILL at each
point of a release), 6 (retries never give fresh noise for free), 15 (Ctrl-C and SIGTERM
during a long script). Rounds and crash points are scaled so the default suite stays fast;
the full counts run under ``-m slow``.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from fractions import Fraction

import duckdb
import pytest

import dpsql
from dpsql.interfaces import cli
from dpsql.store import database as engine
from dpsql.store import interrupts
from dpsql.noise.accounting import fraction_from_text
from dpsql.errors import (ERROR_TABLE, EXIT_INTERRUPTED, BudgetExceededError, DpsqlError,
                          Terminated)

from ..conftest import ROOT, make_adult_db, snapshot

TIMEOUT = 120
BATCH = ("SELECT sex, COUNT(*) FROM adult WHERE age < 40 GROUP BY sex;\n"
         "SELECT COUNT(*) FROM adult WHERE race = 'White'")
#: the faults concern the kernel and the ledger, not strategy selection: a cheap strategy
FAST = dict(strategy="workload")
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def check_consistent(path: str) -> dict:
    """The invariant above, read with plain DuckDB after a fault. Returns the ledger rows."""
    con = duckdb.connect(path)                       # replays the WAL like any restart would
    try:
        rows = con.execute("SELECT release_id, status, epsilon_exact, delta_exact, "
                           "result_tables FROM dpsql.ledger ORDER BY release_id").fetchall()
        linked = con.execute("SELECT release_id, table_name, n_rows FROM "
                             "dpsql.release_tables").fetchall()
        tables = {r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()}
        policy = json.loads(con.execute(
            "SELECT policy FROM dpsql.policies WHERE table_name = 'adult'").fetchone()[0])
        counts = {t: con.execute(f'SELECT count(*) FROM main."{t}"').fetchone()[0]
                  for t in tables if t != "adult"}
    finally:
        con.close()
    status = {r[0]: r[1] for r in rows}
    by_release: dict = {}
    for release_id, table, n_rows in linked:
        by_release.setdefault(release_id, []).append(table)
        assert status.get(release_id) == "released", (release_id, status)  # output => charge
        assert counts.get(table) == n_rows, (table, counts.get(table), n_rows)
    for release_id, st, _, _, result_tables in rows:
        assert st in ("charged", "released"), st
        if st == "released":                          # complete: every table, every row
            assert sorted(by_release.get(release_id, [])) == sorted(result_tables)
        else:                                         # no partial results
            assert release_id not in by_release
            assert not (set(result_tables or []) & set(counts)), (release_id, counts)
    assert set(counts) <= {t for ts in by_release.values() for t in ts}  # no orphan table
    basic = sum((fraction_from_text(r[2]) for r in rows), Fraction(0))
    with dpsql.connect(path) as db:                    # dpsql agrees and still works
        budget = db.budget("adult")
    # every release is counted: basic composition of the ledger's exact rows bounds any
    # valid accountant from above (a zCDP accountant may report less), and both are within
    # the limit
    assert budget["epsilon_spent"] <= basic
    assert (budget["epsilon_spent"] > 0) == (len(rows) > 0)
    if budget.get("accounting", "basic") == "basic":
        assert budget["epsilon_spent"] == basic
    assert budget["epsilon_spent"] <= fraction_from_text(policy["epsilon"])
    return {r[0]: r[1] for r in rows}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A protected Adult database, budget epsilon = 1, delta = 1e-5, copied by each test."""
    path = str(tmp_path_factory.mktemp("faults") / "adult.duckdb")
    make_adult_db(path, epsilon=1.0, delta=1e-5).close()
    return path


def fresh(template, tmp_path, name="adult.duckdb") -> str:
    path = str(tmp_path / name)
    shutil.copyfile(template, path)
    return path


# =========================================================================== item 4
# test_concurrency.py races two processes 4 times and 8 threads once (0.3 each). Added: N
# threads and 2 OS processes together, each asking for 0.6 of 1.0, with random delays,
# repeated (8 rounds by default, the spec's 50 under -m slow).

WORKER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    import dpsql
    from dpsql.errors import BudgetExceededError
    print("READY", flush=True)
    for line in sys.stdin:
        path, start, delay = line.split()
        while time.time() < float(start):
            time.sleep(0.0005)
        time.sleep(float(delay))
        db = dpsql.connect(path, lock_timeout=60, reuse=False)
        try:
            db.answer({sql!r}, epsilon=0.6, delta=1e-7, strategy="workload")
            print("WON", flush=True)
        except BudgetExceededError as exc:
            print("LOST", str(exc).replace("\\n", " "), flush=True)
        except Exception as exc:
            print("ERROR", type(exc).__name__, str(exc).replace("\\n", " "), flush=True)
        finally:
            db.close()
""")


def race(template, tmp_path, rounds: int, n_threads: int = 4):
    """Each round: a fresh database (epsilon budget 1.0); n_threads threads here and two
    worker processes each ask for 0.6 after a random delay. Returns per-round outcomes."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(root=str(ROOT), sql=RACE_SQL))
    workers = [subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=ENV) for _ in range(2)]
    rng = random.Random(20261122)            # test timing only
    results = []
    try:
        for w in workers:
            assert w.stdout.readline().strip() == "READY", w.stderr.read()[-2000:]
        for r in range(rounds):
            path = fresh(template, tmp_path, f"race{r}.duckdb")
            start = time.time() + 0.2
            outcomes: list = []

            def thread_worker(delay):
                while time.time() < start:
                    time.sleep(0.0005)
                time.sleep(delay)
                db = dpsql.connect(path, lock_timeout=60, reuse=False)
                try:
                    db.answer(RACE_SQL, epsilon=0.6, delta=1e-7, **FAST)
                    outcomes.append("WON")
                except BudgetExceededError as exc:
                    outcomes.append(f"LOST {exc}")
                except Exception as exc:  # pragma: no cover - reported by the assertion
                    outcomes.append(f"ERROR {type(exc).__name__} {exc}")
                finally:
                    db.close()

            for w in workers:
                w.stdin.write(f"{path} {start} {rng.uniform(0, 0.05)}\n")
                w.stdin.flush()
            threads = [threading.Thread(target=thread_worker, args=(rng.uniform(0, 0.05),))
                       for _ in range(n_threads)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            outcomes += [w.stdout.readline().strip() for w in workers]
            results.append((path, outcomes))
    finally:
        for w in workers:
            w.stdin.close()
            w.wait(timeout=TIMEOUT)
    return results


RACE_SQL = "SELECT COUNT(*) FROM adult WHERE age < 40"


def sequential_baseline(template, tmp_path, n: int):
    """The same n requests one after the other: (outcomes, spent, accounting). How many fit
    depends only on the accountant (basic composition: one 0.6 in a budget of 1.0; a zCDP
    accountant may fit more), never on the order or the timing."""
    path = fresh(template, tmp_path, "sequential.duckdb")
    outcomes = []
    with dpsql.connect(path, reuse=False) as db:
        for _ in range(n):
            try:
                db.answer(RACE_SQL, epsilon=0.6, delta=1e-7, **FAST)
                outcomes.append("WON")
            except BudgetExceededError as exc:
                outcomes.append(f"LOST {exc}")
        budget = db.budget("adult")
    return outcomes, budget["epsilon_spent"], budget.get("accounting", "basic")


def _check_race(results, baseline):
    expected, spent, accounting = baseline
    winners = expected.count("WON")
    refusal = next(o for o in expected if o.startswith("LOST"))
    if accounting == "basic":                      # the spec's case: at most one 0.6 fits
        assert winners == 1
        assert "spent 0.6" in refusal and "requested 0.6" in refusal and "limit 1" in refusal
    for path, outcomes in results:
        # as many winners as fit when asked one by one; every loser refused with the same
        # exact figures as the sequential loser, i.e. nothing charged for it
        assert sorted(outcomes) == sorted(expected), (outcomes, expected)
        assert "budget exceeded on table 'adult'" in refusal
        assert "nothing was charged" in refusal
        statuses = check_consistent(path)
        assert list(statuses.values()) == ["released"] * winners   # one row per success
        with dpsql.connect(path) as db:
            assert db.budget("adult")["epsilon_spent"] == spent


def test_threads_and_processes_race_for_one_budget(template, tmp_path):
    """Three rounds of six requests (4 threads, 2 processes). Passing: in every round exactly
    as many win as fit when asked one by one (one, under basic composition), every other is
    refused with the same exact figures as a sequential loser and charges nothing; the
    ledger holds one row per winner and the spent total is the sequential one."""
    n = 6
    _check_race(race(template, tmp_path, rounds=3, n_threads=n - 2),
                sequential_baseline(template, tmp_path, n))


@pytest.mark.slow
def test_threads_and_processes_race_for_one_budget_50_rounds(template, tmp_path):
    """The spec's 50 rounds, 6 threads + 2 processes each."""
    n = 8
    _check_race(race(template, tmp_path, rounds=50, n_threads=n - 2),
                sequential_baseline(template, tmp_path, n))


# =========================================================================== items 5, 6
# Crash injection. A release goes: validate -> charge (BEGIN, check, INSERT, COMMIT) -> read x
# -> A x + noise -> least squares -> write tables + mark released (BEGIN ... COMMIT) -> output.
# test_release.py covers an exception at Session._write (charged, never re-noised) and Ctrl-C
# after the charge; here: an exception, and SIGKILL, at every point.

POINTS = {
    # name: (target "module:attribute" or "commit", before/after the call, which call)
    "after_validation": ("dpsql.store.ledger:charge", "before", 1),
    "inside_charge": ("commit", "before", 1),           # INSERT done, COMMIT not yet
    "after_data_read": ("dpsql.engines.duckdb:data_vector", "after", 1),
    "after_noise": ("dpsql.noise.samplers:SecureGaussianSampler.sample", "after", 1),
    "writing_tables": ("dpsql.store.database:_create_tables", "before", 1),  # rows staged
    "after_tables": ("dpsql.store.ledger:mark_released", "after", 1),
    "at_results_commit": ("commit", "before", 2),
    "after_commit": ("dpsql.session:Session._write", "after", 1),  # before any output
}
#: ledger state after a fault at each point: None (nothing charged), charged, released
EXPECTED = {"after_validation": None, "inside_charge": None, "after_data_read": "charged",
            "after_noise": "charged", "writing_tables": "charged", "after_tables": "charged",
            "at_results_commit": "charged", "after_commit": "released"}


def install_fault(point: str, action, setattr=setattr) -> None:
    """Call ``action()`` at ``point`` of the next release (``setattr`` may be monkeypatch's)."""
    target, when, nth = POINTS[point]
    calls = []
    if target == "commit":
        real_open = engine.Database._open

        class Faulty:
            def __init__(self, con):
                self._con = con

            def execute(self, sql, *args, **kwargs):
                if str(sql).strip().upper() == "COMMIT":
                    calls.append(1)
                    if len(calls) == nth:
                        action()
                return self._con.execute(sql, *args, **kwargs)

            def __getattr__(self, name):
                return getattr(self._con, name)

        setattr(engine.Database, "_open", lambda db, owner: Faulty(real_open(db, owner)))
        return
    module_name, attribute = target.split(":")
    owner = importlib.import_module(module_name)
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    original = getattr(owner, name)

    def faulty(*args, **kwargs):
        calls.append(1)
        if when == "before" and len(calls) == nth:
            action()
        result = original(*args, **kwargs)
        if when == "after" and len(calls) == nth:
            action()
        return result

    setattr(owner, name, faulty)


class InjectedFault(Exception):
    """Raised at a crash point (not a DpsqlError: an unexpected failure)."""


def _raise():
    raise InjectedFault("injected")


def _check_after_fault(path, point, name):
    """The state a fault at ``point`` must leave, after a restart, and what a retry gets."""
    statuses = check_consistent(path)
    expected = EXPECTED[point]
    assert list(statuses.values()) == ([] if expected is None else [expected]), statuses
    with dpsql.connect(path) as db:
        before = snapshot(db)
        spent = db.budget("adult")["epsilon_spent"]
        assert spent == (0 if expected is None else Fraction(1, 5))   # one release: its ε
        # item 6: the same named release again
        if expected is None:                      # nothing was charged: a normal release
            again = db.answer(BATCH, epsilon=0.2, delta=1e-7, name=name, **FAST)
            assert not again.reused and db.budget("adult")["epsilon_spent"] == Fraction(1, 5)
        elif expected == "charged":               # charged, never written: no free re-noise
            with pytest.raises(DpsqlError, match="never written") as info:
                db.answer(BATCH, epsilon=0.2, delta=1e-7, name=name, **FAST)
            assert "budget stays spent" in str(info.value)
            assert snapshot(db) == before
        else:                                     # released: the recorded answers, free
            again = db.answer(BATCH, epsilon=0.2, delta=1e-7, name=name, **FAST)
            assert again.reused and snapshot(db) == before
            with db.db.connect() as c:
                for result in again.results:
                    rows = c.execute(f'SELECT * FROM main."{result.name}"').fetchall()
                    assert [tuple(r) for r in rows] == [tuple(r) for r in result.rows]
        if point in ("after_data_read", "after_commit"):
            # without a name and without reuse, asking again is a new release with its own
            # charge, never a free re-noise (with reuse it is answered from the recorded
            # measurements at no cost and no new noise: tests/mechanisms/test_reuse.py)
            n, spent = len(db.ledger()), db.budget("adult")["epsilon_spent"]
            db.answer(BATCH, epsilon=0.1, delta=1e-7, reuse=False, **FAST)
            assert len(db.ledger()) == n + 1 and db.ledger()[-1]["epsilon"] == 0.1
            assert db.budget("adult")["epsilon_spent"] > spent


@pytest.mark.parametrize("point", list(POINTS))
def test_an_exception_at_each_point_of_a_release(template, tmp_path, monkeypatch, point):
    """An unexpected exception at each point of a named release. Passing: the exception
    reaches the caller (no silent success); before the charge's COMMIT nothing is charged;
    between it and the results' COMMIT the release stays `charged` with no result table;
    after it, it is `released` with all tables; after a restart the budget is consistent, a
    retry under the same name is a normal release, a refusal ("never written", no charge)
    or the recorded answers (no charge), and an unnamed retry is charged again."""
    path = fresh(template, tmp_path)
    install_fault(point, _raise, setattr=monkeypatch.setattr)
    with dpsql.connect(path, reuse=False) as db:
        with pytest.raises(InjectedFault):
            db.answer(BATCH, epsilon=0.2, delta=1e-7, name="weekly", **FAST)
    monkeypatch.undo()
    _check_after_fault(path, point, "weekly")


KILL_HOOK = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from tests.privacy.test_faults import BATCH, FAST, install_fault
    import dpsql
    path, point = sys.argv[1], sys.argv[2]

    def pause():
        print("[hook] at", point, flush=True)
        time.sleep(120)

    install_fault(point, pause)
    with dpsql.connect(path, reuse=False) as db:
        db.answer(BATCH, epsilon=0.2, delta=1e-7, name="weekly", **FAST)
    print("[hook] returned", flush=True)
""")


def _kill_at(points, template, tmp_path):
    """Start one process per point (in parallel), SIGKILL each when it reaches its point."""
    hook = tmp_path / "kill_hook.py"
    hook.write_text(KILL_HOOK.format(root=str(ROOT)))
    procs = {}
    for point in points:
        path = fresh(template, tmp_path, f"{point}.duckdb")
        procs[point] = (path, subprocess.Popen(
            [sys.executable, str(hook), path, point], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=ENV, cwd=str(ROOT)))
    for point, (path, proc) in procs.items():
        line = proc.stdout.readline()
        assert line.strip() == f"[hook] at {point}", (line, proc.stderr.read()[-3000:])
        proc.kill()
        proc.wait(timeout=TIMEOUT)
        assert proc.returncode == -signal.SIGKILL
    return {point: path for point, (path, _) in procs.items()}


@pytest.mark.parametrize("points", [
    ["inside_charge", "writing_tables", "after_commit"],
    pytest.param([p for p in POINTS if p not in ("inside_charge", "writing_tables",
                                                 "after_commit")], marks=pytest.mark.slow),
], ids=["default", "the-rest"])
def test_sigkill_at_each_point_of_a_release(template, tmp_path, points):
    """The process running a named release is killed (SIGKILL: no handler, no cleanup) at the
    point. Passing, after reopening the database: the same states and retries as for an
    exception (previous test): an uncommitted charge is gone, a committed charge without its
    results stays `charged` with no table, a committed release is complete."""
    for point, path in _kill_at(points, template, tmp_path).items():
        _check_after_fault(path, point, "weekly")


# =========================================================================== item 15
# Ctrl-C and SIGTERM during a long `dpsql run`. test_scripts.py covers a KeyboardInterrupt
# raised between workloads (in-process); test_shell.py Ctrl-C in the shell. Here: real signals
# at random times in a real process, and what a re-run does afterwards.

def long_script(tmp_path, n_workloads: int) -> str:
    parts = ["SET dpsql.release = 'nightly'; SET dpsql.delta = 1e-8; "
             "SET dpsql.strategy = 'workload';"]
    for i in range(n_workloads):
        parts.append(f"SET dpsql.epsilon = 0.01;\n"
                     f"SELECT sex, COUNT(*) FROM adult WHERE age >= {20 + i} GROUP BY sex;\n"
                     f"CREATE TABLE t{i} AS SELECT race, COUNT(*) FROM adult "
                     f"WHERE age < {20 + i} GROUP BY race;")
    script = tmp_path / "nightly.sql"
    script.write_text("\n".join(parts))
    return str(script)


def _run_and_signal(path, script, sig, delay, hook=None):
    """Run `dpsql run` on ``script``; after its first release (or the hook's marker), wait
    ``delay`` seconds and send ``sig``. Returns (returncode, stdout, stderr)."""
    argv = ([sys.executable, "-m", "dpsql"] if hook is None else [sys.executable, hook])
    proc = subprocess.Popen([*argv, "run", path, script, "--quiet"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, cwd=str(ROOT))
    seen = []
    marker = "released as release" if hook is None else "[hook]"
    while True:
        line = proc.stdout.readline()
        assert line, ("no marker", "".join(seen), proc.stderr.read()[-3000:])
        seen.append(line)
        if marker in line:
            break
    time.sleep(delay)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, "".join(seen) + out, err


def _rerun(capsys, path, script):
    code = cli.main(["run", path, script, "--quiet"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("n_workloads, delay", [
    (4, 0.0), pytest.param(12, 0.35, marks=pytest.mark.slow),
    pytest.param(12, 1.0, marks=pytest.mark.slow)])
def test_ctrl_c_during_a_long_script(template, tmp_path, capsys, n_workloads, delay):
    """SIGINT after the first release plus ``delay``. Passing: exit 130; the message lists
    the workloads the ledger holds as released; every ledger entry is released and
    complete (Ctrl-C after a charge completes that release), no partial table; a re-run
    returns those workloads' recorded answers (no new charge) and releases the rest, so the
    whole script costs exactly its total once."""
    path = fresh(template, tmp_path)
    script = long_script(tmp_path, n_workloads)
    code, out, err = _run_and_signal(path, script, signal.SIGINT, delay)
    # 0 or -SIGINT: the signal came after the script had finished (-SIGINT: during the
    # interpreter's shutdown, when Python has put back the default handler)
    finished = out.count("released as release") == n_workloads
    # Ctrl-C inside a DuckDB statement is a cancel too (store.interrupts.interrupts_restored):
    # never an internal error
    assert code == 130 or (finished and code in (0, -signal.SIGINT)), (code, err)
    statuses = check_consistent(path)
    assert set(statuses.values()) <= {"released"}
    if code == 130:
        assert err.startswith("cancelled: interrupted; released before it and still "
                              "recorded: ") and "Traceback" not in err
        listed = re.findall(r"workload (\d+) as 'nightly/\d+' \(release (\d+)", err)
        with dpsql.connect(path) as db:
            recorded = [(e["release_name"], str(e["release_id"])) for e in db.ledger()]
        listed = [(f"nightly/{w}", r) for w, r in listed]
        assert listed in (recorded, recorded[:-1]), (listed, recorded)
    code, out, err = _rerun(capsys, path, script)
    assert code == 0 and err == "", err
    assert out.count("nothing charged") == len(statuses)
    statuses = check_consistent(path)
    assert list(statuses.values()) == ["released"] * n_workloads
    with dpsql.connect(path) as db:                 # each workload charged exactly once
        names = sorted(e["release_name"] for e in db.ledger())
    assert names == sorted(f"nightly/{k}" for k in range(1, n_workloads + 1))


@pytest.mark.parametrize("n_workloads, delay", [
    (4, 0.1), pytest.param(12, 0.3, marks=pytest.mark.slow),
    pytest.param(12, 0.9, marks=pytest.mark.slow)])
def test_sigterm_during_a_long_script_leaves_a_consistent_ledger(template, tmp_path, capsys,
                                                                 n_workloads, delay):
    """SIGTERM after the first release plus ``delay``: outside a release it cancels like
    Ctrl-C (exit 143, the error table's row for ``Terminated``; -15 if it lands before the
    handler is installed or after it is removed); inside one (charge to committed tables)
    it is held until the release is complete, then handled likewise. Passing: no partial result table, every
    released entry complete, the budget
    consistent; at most the one release in progress is left `charged` (its budget spent, its
    answers lost). A re-run returns the recorded answers; if a release was left charged,
    the re-run is refused for it ("never written", nothing charged) instead of re-noising."""
    path = fresh(template, tmp_path)
    script = long_script(tmp_path, n_workloads)
    code, _, _ = _run_and_signal(path, script, signal.SIGTERM, delay)
    assert code in (0, ERROR_TABLE[Terminated].exit_status, -signal.SIGTERM)
    statuses = check_consistent(path)
    charged = [r for r, s in statuses.items() if s == "charged"]
    assert len(charged) <= 1 and (not charged or charged[0] == max(statuses))
    with dpsql.connect(path) as db:
        before = snapshot(db)
    code, out, err = _rerun(capsys, path, script)
    if charged:
        assert code == 65 and "never written" in err and "cannot be re-noised" in err
        with dpsql.connect(path) as db:
            assert snapshot(db) == before
    else:
        assert code == 0
        assert list(check_consistent(path).values()) == ["released"] * n_workloads


SIGNAL_HOOK = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    import dpsql.store.database as engine
    real = engine._create_tables
    calls = []

    def slow_write(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            print("[hook] writing the first result tables", flush=True)
            time.sleep(3)
        return real(*args, **kwargs)

    engine._create_tables = slow_write
    from dpsql.interfaces.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_sigterm_after_the_charge_completes_the_release_like_ctrl_c(template, tmp_path):
    """SIGTERM while the first release writes its result tables (after its charge).
    Passing: like Ctrl-C, the release is completed before the process stops, and it says so;
    the ledger entry is `released` with its tables."""
    path = fresh(template, tmp_path)
    script = long_script(tmp_path, 2)
    hook = tmp_path / "signal_hook.py"
    hook.write_text(SIGNAL_HOOK.format(root=str(ROOT)))
    code, out, err = _run_and_signal(path, script, signal.SIGTERM, 0.2, hook=str(hook))
    statuses = check_consistent(path)
    assert statuses and statuses[min(statuses)] == "released", (code, statuses)
    assert "nightly/1" in err and code != 0


def test_ctrl_c_right_after_the_commit_is_reported_as_released(template, tmp_path,
                                                               monkeypatch, capsys):
    """Ctrl-C lands just after the commit, while answer() builds its Release (hit on purpose
    by sending SIGINT from there). Passing: exit 130 and the message counts workload 1 as
    released, as the ledger does."""
    from dpsql import session as session_module

    path = fresh(template, tmp_path)
    script = tmp_path / "two.sql"
    script.write_text("SET dpsql.epsilon = 0.1; SET dpsql.delta = 1e-7; "
                      "SET dpsql.release = 'r'; SET dpsql.strategy = 'workload';\n" + BATCH +
                      ";\n"
                      "SET dpsql.epsilon = 0.2;\nSELECT COUNT(*) FROM adult;")
    real_release = session_module.Release
    sent = []

    def release_after_sigint(*args, **kwargs):
        if not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)
        return real_release(*args, **kwargs)

    monkeypatch.setattr(session_module, "Release", release_after_sigint)
    code = cli.main(["run", path, str(script), "--quiet"])
    out, err = capsys.readouterr()
    monkeypatch.undo()
    assert code == 130 and sent
    assert list(check_consistent(path).values()) == ["released"]
    assert "workload 1 as 'r/1'" in err, err


def test_ctrl_c_during_a_duckdb_query_is_a_clean_cancel(template, tmp_path, monkeypatch,
                                                         capsys):
    """Ctrl-C arrives while DuckDB runs a catalog query of `dpsql run`, before anything is
    charged: the DuckDB connection (below everything dpsql wraps around it) raises what
    DuckDB's client raises then (see the next test). Passing: exit 130 with a one-line
    `cancelled` message, nothing charged."""
    path = fresh(template, tmp_path)
    script = tmp_path / "one.sql"
    script.write_text("SET dpsql.epsilon = 0.1; SET dpsql.delta = 1e-7;\n"
                      "CREATE TABLE weekly AS SELECT COUNT(*) FROM adult;")
    real_connect = duckdb.connect
    raised = []

    class InterruptedOnce:
        """A DuckDB connection whose first catalog query is interrupted by Ctrl-C."""

        def __init__(self, con):
            self._con = con

        def execute(self, sql, *args, **kwargs):
            if "duckdb_tables()" in str(sql) and not raised:
                raised.append(sql)
                raise RuntimeError("Query interrupted")
            return self._con.execute(sql, *args, **kwargs)

        def __getattr__(self, name):
            return getattr(self._con, name)

    monkeypatch.setattr(engine.duckdb, "connect",
                        lambda *a, **k: InterruptedOnce(real_connect(*a, **k)))
    try:
        code = cli.main(["run", path, str(script), "--quiet"])
    finally:
        monkeypatch.undo()
        assert raised and list(check_consistent(path).values()) == []
    out, err = capsys.readouterr()
    assert code == 130 and err.startswith("cancelled") and "Traceback" not in err


@pytest.mark.slow
def test_duckdb_turns_ctrl_c_during_a_query_into_a_runtime_error():
    """The dependency behaviour the previous test simulates: SIGINT while DuckDB's Python
    client runs a query surfaces as RuntimeError('Query interrupted'), not as
    KeyboardInterrupt or duckdb.Error (DuckDB may notice the signal only at the end of the
    query, so the query is bounded)."""
    con = duckdb.connect()
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(RuntimeError, match="Query interrupted") as info:
        con.execute("SELECT count(*) FROM range(1000000000) t(i) WHERE i % 7 = 3").fetchall()
    assert not isinstance(info.value, duckdb.Error)
    con.close()


@pytest.mark.parametrize("sig, status", [
    (signal.SIGINT, EXIT_INTERRUPTED),
    (signal.SIGTERM, ERROR_TABLE[Terminated].exit_status)])
def test_a_signal_inside_any_duckdb_statement_cancels_with_its_status(capsys, sig, status):
    """DuckDB's client runs a signal's handler inside a statement, drops what it raised and
    raises RuntimeError('Query interrupted'); outside engine_errors that used to end
    ``dpsql run`` as an internal error (exit 70) under SIGTERM. Passing: a real signal inside
    a real DuckDB statement, with the command-line guard's handlers installed, ends with the
    signal's status and a one-line "cancelled". (If the query ends before the signal, the
    handler raises between statements: the same outcome.)"""
    from dpsql.interfaces.exits import guarded

    def body() -> int:
        con = duckdb.connect()
        try:
            # DuckDB often reports the signal only when the statement ends, so the
            # statement's length is the test's: 4e8 rows run ~1.7-2.7 s of wall on 2 cores
            # (load 5), 15-25 times the 0.1 s before the signal, which landed inside the
            # statement in every trial (2e9 rows after 0.3 s cost ~10 s of CPU per test)
            threading.Timer(0.1, os.kill, (os.getpid(), sig)).start()
            con.execute("SELECT count(*) FROM range(400000000) t(i) WHERE i % 7 = 3")
            time.sleep(30)                       # the signal lands here if not in the query
            return 0
        finally:
            con.close()

    assert guarded(body) == status
    err = capsys.readouterr().err
    assert err.startswith("cancelled") and "internal" not in err and "Traceback" not in err
    assert interrupts.engine_interrupted(RuntimeError("Query interrupted"))
    assert not interrupts.engine_interrupted(RuntimeError("something else"))


def test_a_sigterm_the_request_saw_as_a_cancel_exits_as_terminated(capsys):
    """A SIGTERM that lands inside a DuckDB statement while a script is checked reaches the
    command line as RequestCancelled ("while checking the script ..."): the guard, which saw
    the SIGTERM, exits with Terminated's status, not Ctrl-C's."""
    from dpsql.errors import RequestCancelled
    from dpsql.interfaces.exits import guarded

    def body() -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        except KeyboardInterrupt:
            raise RequestCancelled("while checking the script, before any release; "
                                   "nothing was charged") from None
        return 0

    assert guarded(body) == ERROR_TABLE[Terminated].exit_status
    assert "while checking the script" in capsys.readouterr().err

"""Two OS processes, and many threads, racing for one budget never overspend it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from fractions import Fraction

import dpsql
from dpsql.errors import BudgetExceededError

from ..conftest import ROOT, make_adult_db

WORKER = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {root!r})
    import dpsql
    from dpsql.errors import BudgetExceededError
    print("READY", flush=True)
    while line := sys.stdin.readline():            # one round per line: the database's path
        db = dpsql.connect(json.loads(line), lock_timeout=60, reuse=False)
        print("CONNECTED", flush=True)
        start = float(sys.stdin.readline())
        while time.time() < start:
            time.sleep(0.001)
        try:
            db.answer("SELECT COUNT(*) FROM adult WHERE age < 40", epsilon=0.6, delta=1e-7)
            print("WON", flush=True)
        except BudgetExceededError as exc:
            print("LOST", exc, flush=True)
        db.close()
""")


def _said(proc, errors) -> str:
    line = proc.stdout.readline().strip()
    assert line, f"worker {proc.pid} ended: {errors.read_text()[-2000:]}"
    return line


def test_two_processes_never_overspend(tmp_path):
    """Two worker processes race for each of four fresh databases: both are connected
    before a common start time, then each asks for 0.6 of a budget of 1. The workers are
    started (and import dpsql) once, not once per round."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(root=str(ROOT)))
    errors = [tmp_path / f"worker{i}.err" for i in range(2)]
    procs = []
    for err in errors:
        with open(err, "w") as stream:
            procs.append(subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=stream, text=True))
    try:
        assert [_said(p, e) for p, e in zip(procs, errors)] == ["READY", "READY"]
        for r in range(4):
            path = str(tmp_path / f"race{r}.duckdb")
            make_adult_db(path, reuse=False, epsilon=1.0, delta=1e-5).close()
            _tell(procs, json.dumps(path))
            assert [_said(p, e) for p, e in zip(procs, errors)] == ["CONNECTED"] * 2
            _tell(procs, str(time.time() + 0.2))
            results = [_said(p, e) for p, e in zip(procs, errors)]
            _check_round(path, results)
    finally:
        for p in procs:
            p.stdin.close()
        for p in procs:
            p.wait()
    assert all(p.returncode == 0 for p in procs), [e.read_text()[-2000:] for e in errors]


def _tell(procs, line: str) -> None:
    for p in procs:
        p.stdin.write(line + "\n")
        p.stdin.flush()


def _check_round(path: str, results: list[str]) -> None:
    assert sorted(x.split()[0] for x in results) == ["LOST", "WON"], results
    loser = next(x for x in results if x.startswith("LOST"))
    assert "spent 0.6" in loser and "requested 0.6" in loser and "limit 1" in loser
    db = dpsql.connect(path, reuse=False)
    assert len(db.ledger()) == 1
    assert db.budget("adult")["epsilon_spent"] == Fraction(3, 5)
    db.close()


def test_threads_never_overspend(tmp_path):
    path = str(tmp_path / "threads.duckdb")
    make_adult_db(path, reuse=False, epsilon=1.0, delta=1e-5).close()
    outcomes = []
    barrier = threading.Barrier(8)

    def worker():
        db = dpsql.connect(path, reuse=False)
        barrier.wait()
        try:
            db.answer("SELECT COUNT(*) FROM adult", epsilon=0.3, delta=1e-7)
            outcomes.append("won")
        except BudgetExceededError:
            outcomes.append("lost")

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["lost"] * 5 + ["won"] * 3
    db = dpsql.connect(path, reuse=False)
    assert db.budget("adult")["epsilon_spent"] == Fraction(9, 10)
    assert len(db.ledger()) == 3

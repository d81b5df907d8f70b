"""Two OS processes, and many threads, racing for one budget never overspend it."""

from __future__ import annotations

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
    import sys, time
    sys.path.insert(0, {root!r})
    import dpsql
    from dpsql.errors import BudgetExceededError
    path, start = sys.argv[1], float(sys.argv[2])
    db = dpsql.connect(path, lock_timeout=60, reuse=False)
    while time.time() < start:
        time.sleep(0.001)
    try:
        db.answer("SELECT COUNT(*) FROM adult WHERE age < 40", epsilon=0.6, delta=1e-7)
        print("WON")
    except BudgetExceededError as exc:
        print("LOST", exc)
""")


def test_two_processes_never_overspend(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(root=str(ROOT)))
    rounds = 4
    for r in range(rounds):
        path = str(tmp_path / f"race{r}.duckdb")
        make_adult_db(path, reuse=False, epsilon=1.0, delta=1e-5).close()
        start = time.time() + 2.0  # both processes are importing by then
        procs = [subprocess.Popen([sys.executable, str(script), path, str(start)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        outs = [p.communicate(timeout=120) for p in procs]
        results = [o[0].strip() for o in outs]
        assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
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

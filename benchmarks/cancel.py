"""Cancel latency: how long after Ctrl-C (SIGINT), SIGTERM or ``cancel()`` control comes
back, for each long planning step, against the 1-s target (issue 22 item 2).

    PYTHONPATH=. python benchmarks/cancel.py            # latencies (a few minutes)
    PYTHONPATH=. python benchmarks/cancel.py --full     # also the full selection's duration
    PYTHONPATH=. python benchmarks/cancel.py --reuse    # the reuse decomposition only

Steps: strategy selection by each slow strategy (``optimal``, ``coa``, ``eigen``, and
``auto``) over 600 random ranges of a 2,048-value column; MWEM's planning of the same batch
runs inline and is timed (its duration bounds the latency there). Routes:

- ``SIGINT`` / ``SIGTERM``: ``dpsql explain`` of the batch in a child process; the signal is
  sent once the selection's worker process exists (or after 2 s for a step without one);
  the latency is signal -> the process has exited (its one-line message printed).
- ``cancel()``: ``Session.explain`` in a thread of this process; ``Session.cancel()`` from
  the main thread (what the DB-API's ``Connection.cancel()`` and the server's disconnect
  call); the latency is the call -> ``RequestCancelled`` raised in the thread.

``reuse``: the answers-from-past-releases decision of a request after one release of every
age (2,048 measurements): an eigendecomposition of the 2,048 x 2,048 Gram matrix of the past
measurements (``dpsql.mechanisms.reuse.pool``); the signal or cancel is sent once its worker
exists (or, when it runs inline, after :func:`patience`).
``--reuse`` measures this step only.

Latencies are wall-clock by nature; the machine is shared (load average printed). ``--full``
runs the ``optimal`` selection to its end and reports its CPU time (this process and its
reaped workers: ``RUSAGE_CHILDREN``), the figure tests/release/test_cancel.py relies on.
"""

from __future__ import annotations

import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import dpsql  # noqa: E402
from dpsql.errors import RequestCancelled  # noqa: E402
from dpsql.workload import limits  # noqa: E402

N_CELLS, N_RANGES = 2048, 600
TARGET = 1.0
STEPS = ("optimal", "coa", "eigen", "auto")
#: the reuse step: a release of every age, then a request over ranges of ages (identity)
REUSE_PAST = "SELECT age, COUNT(*) FROM adult GROUP BY age"
REUSE_BATCH = ["SELECT COUNT(*) FROM adult WHERE age BETWEEN 10 AND 900",
               "SELECT COUNT(*) FROM adult WHERE age BETWEEN 5 AND 2000"]


def batch(seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(N_RANGES):
        a = rng.randrange(N_CELLS)
        out.append(f"SELECT COUNT(*) FROM adult WHERE age BETWEEN {a} AND "
                   f"{rng.randrange(a, N_CELLS)}")
    return out


def database(where: str) -> str:
    from tests.conftest import ADULT_POLICY, raw_adult_file

    path = os.path.join(where, "wide.duckdb")
    shutil.copyfile(raw_adult_file(), path)
    policy = dict(ADULT_POLICY, epsilon=10.0, delta=1e-3)
    policy["columns"] = dict(policy["columns"],
                             age={"type": "integer", "min": 0, "max": N_CELLS - 1})
    with dpsql.connect(path) as db:
        db.protect("adult", policy)
    return path


def children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            pass
    return found


def in_long_step(pid: int, alive, patience: float) -> str:
    """Wait until ``pid`` runs a worker (``"worker"``), or ``patience`` seconds (``"inline"``:
    the step runs in the process itself), or the request ended (``"ended"``)."""
    started = time.monotonic()
    while alive():
        if children(pid):
            return "worker"
        if time.monotonic() - started > patience:
            return "inline"
        time.sleep(0.02)
    return "ended"


def patience(step: str, route: str = "signal") -> float:
    """How long to wait for a worker. The reuse step: 5 s in this process (past the pool's
    set-up), 60 s for a command (its start-up alone takes 10 s or more on a loaded machine)."""
    if step == "reuse":
        return 5.0 if route == "cancel()" else 60.0
    return 120.0


def strategy_of(step: str) -> str:
    return "identity" if step == "reuse" else step


def reuse_database(where: str) -> str:
    """The wide table after one release of every age (the reuse step's past release)."""
    os.makedirs(os.path.join(where, "reuse"))
    path = database(os.path.join(where, "reuse"))
    with dpsql.connect(path) as db:
        db.answer(REUSE_PAST, epsilon=0.5, delta=1e-6, strategy="identity")
    return path


def delta_of(step: str) -> str:
    return "0" if step.startswith("mwem") else "1e-6"


def mwem_planning(path: str, sql: list[str]) -> None:
    """MWEM's planning (compile, blocks, run-time check, explanation) runs inline: its
    duration bounds a cancel's latency there (SIGINT lands at once; a token at its end)."""
    with dpsql.connect(path) as db:
        for rounds in (10, 1000):
            started = time.monotonic()
            cpu = time.process_time()
            try:
                db.explain(sql, epsilon=0.5, delta=0, strategy=f"mwem(rounds={rounds})")
                outcome = "planned"
            except Exception as exc:          # e.g. refused by its run-time bound
                outcome = f"refused ({type(exc).__name__})"
            print(f"mwem(rounds={rounds}) planning: {time.monotonic() - started:.3f} s wall, "
                  f"{time.process_time() - cpu:.3f} s CPU, {outcome}", flush=True)


def by_signal(path: str, script: str, step: str, sig: int) -> tuple[float, str, str]:
    """Signal -> the one-line ``cancelled: ...`` message (what a terminal user sees before
    the prompt); the exit follows (interpreter shutdown, reported separately)."""
    argv = [sys.executable, "-m", "dpsql", "explain", path, script, "--epsilon", "0.5",
            "--delta", delta_of(step), "--strategy", strategy_of(step), "--time-limit", "86400",
            "--quiet"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    where = in_long_step(proc.pid, lambda: proc.poll() is None, patience(step))
    sent = time.monotonic()
    proc.send_signal(sig)
    message = None
    for line in proc.stderr:
        if line.startswith(("cancelled", "error")):
            message = time.monotonic()
            break
    proc.wait()
    exited = time.monotonic() - sent
    if message is None:
        return exited, where, f"exit {proc.returncode}, no message"
    return message - sent, where, f"exit {proc.returncode} after {exited:.2f} s"


def by_cancel(path: str, sql: list[str], step: str) -> tuple[float, str, str]:
    session = dpsql.connect(path)
    out: dict = {}

    def run() -> None:
        try:
            with limits.applied(time_limit=86400, max_memory=8 << 30):
                session.explain(sql, epsilon=0.5, delta=float(delta_of(step)),
                                strategy=strategy_of(step))
            out["result"] = "finished"
        except RequestCancelled:
            out["result"] = "cancelled"
        out["at"] = time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    where = in_long_step(os.getpid(), thread.is_alive, patience(step, "cancel()"))
    sent = time.monotonic()
    session.cancel()
    thread.join()
    session.close()
    return out["at"] - sent, where, out["result"]


def full_selection(path: str, sql: list[str]) -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = time.process_time()
    wall = time.monotonic()
    with dpsql.connect(path) as db, limits.applied(time_limit=86400, max_memory=8 << 30):
        db.explain(sql, epsilon=0.5, delta=1e-6, strategy="optimal")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    workers = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    print(f"\nfull optimal selection ({N_RANGES} ranges, n = {N_CELLS}): CPU "
          f"{time.process_time() - own + workers:.1f} s (workers {workers:.1f} s), wall "
          f"{time.monotonic() - wall:.1f} s, load average {os.getloadavg()[0]:.1f}")


def routes(path: str, script: str, sql: list[str], step: str) -> float:
    """Each route's latency for ``step``, printed; the worst."""
    worst = 0.0
    for route in ("SIGINT", "SIGTERM", "cancel()"):
        if route == "cancel()":
            latency, place, outcome = by_cancel(path, sql, step)
        else:
            sig = signal.SIGINT if route == "SIGINT" else signal.SIGTERM
            latency, place, outcome = by_signal(path, script, step, sig)
        worst = max(worst, latency)
        mark = "ok" if latency <= TARGET else "OVER"
        print(f"{step:<10} {route:<9} {place:<7} {latency:9.3f}  {outcome} {mark}",
              flush=True)
    return worst


def script_of(where: str, name: str, sql: list[str]) -> str:
    script = os.path.join(where, name)
    with open(script, "w") as f:
        f.write(";\n".join(sql) + ";\n")
    return script


def main() -> None:
    where = tempfile.mkdtemp(prefix="dpsql-cancel-bench-")
    try:
        sql = batch()
        print(f"cancel latency (target {TARGET:g} s); {N_RANGES} ranges over {N_CELLS} "
              f"cells; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(f"{'step':<10} {'route':<9} {'in':<7} {'latency s':>9}  outcome")
        worst = 0.0
        if "--reuse" not in sys.argv:
            path = database(where)
            script = script_of(where, "batch.sql", sql)
            for step in STEPS:
                worst = max(worst, routes(path, script, sql, step))
        reused = reuse_database(where)
        worst = max(worst, routes(reused, script_of(where, "reuse.sql", REUSE_BATCH),
                                  REUSE_BATCH, "reuse"))
        if "--reuse" not in sys.argv:
            mwem_planning(path, sql)
        print(f"worst latency {worst:.3f} s ({'within' if worst <= TARGET else 'over'} the "
              f"{TARGET:g}-s target)")
        if "--full" in sys.argv and "--reuse" not in sys.argv:
            full_selection(path, sql)
    finally:
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Benchmark: ``dpsql serve`` under load (issue 17), loopback only.

    python benchmarks/server_load.py [--clients 32] [--batches 20]

Run 1 (budget sized so no batch is refused): ``--clients`` psycopg clients, one analyst
each, send ``--batches`` batches each at the same time (the same two-statement batch, so
the strategy is cached after the first); then the same batches from as many in-process
threads, each with its own DB-API connection, on a fresh copy of the database. Printed:
p50/p95 latency of both, their ratio (target p95 ≤ 1.5x), and the ledger check: one
ledger row per batch, no release id twice, every release attributed to its analyst once.

Run 2 (a budget that runs out): the same load at epsilon 0.01 a batch against a table
budget of epsilon 0.1 (ten batches by basic composition; the zCDP route cannot add an
eleventh); printed: releases, refusals (all must be SQLSTATE 53400), and the overspend
check: the exact sum of the ledger's charges ≤ the table's epsilon, and the accountant's
reported total ≤ it. (Run 1's many tiny pure-epsilon charges may sum past the table's
epsilon legitimately: the zCDP route of the filter covers them, docs/accounting.md; its
check is the accountant's reported total.) Always exits 0 unless a
check fails (then 1): a benchmark, with its invariants checked.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from tests.interfaces.server_support import ServerProcess, make_database  # noqa: E402

BATCH = ("SELECT sex, count(*) FROM adult GROUP BY sex; "
         "SELECT count(*) FROM adult WHERE age > 40")
EPSILON = Fraction(1, 1000)
EPSILON_RUN2 = Fraction(1, 100)


def _quantiles(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2], xs[min(len(xs) - 1, int(0.95 * len(xs)))]


def _run_threads(n, work):
    results, threads = [None] * n, []
    start = threading.Barrier(n)
    for i in range(n):
        def body(i=i):
            start.wait()
            results[i] = work(i)
        threads.append(threading.Thread(target=body))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def over_the_wire(server, clients, batches, epsilon=EPSILON):
    def client(i):
        user = f"a{i:02d}"
        out = []
        # reuse off, as in-process: each batch is a release (with reuse, an analyst's own
        # repeated batch would be answered free from their first release)
        with psycopg.connect(server.dsn(user, password=user + "-pw", epsilon=str(epsilon),
                                        delta="0", reuse="false"), autocommit=True) as conn:
            for _ in range(batches):
                t0 = time.perf_counter()
                try:
                    conn.execute(BATCH).fetchall()
                    out.append(("ok", time.perf_counter() - t0))
                except psycopg.Error as exc:
                    out.append((exc.sqlstate, time.perf_counter() - t0))
        return out
    return [r for rs in _run_threads(clients, _guarded(client)) for r in rs]


def _guarded(client):
    def run(i):
        try:
            return client(i)
        except psycopg.Error as exc:            # a refused connection: counted, not lost
            return [(f"connect: {str(exc).splitlines()[-1][:120]}", 0.0)]
    return run


def in_process(db_path, clients, batches):
    from dpsql.interfaces import dbapi

    def worker(i):
        out = []
        with dbapi.connect(db_path, epsilon=float(EPSILON), delta=0, reuse=False) as conn:
            cur = conn.cursor()
            for _ in range(batches):
                t0 = time.perf_counter()
                cur.execute(BATCH)
                out.append(("ok", time.perf_counter() - t0))
        return out
    return [r for rs in _run_threads(clients, worker) for r in rs]


def ledger_check(db_path, expected, basic: bool):
    """One ledger row per release, each attributed once; no overspend (the charges' exact
    sum when ``basic``, always the accountant's reported total)."""
    import dpsql

    with dpsql.connect(db_path) as db:
        rows = db.ledger()
        policy = db.policies()["adult"]
        reported = Fraction(db.budget("adult")["epsilon_spent"])
    ids = [r["release_id"] for r in rows]
    spent = sum((Fraction(repr(r["epsilon"])) for r in rows), Fraction(0))
    journal = [json.loads(line) for line in open(db_path + ".analysts.jsonl")]
    settled = [r["release_id"] for r in journal if r["op"] == "settle" and r["release_id"]]
    ok = (len(ids) == len(set(ids)) and sorted(settled) == sorted(ids)
          and len(ids) == expected and reported <= policy.epsilon
          and (spent <= policy.epsilon or not basic))
    print(f"  ledger: {len(ids)} releases (expected {expected}), distinct ids "
          f"{len(set(ids))}, attributed {len(settled)}; sum of charges {spent}"
          f"{' <=' if spent <= policy.epsilon else ' (zCDP route) vs'} budget {policy.epsilon}"
          f", accountant's total {float(reported):.6g}: {'OK' if ok else 'FAILED'}")
    return ok


def run1(tmp: Path, clients: int, batches: int) -> bool:
    n = clients * batches
    allow = {f"a{i:02d}": (str(EPSILON * batches), "0") for i in range(clients)}
    wire_dir, local_dir = tmp / "run1", tmp / "local"
    wire_dir.mkdir()
    local_dir.mkdir()
    db, users = make_database(wire_dir, epsilon=float(EPSILON * (n + 1)), allowances=allow)
    server = ServerProcess(db, users, "--max-connections", str(clients + 4))
    try:
        wire = over_the_wire(server, clients, batches)
    finally:
        err = server.stop()
    if err.strip():
        print("  server stderr:", err.strip()[-2000:])
    refused = [s for s, _ in wire if s != "ok"]
    w50, w95 = _quantiles([t for _, t in wire])
    print(f"run 1: {clients} clients x {batches} batches over the wire: "
          f"p50 {w50 * 1e3:.1f} ms, p95 {w95 * 1e3:.1f} ms, refused {len(refused)}")
    ok = ledger_check(db, n, basic=False) and not refused
    db2, _ = make_database(local_dir, epsilon=float(EPSILON * (n + 1)), allowances=allow)
    inproc = in_process(db2, clients, batches)
    l50, l95 = _quantiles([t for _, t in inproc])
    print(f"       {clients} in-process workers, same batches: p50 {l50 * 1e3:.1f} ms, "
          f"p95 {l95 * 1e3:.1f} ms; wire/in-process p95 = {w95 / l95:.2f} (target <= 1.5)",
          flush=True)
    return ok


def run2(tmp: Path, clients: int, batches: int) -> bool:
    n = clients * batches
    directory = tmp / "run2"
    directory.mkdir()
    big = {f"a{i:02d}": ("1", "0") for i in range(clients)}
    db, users = make_database(directory, epsilon=float(EPSILON_RUN2 * 10), allowances=big)
    server = ServerProcess(db, users, "--max-connections", str(clients + 4))
    try:
        wire = over_the_wire(server, clients, batches, EPSILON_RUN2)
    finally:
        err = server.stop()
    if err.strip():
        print("  server stderr:", err.strip()[-2000:])
    released = sum(1 for s, _ in wire if s == "ok")
    states = sorted({s for s, _ in wire if s != "ok"})
    print(f"run 2: budget of 10 batches, {n} sent: released {released}, refused "
          f"{n - released} with SQLSTATEs {states}")
    return ledger_check(db, min(n, 10), basic=True) and set(states) <= {"53400"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--runs", default="1,2", help="which runs: 1, 2 or 1,2")
    a = p.parse_args(argv)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        if "1" in a.runs:
            ok &= run1(Path(tmp), a.clients, a.batches)
        if "2" in a.runs:
            ok &= run2(Path(tmp), a.clients, a.batches)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

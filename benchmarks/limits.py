"""Benchmark: predicted against measured planning memory and time (issue 22 item 3).

    python benchmarks/limits.py [--max-seconds S]

For growing batches, the planning step of every candidate strategy (plan + least-squares
error factors: :func:`dpsql.mechanisms.selection.evaluate`) and the singular value bound are
run on their own, each with a fresh ``V``, and compared with the prediction
:mod:`dpsql.mechanisms.fit` makes from the batch's size before any numerics:

- ``cube k``: ``GROUP BY CUBE`` over the first k of sex, race, income, marital_status,
  workclass, education, occupation (the packaged Adult policy: declared values plus
  ``other``), compiled from SQL;
- ``ranges n``: every range ``[i, j]`` over one ordered column of n parts (m = n(n+1)/2).

Peak memory is tracemalloc's peak (NumPy allocations included) over the step; time is
process CPU time measured in a separate, untraced run: tracemalloc hooks every Python
allocation and made the Python-heavy L1 Eigen-Design (scipy line searches over chains)
about 6x slower on small batches, a cost no request pays. ``ratio`` is
measured / predicted (target: within 2x, i.e. 0.5 to 2; a prediction above the measure is
the safe side); it is ``n/a`` below 1 MiB or 0.5 s, where fixed overheads dominate and no
limit is near. Steps predicted over ``--max-seconds`` are not run (``-``). The last column
is what ``auto`` does under the default limits (4 GiB, 60 s): candidates kept, or refused.
Then the refusal points of all-range workloads (predicted only): where the first candidate
is skipped, where only the identity is left, where compile refuses and where no candidate
fits. Always exits 0: a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import sys
import tracemalloc
from types import SimpleNamespace

for _threads in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")     # one core: CPU time is then the step's time

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dpsql import cancel  # noqa: E402
from dpsql.errors import BatchTooLarge  # noqa: E402
from dpsql.mechanisms import fit, halfwidths, matrix, selection  # noqa: E402
from dpsql.policy.policy import load_policy  # noqa: E402
from dpsql.errors import DpsqlError  # noqa: E402
from dpsql.sql.compile import (MAX_NONZEROS, ColumnPartition, Output, Workload,  # noqa: E402
                               compile_workload)
from dpsql.sql.implicit import compile_batch  # noqa: E402
from dpsql.sql.parse import parse_batch  # noqa: E402
from dpsql.workload import limits as planning  # noqa: E402

CUBE_COLUMNS = ("sex", "race", "income", "marital_status", "workclass", "education",
                "occupation")
POLICY = os.path.join(ROOT, "dpsql", "data", "adult_policy.toml")


def cube(k: int, policies) -> Workload:
    cols = ", ".join(CUBE_COLUMNS[:k])
    sql = f"SELECT {cols}, COUNT(*) FROM adult GROUP BY CUBE({cols})"
    queries = parse_batch(sql, lambda name, node: policies[name])
    return compile_workload(queries, policies["adult"])


def ranges(n: int) -> Workload:
    """Every range [i, j] over n ordered parts, as a compiled workload would hold it."""
    i, j = np.triu_indices(n)
    rows = np.repeat(np.arange(len(i)), j - i + 1)
    cols = np.concatenate([np.arange(a, b + 1) for a, b in zip(i, j)])
    W = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(i), n))
    part = ColumnPartition("x", np.arange(n), n, tuple((u,) for u in range(n)))
    query = SimpleNamespace(index=0, where=None, grouping_sets=(("x",),), count_column=None)
    return Workload("synthetic", (part,), W, (Output(query, 0, len(i), (), (), (), None),))


def measured(step, trace: bool = True):
    """(peak bytes, CPU seconds) of ``step()``: process CPU time plus that of the worker
    processes it forked and reaped (:func:`dpsql.cancel.run` computes a step predicted over
    ``cancel.long_step()`` in a forked child, whose time the parent's own clock never sees). CPU
    time, not wall-clock: the machine is shared, and its load moves wall-clock times by
    factors. ``trace``: tracemalloc's peak, with every step inline (a forked child's
    allocations are out of the parent's sight; the child's are the same numerics)."""
    inline = cancel.LONG_STEP, cancel.LONG_STEP_ALONE
    if trace:
        cancel.LONG_STEP = cancel.LONG_STEP_ALONE = math.inf
        tracemalloc.start()
    started = _cpu()
    try:
        step()
    except MemoryError:
        pass
    finally:
        cancel.LONG_STEP, cancel.LONG_STEP_ALONE = inline
    seconds = _cpu() - started
    peak = tracemalloc.get_traced_memory()[1] if trace else 0
    if trace:
        tracemalloc.stop()
    return peak, seconds


def _cpu() -> float:
    """CPU seconds of this process and of its reaped children (user + system)."""
    own, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                     resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def machine() -> str:
    """The machine's state for the figures: load average and the CPU seconds of a fixed
    reference step (the eigenvalues of a 1,000 x 1,000 matrix and a sparse Gram product on
    one BLAS thread; median of three): CPU time per step grows with the other jobs sharing the cores (caches,
    hyperthreads), so figures from runs at different loads compare only through it."""
    rng = np.random.default_rng(0)
    M = rng.standard_normal((1000, 1000))
    S = sp.random(20000, 1000, density=0.01, random_state=0, format="csr")
    seconds = sorted(measured(lambda: (np.linalg.eigvalsh(M + M.T), S.T @ S),
                              trace=False)[1] for _ in range(3))[1]
    return (f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, "
            f"reference step {seconds:.2f} s CPU (median of 3)")


def fresh(workload: Workload) -> None:
    object.__setattr__(workload, "_strategy_info", None)


def row(label: str, what: str, cost: planning.Cost, max_seconds: float, step) -> None:
    if cost.seconds > max_seconds or cost.memory > 2 * planning.GIB:
        print(f"{label:<12} {what:<14} {cost.memory / 2**20:>11.1f} {'-':>10} {'-':>6} "
              f"{cost.seconds:>9.2f} {'-':>9} {'-':>6}", flush=True)
        return
    _, seconds = measured(step, trace=False)      # tracemalloc slows Python-heavy steps
    peak, _ = measured(step)
    memory_ratio = (f"{peak / cost.memory:>6.2f}" if max(peak, cost.memory) >= 2 ** 20
                    else f"{'n/a':>6}")
    time_ratio = (f"{seconds / cost.seconds:>6.2f}" if max(seconds, cost.seconds) >= 0.5
                  else f"{'n/a':>6}")
    print(f"{label:<12} {what:<14} {cost.memory / 2**20:>11.1f} {peak / 2**20:>10.1f} "
          f"{memory_ratio} {cost.seconds:>9.2f} {seconds:>9.2f} {time_ratio}", flush=True)


def case(label: str, workload: Workload, max_seconds: float) -> None:
    names = selection.requested(_Policy, 1e-6, "auto")
    print(f"{label}: n = {workload.n_cells:,} cells, m = {workload.n_queries:,} queries, "
          f"nnz = {workload.W.nnz:,}; auto under the default limits: {auto(workload, names)}")
    fresh(workload)
    cost = planning.bound_cost(workload.n_cells, workload.n_queries, workload.W.nnz,
                               planning.gram_ops(workload.W))
    row(label, "svdb", cost, max_seconds,
        lambda: (fresh(workload), halfwidths.svdb(matrix.workload_info(workload))))
    seen = set()
    for family, name, strategy in names:
        if (name, type(strategy)) in seen or family == "laplace" and name != "eigen":
            continue                    # the shared strategies cost the same in both
        seen.add((name, type(strategy)))
        fresh(workload)
        cost = fit.predicted(workload, family, name, strategy)
        row(label, f"{name}/{family[:5]}", cost, max_seconds,
            lambda: (fresh(workload),
                     selection.evaluate(None, family, name, strategy, workload, False)))


def auto(workload: Workload, names) -> str:
    try:
        kept, skipped = fit.screen(workload, names, True)
    except BatchTooLarge:
        return "refused"
    bound = "" if fit.bound_fits(workload) is None else "; svdb skipped"
    return f"{len(kept)} of {len(names)} candidates kept{bound}"


class _Policy:
    delta = 1e-5


def refusal_points() -> None:
    """All ranges over n parts (m = n(n+1)/2, nnz = n(n+1)(n+2)/6), predicted only."""
    names = selection.requested(_Policy, 1e-6, "auto")
    limits = planning.current()
    print(f"\nrefusal points of all-range workloads under the default limits "
          f"({limits.describe()}), predicted:")
    said = set()
    for n in range(16, 4096, 8):
        m, nnz = n * (n + 1) // 2, n * (n + 1) * (n + 2) // 6
        kept = {nm for fm, nm, st in names
                if _cost(fm, nm, st, n, m, nnz).over(limits) is None}
        for what, hit in (("the first candidate is skipped", len(kept) < len(set(
                              nm for _, nm, _ in names))),
                          ("only identity fits", kept == {"identity"}),
                          ("compile refuses (nonzeros over MAX_NONZEROS)", nnz > MAX_NONZEROS),
                          ("refused (no candidate fits)", not kept)):
            if hit and what not in said:
                said.add(what)
                print(f"  from n = {n:,} (m = {m:,}, nnz = {nnz:,}): {what}")


def _cost(family, name, strategy, n, m, nnz):
    estimate = getattr(strategy, "estimated_seconds", None)
    class _N:  # noqa: E306
        pass
    info = _N()
    info.n, info.m = n, m
    key = "eigen/laplace" if family == "laplace" and name == "eigen" else name
    # WᵀW by column differences (dpsql.workload.matrix.gram_route): two per range, one for
    # the n ranges that end in the last column, and the dense passes 4n²
    return planning.candidate_cost(key, n, m, nnz, estimate(info) if estimate else 0.0,
                                   row_gram=4.0 * (m - n) + n + 4.0 * n * n)


def whole_requests(policies, max_seconds: float) -> int:
    """Whole requests through ``Session.answer`` (compile, selection under the limits, the
    kernel, inference, result tables) on a fresh copy of the packaged Adult database each:
    predicted (:func:`dpsql.mechanisms.fit.request_cost`: the dense candidates' model, or
    for a batch compiled to Kronecker blocks the implicit path's own,
    :func:`dpsql.mechanisms.implicit_cost.request_cost`) against measured, time and memory
    in two separate runs (tracemalloc slows Python-heavy steps)."""
    import shutil
    import tempfile

    import duckdb

    import dpsql

    folder = tempfile.mkdtemp(prefix="dpsql-limits-")
    base = os.path.join(folder, "base.duckdb")
    con = duckdb.connect(base)
    con.execute("CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true)",
                [os.path.join(ROOT, "dpsql", "data", "adult.csv.gz")])
    con.close()
    with dpsql.connect(base) as db:
        db.protect("adult", POLICY)
    print(f"# machine before: {machine()}")
    print(f"{'request':<12} {'n':>8} {'m':>8} {'pred MiB':>9} {'peak MiB':>9} {'ratio':>6} "
          f"{'pred s':>8} {'cpu s':>8} {'ratio':>6}  kept")
    names = selection.requested(_Policy, 1e-6, "auto")
    for k in range(2, len(CUBE_COLUMNS) + 1):
        cols = ", ".join(CUBE_COLUMNS[:k])
        sql = f"SELECT {cols}, COUNT(*) FROM adult GROUP BY CUBE({cols})"
        workload = compile_batch(parse_batch(sql, lambda name, node: policies[name]),
                                 policies["adult"])       # as the request compiles it
        try:
            cost = fit.request_cost(workload, names)
            kept = "implicit" if getattr(workload, "implicit", False) else \
                f"{len(fit.screen(workload, names, True)[0])}/{len(names)}"
        except BatchTooLarge:
            print(f"cube {k}: refused under the default limits")
            continue
        runs = []
        for trace in (False, True):
            if trace and runs[0][1] > max_seconds:
                runs.append((math.nan, math.nan))
                continue
            path = os.path.join(folder, f"cube{k}-{trace}.duckdb")
            shutil.copyfile(base, path)
            with dpsql.connect(path, reuse=False) as db:
                runs.append(measured(lambda: db.answer(sql, epsilon=0.01, delta=1e-6),
                                     trace=trace))
            os.remove(path)
        peak, seconds = runs[1][0], runs[0][1]
        print(f"{'cube ' + str(k):<12} {workload.n_cells:>8,} {workload.n_queries:>8,} "
              f"{cost.memory / 2**20:>9.1f} {peak / 2**20:>9.1f} "
              f"{peak / cost.memory:>6.2f} {cost.seconds:>8.2f} {seconds:>8.2f} "
              f"{seconds / cost.seconds:>6.2f}  {kept}", flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    print(f"# machine after: {machine()}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-seconds", type=float, default=20.0)
    parser.add_argument("--fit", action="store_true",
                        help="calibrate the time model on random batches and stop")
    parser.add_argument("--requests", action="store_true",
                        help="whole requests only (dpsql answer, predicted vs measured)")
    parser.add_argument("--only", help="with --fit: refit these steps only (comma-separated, "
                        "e.g. eigen,optimal,eigen/laplace)")
    args = parser.parse_args()
    if args.fit:
        from benchmarks.limits_fit import FIT_BATCHES, calibrate

        calibrate(FIT_BATCHES, None if args.only is None else set(args.only.split(",")))
        return 0
    policies = load_policy(POLICY)
    if args.requests:
        return whole_requests(policies, args.max_seconds)
    print(f"# machine before: {machine()}")
    print(f"{'batch':<12} {'step':<14} {'pred MiB':>11} {'peak MiB':>10} {'ratio':>6} "
          f"{'pred s':>9} {'actual s':>9} {'ratio':>6}")
    for k in range(2, len(CUBE_COLUMNS) + 1):
        try:
            workload = cube(k, policies)
        except DpsqlError as exc:
            print(f"cube {k}: refused by compile: {exc}")
            continue
        case(f"cube {k}", workload, args.max_seconds)
    for n in (64, 128, 256, 512, 1024):
        case(f"ranges {n}", ranges(n), args.max_seconds)
    print(f"# machine after: {machine()}")
    refusal_points()
    return 0


if __name__ == "__main__":
    sys.exit(main())

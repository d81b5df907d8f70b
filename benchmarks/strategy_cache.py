"""Benchmark: the strategy cache — first (cold) selection against a cache hit, end to end.

    python benchmarks/strategy_cache.py [--rows N] [--repeat R] [--only CASE ...] [--no-answer]
                                        [--no-profile]

Each case is a batch of SQL counting queries compiled against a protected table into
n >= 512 cells. For ``strategy="auto"`` and ``strategy="optimal"`` it starts from a copy of
the protected database with an empty cache and times

- the first ``db.explain`` (cold: the optimised strategies are selected and stored),
- the second ``db.explain`` (cache hit), and the median of ``R`` further hits,
- the speed-up (first / second) against the issue's target (>= 10x for n >= 512),
- whether the chosen plan is identical (same strategy, σ, expected RMSE and matrix ``A``
  bit for bit, the hit's plan being the one re-read and re-verified from the cache);

then, on another fresh copy, ``db.answer`` cold against ``db.answer`` again (warm: the
strategy cached by the first release), and finally a profile of one cache hit split by
phase (parse, compile, svdb, cache look-up, the cheap strategies ``auto`` re-plans every
time, least squares, ...), so that a missed target says where the hit's time goes.

It is a benchmark, not a test: it prints the figures with PASS / MISS and always exits 0.
The machine load (``os.getloadavg``) is printed with the results: timings on a shared
machine are inflated, and a multi-threaded BLAS competing with other jobs for the cores can
make small dense factorisations 10x slower; ``OPENBLAS_NUM_THREADS=1`` gives steadier figures
there.
"""

from __future__ import annotations

import argparse
import cProfile
import math
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from importlib import resources

import duckdb
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dpsql  # noqa: E402

TARGET = 10.0
EPSILON, DELTA = 1.0, 1e-6


def _ranges(column: str, table: str, lo: int, hi: int, count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)  # benchmark query text only
    out = []
    for _ in range(count):
        a, b = sorted(int(v) for v in rng.choice(np.arange(lo, hi + 1), 2, replace=False))
        out.append(f"SELECT COUNT(*) FROM {table} WHERE {column} BETWEEN {a} AND {b}")
    return out


def synthetic_case(size: int, queries: int, histogram: bool, seed: int = 0) -> dict:
    """Table ``t(x)`` with ``x`` declared integer 0..size-1; random range COUNTs (plus the
    full histogram ``GROUP BY x`` when ``histogram``, which makes every value a cell)."""
    stmts = _ranges("x", "t", 0, size - 1, queries, seed)
    if histogram:
        stmts.insert(0, "SELECT x, COUNT(*) FROM t GROUP BY x")
    return {
        "table": "t",
        "create": f"CREATE TABLE t AS SELECT CAST(floor(random() * {size}) AS INTEGER) AS x "
                  "FROM range(?)",
        "policy": {"epsilon": 1e6, "delta": 0.5,
                   "columns": {"x": {"type": "integer", "min": 0, "max": size - 1}}},
        "sql": ";\n".join(stmts),
    }


def adult_case() -> dict:
    """The shipped Adult extract and policy: an age histogram plus a sex x race cube per age
    band and one conjunction (cells: 74 ages x 3 sex parts x 6 race parts = 1332; each
    categorical column also has its implicit ``other`` part)."""
    data = resources.files("dpsql") / "data"
    bands = [(17, 24), (25, 34), (35, 44), (45, 54), (55, 64), (65, 90)]
    stmts = ["SELECT age, COUNT(*) FROM adult GROUP BY age"]
    stmts += [f"SELECT sex, race, COUNT(*) FROM adult WHERE age BETWEEN {a} AND {b} "
              "GROUP BY CUBE(sex, race)" for a, b in bands]
    stmts += ["SELECT COUNT(*) FROM adult WHERE age >= 40 AND sex = 'Female' AND "
              "race <> 'White'"]
    return {
        "table": "adult",
        "create": "CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true)",
        "create_arg": str(data / "adult.csv.gz"),
        "policy": dict(_adult_policy(str(data / "adult_policy.toml")), epsilon=1e6,
                       delta=0.5),
        "sql": ";\n".join(stmts),
    }


def _adult_policy(path: str) -> dict:
    import tomllib

    with open(path, "rb") as fh:
        return dict(tomllib.load(fh)["tables"]["adult"])


CASES = {
    "ranges n~540 (400 random ranges on 0..1023)": lambda: synthetic_case(1024, 400, False),
    "histogram+ranges n=1024": lambda: synthetic_case(1024, 200, True, seed=1),
    "histogram+ranges n=2048": lambda: synthetic_case(2048, 200, True, seed=2),
    "adult multi-column n=1332 (age x sex x race)": adult_case,
}


def build(case: dict, rows: int, directory: str) -> str:
    """A protected template database for ``case`` (copied for each cold start)."""
    path = os.path.join(directory, "template.duckdb")
    con = duckdb.connect(path)
    con.execute(case["create"], [case.get("create_arg", rows)])
    con.close()
    db = dpsql.connect(path)
    db.protect(case["table"], case["policy"])
    db.close()
    return path


def fresh(template: str, directory: str, tag: str) -> "dpsql.Session":
    path = os.path.join(directory, f"{tag}.duckdb")
    shutil.copyfile(template, path)
    return dpsql.connect(path)


def chosen(expl):
    """The chosen candidate (auto may compare the same name in two noise families)."""
    mechanism = getattr(expl, "mechanism", None)
    return next(c for c in expl.candidates if c.strategy == expl.strategy
                and getattr(c, "mechanism", None) == mechanism)


def named(expl) -> str:
    mechanism = getattr(expl, "mechanism", None)
    return expl.strategy + (f"/{mechanism}" if mechanism else "")


def _dense(A):
    if A is None:
        return None
    return A.toarray() if hasattr(A, "toarray") else np.asarray(A)


def identical(e1, e2) -> bool:
    c1, c2 = chosen(e1), chosen(e2)
    A1, A2 = _dense(c1.plan.A), _dense(c2.plan.A)
    same_matrix = (A1 is None and A2 is None) or (
        A1 is not None and A2 is not None and A1.shape == A2.shape
        and bool(np.array_equal(A1, A2)))
    return (e1.strategy == e2.strategy and e1.sigma == e2.sigma and e1.rmse == e2.rmse
            and same_matrix and bool(np.array_equal(e1.stderr, e2.stderr)))


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


# ---------------------------------------------------------------- profile of one hit
#: (label, file suffixes, function names): cumulative time of the outermost match
PHASES = [
    ("parse (sqlglot + allow-list)", ("sql/parse.py",), ("parse_batch",)),
    ("compile (cells, W)", ("sql/compile.py",), ("compile_workload",)),
    ("svdb (eigenvalues of V or WWᵀ)", ("session.py", "selection.py"), ("svdb",)),
    ("V = WᵀW (dense)", ("strategies/base.py",), ("V",)),
    ("cache look-up + re-verify", ("strategy_cache.py",), ("load", "fingerprint")),
    ("re-planned cheap strategies", ("strategies/identity.py", "strategies/workload.py",
                                     "strategies/hierarchical.py", "strategies/wavelet.py",
                                     "strategies/fourier.py"), ("plan",)),
    ("cached strategies' plan() (0 on a hit)", ("strategies/eigen.py", "strategies/optimal.py",
                                                 "strategies/coa.py"), ("plan",)),
    ("least squares: factorisation", ("inference.py",), ("__init__",)),
    ("least squares: error factors", ("inference.py",), ("error_factors",)),
    ("noise calibration", ("noise.py",), ("calibrate_with_rounding",)),
    ("database connection", ("engine.py",), ("connect",)),
]


def profile_hit(db, sql: str, strategy: str) -> list[tuple[str, float]]:
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    db.explain(sql, epsilon=EPSILON, delta=DELTA, strategy=strategy)
    prof.disable()
    total = time.perf_counter() - t
    stats = pstats.Stats(prof).stats
    out = []
    for label, suffixes, names in PHASES:
        seconds = 0.0
        for (filename, _, func), (_, _, _, cum, callers) in stats.items():
            if func not in names or not filename.replace("\\", "/").endswith(suffixes):
                continue
            # count only outermost calls (a caller outside this phase)
            inner = any(cf in names and cfile.replace("\\", "/").endswith(suffixes)
                        for (cfile, _, cf) in callers)
            if not inner:
                seconds += cum
        out.append((label, seconds))
    accounted = sum(s for _, s in out)
    out.append(("other", max(0.0, total - accounted)))
    out.append(("total (under the profiler)", total))
    return out


def run_case(label: str, case: dict, rows: int, repeat: int, answer: bool,
             profile: bool) -> list[str]:
    directory = tempfile.mkdtemp(prefix="dpsql-cache-bench-")

    class _Lines(list):
        def append(self, line):  # print as soon as measured
            print(line, flush=True)
            super().append(line)

    lines = _Lines()
    try:
        template = build(case, rows, directory)
        sql = case["sql"]
        for strategy in ("auto", "optimal"):
            db = fresh(template, directory, f"explain-{strategy}")
            e1, cold = timed(lambda: db.explain(sql, epsilon=EPSILON, delta=DELTA,
                                                strategy=strategy))
            e2, hit = timed(lambda: db.explain(sql, epsilon=EPSILON, delta=DELTA,
                                               strategy=strategy))
            more = [timed(lambda: db.explain(sql, epsilon=EPSILON, delta=DELTA,
                                             strategy=strategy))[1] for _ in range(repeat)]
            hit_median = statistics.median([hit] + more)
            cached = [named(c) for c in e2.candidates if c.cached]
            speed = cold / hit
            lines.append(
                f"  explain {strategy:<8} n={e1.n_cells:<5} m={e1.n_queries:<5} "
                f"chosen={named(e1):<17} cold {cold:7.2f}s  hit {hit:6.2f}s "
                f"(median of {1 + repeat}: {hit_median:5.2f}s)  speed-up {speed:5.1f}x "
                f"[{'PASS' if speed >= TARGET else 'MISS'}]  identical plan: "
                f"{'yes' if identical(e1, e2) else 'NO'}  cached: {','.join(cached) or '-'}")
            sel = [(named(c), c.seconds) for c in e1.candidates if math.isfinite(c.rmse)]
            lines.append("      cold selection seconds: " + ", ".join(
                f"{s} {t:.2f}" for s, t in sel))
            if profile:
                lines.append(f"      where a hit's time goes ({strategy}):")
                for phase, seconds in profile_hit(db, sql, strategy):
                    if seconds >= 0.0005 or phase.startswith("total"):
                        lines.append(f"        {phase:<42} {seconds:7.3f}s")
            db.close()
            if answer:
                db = fresh(template, directory, f"answer-{strategy}")
                r1, a_cold = timed(lambda: db.answer(sql, epsilon=EPSILON, delta=DELTA,
                                                     strategy=strategy))
                r2, a_warm = timed(lambda: db.answer(sql, epsilon=EPSILON, delta=DELTA,
                                                     strategy=strategy))
                same = (r1.strategy, r1.expected_rmse) == (r2.strategy, r2.expected_rmse)
                lines.append(
                    f"  answer  {strategy:<8} cold {a_cold:7.2f}s  warm {a_warm:6.2f}s  "
                    f"speed-up {a_cold / a_warm:5.1f}x "
                    f"[{'PASS' if a_cold / a_warm >= TARGET else 'MISS'}]  same strategy "
                    f"and expected RMSE: {'yes' if same else 'NO'}")
                db.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000,
                    help="rows of the synthetic table (default 100000)")
    ap.add_argument("--repeat", type=int, default=3, help="further cache hits timed")
    ap.add_argument("--only", nargs="*", help="substrings of the case names to run")
    ap.add_argument("--no-answer", action="store_true", help="skip answer cold vs warm")
    ap.add_argument("--no-profile", action="store_true", help="skip the profile of a hit")
    args = ap.parse_args(argv)
    load = os.getloadavg()
    print(f"strategy cache: epsilon={EPSILON}, delta={DELTA}; target: a hit >= {TARGET:g}x "
          f"faster than the first selection (n >= 512); load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs; "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}",
          flush=True)
    for label, make in CASES.items():
        if args.only and not any(s in label for s in args.only):
            continue
        print(label, flush=True)
        run_case(label, make(), args.rows, args.repeat, not args.no_answer,
                 not args.no_profile)
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: the strategy cache — first (cold) selection against a cache hit, end to end.

    python benchmarks/strategy_cache.py [--rows N] [--repeat R] [--only CASE ...] [--no-answer]
                                        [--no-profile]

Each case is a batch of SQL counting queries compiled against a protected table into
n >= 512 cells. For ``strategy="auto"`` and ``strategy="optimal"`` it starts from a copy of
the protected database with an empty cache (and an empty in-process parse/compile memo, as
in a new process) and times

- the first ``db.explain`` (cold: parse, compile, every candidate selected, factorised and
  stored), the second ``db.explain`` (a hit: the selection cache), and the median of ``R``
  further hits; the speed-up (cold / median hit) against the issue's target (>= 10x for
  n >= 512); whether the hit's explanation is identical (every candidate's σ, sensitivity,
  expected RMSE and standard errors bit for bit, and the chosen plan's matrix ``A``, the
  hit's being the one re-read and re-verified from the cache);
- on another fresh copy, the first ``db.answer`` (cold) against the median of ``R + 1``
  further identical answers (hits), with ``reuse=False`` where the session offers it (else a
  repeated batch would be answered from the first release, which is not what is measured
  here); same strategy and expected RMSE;
- a profile of one explain hit and one answer hit split by phase, so that a missed target
  says where the time goes.

It is a benchmark, not a test: it prints the figures with PASS / MISS and always exits 0.
The machine load (``os.getloadavg``) is printed with the results: timings on a shared
machine are inflated, and a multi-threaded BLAS competing with other jobs for the cores can
make small dense factorisations 10x slower; ``OPENBLAS_NUM_THREADS=1`` gives steadier figures
there.
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
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
from dpsql.sql import memo  # noqa: E402

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


def _eq(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a)
                      and math.isnan(b))


def identical(e1, e2) -> bool:
    """Same choice, same numbers for every candidate, same chosen matrix (bit for bit)."""
    c1, c2 = chosen(e1), chosen(e2)
    A1, A2 = _dense(c1.plan.A), _dense(c2.plan.A)
    same_matrix = (A1 is None and A2 is None) or (
        A1 is not None and A2 is not None and A1.shape == A2.shape
        and bool(np.array_equal(A1, A2)))
    same_candidates = len(e1.candidates) == len(e2.candidates) and all(
        a.strategy == b.strategy and a.mechanism == b.mechanism and _eq(a.sigma, b.sigma)
        and _eq(a.sensitivity, b.sensitivity) and _eq(a.rmse, b.rmse)
        and np.array_equal(a.stderr, b.stderr) for a, b in zip(e1.candidates, e2.candidates))
    return (e1.strategy == e2.strategy and e1.sigma == e2.sigma and e1.rmse == e2.rmse
            and same_matrix and bool(np.array_equal(e1.stderr, e2.stderr))
            and same_candidates)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


# ---------------------------------------------------------------- profile of one hit
#: (label, file suffixes, function names, nested): cumulative time of the outermost calls;
#: nested phases ("of which") are inside an earlier phase and not added to the total
EXPLAIN_PHASES = [
    ("database connection", ("engine.py",), ("connect",), False),
    ("parse + compile (memo)", ("session.py",), ("_compile", "_parse"), False),
    ("parse (sqlglot + allow-list)", ("sql/parse.py",), ("parse_batch",), True),
    ("compile (cells, W)", ("sql/compile.py",), ("compile_workload",), True),
    ("selection (select)", ("selection.py",), ("select",), False),
    ("selection cache look-up", ("selection_cache.py",), ("load",), True),
    ("chosen plan: read + re-verify", ("strategy_cache.py",), ("load_entry",), True),
    ("svdb (0 on a hit)", ("halfwidths.py",), ("svdb",), True),
    ("strategies' plan() (0 on a hit)", ("strategies/",), ("plan",), True),
    ("least squares (0 on a hit)", ("inference.py",), ("_factorise", "error_factors"), True),
    ("noise calibration", ("noise.py", "laplace.py"),
     ("calibrate_with_rounding", "laplace_scale"), True),
]
ANSWER_PHASES = EXPLAIN_PHASES[:2] + [
    ("policies, named releases, targets", ("ledger.py", "session.py"),
     ("load_policies", "find_named", "_check_targets"), False),
    ("selection (select)", ("selection.py",), ("select",), False),
    ("solver: stored factor or factorise", ("inference.py",), ("_ensure",), False),
    ("interval half-widths", ("halfwidths.py", "session.py"), ("interval_halfwidths",), False),
    ("budget check", ("ledger.py",), ("check_fits",), False),
    ("kernel: charge, read data, noise", ("kernel/boundary.py",), ("release",), False),
    ("ledger charge", ("ledger.py",), ("charge",), True),
    ("result table names (table_exists)", ("session.py",), ("result_names",), True),
    ("data vector (GROUP BY)", ("kernel/data.py",), ("_data_vector",), True),
    ("noise sampling", ("noise.py",), ("sample", "laplace"), True),
    ("least-squares answers", ("inference.py",), ("answers",), False),
    ("reuse record", ("reuse/records.py",), ("record_of",), False),
    ("write result tables + mark released", ("session.py",), ("_write",), False),
    ("engine.write_table", ("engine.py",), ("write_table",), True),
    ("ledger.mark_released", ("ledger.py",), ("mark_released",), True),
    ("reuse store", ("reuse/records.py",), ("store",), True),
]


def profile(fn, phases) -> list[tuple[str, float, bool]]:
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    fn()
    prof.disable()
    total = time.perf_counter() - t
    stats = pstats.Stats(prof).stats
    out = []
    for label, suffixes, names, nested in phases:
        seconds = 0.0
        for (filename, _, func), (_, _, _, cum, callers) in stats.items():
            path = filename.replace("\\", "/")
            if func not in names or not any(x in path for x in suffixes):
                continue
            # count only outermost calls (a caller outside this phase)
            inner = any(cf in names and any(x in cfile.replace("\\", "/") for x in suffixes)
                        for (cfile, _, cf) in callers)
            if not inner:
                seconds += cum
        out.append((label, seconds, nested))
    accounted = sum(s for _, s, nested in out if not nested)
    out.append(("other", max(0.0, total - accounted), False))
    out.append(("total (under the profiler)", total, False))
    return out


def show_profile(lines, title: str, rows) -> None:
    lines.append(f"      {title}:")
    for phase, seconds, nested in rows:
        if seconds >= 0.0005 or phase.startswith("total"):
            label = ("  of which " + phase) if nested else phase
            lines.append(f"        {label:<46} {seconds:7.3f}s")


def answer_kwargs(db) -> dict:
    """``reuse=False`` when the session has release reuse (a repeated batch would be
    answered from the first release: not the path measured here)."""
    params = inspect.signature(db.answer).parameters
    return {"reuse": False} if "reuse" in params else {}


def run_answers(lines, template: str, directory: str, sql: str, strategy: str, kw: dict,
                repeat: int, prof: bool) -> None:
    """Answer cold (empty cache, empty memo) against answer hits: the second release of
    the batch, each into its own copy of the database as the first release left it (so
    every hit writes into a catalog of the same size: each release adds one result table
    per statement, and some per-table look-ups grow with the catalog)."""
    db = fresh(template, directory, f"answer-{strategy}")
    akw = dict(kw, **answer_kwargs(db))
    memo.clear()
    r1, a_cold = timed(lambda: db.answer(sql, **akw))
    first = db.db.path                # the database as the first release left it
    db.close()
    hits = []
    for i in range(1 + repeat):
        db = fresh(first, directory, f"hit-{strategy}-{i}")
        hits.append(timed(lambda: db.answer(sql, **akw)))
        db.close()
    if prof:
        db = fresh(first, directory, f"profile-{strategy}")
        rows = profile(lambda: db.answer(sql, **akw), ANSWER_PHASES)
        db.close()
    a_hit = statistics.median(t for _, t in hits)
    same = all((r1.strategy, r1.expected_rmse) == (r.strategy, r.expected_rmse)
               for r, _ in hits)
    lines.append(
        f"  answer  {strategy:<8} cold {a_cold:7.2f}s  hit {a_hit:6.3f}s "
        f"(median of {len(hits)})  speed-up {a_cold / a_hit:6.1f}x "
        f"[{'PASS' if a_cold / a_hit >= TARGET else 'MISS'}]  same strategy "
        f"and expected RMSE: {'yes' if same else 'NO'}  "
        f"({len(r1.tables)} result tables per release)")
    if prof:
        show_profile(lines, f"where an answer hit's time goes ({strategy})", rows)


def run_case(label: str, case: dict, rows: int, repeat: int, answer: bool,
             prof: bool) -> list[str]:
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
            kw = dict(epsilon=EPSILON, delta=DELTA, strategy=strategy)
            db = fresh(template, directory, f"explain-{strategy}")
            memo.clear()                      # a cold request: as in a new process
            e1, cold = timed(lambda: db.explain(sql, **kw))
            hits = [timed(lambda: db.explain(sql, **kw)) for _ in range(1 + repeat)]
            e2, hit = hits[0][0], statistics.median(t for _, t in hits)
            cached = [named(c) for c in e2.candidates if c.cached]
            speed = cold / hit
            lines.append(
                f"  explain {strategy:<8} n={e1.n_cells:<5} m={e1.n_queries:<5} "
                f"chosen={named(e1):<17} cold {cold:7.2f}s  hit {hit:6.3f}s "
                f"(median of {1 + repeat})  speed-up {speed:6.1f}x "
                f"[{'PASS' if speed >= TARGET else 'MISS'}]  identical explanation: "
                f"{'yes' if all(identical(e1, e) for e, _ in hits) else 'NO'}  "
                f"cached: {len(cached)}/{len(e2.candidates)}")
            sel = [(named(c), c.seconds) for c in e1.candidates if math.isfinite(c.rmse)]
            lines.append("      cold selection seconds: " + ", ".join(
                f"{s} {t:.2f}" for s, t in sel))
            if prof:
                show_profile(lines, f"where an explain hit's time goes ({strategy})",
                             profile(lambda: db.explain(sql, **kw), EXPLAIN_PHASES))
            db.close()
            if answer:
                run_answers(lines, template, directory, sql, strategy, kw, repeat, prof)
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
    ap.add_argument("--no-profile", action="store_true", help="skip the profiles of hits")
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

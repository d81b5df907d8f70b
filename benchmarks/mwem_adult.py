"""MWEM against the best data-independent pure ε-DP strategy and svdb on Adult (issue "Pure ε-DP
and MWEM").

    python benchmarks/mwem_adult.py [--quick] [--runs N] [--rounds T ...] [--epsilons E ...]
    python benchmarks/mwem_adult.py | tee benchmarks/results/mwem_adult.txt    # the full run

Three workloads, each written as SQL and compiled by dpsql against the benchmark's own policy
(the public domains below; the table's row count N = 32,561 is declared public, as MWEM's
paper assumes N known: MWEM then spends no budget on it, the data-independent strategies do
not use it):

- (a) all 2,080 range queries over ``capital_loss``, declared ``integer 0..4356`` with
  ``step = 69``: 64 equal-width bins of 69 dollars (the last one 4347..4356), every range
  ``[bin a, bin b]``, ``a <= b``;
- (b) 300 random 2-D rectangles over ``age × hours_per_week`` (seed 7), ``age`` integer
  17..90 in 15 bins of 5 years (the last 87..90), ``hours_per_week`` integer 1..99 in 20 bins
  of 5 hours (the last 96..99): up to 300 cells (fewer if the rectangles leave some bin
  boundaries unused: the compiler merges them);
- (c) all 15 two-way marginals (``GROUP BY a, b``) over 6 categorical columns: ``sex``,
  ``race``, ``income``, ``relationship``, ``marital_status``, ``workclass`` (declared values
  as in dpsql/data/adult_policy.toml; ``?`` falls in ``workclass``'s implicit ``other``):
  359 queries over 3·6·3·7·8·9 = 27,216 cells (each column's ``other`` is a cell).

For each ε ∈ {0.01, 0.05, 0.1, 0.5, 1} the table shows the average squared error per query
(MSE, over every query of the workload) of

- **MWEM** (dpsql.mwem.run_mwem) with the paper's practical variants: last iterate, uniform
  start, and ``replay`` (every past measurement re-applied after each round). (a), (b):
  single-query candidates, ``replay = 100``; (c): whole marginals as candidates
  (``cuboids``), ``replay = 30``. T in {5, 10, 20, 40} ({5, 10, 20} for (c): a replay pass
  there touches all 27,216 cells once per past marginal, and T = 40 would cost minutes per
  run), 10 runs each; the table reports the best T in hindsight (as the paper's figures do;
  this favours MWEM) and its mean MSE with the standard error of that mean. dpsql's default
  ``replay = 10`` is run too on (a) and (b), as a check (it under-fits at large ε: on (a)
  with ε = 100 and T = 5 its MSE is ~1.8e5, against ~3e3 with replay = 100);
- the **best data-independent pure-DP strategy**: dpsql's Laplace family as ``auto``
  compares it under δ = 0 (:func:`dpsql.selection.select`), its *expected* MSE, exact (no
  simulation). Selected once at ε = 1; every candidate's MSE at another ε is its variance
  at that ε (:func:`dpsql.selection.noise_scale`, the secure sampler's calibration) times
  its exact error factors, checked against a direct ``select`` on (a);
- **svdb**: the Laplace-calibrated singular value bound,
  ``bound_rmse("laplace", ε, 0, "analytic", svdb(info), m)²`` — no data-independent
  matrix-mechanism strategy has a lower expected MSE.

Simulation. MWEM runs against :class:`dpsql.kernel.MeasureOracle` — the kernel's own oracle
class (same scores, same exact sensitivities, same ``laplace_scale`` calibration, same
budget checks) — holding the true data vector, but with
:class:`dpsql.noise.SeededTestSampler`: seeded numpy noise of the same distributions
(continuous Laplace, Gumbel-max exponential mechanism; :func:`dpsql.laplace.seeded_laplace`,
:func:`dpsql.laplace.seeded_exponential`) instead of OpenDP's exact samplers. The data
vector is counted by the benchmark's own DuckDB query and checked against
:func:`dpsql.engine.data_vector`. The blocks are the pipeline's (:func:`dpsql.adaptive.blocks_for`).
Not private: a benchmark, not a release.

End to end. One configuration — workload (b), ε = 0.1, the best T found for it — also runs
through ``dpsql.connect(...).answer(sql, epsilon=0.1, delta=0,
strategy="mwem(rounds=T, replay=100)")``
on a DuckDB file holding Adult, with the real secure sampler (OpenDP); its MSE against the
exact counts (computed by DuckDB on the raw table) and wall time are printed.

A benchmark, not a test: it always exits 0. The machine load is printed (shared machine).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import shutil
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import duckdb  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dpsql  # noqa: E402
from dpsql import adaptive, engine, selection  # noqa: E402
from dpsql.domain import CategoricalDomain, IntegerDomain  # noqa: E402
from dpsql.kernel import MeasureOracle  # noqa: E402
from dpsql.mwem import MWEMOptions, run_mwem  # noqa: E402
from dpsql.noise import SeededTestSampler  # noqa: E402
from dpsql.policy import load_policy  # noqa: E402
from dpsql.sql.compile import compile_workload  # noqa: E402
from dpsql.sql.parse import parse_batch  # noqa: E402

SHARED_CSV = ROOT.parent / "shared" / "data" / "adult.csv"
PACKAGED_CSV = ROOT / "dpsql" / "data" / "adult.csv.gz"

N_ROWS = 32561
EPSILONS = (0.01, 0.05, 0.1, 0.5, 1.0)
ROUNDS = (5, 10, 20, 40)
RUNS = 10
DEFAULT_REPLAY = 10          # dpsql's MWEMOptions default, shown as a check on (a), (b)
E2E_EPSILON = 0.1

CL_STEP, CL_BINS = 69, 64                 # capital_loss 0..4356 in 64 bins of 69
AGE_MIN, AGE_MAX, AGE_STEP = 17, 90, 5    # 15 bins
HRS_MIN, HRS_MAX, HRS_STEP = 1, 99, 5     # 20 bins
N_RECT, RECT_SEED = 300, 7
MARGINAL_COLUMNS = ("sex", "race", "income", "relationship", "marital_status", "workclass")

POLICY = {
    "epsilon": 1000.0, "delta": 1e-5, "rows": N_ROWS,
    "columns": {
        "capital_loss": {"type": "integer", "min": 0, "max": 4356, "step": CL_STEP},
        "age": {"type": "integer", "min": AGE_MIN, "max": AGE_MAX, "step": AGE_STEP},
        "hours_per_week": {"type": "integer", "min": HRS_MIN, "max": HRS_MAX,
                           "step": HRS_STEP},
        "sex": {"type": "categorical", "values": ["Female", "Male"]},
        "race": {"type": "categorical", "values": [
            "White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other"]},
        "income": {"type": "categorical", "values": ["<=50K", ">50K"]},
        "relationship": {"type": "categorical", "values": [
            "Husband", "Not-in-family", "Own-child", "Unmarried", "Wife", "Other-relative"]},
        "marital_status": {"type": "categorical", "values": [
            "Married-civ-spouse", "Divorced", "Never-married", "Separated", "Widowed",
            "Married-spouse-absent", "Married-AF-spouse"]},
        "workclass": {"type": "categorical", "values": [
            "Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov",
            "State-gov", "Without-pay", "Never-worked"]},
    },
}


def adult_csv() -> str:
    """The shared extract when present (developer checkouts), else the packaged copy."""
    return str(SHARED_CSV if SHARED_CSV.exists() else PACKAGED_CSV)


def load_text() -> str:
    load = os.getloadavg()
    return f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs"


# ------------------------------------------------------------------------------ workloads

def sql_capital_loss_ranges() -> list[str]:
    def hi(b):
        return min(CL_STEP * b + CL_STEP - 1, 4356)
    return [f"SELECT COUNT(*) FROM adult WHERE capital_loss BETWEEN {CL_STEP * a} AND {hi(b)}"
            for a in range(CL_BINS) for b in range(a, CL_BINS)]


def sql_age_hours_rectangles(count: int = N_RECT, seed: int = RECT_SEED) -> list[str]:
    rng = np.random.default_rng(seed)          # the public workload, not noise
    n_age = (AGE_MAX - AGE_MIN) // AGE_STEP + 1
    n_hrs = (HRS_MAX - HRS_MIN) // HRS_STEP + 1
    out = []
    for _ in range(count):
        a = np.sort(rng.integers(0, n_age, 2))
        h = np.sort(rng.integers(0, n_hrs, 2))
        alo, ahi = AGE_MIN + AGE_STEP * a[0], min(AGE_MIN + AGE_STEP * a[1] + AGE_STEP - 1,
                                                  AGE_MAX)
        hlo, hhi = HRS_MIN + HRS_STEP * h[0], min(HRS_MIN + HRS_STEP * h[1] + HRS_STEP - 1,
                                                  HRS_MAX)
        out.append(f"SELECT COUNT(*) FROM adult WHERE age BETWEEN {alo} AND {ahi} "
                   f"AND hours_per_week BETWEEN {hlo} AND {hhi}")
    return out


def sql_marginals() -> list[str]:
    return [f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}"
            for a, b in itertools.combinations(MARGINAL_COLUMNS, 2)]


#: label -> (SQL builder, MWEM options besides rounds, T grid)
WORKLOADS = {
    "(a) capital_loss all ranges": (sql_capital_loss_ranges, {"replay": 100}, ROUNDS),
    "(b) age x hours rectangles": (sql_age_hours_rectangles, {"replay": 100}, ROUNDS),
    # whole marginals as candidates; replay and T=40 cut for time (a round's replay touches
    # all 27,216 cells once per past marginal: T=20 with replay=30 already takes ~3 s a run)
    "(c) 2-way marginals, 6 cols": (sql_marginals, {"cuboids": True, "replay": 30},
                                    (5, 10, 20)),
}


# ------------------------------------------------------------------------------ data vector

def unit_sql(name: str, dom) -> str:
    """The unit (declared value / integer bin) of a row's value, by the README's rules."""
    col = f'"{name}"'
    if isinstance(dom, IntegerDomain):
        # not nullable: NULL counts at min; out-of-domain values are clamped
        return (f"(LEAST(GREATEST(COALESCE({col}, {dom.min}), {dom.min}), {dom.max}) "
                f"- {dom.min}) // {dom.step}")
    if isinstance(dom, CategoricalDomain):
        cases = " ".join(f"WHEN {col} = '{v}' THEN {k}" for k, v in enumerate(dom.values))
        return f"CASE {cases} ELSE {len(dom.values)} END"      # other (and NULL)
    raise TypeError(f"unsupported domain {dom!r}")


def data_vector(con, policy, workload) -> np.ndarray:
    """Cell counts of a compiled block by the benchmark's own GROUP BY over the units."""
    parts = workload.partitions
    doms = [policy.column(p.column) for p in parts]
    keys = ", ".join(f"{unit_sql(p.column, d)} AS u{i}"
                     for i, (p, d) in enumerate(zip(parts, doms)))
    rows = con.execute(f"SELECT {keys}, count(*) FROM adult GROUP BY ALL").fetchall()
    units = np.array([r[:-1] for r in rows], dtype=np.int64).reshape(len(rows), len(parts))
    counts = np.array([r[-1] for r in rows], dtype=float)
    idx = [p.unit_to_part[units[:, i]] for i, p in enumerate(parts)]
    shape = tuple(int(p.unit_to_part.max()) + 1 for p in parts)
    cell = np.ravel_multi_index(idx, shape) if parts else np.zeros(len(rows), dtype=np.int64)
    x = np.bincount(cell, weights=counts, minlength=workload.n_cells)
    # cross-check against dpsql's own count (the kernel's query)
    columns = [(p.column, policy.column(p.column), p.unit_to_part) for p in parts]
    ref = engine.data_vector(con, "adult", columns, workload.n_cells)
    if not np.array_equal(x, ref):
        raise SystemExit("data vector mismatch between the benchmark's query and dpsql's "
                         "engine.data_vector")
    return x


# ------------------------------------------------------------------------------ measures

class Case:
    """One workload compiled: the matrix-mechanism workload and MWEM's blocks, plus truth."""

    def __init__(self, label, sql, policy, con, options, rounds):
        self.options, self.rounds = dict(options), tuple(rounds)
        started = time.perf_counter()
        self.label, self.sql = label, sql
        queries = parse_batch(";\n".join(sql), lambda name, node: policy)
        self.workload = compile_workload(queries, policy)
        self.compiled, self.blocks = adaptive.blocks_for(queries, policy)
        self.xs = [data_vector(con, policy, w) for w, _ in self.compiled]
        self.truth = [np.asarray(b.W @ x, dtype=float) for b, x in zip(self.blocks, self.xs)]
        self.m = self.workload.n_queries
        self.n = self.workload.n_cells
        self.compile_seconds = time.perf_counter() - started
        started = time.perf_counter()
        self.info = selection.workload_info(self.workload)
        self.svdb = selection.svdb(self.info)
        expl = selection.select(None, policy, self.workload, 1.0, 0, "auto", "analytic")
        self.candidates = []       # (name, plan, mean error factor)
        self.skipped = []
        for c in expl.candidates:
            if not math.isfinite(c.rmse):
                self.skipped.append(f"{c.strategy}: {c.note}")
                continue
            variance = selection.noise_scale("laplace", c.plan, 1.0, 0, "analytic")[1]
            self.candidates.append((c.strategy, c.plan, c.rmse ** 2 / variance))
        self.select_seconds = time.perf_counter() - started

    def best_independent(self, eps: float) -> tuple[str, float]:
        mses = [(factor * selection.noise_scale("laplace", plan, eps, 0, "analytic")[1], name)
                for name, plan, factor in self.candidates]
        mse, name = min(mses)
        return name, mse

    def svdb_mse(self, eps: float) -> float:
        return selection.bound_rmse("laplace", eps, 0, "analytic", self.svdb, self.m) ** 2

    def mwem_mse(self, eps: float, rounds: int, seed: int, **options) -> float:
        oracle = MeasureOracle(self.xs, SeededTestSampler(seed), Fraction(repr(eps)))
        opts = MWEMOptions(rounds=rounds, iterate="last", total=N_ROWS, **options)
        result = run_mwem(self.blocks, Fraction(repr(eps)), oracle, opts)
        err = np.concatenate([a - t for a, t in zip(result.answers, self.truth)])
        return float(np.mean(err ** 2))


def seed_of(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])


# ------------------------------------------------------------------------------ end to end

def end_to_end(csv: str, sql: list[str], eps: float, spec: str) -> tuple[float, float, str]:
    """(MSE vs exact counts, seconds of db.answer, ledger note) of one real MWEM release."""
    tmp = tempfile.mkdtemp(prefix="dpsql-mwem-bench-")
    try:
        path = os.path.join(tmp, "adult.duckdb")
        con = duckdb.connect(path)
        con.execute("CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true)", [csv])
        exact = np.array([con.execute(q).fetchone()[0] for q in sql], dtype=float)
        con.close()
        db = dpsql.connect(path)
        db.protect("adult", POLICY)
        started = time.perf_counter()
        release = db.answer(sql, epsilon=eps, delta=0, strategy=spec)
        seconds = time.perf_counter() - started
        answers = []
        for table in release.results:
            k = table.columns.index("count")
            answers.extend(float(row[k]) for row in table.rows)
        answers = np.array(answers)
        entry = db.ledger("adult")[-1]
        db.close()
        note = (f"release {release.release_id}: private={release.private}, ledger mechanism="
                f"{entry.get('mechanism')}, ε charged={entry.get('epsilon')}, "
                f"{len(release.tables)} result tables")
        return float(np.mean((answers - exact) ** 2)), seconds, note
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------------ main

def describe(options: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in options.items())


def sweep(case, wi, eps_grid, rounds, runs, options, tag=0):
    """{(ε, T): (mean MSE, standard error)} over `runs` seeded runs each."""
    out = {}
    for ei, eps in enumerate(eps_grid):
        started = time.perf_counter()
        for T in rounds:
            vals = [case.mwem_mse(eps, T, seed_of(tag, wi, ei, T, r), **options)
                    for r in range(runs)]
            out[(eps, T)] = (float(np.mean(vals)),
                             float(np.std(vals, ddof=1) / math.sqrt(runs)) if runs > 1
                             else math.nan)
        print(f"  done {case.label} ε={eps:g} [{describe(options)}] "
              f"({time.perf_counter() - started:.1f}s)", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke run (~15 s): ε 0.05 and 0.5, T 5 and 10, 2 runs, (c) "
                         "skipped, end-to-end on 60 rectangles")
    ap.add_argument("--runs", type=int, help=f"MWEM runs per (ε, T) (default {RUNS})")
    ap.add_argument("--epsilons", type=float, nargs="*", help=f"ε grid (default {EPSILONS})")
    ap.add_argument("--no-e2e", action="store_true", help="skip the end-to-end release")
    args = ap.parse_args(argv)
    eps_grid = tuple(args.epsilons or ((0.05, 0.5) if args.quick else EPSILONS))
    runs = args.runs or (2 if args.quick else RUNS)
    workloads = dict(WORKLOADS)
    if args.quick:
        workloads = {k: (b, o, (5, 10)) for k, (b, o, _) in workloads.items()
                     if not k.startswith("(c)")}
    t_start = time.perf_counter()

    csv = adult_csv()
    print(f"# python benchmarks/mwem_adult.py{' --quick' if args.quick else ''}   data: {csv}; "
          f"started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    print(f"load average at start {load_text()} (shared machine: seconds are inflated)")
    print(f"MSE = average squared error per query. MWEM: last iterate, uniform start, "
          f"N={N_ROWS} public, {runs} runs per (ε, T), best T in hindsight; options per "
          f"workload below. Simulated oracle = dpsql.kernel.MeasureOracle + SeededTestSampler "
          f"(continuous Laplace, Gumbel-max EM). Data-independent: dpsql's Laplace family "
          f"(auto, δ=0), exact expected MSE. svdb: Laplace-calibrated singular value bound.",
          flush=True)

    policy = load_policy({"tables": {"adult": POLICY}})["adult"]
    con = duckdb.connect()
    con.execute("CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true)", [csv])

    cases = []
    for label, (build, options, rounds) in workloads.items():
        case = Case(label, build(), policy, con, options, rounds)
        cases.append(case)
        print(f"{label}: {case.m} queries over {case.n} cells (shape {case.workload.shape}); "
              f"MWEM {describe(options)}, T in {list(rounds)}; compile + data vector "
              f"{case.compile_seconds:.1f}s, strategy selection {case.select_seconds:.1f}s; "
              f"data-independent candidates: "
              + ", ".join(f"{name}" for name, _, _ in case.candidates)
              + (f"; skipped: {'; '.join(case.skipped)}" if case.skipped else ""), flush=True)
    con.close()

    # the rescaled expected MSE equals a direct select at that ε
    a = cases[0]
    direct = selection.select(None, policy, a.workload, 0.1, 0, "auto", "analytic")
    name, mse = a.best_independent(0.1)
    if direct.strategy != name or abs(direct.rmse ** 2 / mse - 1) > 1e-9:
        print(f"WARNING: rescaled expected MSE {name} {mse} differs from select at ε=0.1: "
              f"{direct.strategy} {direct.rmse ** 2}")

    started = time.perf_counter()
    main_runs, default_runs = {}, {}
    for wi, case in enumerate(cases):
        main_runs[case.label] = sweep(case, wi, eps_grid, case.rounds, runs, case.options)
        if case.options.get("replay") != DEFAULT_REPLAY and not case.options.get("cuboids"):
            default_runs[case.label] = sweep(case, wi, eps_grid, case.rounds, runs,
                                             {"replay": DEFAULT_REPLAY}, tag=1)
    mwem_seconds = time.perf_counter() - started
    n_runs = runs * len(eps_grid) * sum(len(c.rounds) * (1 + (c.label in default_runs))
                                        for c in cases)

    header = (f"{'workload':<29} {'ε':>5} {'MWEM MSE (best T)':>22} {'T':>3} "
              f"{'best data-indep.':>16} {'its MSE':>11} {'svdb MSE':>11} {'MWEM/svdb':>9} "
              f"{'MWEM/indep':>10} {'MWEM wins?':>10}")
    print()
    print(header)
    print("-" * len(header))
    best_t, sim = {}, {}
    for case in cases:
        by = main_runs[case.label]
        for eps in eps_grid:
            T = min(case.rounds, key=lambda t: by[(eps, t)][0])
            mse, se = by[(eps, T)]
            best_t[(case.label, eps)], sim[(case.label, eps)] = T, mse
            name, ind = case.best_independent(eps)
            bound = case.svdb_mse(eps)
            verdict = "yes" if mse < bound else "vs indep." if mse < ind else "no"
            print(f"{case.label:<29} {eps:>5g} {mse:>12.4g} ±{se:>8.2g} {T:>3} "
                  f"{name:>16} {ind:>11.4g} {bound:>11.4g} {mse / bound:>9.3g} "
                  f"{mse / ind:>10.3g} {verdict:>10}")
    print("MWEM wins?: 'yes' = MWEM's mean MSE below svdb (so below every data-independent "
          "strategy); 'vs indep.' = below the best data-independent strategy dpsql offers "
          "but not below svdb; 'no' = above both. ± = standard error of MWEM's mean over the "
          "runs.")
    print()
    print(f"MWEM mean MSE by T ({runs} runs each; options as above)")
    print(f"{'workload':<29} {'ε':>5}  T: MSE ...")
    for case in cases:
        by = main_runs[case.label]
        for eps in eps_grid:
            print(f"{case.label:<29} {eps:>5g} " + " ".join(
                f"{'T=' + str(t):>5} {by[(eps, t)][0]:>10.4g}" for t in case.rounds))
    if default_runs:
        print()
        print(f"Check: dpsql's default replay={DEFAULT_REPLAY} (otherwise as above), best T "
              f"and its mean MSE; ratio to the replay used in the main table")
        for label, by in default_runs.items():
            case = next(c for c in cases if c.label == label)
            for eps in eps_grid:
                T = min(case.rounds, key=lambda t: by[(eps, t)][0])
                print(f"{label:<29} {eps:>5g} T={T:<3} MSE {by[(eps, T)][0]:>11.4g}  "
                      f"x{by[(eps, T)][0] / sim[(label, eps)]:.2f} vs "
                      f"{describe(case.options)}")
    print(f"MWEM simulation time: {mwem_seconds:.1f}s for {n_runs} runs")

    if not args.no_e2e:
        label = "(b) age x hours rectangles"
        case = next(c for c in cases if c.label == label)
        sql = sql_age_hours_rectangles(60 if args.quick else N_RECT)
        T = best_t.get((label, E2E_EPSILON), 10)
        spec = f"mwem(rounds={T}, " + ", ".join(f"{k}={v}" for k, v in case.options.items()) + ")"
        print()
        print(f"End to end: {label}{' (first 60)' if args.quick else ''}, ε={E2E_EPSILON}, "
              f"db.answer(..., delta=0, strategy='{spec}'), secure sampler (OpenDP)",
              flush=True)
        try:
            mse, seconds, note = end_to_end(csv, sql, E2E_EPSILON, spec)
            ref = sim.get((label, E2E_EPSILON))
            ref = (f"simulated mean at this T: {ref:.4g}" if ref is not None and not args.quick
                   else "no simulated reference for this ε / subset")
            print(f"  MSE vs exact counts {mse:.4g} (one run; {ref}); db.answer wall time "
                  f"{seconds:.1f}s; {note}")
        except Exception as exc:   # a benchmark: report, do not crash
            print(f"  FAILED: {type(exc).__name__}: {exc}")
    print()
    print(f"total wall time {time.perf_counter() - t_start:.1f}s; load average at end "
          f"{load_text()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

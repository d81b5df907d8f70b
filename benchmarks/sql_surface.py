"""A reporting batch with COUNT, SUM, AVG and quantiles: answered jointly vs one query at a
time (issue 20).

    python benchmarks/sql_surface.py [--sql sql/reporting_sums.sql] [--releases N]

Loads the Adult extract into a temporary DuckDB file, protects it with the packaged policy
(``dpsql/data/adult_policy.toml``: hours_per_week in [0, 100], age in [17, 90]) and reads the
batch, ε and δ from the reporting script (committed before it was measured: 20 COUNT,
20 SUM(hours_per_week), 10 AVG(age) and 5 quantiles by group). Then, at the same (ε, δ):

- **joint** (dpsql): the batch as one workload, one charge: a strategy per data vector and
  the budget split between them (:mod:`dpsql.release.joint`); a quantile's CDF counts are
  rows of the counts' vector;
- **per query** (the SmartNoise-style baseline): each of the S statements spends ε/S and
  δ/S (basic composition: the same total), a Gaussian with the analytic calibration at its
  own sensitivity — 1 for a COUNT (a row is in one group), M = 100 for SUM(hours_per_week);
  an AVG is a SUM and a COUNT at half the statement's budget each (as SmartNoise does); a
  quantile is the statement alone answered by dpsql at ε/S, δ/S (one release each).

Printed per aggregate type, in its own units (never one mixed figure): the exact expected
RMSE of both (COUNT and SUM: from the plans' standard errors; AVG: the delta method at the
exact sums and counts, which the benchmark reads — it is not a release) and their ratio;
COUNT and SUM must be at least 2x lower jointly. ``--releases N`` adds the empirical RMSE
and the 95% interval coverage of N seeded releases of the joint plan (the AVG interval
widths among them), and per quantile statement, in its own units, joint vs per query over
N seeded releases each: the RMSE against the rule on exact counts and against DuckDB's
exact quantile, the median 95% interval width, the interval's coverage and the share of
NULL answers (as :mod:`benchmarks.quantiles`; its ``truth`` gives the exact values, for
statements without WHERE). Process CPU time of planning (explain) is printed first.

On ``sql/reporting_sums.sql`` the three age quantiles refine the batch to unit ages (23,976
cells): every dense strategy but identity is over the memory limit and a batch with SUM/AVG
takes the dense form, so the joint COUNT and SUM lose to per query there (the figures:
``benchmarks/results/sql_surface.txt``).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from fractions import Fraction

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import dpsql  # noqa: E402
from benchmarks.quantiles import _stats, truth  # noqa: E402
from dpsql.inference.ratios import ratio  # noqa: E402
from dpsql.kernel.data import _data_vectors  # noqa: E402
from dpsql.noise.gaussian import analytic_gaussian_sigma  # noqa: E402
from dpsql.noise.samplers import SeededTestSampler  # noqa: E402
from dpsql.release import matrix  # noqa: E402
from dpsql.release.mechanism import Ask, Public  # noqa: E402
from dpsql.request.declared import SETTINGS  # noqa: E402
from dpsql.request.value import Request  # noqa: E402
from dpsql.sql.script import parse_script  # noqa: E402
from dpsql.store import ledger  # noqa: E402
from dpsql.workload.values import ValueBound  # noqa: E402

POLICY = os.path.join(ROOT, "dpsql", "data", "adult_policy.toml")
KINDS = ("count", "sum", "avg")
UNITS = {"count": "rows", "sum": "hours", "avg": "years", "age": "years",
         "hours_per_week": "hours"}
Z95 = 1.959963984540054


def adult_db(path: str, sampler=None):
    from tests.conftest import raw_adult_file

    shutil.copyfile(raw_adult_file(), path)
    db = dpsql.connect(path, sampler=sampler, reuse=False)
    db.protect("adult", POLICY)
    return db


def batch(sql_path: str):
    """(statements, ε, δ) of the reporting script's one workload."""
    with open(sql_path, encoding="utf-8") as f:
        script = parse_script(f.read(), declared=SETTINGS)
    (w,) = script.workloads
    return list(w.sql), Fraction(w.epsilon), Fraction(w.delta)


def joint_plan(db, statements, eps, dlt):
    with db.db.connect() as con:
        public = Public(con, ledger.load_policies(con))
        return matrix.plan(Ask(Request(statements, epsilon=eps, delta=dlt), release=False),
                           public)


def exact_vectors(db, plan) -> list:
    """Per data vector, the exact answers of its rows (a benchmark reads the data)."""
    split = plan.split
    with db.db.connect() as con:
        x, sums = _data_vectors(con, plan.policy, split.base,
                                [v.value for v in split.vectors[1:]])
    out = [np.asarray(split.vectors[0].workload.W @ x).reshape(-1)]
    for v, s in zip(split.vectors[1:], sums):
        unit = float(ValueBound(v.value.lo, v.value.hi).unit)
        out.append(np.asarray(v.workload.W @ (s.astype(float) * unit)).reshape(-1))
    return out


def row_kinds(split) -> list:
    """Per row of W: count, sum, avg, or quantile (a row of a quantile's CDF)."""
    return ["quantile" if q.quantile is not None else q.aggregate for q in split.owners]


def per_answer(plan, exact, se_of) -> dict:
    """{kind: (exact answers, expected standard errors)} from per-vector standard errors
    ``se_of[v][i]`` (the AVG by the delta method at the exact values)."""
    split, out = plan.split, {k: ([], []) for k in KINDS}
    for r, kind in enumerate(row_kinds(split)):
        v, i = split.numerator[r]
        if kind == "quantile":      # a quantile's CDF rows: measured, reported apart
            continue
        if kind != "avg":
            out[kind][0].append(exact[v][i])
            out[kind][1].append(se_of[v][i])
            continue
        c, j = split.denominator[r]
        total, count = exact[v][i], exact[c][j]
        out["avg"][0].append(total / count)
        out["avg"][1].append(ratio(total, se_of[v][i], count, se_of[c][j], (-1e300, 1e300))[1])
    return {k: (np.asarray(a), np.asarray(s)) for k, (a, s) in out.items()}


def baseline_se(plan, eps, dlt) -> list:
    """Per data vector and row, the per-query baseline's standard error."""
    split = plan.split
    n_statements = len(split.base.outputs)
    budget = {}          # statement index -> the (ε, δ) each of its aggregates spends
    for o in split.base.outputs:
        parts = 2 if o.query.aggregate == "avg" else 1
        budget[o.query.index] = (eps / n_statements / parts, dlt / n_statements / parts)
    out = []
    for v in split.vectors:
        bound = 1.0 if v.value is None else float(ValueBound(v.value.lo, v.value.hi).bound)
        se = []
        for o in v.workload.outputs:
            e, d = budget[o.query.index]
            sigma = analytic_gaussian_sigma(float(e), float(d), bound)
            se += [sigma] * (o.stop - o.start)
        out.append(np.asarray(se))
    return out


def rmse(se: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(se)))) if se.size else math.nan


def _session(path: str, seed: int):
    db = adult_db(path, SeededTestSampler(seed))
    db.protect("adult", {"tables": {"adult": _huge_budget()}}, replace=True)
    return db


def released(db_path: str, statements, eps, dlt, releases: int, plan, truth_of,
             quantiles: dict) -> tuple:
    """Joint: ``releases`` seeded releases of the batch. ({kind: (errors, stderr,
    half-widths)}, {statement: [(value, low, high, rule, exact)]})."""
    db = _session(db_path, 11)
    kinds = row_kinds(plan.split)
    got = {k: ([], [], []) for k in KINDS}
    quant = {i: [] for i in quantiles}
    for _ in range(releases):
        results = db.answer(statements, epsilon=eps, delta=dlt).results
        for o in plan.split.base.outputs:
            table = results[o.query.index]
            if o.query.index in quantiles:
                _quantile_rows(table, quantiles[o.query.index][-1], quant[o.query.index])
                continue
            for row, values in zip(range(o.start, o.stop), table.rows, strict=True):
                value, se, low, high = values[-4:]
                if value is not None:
                    got[kinds[row]][0].append(value - truth_of[row])
                    got[kinds[row]][1].append(se)
                    got[kinds[row]][2].append((high - low) / 2)
    db.close()
    return {k: tuple(np.asarray(a, dtype=float) for a in v) for k, v in got.items()}, quant


def per_query_quantiles(db_path: str, statements, eps, dlt, releases: int,
                        quantiles: dict) -> dict:
    """Per query: each quantile statement alone at ε/S, δ/S through dpsql (S statements in
    the batch), ``releases`` times: {statement: [(value, low, high, rule, exact)]}."""
    db = _session(db_path, 12)
    n = len(statements)
    quant = {i: [] for i in quantiles}
    for _ in range(releases):
        for i, (*_, table_truth) in quantiles.items():
            (table,) = db.answer(statements[i], epsilon=eps / n, delta=dlt / n).results
            _quantile_rows(table, table_truth, quant[i])
    db.close()
    return quant


def _quantile_rows(table, table_truth: dict, out: list) -> None:
    for row in table.rows:
        key, (value, _se, low, high) = tuple(row[:-4]), row[-4:]
        if key in table_truth:
            out.append((value, low, high) + table_truth[key])


def quantile_truths(plan) -> dict:
    """{statement index: (label, column, {group key: (rule on exact counts, DuckDB's
    exact quantile)})} of the batch's quantile statements (read from the raw data)."""
    import duckdb
    from tests.conftest import raw_adult_file

    out = {}
    con = duckdb.connect(raw_adult_file(), read_only=True)
    for o in plan.split.base.outputs:
        q = o.query.quantile
        if q is None:
            continue
        label = (f"q{float(q.q):g}_{q.kind}({q.column})"
                 + (f" by {', '.join(o.key_columns)}" if o.key_columns else ""))
        out[o.query.index] = (label, q.column,
                              truth(con, q.column, float(q.q), q.kind, tuple(o.key_columns)))
    con.close()
    return out


def _huge_budget() -> dict:
    import tomllib

    with open(POLICY, "rb") as f:
        spec = tomllib.load(f)["tables"]["adult"]
    return dict(spec, epsilon=100_000, delta=0.5)


def expected(plan, exact, eps, dlt) -> dict:
    """Print the expected RMSE per aggregate type, joint and per query; {kind: joint se}."""
    joint = per_answer(plan, exact, [e.stderr for e, _ in plan.parts])
    base = per_answer(plan, exact, baseline_se(plan, eps, dlt))
    print(f"\nexpected RMSE per aggregate type (exact; AVG by the delta method at the "
          f"exact values; quantiles: empirical only, below)\n{'aggregate':<10} "
          f"{'answers':>7} {'joint':>12} {'per query':>12} {'ratio':>7}  unit")
    ok = True
    for k in KINDS:
        j, b = rmse(joint[k][1]), rmse(base[k][1])
        print(f"{k.upper():<10} {joint[k][1].size:>7} {j:>12.4g} {b:>12.4g} "
              f"{b / j:>7.2f}  {UNITS[k]}")
        if k in ("count", "sum"):
            ok &= b / j >= 2
    print(f"COUNT and SUM at least 2x lower jointly: {'yes' if ok else 'NO'}")
    return {k: joint[k][1] for k in KINDS}


def answer_truths(plan, exact) -> np.ndarray:
    """Per row of W: its exact answer (an AVG: the exact sum / the exact count)."""
    split = plan.split
    out = np.empty(len(split.owners))
    for r, kind in enumerate(row_kinds(split)):
        v, i = split.numerator[r]
        out[r] = exact[v][i]
        if kind == "avg":
            c, j = split.denominator[r]
            out[r] = exact[v][i] / exact[c][j]
    return out


def print_releases(releases: int, got: dict, joint_se: dict) -> None:
    print(f"\n{releases} seeded releases of the joint plan\n{'aggregate':<10} "
          f"{'empirical RMSE':>15} {'expected':>10} {'95% coverage':>13} "
          f"{'mean half-width':>16}")
    for k in KINDS:
        err, se, half = got[k]
        cover = float(np.mean(np.abs(err) <= Z95 * se))
        print(f"{k.upper():<10} {rmse(err):>15.4g} {rmse(joint_se[k]):>10.4g} "
              f"{cover:>13.3f} {float(np.mean(half)):>16.4g}")


def print_quantiles(releases: int, quantiles: dict, joint: dict, single: dict, n: int) -> None:
    """Per quantile statement, in its own units: joint vs per query."""
    print(f"\nquantiles: {releases} seeded releases, joint (the batch) vs per query (the "
          f"statement alone at epsilon/{n}, delta/{n}); RMSE against the rule on exact "
          f"counts and against DuckDB's exact quantile; median 95% interval width; the "
          f"interval's coverage of the exact-count value; share of NULL answers")
    head = (f"{'statement':<36} {'mode':<9} {'RMSE':>8} {'RMSE/DuckDB':>11} "
            f"{'CI width':>9} {'coverage':>8} {'NULL':>5}  unit")
    print(head)
    ratios = []
    for i, (label, column, _) in quantiles.items():
        stats = {}
        for mode, rows in (("joint", joint[i]), ("per query", single[i])):
            s = stats[mode] = _stats(rows)
            print(f"{label:<36} {mode:<9} {s['rmse']:>8.3f} {s['rmse_exact']:>11.3f} "
                  f"{s['width']:>9.2f} {s['coverage']:>8.3f} {s['null']:>5.2f}  "
                  f"{UNITS.get(column, column)}")
        ratios.append(stats["per query"]["rmse"] / stats["joint"]["rmse"])
    print("quantile RMSE per query / joint, per statement: "
          + ", ".join(f"{r:.2f}" for r in ratios))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sql", default=os.path.join(ROOT, "sql", "reporting_sums.sql"))
    ap.add_argument("--releases", type=int, default=0)
    args = ap.parse_args()
    statements, eps, dlt = batch(args.sql)
    work = tempfile.mkdtemp(prefix="dpsql-sql-surface-")
    try:
        db = adult_db(os.path.join(work, "plan.duckdb"))
        started, wall = time.process_time(), time.perf_counter()
        plan = joint_plan(db, statements, eps, dlt)
        cpu = time.process_time() - started
        children = os.times().children_user + os.times().children_system
        print(f"batch {os.path.relpath(args.sql, ROOT)}: {len(statements)} statements, "
              f"{plan.split.base.n_queries} answers over {plan.split.base.n_cells} cells; "
              f"epsilon={float(eps):g} delta={float(dlt):g}")
        print(f"planning (explain, cold): {cpu:.1f} s CPU + {children:.1f} s in workers, "
              f"{time.perf_counter() - wall:.1f} s wall")
        print(plan.explanation)
        exact = exact_vectors(db, plan)
        db.close()
        joint_se = expected(plan, exact, eps, dlt)
        if args.releases:
            quantiles = quantile_truths(plan)
            got, joint_q = released(os.path.join(work, "runs.duckdb"), statements, eps, dlt,
                                    args.releases, plan, answer_truths(plan, exact),
                                    quantiles)
            print_releases(args.releases, got, joint_se)
            if quantiles:
                single = per_query_quantiles(os.path.join(work, "single.duckdb"),
                                             statements, eps, dlt, args.releases, quantiles)
                print_quantiles(args.releases, quantiles, joint_q, single, len(statements))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""End-to-end rows of ``benchmarks/highdim.py``: SQL batches through the Session (issue 16).

Each case builds a DuckDB file, protects the table, then in a warm process (imports done; no
strategy cache is involved on the implicit path) times ``explain`` and ``answer`` (process CPU
seconds, and wall seconds: the machine is shared, so CPU is the steadier figure), measures the
answer's peak Python/NumPy allocation with tracemalloc on a second answer, and reports the
chosen strategy's RMSE ÷ svdb (computed implicitly by explain) and ÷ the residual plan
optimised for *full* marginals (the issue's fallback accuracy rule for Adult batches, whose
GROUP BYs do not return the implicit ``other`` cells).
"""

from __future__ import annotations

import itertools
import math
import os
import tempfile
import time
import tomllib
import tracemalloc
from importlib import resources

import duckdb
import numpy as np

import dpsql
from dpsql.inference.implicit import residual_block_stderr
from dpsql.policy.policy import table_policy_from_spec
from dpsql.sql.implicit import compile_batch
from dpsql.sql.parse import parse_batch
from dpsql.strategies.residual import blocks_plan, residual_plan
from dpsql.strategies.symmetric import restricted_optimum

DATA = resources.files("dpsql") / "data"
ADULT = ["sex", "race", "income", "marital_status", "workclass", "education", "occupation"]
DEMO10 = ADULT + ["age", "education_num", "hours_per_week"]
ADULT_SPEC = tomllib.loads((DATA / "adult_policy.toml").read_text())["tables"]["adult"]


def _adult_db(path: str):
    con = duckdb.connect(path)
    con.execute("CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true)",
                [str(DATA / "adult.csv.gz")])
    con.close()
    db = dpsql.connect(path)
    db.protect("adult", dict(ADULT_SPEC, epsilon=100, delta=0.5))
    return db


def _grid_db(path: str, d: int = 8, n: int = 10, rows: int = 1000):
    rng = np.random.default_rng(0)                       # synthetic public benchmark data
    values = rng.integers(0, n, size=(rows, d))
    con = duckdb.connect(path)
    con.execute("CREATE TABLE grid (" + ", ".join(f"c{i} INTEGER" for i in range(d)) + ")")
    con.executemany("INSERT INTO grid VALUES (" + ", ".join("?" * d) + ")",
                    values.tolist())
    con.close()
    db = dpsql.connect(path)
    db.protect("grid", _grid_spec(d, n))
    return db


def _grid_spec(d: int = 8, n: int = 10) -> dict:
    return {"epsilon": 100, "delta": 0.5, "columns": {
        f"c{i}": {"type": "integer", "min": 0, "max": n - 1} for i in range(d)}}


def marginals_sql(table: str, columns, ways) -> list[str]:
    return [f"SELECT {', '.join(c)}, COUNT(*) FROM {table} GROUP BY {', '.join(c)}"
            for w in ways for c in itertools.combinations(columns, w)]


def accuracy(policy, sql: list[str], optimum: bool) -> tuple[float, float, float]:
    """(chosen ÷ residual-for-full-marginals RMSE, chosen ÷ certified optimum RMSE, seconds
    of the certificate), all on the batch's actual (restricted) blocks, at σ = 1."""
    queries = parse_batch(sql, lambda name, node: policy)
    workload = compile_batch(queries, policy)
    union = workload.union
    chosen = blocks_plan(union)
    full = residual_plan(union.sizes, {b.used: 1.0 for b in union.blocks})

    def total(a):
        return sum(float(np.sum(residual_block_stderr(union.sizes, a, b) ** 2))
                   for b in union.blocks)

    mine = total(chosen.a)
    vs_full = math.sqrt(mine / total(full.a))
    if not optimum:
        return vs_full, math.nan, math.nan
    started = time.process_time()
    best = restricted_optimum(union)
    return vs_full, math.sqrt(mine / best.lower), time.process_time() - started


def run_case(name: str, make_db, sql: list[str], epsilon=1.0, delta=1e-6) -> dict:
    path = os.path.join(tempfile.mkdtemp(prefix="dpsql-highdim-"), "b.duckdb")
    db = make_db(path)
    wall, cpu = time.perf_counter(), time.process_time()
    expl = db.explain(sql, epsilon=epsilon, delta=delta)
    explain = (time.perf_counter() - wall, time.process_time() - cpu)
    wall, cpu = time.perf_counter(), time.process_time()
    db.answer(sql, epsilon=epsilon, delta=delta)
    answer = (time.perf_counter() - wall, time.process_time() - cpu)
    tracemalloc.start()
    db.answer(sql, epsilon=epsilon, delta=delta)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    row = dict(case=name, cells=expl.n_cells, queries=expl.n_queries, strategy=expl.strategy,
               explain=explain, answer=answer, peak=peak, ratio=expl.bound_ratio,
               rmse=expl.rmse, note=expl.bound_note)
    db.close()
    return row


def cases() -> list:
    """(name, database builder, policy, batch, compute the certified optimum?)."""
    adult = table_policy_from_spec("adult", ADULT_SPEC)
    grid = table_policy_from_spec("grid", _grid_spec())
    return [("2-way 8x10 (1e8 cells) SQL", _grid_db, grid,
             marginals_sql("grid", [f"c{i}" for i in range(8)], [2]), False),
            *[(f"Adult 2-way k={k}", _adult_db, adult,
               marginals_sql("adult", ADULT[:k], [2]), True) for k in (5, 6, 7)],
            ("Adult 2-way, 10 demo columns", _adult_db, adult,
             marginals_sql("adult", DEMO10, [2]), False),
            ("Adult 1-,2-,3-way, 10 columns", _adult_db, adult,
             marginals_sql("adult", DEMO10, [1, 2, 3]), False)]


def table() -> list[str]:
    lines = [f"{'end to end (eps=1, delta=1e-6)':<32}{'cells':>14}{'queries':>8}"
             f"{'explain cpu/wall s':>20}{'answer cpu/wall s':>19}{'peak MB':>9}"
             f"{'RMSE':>8}{'/svdb':>8}{'/fullres':>9}{'/opt':>8}  strategy"]
    for name, make_db, policy, sql, optimum in cases():
        r = run_case(name, make_db, sql)
        vs_full, vs_opt, opt_s = accuracy(policy, sql, optimum)
        note = f"certificate {opt_s:.1f}s cpu" if optimum else ""
        note = "; ".join(x for x in (note, r["note"]) if x)
        lines.append(f"{r['case']:<32}{r['cells']:>14,}{r['queries']:>8}"
                     f"{r['explain'][1]:>10.2f}/{r['explain'][0]:<9.2f}"
                     f"{r['answer'][1]:>9.2f}/{r['answer'][0]:<9.2f}{r['peak'] / 2**20:>9.1f}"
                     f"{r['rmse']:>8.3f}{r['ratio']:>8.4f}{vs_full:>9.4f}{vs_opt:>8.4f}  "
                     f"{r['strategy']}" + (f" ({note})" if note else ""))
    return lines


if __name__ == "__main__":
    print("\n".join(table()))

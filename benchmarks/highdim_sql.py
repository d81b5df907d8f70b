"""End-to-end rows of ``benchmarks/highdim.py``: SQL batches through the Session (issue 16).

The ranges x marginals batch (:func:`ranges_sql`): all 2,775 ranges on single-year age
(17..90), each crossed with every 1-way GROUP BY of the other nine demo columns — 24,975
statements, 210,900 answers (2,775 x 76 declared groups) over a product of ~7e9 cells. Its
rows give, at δ > 0, the chosen RMSE ÷ svdb and ÷ the residual plan; at δ = 0, ÷ the best
Kronecker L1 strategy with factors from dpsql's own L1 design
(:func:`dpsql.strategies.kronecker.separate_kron` and ``union_kron``, computed on the
compiled blocks) and the identity's RMSE ÷ the chosen one. Its answer is timed once
(24,975 result tables; peak memory is the process's maximum RSS, not traced).

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


RANGE_COLUMNS = [c for c in DEMO10 if c != "age"]

#: the issue's "realistic batch of 30 queries over 10 columns" (its product of parts: 7·10⁹
#: cells, refused before issue 16): every demo column's 1-way GROUP BY, ten 2-way crosstabs,
#: ten filtered counts (ranges, IN lists, conditions on two columns)
THIRTY = [f"SELECT {c}, COUNT(*) FROM adult GROUP BY {c}" for c in DEMO10] + [
    f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}" for a, b in [
        ("sex", "race"), ("education", "income"), ("marital_status", "sex"),
        ("workclass", "income"), ("occupation", "sex"), ("age", "income"),
        ("hours_per_week", "sex"), ("education_num", "income"), ("race", "income"),
        ("marital_status", "income")]] + [
    "SELECT COUNT(*) FROM adult WHERE age BETWEEN 25 AND 34 AND sex = 'Female'",
    "SELECT income, COUNT(*) FROM adult WHERE age >= 65 GROUP BY income",
    "SELECT occupation, COUNT(*) FROM adult WHERE hours_per_week >= 40 AND sex = 'Male' "
    "GROUP BY occupation",
    "SELECT education, COUNT(*) FROM adult WHERE workclass IN ('Federal-gov', 'Local-gov', "
    "'State-gov') GROUP BY education",
    "SELECT race, COUNT(*) FROM adult WHERE income = '>50K' AND age < 30 GROUP BY race",
    "SELECT COUNT(*) FROM adult WHERE education_num >= 13",
    "SELECT marital_status, COUNT(*) FROM adult WHERE age BETWEEN 18 AND 24 "
    "GROUP BY marital_status",
    "SELECT sex, COUNT(*) FROM adult WHERE occupation = 'Exec-managerial' GROUP BY sex",
    "SELECT hours_per_week, COUNT(*) FROM adult WHERE workclass = 'Self-emp-inc' "
    "GROUP BY hours_per_week",
    "SELECT income, COUNT(*) FROM adult WHERE education IN ('Bachelors', 'Masters', "
    "'Doctorate') AND sex = 'Female' GROUP BY income"]
#: the ten 2-way marginals over five categorical columns
FIVE = [f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}"
        for a, b in itertools.combinations(ADULT[:5], 2)]
#: (name, statements, statements per request): each request answered in turn, default
#: settings (answers from past releases on), ε = 0.1 each, δ = 1e-7
SPLITS = [("30 queries, 10 columns, 1 request", THIRTY, 30),
          ("30 queries split, 6 requests of 5", THIRTY, 5),
          ("5-col 2-way split, 5 requests of 2", FIVE, 2)]


def split_case(index: int) -> dict:
    """One :data:`SPLITS` case in this process: CPU seconds (planning workers included)
    and the largest resident set (this process or a worker), in MB."""
    import resource

    name, sql, k = SPLITS[index]
    db = _adult_db(os.path.join(tempfile.mkdtemp(prefix="dpsql-highdim-"), "b.duckdb"))

    def cpu():
        a, b = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                  resource.RUSAGE_CHILDREN))
        return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime

    start, wall, strategies = cpu(), time.perf_counter(), []
    for i in range(0, len(sql), k):
        strategies.append(db.answer(sql[i:i + k], epsilon=0.1, delta=1e-7).strategy)
    rss = max(_peak_rss_mb(), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    db.close()
    return dict(case=name, cpu=cpu() - start, wall=time.perf_counter() - wall, rss=rss,
                strategies=strategies)


def _peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM: reset by exec, unlike ``ru_maxrss``, which
    keeps the launching process's peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return math.nan


#: the process's peak RSS (MB) after the marginal rows, before the ranges rows (which hold
#: DuckDB's buffers for 24,975 tables): what ``highdim.py``'s memory verdict reads
MARGINAL_RSS = [math.nan]


def split_lines() -> list[str]:
    """Each split case in a fresh process (so its memory is its own)."""
    import json
    import subprocess
    import sys

    lines = []
    for index in range(len(SPLITS)):
        out = subprocess.run([sys.executable, __file__, "--split", str(index)],
                             capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        lines.append(f"{r['case']:<36} answered in {r['cpu']:6.2f} s CPU ({r['wall']:.1f} s "
                     f"wall), max RSS {r['rss']:.0f} MB; strategies "
                     + ", ".join(r["strategies"]))
    return lines


def ranges_sql(columns=RANGE_COLUMNS) -> list[str]:
    """Every range [a, b] of single-year age crossed with each column's GROUP BY."""
    return [f"SELECT {c}, COUNT(*) FROM adult WHERE age BETWEEN {a} AND {b} GROUP BY {c}"
            for c in columns for a in range(17, 91) for b in range(a, 91)]


def l1_references(policy, sql: list[str]) -> tuple[float, float]:
    """(best Kronecker L1 total, identity total): total squared error at Laplace b = 1 / 2
    (the chosen plan's units), from the compiled blocks, never the product."""
    from dpsql.strategies.kronecker import separate_kron, union_kron

    union = compile_batch(parse_batch(sql, lambda name, node: policy), policy).union
    best = min(separate_kron(union, "l1")[2], union_kron(union, max_rounds=3, norm="l1").error)
    identity = sum(b.weight * math.prod(float(np.square(F).sum()) for F in b.factors)
                   for b in union.blocks)
    return best, identity


def ranges_lines(policy) -> list[str]:
    """The ranges x marginals rows (δ = 1e-6, then δ = 0)."""
    import resource

    sql = ranges_sql()
    best, identity = l1_references(policy, sql)
    lines = []
    for delta in (1e-6, 0.0):
        r = run_case(f"ranges x marginals d={delta:g}", _adult_db, sql, delta=delta,
                     trace=False)
        chosen = next(c for c in r["candidates"] if c.strategy == r["strategy"]
                      and c.mechanism == r["mechanism"])
        others = {(c.strategy, c.mechanism): c.rmse for c in r["candidates"]}
        m = r["queries"]
        if delta > 0:
            extra = f"/residual {chosen.rmse / others[('residual', 'gaussian')]:.3f}"
        else:
            b = chosen.sigma / chosen.sensitivity      # b per unit of L1 sensitivity
            ref = math.sqrt(2 * best / m) * b
            extra = (f"/best L1 Kronecker {chosen.rmse / ref:.4f}; identity "
                     f"{math.sqrt(2 * identity / m) * b / chosen.rmse:.0f}x the chosen RMSE")
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        lines.append(f"{r['case']:<32}{r['cells']:>14,}{r['queries']:>8}"
                     f"{r['explain'][1]:>10.2f}/{r['explain'][0]:<9.2f}"
                     f"{r['answer'][1]:>9.2f}/{r['answer'][0]:<9.2f}{rss:>8.0f}R"
                     f"{r['rmse']:>8.3f}{r['ratio']:>8.4f}{'':>9}{'':>8}  "
                     f"{r['strategy']} ({r['mechanism']}; {extra})")
    return lines


def run_case(name: str, make_db, sql: list[str], epsilon=1.0, delta=1e-6,
             trace: bool = True) -> dict:
    path = os.path.join(tempfile.mkdtemp(prefix="dpsql-highdim-"), "b.duckdb")
    db = make_db(path)
    wall, cpu = time.perf_counter(), time.process_time()
    expl = db.explain(sql, epsilon=epsilon, delta=delta)
    explain = (time.perf_counter() - wall, time.process_time() - cpu)
    wall, cpu = time.perf_counter(), time.process_time()
    db.answer(sql, epsilon=epsilon, delta=delta)
    answer = (time.perf_counter() - wall, time.process_time() - cpu)
    peak = math.nan
    if trace:
        tracemalloc.start()
        db.answer(sql, epsilon=epsilon, delta=delta)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    row = dict(case=name, cells=expl.n_cells, queries=expl.n_queries, strategy=expl.strategy,
               explain=explain, answer=answer, peak=peak, ratio=expl.bound_ratio,
               rmse=expl.rmse, note=expl.bound_note, mechanism=expl.mechanism,
               candidates=expl.candidates)
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
    MARGINAL_RSS[0] = _peak_rss_mb()
    lines += ranges_lines(table_policy_from_spec("adult", ADULT_SPEC))
    lines.append("(R: the process's maximum resident set size in MB, after the answer)")
    return lines + split_lines()


if __name__ == "__main__":
    import json
    import sys

    if sys.argv[1:2] == ["--split"]:
        print(json.dumps(split_case(int(sys.argv[2]))))
    elif sys.argv[1:2] == ["--ranges"]:     # the ranges x marginals rows alone
        print("\n".join(ranges_lines(table_policy_from_spec("adult", ADULT_SPEC))))
    else:
        print("\n".join(table()))

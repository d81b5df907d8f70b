"""Answers from past releases for wide batches (issue 16, "What to build" 3-4).

    PYTHONPATH=. python benchmarks/reuse_wide.py [--big]

On the demo Adult table (its packaged policy; batches compiled to Kronecker blocks), a first
release of every 2-way marginal over seven columns (ε = 1, δ = 1e-6), then:

- *repeat*: the same batch again (every block free: nothing charged);
- *partly new*: the 2-way marginals over eight columns (the 21 old blocks free, 7 new ones
  measured at ε = 1, one charge);
- *more accurate*: the same 21 marginals at ε = 4 (nothing free: every block measured, each
  clique's old and new measurements combined by GLS);
- with ``--big``: all 1-, 2- and 3-way marginals over the ten demo columns (175 marginals) as
  the first release, then the same again.

Per row: the ε charged, the RMSE with reuse and with ``reuse=False``, the rows free, and the
process CPU seconds of ``explain`` with and without reuse (warm process; the difference is
the reuse analysis: loading the stored pieces and the per-clique GLS), plus the peak traced
allocation of the explain with reuse. Noise: the seeded test sampler (errors and costs do not
depend on it). Always exits 0.
"""

from __future__ import annotations

import itertools
import os
import sys
import tempfile
import time
import tomllib
import tracemalloc
from importlib import resources

import duckdb

import dpsql
from dpsql.noise.samplers import SeededTestSampler

DATA = resources.files("dpsql") / "data"
SPEC = tomllib.loads((DATA / "adult_policy.toml").read_text())["tables"]["adult"]
ADULT = ["sex", "race", "income", "marital_status", "workclass", "education", "occupation"]
DEMO10 = ADULT + ["age", "education_num", "hours_per_week"]


def marginals(columns, ways=(2,)) -> list[str]:
    return [f"SELECT {', '.join(c)}, COUNT(*) FROM adult GROUP BY {', '.join(c)}"
            for k in ways for c in itertools.combinations(columns, k)]


def fresh_db():
    path = os.path.join(tempfile.mkdtemp(prefix="dpsql-reuse-wide-"), "a.duckdb")
    con = duckdb.connect(path)
    con.execute("CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true)",
                [str(DATA / "adult.csv.gz")])
    con.close()
    db = dpsql.connect(path, sampler=SeededTestSampler(1))
    db.protect("adult", dict(SPEC, epsilon=1000, delta=0.5))
    return db


def timed_explain(db, sql, eps, reuse: bool):
    started = time.process_time()
    e = db.explain(sql, epsilon=eps, delta=1e-6, reuse=reuse)
    return e, time.process_time() - started


def row(db, name, sql, eps) -> str:
    off, cpu_off = timed_explain(db, sql, eps, False)
    on, cpu_on = timed_explain(db, sql, eps, True)
    tracemalloc.start()
    db.explain(sql, epsilon=eps, delta=1e-6)
    peak = tracemalloc.get_traced_memory()[1] / 2 ** 20
    tracemalloc.stop()
    before = db.budget("adult")["epsilon_spent"]
    db.answer(sql, epsilon=eps, delta=1e-6)
    charged = float(db.budget("adult")["epsilon_spent"] - before)
    return (f"{name:<28} {len(sql):>5} {on.n_queries:>7} {charged:>8.3g} {len(on.free):>6} "
            f"{on.rmse:>10.4g} {off.rmse:>10.4g} {cpu_on:>9.2f} {cpu_off:>9.2f} {peak:>8.1f}")


def main() -> None:
    print(f"# PYTHONPATH=. python benchmarks/reuse_wide.py {' '.join(sys.argv[1:])}   "
          f"load average {os.getloadavg()[0]:.1f} at start")
    print(f"{'case':<28} {'stmts':>5} {'answers':>7} {'charged':>8} {'free':>6} "
          f"{'rmse reuse':>10} {'rmse off':>10} {'cpu reuse':>9} {'cpu off':>9} {'peak MB':>8}")
    db = fresh_db()
    first = marginals(ADULT)
    db.explain(first, epsilon=1.0, delta=1e-6)        # warm: imports and first-call costs
    print(row(db, "first: 2-way over 7", first, 1.0))
    print(row(db, "repeat", first, 1.0))
    print(row(db, "partly new: 2-way over 8", marginals(ADULT + ["age"]), 1.0))
    print(row(db, "more accurate: eps 4", first, 4.0))
    db.close()
    if "--big" in sys.argv:
        db = fresh_db()
        big = marginals(DEMO10, (1, 2, 3))
        db.explain(big, epsilon=1.0, delta=1e-6)
        print(row(db, "first: 1-3-way over 10", big, 1.0))
        print(row(db, "repeat", big, 1.0))
        db.close()
    print(f"# load average {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()

"""Benchmark: store a chosen plan's Cholesky factor, or recompute it on each hit?

    OPENBLAS_NUM_THREADS=1 python benchmarks/factor_store.py [N ...]    (default 256 1024 2048 4096)

For a dense ``n x n`` plan on the 2**-20 grid (the shape ``optimal`` chooses) it measures,
in process CPU seconds, twice per ``n``:

- ``recompute``: the factorisation a hit without a stored factor does
  (:func:`dpsql.inference.least_squares._factors`: the Gram ``AᵀA`` and its Cholesky factor);
- ``store``: :func:`dpsql.store.selection_cache.store_factor` (``np.tril``, DELETE, INSERT);
- ``checkpoint``: what the factor adds to closing the connection (DuckDB's checkpoint);
- ``read``: a hit's read of the stored factor and its check
  (:func:`~dpsql.store.selection_cache.factor_loader`, :func:`~dpsql.inference.least_squares.valid_factor`);

and what :func:`dpsql.mechanisms.selection.factor_worth_storing` decides, with the cost
model's predicted recompute. The database is built by :func:`dpsql.store.schema.ensure`
(the current schema's column compression). A benchmark, not a test: it always exits 0; the
machine load is printed (a shared machine inflates the seconds).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import duckdb
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dpsql.inference import least_squares  # noqa: E402
from dpsql.mechanisms import selection  # noqa: E402
from dpsql.store import schema, selection_cache  # noqa: E402
from dpsql.workload.matrix import Plan  # noqa: E402

cpu = time.process_time


def one(n: int, rng) -> tuple:
    """(recompute, store, checkpoint, read) CPU seconds for one random dense n x n plan."""
    A = np.rint(rng.standard_normal((n, n)) / np.sqrt(n) * 2 ** 20) / 2 ** 20
    plan = Plan("optimal", n, A, 1.0, integral=True)
    t = cpu()
    chol, _ = least_squares._factors(plan)
    recompute = cpu() - t
    path = os.path.join(tempfile.mkdtemp(prefix="dpsql-factor-"), "f.duckdb")
    con = duckdb.connect(path)
    schema.ensure(con)
    con.close()
    con = duckdb.connect(path)             # the checkpoint of a small write, for reference
    con.execute("INSERT INTO dpsql.halfwidth_cache (key, n_queries, units) VALUES ('x', 0, '')")
    t = cpu()
    con.close()
    baseline = cpu() - t
    con = duckdb.connect(path)
    con.execute("DELETE FROM dpsql.halfwidth_cache")
    t = cpu()
    selection_cache.store_factor(con, "k", chol[0])
    store = cpu() - t
    t = cpu()
    con.close()
    checkpoint = cpu() - t - baseline
    con = duckdb.connect(path)
    con.execute("SELECT 1").fetchone()
    t = cpu()
    loaded = selection_cache.factor_loader(con, "k", n)()
    ok = loaded is not None and least_squares.valid_factor(plan, *loaded)
    read = cpu() - t
    con.close()
    if not ok:
        print(f"  n={n}: the stored factor did not read back valid", flush=True)
    return recompute, store, checkpoint, read, plan


def main(argv=None) -> int:
    sizes = [int(a) for a in (sys.argv[1:] if argv is None else argv)] or [256, 1024, 2048, 4096]
    rng = np.random.default_rng(0)          # benchmark matrices only
    print(f"Cholesky factor: recompute vs store (CPU s); OPENBLAS_NUM_THREADS="
          f"{os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print("     n  recompute    store  checkpoint    read  predicted  stored?")
    for n in sizes:
        for _ in range(2):
            r, s, c, rd, plan = one(n, rng)
            predicted = least_squares.factorise_seconds(plan.A)
            print(f"{n:6d}  {r:9.3f}  {s:7.3f}  {c:10.3f}  {rd:6.3f}  {predicted:9.3f}  "
                  f"{'yes' if selection.factor_worth_storing(plan) else 'no'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

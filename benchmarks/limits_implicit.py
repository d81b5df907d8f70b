"""Calibrate the implicit path's request cost on synthetic tables (issue 22 item 3).

    python benchmarks/limits_implicit.py --fit

Batches over more than 1,024 cells (two or more columns) are compiled to Kronecker blocks
and answered without the product (:mod:`dpsql.mechanisms.implicit_cost`). This fits
:data:`dpsql.mechanisms.implicit_cost.IMPLICIT_TIME_FIT` on whole requests
(``Session.answer``, auto, ε = 0.01, δ = 10⁻⁶) over a synthetic table: 30,000 random rows
over eight made-up categorical columns (never the Adult data, nor its columns' sizes),
CUBEs over 3-6 of them and a half of the grouping sets of 7. Time is process CPU time (one
BLAS thread, forked workers included), a fresh copy of the database per request.
``benchmarks/limits.py --requests`` then reports the Adult CUBEs against the fit.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import sys
import tempfile

for _threads in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.limits import measured  # noqa: E402
from dpsql.mechanisms import implicit_cost  # noqa: E402
from dpsql.policy.policy import load_policy  # noqa: E402
from dpsql.sql.implicit import compile_batch  # noqa: E402
from dpsql.sql.parse import parse_batch  # noqa: E402

#: the made-up columns' sizes (values per column; each also has its implicit "other")
SIZES = (3, 9, 4, 11, 6, 15, 5, 12)
ROWS = 30_000
#: (columns of the CUBE, or of a half of the grouping sets when marked "half")
BATCHES = [((0, 1, 2, 3), "cube"), ((1, 3, 5), "cube"), ((0, 2, 4, 6, 7), "cube"),
           ((1, 2, 3, 4), "cube"), ((0, 1, 2, 4, 6), "cube"), ((3, 5, 7), "cube"),
           ((0, 1, 2, 3, 4, 6), "cube"), ((1, 3, 4, 5), "cube"), ((0, 2, 3, 4, 6, 7), "cube"),
           ((0, 1, 2, 3, 4, 6, 7), "half"), ((1, 2, 3, 4, 5), "cube"),
           ((0, 1, 2, 4, 5, 6, 7), "half")]


def policy() -> dict:
    return {"epsilon": 1e6, "delta": 1e-3, "columns": {
        f"c{i}": {"type": "categorical", "values": [f"v{j}" for j in range(k)]}
        for i, k in enumerate(SIZES)}}


def make_table(path: str) -> None:
    """The synthetic table: uniform random values, 1 in 20 outside the declared ones."""
    import duckdb

    rng = np.random.default_rng(2026)
    con = duckdb.connect(path)
    cols = {f"c{i}": np.where(rng.random(ROWS) < 0.05, "zz",
                              np.char.add("v", rng.integers(0, k, ROWS).astype(str)))
            for i, k in enumerate(SIZES)}
    import pandas as pd

    frame = pd.DataFrame(cols)  # noqa: F841 (read by DuckDB by name)
    con.execute("CREATE TABLE synth AS SELECT * FROM frame")
    con.close()


def sql_of(cols, kind: str, seed: int) -> str:
    names = [f"c{i}" for i in cols]
    listed = ", ".join(names)
    if kind == "cube":
        return f"SELECT {listed}, COUNT(*) FROM synth GROUP BY CUBE({listed})"
    rng = np.random.default_rng(seed)
    subsets = [s for r in range(len(names) + 1) for s in itertools.combinations(names, r)]
    chosen = sorted(rng.choice(len(subsets), len(subsets) // 2, replace=False))
    sets = ", ".join("(" + ", ".join(subsets[i]) + ")" for i in chosen)
    return f"SELECT {listed}, COUNT(*) FROM synth GROUP BY GROUPING SETS ({sets})"


def fit() -> None:
    import dpsql

    folder = tempfile.mkdtemp(prefix="dpsql-implicit-")
    base = os.path.join(folder, "base.duckdb")
    make_table(base)
    with dpsql.connect(base) as db:
        db.protect("synth", policy())
    policies = load_policy(policy(), "synth")
    rows = []
    for k, (cols, kind) in enumerate(BATCHES):
        sql = sql_of(cols, kind, k)
        workload = compile_batch(parse_batch(sql, lambda n, node: policies[n]),
                                 policies["synth"])
        if not getattr(workload, "implicit", False):
            print(f"  batch {k}: dense ({workload.n_cells} cells), not fitted")
            continue
        path = os.path.join(folder, f"b{k}.duckdb")
        shutil.copyfile(base, path)
        with dpsql.connect(path, reuse=False) as db:
            _, seconds = measured(lambda: db.answer(sql, epsilon=0.01, delta=1e-6),
                                  trace=False)
        os.remove(path)
        features = implicit_cost.features(workload)
        rows.append((features, seconds))
        print(f"  batch {k}: n = {workload.n_cells:,}, m = {workload.n_queries:,}, "
              f"features {tuple(f'{f:.3g}' for f in features)}, cpu {seconds:.2f} s",
              flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    report(rows)


def report(rows) -> None:
    """Non-negative least squares on the relative error; the bound's flops keep the dense
    model's own cost (``4/FLOPS`` per flop, not fitted: on CUBEs they grow with the other
    features and a free coefficient took 10⁴ times that, which would refuse any batch near
    the bound's own flop limit)."""
    from scipy.optimize import nnls

    from dpsql.workload.limits import FLOPS

    F = np.array([f for f, _ in rows], dtype=float)
    y = np.array([t for _, t in rows])
    per_flop = 4.0 / FLOPS
    G = F[:, :4]
    scale = np.where(G.max(axis=0) > 0, G.max(axis=0), 1.0)
    coef, _ = nnls(G / scale / y[:, None], (y - per_flop * F[:, 4]) / y)
    coef = np.append(coef / scale, per_flop)
    pred = F @ coef
    print(f"IMPLICIT_TIME_FIT = ({', '.join(f'{c:.3g}' for c in coef)})  "
          f"# worst {max(max(p / t, t / p) for p, t in zip(pred, y)):.2f}")
    for (f, t), p in zip(rows, pred):
        print(f"  m = {f[1]:>9,.0f}  cells = {f[2]:>9,.0f}  actual {t:6.2f} s  "
              f"fitted {p:6.2f} s  ratio {t / p:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="fit IMPLICIT_TIME_FIT and stop")
    args = parser.parse_args()
    if args.fit:
        fit()
    else:
        parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())

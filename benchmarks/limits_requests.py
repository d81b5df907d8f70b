"""Calibrate whole requests' time on a synthetic table (issue 22 item 3).

    python benchmarks/limits_requests.py --fit implicit|dense

``implicit``: batches over more than 1,024 cells (two or more columns) are compiled to
Kronecker blocks and answered without the product (:mod:`dpsql.mechanisms.implicit_cost`);
this fits :data:`dpsql.mechanisms.implicit_cost.IMPLICIT_TIME_FIT` on whole requests
(``Session.answer``, auto, ε = 0.01, δ = 10⁻⁶) over a synthetic table: 30,000 random rows
over eight made-up categorical columns (never the Adult data, nor its columns' sizes),
CUBEs over 3-6 of them and a half of the grouping sets of 7. Time is process CPU time (one
BLAS thread, forked workers included), a fresh copy of the database per request.
``dense``: smaller batches; what the steps' model (:mod:`dpsql.mechanisms.fit`) leaves of
a whole request is fitted as :data:`dpsql.mechanisms.fit.REQUEST_FIXED_SECONDS` and
:data:`~dpsql.mechanisms.fit.CANDIDATE_SECONDS` (auto, δ = 0 and a strategy named, so
that the candidates' number varies). ``benchmarks/limits.py --requests`` then reports the
Adult CUBEs against the fits.
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


#: dense batches (at most 1,024 cells): GROUP BY or CUBE columns
DENSE = [((0, 2), "cube"), ((0, 1, 2), "cube"), ((2, 4, 6), "cube"), ((0, 3, 6), "cube"),
         ((0, 2, 4, 6), "cube"), ((5,), "group"), ((1, 3), "group"), ((1, 3), "cube")]
#: (δ, strategy) of each dense batch's requests: 13, 6 and 1 candidates
ASKS = [(1e-6, "auto"), (0.0, "auto"), (1e-6, "identity")]


def fit_dense() -> None:
    """What the steps' model leaves of whole dense requests, as fixed + per candidate."""
    import dpsql
    from dpsql.mechanisms import fit as fitting
    from dpsql.mechanisms import selection

    folder, base, policies = _table()
    rows = []
    for k, (cols, kind) in enumerate(DENSE):
        names = ", ".join(f"c{i}" for i in cols)
        sql = (f"SELECT {names}, COUNT(*) FROM synth GROUP BY "
               + (f"CUBE({names})" if kind == "cube" else names))
        workload = compile_batch(parse_batch(sql, lambda n, node: policies[n]),
                                 policies["synth"])
        for dlt, strategy in ASKS:
            wanted = selection.requested(policies["synth"], dlt, strategy)
            base_seconds = fitting.request_cost(workload, wanted).seconds
            kept = len(fitting.screen(workload, wanted, strategy == "auto")[0])
            path = os.path.join(folder, f"d{k}.duckdb")
            shutil.copyfile(base, path)
            with dpsql.connect(path, reuse=False) as db:
                _, seconds = measured(lambda: db.answer(sql, epsilon=0.5, delta=dlt,
                                                        strategy=strategy), trace=False)
            os.remove(path)
            rows.append((kept, base_seconds, seconds))
            print(f"  n = {workload.n_cells:>4}, {strategy:<8} δ = {dlt:g}: {kept:>2} kept, "
                  f"steps' model {base_seconds:.2f} s, cpu {seconds:.2f} s", flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    report_dense(rows)


def report_dense(rows) -> None:
    from scipy.optimize import nnls

    kept = np.array([r[0] for r in rows], dtype=float)
    model = np.array([r[1] for r in rows])
    y = np.array([r[2] for r in rows])
    F = np.stack([np.ones_like(kept), kept], axis=1)
    coef, _ = nnls(F / y[:, None], (y - model) / y)
    pred = model + F @ coef
    print(f"REQUEST_FIXED_SECONDS, CANDIDATE_SECONDS = {coef[0]:.3g}, {coef[1]:.3g}  "
          f"# worst {max(max(p / t, t / p) for p, t in zip(pred, y)):.2f}")


def _table():
    """(folder, the protected synthetic database's path, its policies)."""
    import dpsql

    folder = tempfile.mkdtemp(prefix="dpsql-requests-")
    base = os.path.join(folder, "base.duckdb")
    make_table(base)
    with dpsql.connect(base) as db:
        db.protect("synth", policy())
    return folder, base, load_policy(policy(), "synth")


def fit() -> None:
    import dpsql

    folder, base, policies = _table()
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
    parser.add_argument("--fit", choices=("implicit", "dense"), required=True,
                        help="implicit: IMPLICIT_TIME_FIT; dense: REQUEST_FIXED_SECONDS and "
                             "CANDIDATE_SECONDS")
    args = parser.parse_args()
    fit() if args.fit == "implicit" else fit_dense()
    return 0


if __name__ == "__main__":
    sys.exit(main())

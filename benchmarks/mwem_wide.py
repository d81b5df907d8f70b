"""MWEM over a graphical model on a wide connected batch (issue 16) against the implicit
``auto`` strategy: Adult, all 2-way marginals (``GROUP BY a, b``) over the 10 demo columns
(45 statements, 8,067 answers, one connected group of ~10¹⁰ cells: the factored MWEM form
refuses it).

For each ε in {0.1, 1}: ``strategy='mwem'`` (defaults; pure ε-DP, δ = 0) and ``auto`` at
δ = 0 (Laplace; the like-for-like privacy) and at δ = 1e-6 (Gaussian, for reference), each
run in a fresh child process (so its peak memory is its own maximum RSS), runs alternating
between the strategies. Printed: RMSE and max |error| of the answers against the exact
answers (the same batch measured without noise by a non-private sampler: the policy bins
hours_per_week and education_num, so raw GROUP BYs are not the reference), the answer's process CPU
seconds (``time.process_time``, imports and database set-up excluded), the child's
maximum RSS after that answer (the DuckDB table load dominates it) and the peak Python/NumPy
allocation of a second, identical answer under tracemalloc (the answer's own memory). The machine is shared: the load average is printed with the table.

    PYTHONPATH=. .venv/bin/python benchmarks/mwem_wide.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc

import numpy as np

RUNS = [("mwem", 0.0), ("auto", 0.0), ("auto", 1e-6)]


def _batch() -> list[str]:
    from highdim_sql import DEMO10

    return [f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}"
            for a, b in itertools.combinations(DEMO10, 2)]


def _counts(release) -> np.ndarray:
    return np.array([row[-4] for t in release.results for row in t.rows], dtype=float)


def exact() -> np.ndarray:
    """The exact answers: the same batch measured without noise (non-private sampler,
    benchmark only), so the reference uses the policy's declared bins as the answers do."""
    import dpsql
    from highdim_nonneg import _Exact
    from highdim_sql import _adult_db

    path = os.path.join(tempfile.mkdtemp(prefix="dpsql-mwem-wide-"), "a.duckdb")
    _adult_db(path).close()
    db = dpsql.connect(path, sampler=_Exact())
    truth = _counts(db.answer(_batch(), epsilon=1, delta=1e-6))
    db.close()
    return truth


def one(strategy: str, epsilon: float, delta: float) -> dict:
    """One answer in this process: its answers, CPU seconds, max RSS."""
    from highdim_sql import _adult_db

    path = os.path.join(tempfile.mkdtemp(prefix="dpsql-mwem-wide-"), "a.duckdb")
    db = _adult_db(path)
    batch = _batch()
    t = time.process_time()
    release = db.answer(batch, epsilon=epsilon, delta=delta, strategy=strategy)
    cpu = time.process_time() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tracemalloc.start()                   # a second answer, traced (slower; not timed)
    db.answer(batch, epsilon=epsilon, delta=delta, strategy=strategy)
    traced = tracemalloc.get_traced_memory()[1] / 2 ** 20
    tracemalloc.stop()
    db.close()
    return {"answers": _counts(release).tolist(), "cpu": cpu, "strategy": release.strategy,
            "rss_mb": rss, "traced_mb": traced}


def main(repeats: int) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    truth = exact()
    print(f"load average at start: {os.getloadavg()}")
    print(f"{'eps':>5}{'delta':>7}{'strategy':>10}{'run':>5}{'answers':>9}{'RMSE':>10}"
          f"{'max err':>10}{'CPU s':>8}{'max RSS MB':>12}{'traced MB':>11}")
    for eps in (0.1, 1.0):
        for r in range(repeats):
            for strategy, delta in RUNS:
                out = subprocess.run(
                    [sys.executable, __file__, "--one", strategy, str(eps), str(delta)],
                    capture_output=True, text=True, check=True,
                    env=dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.getcwd()])))
                row = json.loads(out.stdout.strip().splitlines()[-1])
                errors = np.array(row["answers"]) - truth
                row.update(n=errors.size, rmse=float(np.sqrt(np.mean(errors ** 2))),
                           max=float(np.abs(errors).max()))
                print(f"{eps:>5g}{delta:>7g}{row['strategy']:>10}{r:>5}{row['n']:>9,}"
                      f"{row['rmse']:>10.2f}{row['max']:>10.1f}{row['cpu']:>8.2f}"
                      f"{row['rss_mb']:>12.0f}{row['traced_mb']:>11.1f}", flush=True)
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--one", nargs=3, metavar=("STRATEGY", "EPS", "DELTA"))
    args = parser.parse_args()
    if args.one:
        strategy, eps, delta = args.one
        print(json.dumps(one(strategy, float(eps), float(delta))))
    else:
        main(args.repeats)

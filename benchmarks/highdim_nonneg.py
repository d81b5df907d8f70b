"""Non-negative answers on wide batches (issue 16: the local-polytope estimate of
:mod:`dpsql.inference.pgm`): for each batch, the plain and the ``nonnegative=True`` answer's
process CPU seconds, and both answers' RMSE against the exact answers (the same request
measured without noise through a non-private sampler, benchmark only), with the share of
plain answers below zero. Defaults throughout (strategy auto, the default limits).

    PYTHONPATH=. python benchmarks/highdim_nonneg.py            # every batch
    PYTHONPATH=. python benchmarks/highdim_nonneg.py pairs      # one of: pairs, ways, ranges
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

import dpsql
from highdim_sql import DEMO10, _adult_db, marginals_sql, ranges_sql


class _Exact:
    """The exact measurements (non-private: the benchmark's reference answers only)."""

    private = False

    def sample(self, values, sigma, *, sensitivity=None):
        return np.asarray(values, dtype=float), 0.0

    def laplace(self, values, scale, *, sensitivity=None, epsilon=None):
        return np.asarray(values, dtype=float), 0.0


BATCHES = {"pairs": ("2-way marginals, 10 demo columns", lambda: marginals_sql(
               "adult", DEMO10, [2])),
           "ways": ("1-,2-,3-way marginals, 10 columns", lambda: marginals_sql(
               "adult", DEMO10, [1, 2, 3])),
           "ranges": ("age ranges x 1-way marginals", ranges_sql)}
RUNS = [(1.0, 1e-6), (0.1, 1e-6), (1.0, 0.0)]


def _counts(release) -> np.ndarray:
    return np.array([row[-4] for t in release.results for row in t.rows], dtype=float)


def run(key: str) -> list[str]:
    name, make = BATCHES[key]
    sql = make()
    lines = []
    for eps, delta in RUNS if key != "ways" else RUNS[:1]:
        path = os.path.join(tempfile.mkdtemp(prefix="dpsql-nonneg-"), "b.duckdb")
        db = _adult_db(path)
        t = time.process_time()
        plain = db.answer(sql, epsilon=eps, delta=delta)
        plain_s = time.process_time() - t
        t = time.process_time()
        posted = db.answer(sql, epsilon=eps, delta=delta, nonnegative=True)
        posted_s = time.process_time() - t
        db.close()
        exact_db = dpsql.connect(path, sampler=_Exact())
        truth = _counts(exact_db.answer(sql, epsilon=eps, delta=delta))
        exact_db.close()
        a, b = _counts(plain), _counts(posted)
        rmse = [float(np.sqrt(np.mean((v - truth) ** 2))) for v in (a, b)]
        lines.append(f"{name:<36}{eps:>5g}{delta:>7g}{plain.strategy:>10}{len(a):>9,}"
                     f"{plain_s:>9.2f}{posted_s:>9.2f}{rmse[0]:>10.2f}{rmse[1]:>10.2f}"
                     f"{rmse[1] / rmse[0]:>8.3f}{np.mean(a < 0):>8.1%}{b.min():>7.1f}")
    return lines


def main(keys) -> None:
    print(f"{'batch (Adult, defaults)':<36}{'eps':>5}{'delta':>7}{'strategy':>10}"
          f"{'answers':>9}{'plain s':>9}{'nonneg s':>9}{'RMSE LS':>10}{'nonneg':>10}"
          f"{'ratio':>8}{'LS < 0':>8}{'min':>7}")
    for key in keys:
        for line in run(key):
            print(line, flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(sys.argv[1:] or list(BATCHES))

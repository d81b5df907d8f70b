"""Benchmark: high-dimensional workloads without the full cell product (issue 16).

    python benchmarks/highdim.py [--records R] [--no-sql]

First table (:mod:`highdim_sql`, default settings): SQL batches end to end through the
Session — compile to Kronecker blocks, residual plan, the kernel's GROUPING SETS marginals,
answers block by block — with explain/answer CPU and wall seconds, answer peak memory,
RMSE ÷ svdb, ÷ the residual plan for full marginals and ÷ the certified optimum.

Second table (components):

Cases (all public structure; the data is a synthetic set of R records, only ever held as the
marginals the plan measures):

- ``2-way 8x10``: all 28 two-way marginals over 8 columns of 10 values (10^8 cells). The
  ResidualPlanner sum-of-variance optimum: time to build the plan, svdb, expected total error
  and RMSE (σ = 1 per unit of sensitivity, i.e. in units of the mechanism's σ²), RMSE / svdb
  RMSE, L2 sensitivity; then the noise-free measurement and reconstruction of every marginal
  from the 28 stored marginals. Targets: plan <= 2 s, RMSE <= 1.001 x svdb, memory <= 1 GB.
- ``2-way 8x10 max``: the same workload, max-variance objective (the cvxpy program).
- ``3-way 15x10``: all 455 three-way marginals over 15 columns of 10 values (10^15 cells).
- ``NOTES example``: 2, 2, 2, 3 declared values plus `other`, six 2-way GROUP BYs; the
  residual plan restricted to returned cells against the dense svdb (69.33).
- ``Adult 7 cols``: all 21 two-way GROUP BYs over sex, race, income, marital_status,
  workclass, education, occupation (declared values plus `other`: 991,440 cells), the case
  that fell back to identity; the bound is the invariant-block svdb, and the certified
  optimum comes from the COA dual on the invariant blocks (:mod:`dpsql.strategies.symmetric`),
  both computed without the product.
- ``prefix 8x10 OPT⊗``: one Kronecker block of prefix ranges on each of 8 columns of 10
  values: OPT⊗ error against its svdb (the product of the per-column bounds).

Times are measured without tracing; peak memory is tracemalloc's peak over a second run of
the same step (Python allocations, NumPy included), and the process's maximum resident set
size (resource.getrusage) is printed at the end. It prints one table and
always exits 0: it is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import resource
import sys
import time
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dpsql.strategies.bounds import svdb, svdb_from_eigenvalues  # noqa: E402
from dpsql.strategies.kronecker import opt_kron  # noqa: E402
from dpsql.strategies.residual import from_union, residual_plan  # noqa: E402
from dpsql.strategies.symmetric import restricted_optimum, restricted_svdb  # noqa: E402
from dpsql.workload.blocks import (KronBlock, UnionWorkload, grouped_factor,  # noqa: E402
                                   ones_factor)

ROWS = []


def _record(case, seconds, error, bound, answers, sensitivity, peak, extra=""):
    rmse, rmse_bound = math.sqrt(error / answers), math.sqrt(bound / answers)
    ROWS.append((case, seconds, bound, error, rmse, rmse / rmse_bound, sensitivity, peak, extra))


def _records_marginals(sizes, cliques, records: int, seed: int = 0) -> dict:
    """Marginals of R synthetic records (correlated columns), never the full vector."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 10, records)
    data = np.stack([(base + rng.integers(0, 3, records) * (i % 3)) % n
                     for i, n in enumerate(sizes)], axis=1)
    out = {}
    for B in cliques:
        T = np.zeros(tuple(sizes[i] for i in B))
        np.add.at(T, tuple(data[:, i] for i in B), 1.0)
        out[B] = T
    return out


def _timed(fn):
    """(result, seconds, peak bytes): timed untraced (tracemalloc slows NumPy code several
    times), then run again under tracemalloc for the peak of Python and NumPy allocations."""
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return result, seconds, peak


def marginal_case(name, sizes, way, records, objective="sum"):
    cliques = list(itertools.combinations(range(len(sizes)), way))
    plan, seconds, peak = _timed(
        lambda: residual_plan(sizes, {B: 1.0 for B in cliques}, objective=objective))
    answers = sum(math.prod(sizes[i] for i in B) for B in cliques)
    extra = ""
    if records:
        stored = _records_marginals(sizes, cliques, records)

        def measure_and_answer():
            y = plan.measure_all(stored)
            return max(float(np.abs(plan.answer(y, B) - stored[B]).max()) for B in cliques)

        worst, more, peak_answers = _timed(measure_and_answer)
        peak = max(peak, peak_answers)
        extra = (f"measure+answer {more:.2f}s ({plan.n_measurements} rows), "
                 f"max |noise-free - true| {worst:.1e}")
    if objective == "max":
        extra += f" max var {plan.max_variance:.4f}"
    _record(name, seconds, plan.total_error, plan.svdb, answers, plan.sensitivity, peak, extra)


def notes_case():
    sizes = (3, 3, 3, 4)
    pairs = list(itertools.combinations(range(4), 2))
    union = UnionWorkload(tuple("abcd"), sizes, tuple(
        KronBlock(tuple(grouped_factor(n - 1, 1) if i in B else ones_factor(n)
                        for i, n in enumerate(sizes))) for B in pairs))
    plan, seconds, peak = _timed(lambda: from_union(union))
    W = union.dense()
    _record("NOTES example [I|0]", seconds, plan.total_error, svdb(W.T @ W), W.shape[0],
            plan.sensitivity, peak, "dense certified optimum 97.09")


def adult_case():
    """All 21 two-way GROUP BYs over 7 Adult columns (declared values + `other`: 991,440 cells)."""
    returned = (2, 5, 2, 7, 8, 16, 14)   # sex, race, income, marital_status, workclass, education,
    sizes = tuple(k + 1 for k in returned)   # occupation; GROUP BY returns the declared values
    pairs = list(itertools.combinations(range(7), 2))
    union = UnionWorkload(tuple(f"c{i}" for i in range(7)), sizes, tuple(
        KronBlock(tuple(grouped_factor(k, 1) if i in B else ones_factor(k + 1)
                        for i, k in enumerate(returned))) for B in pairs))
    plan, seconds, peak = _timed(lambda: from_union(union))
    start = time.perf_counter()
    bound = restricted_svdb(union)
    bound_seconds = time.perf_counter() - start
    start = time.perf_counter()
    optimum = restricted_optimum(union)
    optimum_seconds = time.perf_counter() - start
    identity = sum(returned[a] * returned[b] * union.N / (sizes[a] * sizes[b]) for a, b in pairs)
    answers = sum(returned[a] * returned[b] for a, b in pairs)
    _record(f"Adult 7 cols ({union.N} cells)", seconds, plan.total_error, bound, answers,
            plan.sensitivity, peak, f"invariant-block svdb {bound_seconds:.2f}s; identity "
            f"{math.sqrt(identity / bound):.2f}x svdb RMSE; certified optimum in "
            f"[{optimum.lower:.2f}, {optimum.upper:.2f}] ({optimum_seconds:.1f}s): residual "
            f"plan {plan.total_error / optimum.lower:.4f}x it")


def kron_case():
    n, d = 10, 8
    prefixes = np.tril(np.ones((n, n)))
    block = KronBlock(tuple(prefixes for _ in range(d)))
    strategy, seconds, peak = _timed(lambda: opt_kron(block))
    one = svdb_from_eigenvalues(np.linalg.eigvalsh(prefixes.T @ prefixes), n)
    _record("prefix 8x10 OPT⊗", seconds, strategy.error, one ** d, n ** d,
            strategy.sensitivity, peak, "svdb = product of per-column bounds")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--no-sql", action="store_true",
                        help="skip the end-to-end SQL rows (highdim_sql.py)")
    args = parser.parse_args()
    marginal_rss = math.nan
    if not args.no_sql:
        from highdim_sql import MARGINAL_RSS, table

        print("\n".join(table()))
        print()
        marginal_rss = MARGINAL_RSS[0]
    start = time.perf_counter()
    import cvxpy  # noqa: F401  (the max-variance program's solver; imported once per process)
    cvxpy_seconds = time.perf_counter() - start
    marginal_case("2-way 8x10 (1e8 cells)", (10,) * 8, 2, args.records)
    marginal_case("2-way 8x10 max", (10,) * 8, 2, 0, objective="max")
    marginal_case("3-way 15x10 (1e15 cells)", (10,) * 15, 3, args.records)
    notes_case()
    adult_case()
    kron_case()
    print(f"highdim: load average {' '.join(f'{v:.2f}' for v in os.getloadavg())} on "
          f"{os.cpu_count()} CPUs; errors at σ = 1 per unit of L2 sensitivity; /svdb is "
          f"RMSE / svdb's RMSE; importing cvxpy took {cvxpy_seconds:.1f}s (not in 'plan s')")
    print(f"{'case':<30}{'plan s':>8}{'svdb':>14}{'error':>14}{'RMSE':>9}{'/svdb':>8}"
          f"{'sens':>7}{'peak MB':>9}  notes")
    for case, s, bound, err, rmse, ratio, sens, peak, extra in ROWS:
        print(f"{case:<30}{s:8.3f}{bound:14.6g}{err:14.6g}{rmse:9.4f}{ratio:8.4f}"
              f"{sens:7.3f}{peak / 2**20:9.1f}  {extra}")
    top = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # the ranges rows hold DuckDB's buffers for 24,975 result tables: the 10^8-cell line's
    # memory is the peak before them (the marginal rows), or the whole run's without SQL
    mine = marginal_rss if math.isfinite(marginal_rss) else top
    first = ROWS[0]
    verdict = first[1] <= 2.0 and first[5] <= 1.001 and mine <= 1024
    print(f"max RSS {top:.0f} MB ({mine:.0f} MB before the ranges rows); targets for 2-way "
          f"8x10 (plan <= 2 s, RMSE <= 1.001 x svdb, memory <= 1 GB): "
          f"{'PASS' if verdict else 'MISS'}")


if __name__ == "__main__":
    main()

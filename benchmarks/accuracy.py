"""Which noise family wins, and what ``auto`` chooses (issue: "the best answer for a guarantee").

    python benchmarks/accuracy.py [--quick] [--consistency-only]

For the strategy benchmark's workloads and ε ∈ {0.1, 0.5, 1, 4} at δ = 1e-6 it prints the best
Gaussian strategy's expected workload RMSE (dpsql's analytic calibration with the sampler's
grid slack, exactly as releases use), the best Laplace strategy's (pure ε, L1 sensitivity,
``dpsql.noise.laplace.laplace_scale``), and what ``auto`` picks: the smaller of the two, by the
same code path as :func:`dpsql.mechanisms.selection.select` (``noise_scale`` on each candidate's plan;
the error factor ``tr(V (AᵀA)⁺)`` is computed once per plan, as the plans do not depend on ε).
The last column checks the claim that ``auto`` is never worse than either family. Expected
errors are exact (no simulation); a benchmark, not a test: it always exits 0.

Then the consistency part: the empirical RMSE of the same batch released many times with
and without ``nonnegative`` / ``integer`` post-processing. Every release there is measured
afresh (``reuse=False``): with release reuse, the second and later releases of the same
batch would be free copies of the first one's answers, not independent noise draws.
``--consistency-only`` runs just that part.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from fractions import Fraction

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dpsql.errors import StrategyError  # noqa: E402
from dpsql.inference.least_squares import LeastSquares  # noqa: E402
from dpsql.mechanisms.matrix import noise_scale, registry  # noqa: E402
from dpsql.strategies.synthetic import all_range, prefix  # noqa: E402

from strategies import marginals_2way, random_predicates  # noqa: E402

EPSILONS = (0.1, 0.5, 1, 4)
DELTA = Fraction(1, 10**6)


def plans(info, family):
    """(name, plan, tr(V (AᵀA)⁺)) of every auto candidate of a family that applies."""
    known, auto = registry(family)
    out = []
    for name in auto:
        try:
            plan = known[name].plan(info)
            out.append((name, plan, LeastSquares(plan).total_error_factor(info.V)))
        except StrategyError:
            continue
    return out


def best(candidates, family, eps, m):
    scored = []
    for name, plan, factor in candidates:
        _, variance = noise_scale(family, plan, Fraction(repr(eps)), DELTA, "analytic")
        scored.append((math.sqrt(variance * factor / m), name))
    return min(scored)


CONSISTENCY_SQL = (
    "SELECT race, COUNT(*) FROM adult WHERE age > 80 GROUP BY race; "
    "SELECT sex, income, COUNT(*) FROM adult WHERE age < 20 GROUP BY sex, income; "
    "SELECT COUNT(*) FROM adult WHERE age BETWEEN 30 AND 39")


ADULT_COLUMNS = {
    "age": {"type": "integer", "min": 17, "max": 90},
    "sex": {"type": "categorical", "values": ["Female", "Male"]},
    "race": {"type": "categorical", "values": ["White", "Black", "Asian-Pac-Islander",
                                               "Amer-Indian-Eskimo", "Other"]},
    "income": {"type": "categorical", "values": ["<=50K", ">50K"]}}


def consistency_effect(releases: int) -> None:
    """Empirical RMSE on Adult with and without nonnegative/integer post-processing
    (seeded test noise through the real release pipeline; exact answers from the same
    compiled workload and DuckDB's cell counts). Every release is an independent noise draw:
    ``reuse=False``, so that repeating the batch measures it afresh instead of answering it
    from the earlier releases for free."""
    import tempfile

    import duckdb
    import numpy as np

    import dpsql
    from dpsql.engines import duckdb as data_engine
    from dpsql.noise.samplers import SeededTestSampler
    from dpsql.sql.compile import compile_workload
    from dpsql.sql.parse import parse_batch

    here = os.path.dirname(os.path.abspath(__file__))
    shared = os.path.join(here, "..", "..", "shared", "data", "adult.csv")
    csv = shared if os.path.exists(shared) else os.path.join(here, "..", "dpsql", "data",
                                                             "adult.csv.gz")
    path = os.path.join(tempfile.mkdtemp(), "adult.duckdb")
    con = duckdb.connect(path)
    con.execute("CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true)", [csv])
    con.close()
    db = dpsql.connect(path, sampler=SeededTestSampler(11))
    policy = db.protect("adult", {"epsilon": 10**6, "delta": 0.5, "columns": ADULT_COLUMNS})
    workload = compile_workload(parse_batch(CONSISTENCY_SQL, lambda name, node: policy),
                                policy)
    with db.db.connect() as c:
        x = data_engine.data_vector(c, "adult", [(p.column, policy.column(p.column), p.unit_to_part)
                                            for p in workload.partitions], workload.n_cells)
    true = np.asarray(workload.W @ x).reshape(-1)
    print(f"\nconsistency on Adult ({releases} seeded releases each, epsilon = 0.1, "
          "delta = 1e-6): empirical RMSE over all answers")
    print(f"{'strategy':<14} {'plain':>10} {'nonneg':>10} {'nonneg+int':>11}")
    for strategy in ("identity", "hierarchical", "optimal"):
        errs = {k: [] for k in ("plain", "nonneg", "both")}
        for _ in range(releases):
            for key, flags in (("plain", {}), ("nonneg", {"nonnegative": True}),
                               ("both", {"nonnegative": True, "integer": True})):
                r = db.answer(CONSISTENCY_SQL, epsilon=0.1, delta=1e-6, strategy=strategy,
                              reuse=False, **flags)
                if r.strategy != strategy:   # a reused or substituted release: not a draw
                    raise SystemExit(f"release {r.release_id} used {r.strategy!r}, not "
                                     f"{strategy!r}: the draws would not be independent")
                got = np.concatenate([[row[-4] for row in t.rows] for t in r.results])
                errs[key].append(got - true)
        rm = {k: float(np.sqrt(np.mean(np.square(v)))) for k, v in errs.items()}
        print(f"{strategy:<14} {rm['plain']:>10.2f} {rm['nonneg']:>10.2f} {rm['both']:>11.2f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small workloads only")
    parser.add_argument("--consistency-only", action="store_true",
                        help="only the consistency part (releases on Adult)")
    args = parser.parse_args(argv)
    if args.consistency_only:
        print(f"load average: {os.getloadavg()[0]:.1f}")
        consistency_effect(20 if args.quick else 100)
        return 0
    workloads = {"all-range n=256": all_range(256), "prefix n=1024": prefix(1024),
                 "2-way marginals 8^4": marginals_2way(), "64 random predicates n=64":
                 random_predicates()}
    if not args.quick:
        workloads["all-range n=1024"] = all_range(1024)
    print(f"load average: {os.getloadavg()[0]:.1f}; delta = {float(DELTA):g}")
    head = (f"{'workload':<27} {'eps':>5} {'best gaussian':>22} {'best laplace':>22} "
            f"{'auto':>22} {'auto<=both':>10}")
    print(head)
    print("-" * len(head))
    for wname, info in workloads.items():
        started = time.perf_counter()
        gauss, lap = plans(info, "gaussian"), plans(info, "laplace")
        seconds = time.perf_counter() - started
        for eps in EPSILONS:
            g, l = best(gauss, "gaussian", eps, info.m), best(lap, "laplace", eps, info.m)
            a, family = min((g, "gaussian"), (l, "laplace"))
            ok = a[0] <= min(g[0], l[0])
            print(f"{wname:<27} {eps:>5g} {g[0]:>12.4g} {g[1]:>9} {l[0]:>12.4g} {l[1]:>9} "
                  f"{a[0]:>12.4g} {family[:5] + ':' + a[1]:>9} {str(ok):>10}")
        print(f"{'':<27} (plans of both families selected in {seconds:.1f} s)")
    consistency_effect(20 if args.quick else 100)
    return 0


if __name__ == "__main__":
    sys.exit(main())

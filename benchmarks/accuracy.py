"""Which noise family wins, and what ``auto`` chooses (issue: "the best answer for a guarantee").

    python benchmarks/accuracy.py [--quick]

For the strategy benchmark's workloads and ε ∈ {0.1, 0.5, 1, 4} at δ = 1e-6 it prints the best
Gaussian strategy's expected workload RMSE (dpsql's analytic calibration with the sampler's
grid slack, exactly as releases use), the best Laplace strategy's (pure ε, L1 sensitivity,
``dpsql.laplace.laplace_scale``), and what ``auto`` picks: the smaller of the two, by the
same code path as :func:`dpsql.selection.select` (``noise_scale`` on each candidate's plan;
the error factor ``tr(V (AᵀA)⁺)`` is computed once per plan, as the plans do not depend on ε).
The last column checks the claim that ``auto`` is never worse than either family. Expected
errors are exact (no simulation); a benchmark, not a test: it always exits 0.
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
from dpsql.inference import LeastSquares  # noqa: E402
from dpsql.selection import noise_scale, registry  # noqa: E402
from dpsql.workloads import all_range, prefix  # noqa: E402

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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small workloads only")
    args = parser.parse_args(argv)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Accuracy first: the smallest ε whose expected error meets a target (public inputs only).

Past releases are combined with the new measurement afterwards, by
:mod:`dpsql.mechanisms.tight`.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from dpsql.errors import StrategyError
from dpsql.mechanisms import matrix, selection
from dpsql.sql.compile import Workload


def smallest_epsilon(con, policy, workload: Workload, dlt, strategy: str, calibration: str,
                     target: float, objective: str):
    """The smallest ε (at this δ) whose expected error meets ``target``: (ε, explanation).

    Accuracy-first requests (no data read). Each candidate's error is its noise scale times a
    fixed factor, and every scale decreases in ε, so per candidate the smallest ε is found by
    bisection on ``log ε``; the cheapest candidate wins. ε is then rounded up to three
    significant digits (a readable charge) and the request explained at that ε with the same
    objective, whose choice meets the target by construction.
    """
    from dpsql.noise.accounting import MAX_EPSILON, MIN_EPSILON

    if isinstance(target, bool) or not isinstance(target, (int, float)) \
            or not math.isfinite(target) or target <= 0:
        raise StrategyError(f"an accuracy target must be a positive number, got {target!r}")
    one = selection.select(con, policy, workload, Fraction(1), dlt, strategy, calibration, objective)
    lo_all, hi_all = math.log(float(MIN_EPSILON)), math.log(float(MAX_EPSILON))
    best = None
    for c in one.candidates:
        if not np.isfinite(c.rmse):
            continue
        family = c.mechanism
        _, var1 = matrix.noise_scale(family, c.plan, Fraction(1), dlt, calibration)
        shape = selection._metric(c.stderr, objective) / math.sqrt(var1)

        def error(log_eps: float) -> float:
            eps = min(max(Fraction(math.exp(log_eps)), MIN_EPSILON), MAX_EPSILON)
            return shape * math.sqrt(matrix.noise_scale(family, c.plan, eps, dlt, calibration)[1])

        if error(hi_all) > target:
            continue
        lo, hi = lo_all, hi_all
        if error(lo) <= target:
            hi = lo
        for _ in range(60):
            if hi - lo < 1e-9:
                break
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if error(mid) <= target else (mid, hi)
        if best is None or hi < best:
            best = hi
    if best is None:
        raise StrategyError(
            f"no strategy reaches an expected {objective.replace('_', ' ')} of {target:g} "
            f"at any epsilon up to {float(MAX_EPSILON):g}; ask for a looser target")
    eps = min(_round_up(math.exp(best)), MAX_EPSILON)
    return eps, selection.select(con, policy, workload, eps, dlt, strategy, calibration, objective)


def _round_up(value: float) -> Fraction:
    """``value`` rounded up to three significant digits, as an exact decimal fraction."""
    from decimal import ROUND_CEILING, Decimal

    d = Decimal(repr(value))
    q = Decimal(1).scaleb(d.adjusted() - 2)
    return Fraction(d.quantize(q, rounding=ROUND_CEILING))

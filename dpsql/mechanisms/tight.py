"""Accuracy first over past releases: the smallest ε whose *combined* error meets a target.

:func:`dpsql.mechanisms.target.smallest_epsilon` finds the smallest ε at which the rows still
to be measured meet an accuracy target *on their own*. With reuse, those rows are then
answered by generalised least squares over the old measurements *and* the new ones, so
their error is smaller than the new measurement's alone: the analyst would pay for accuracy
they did not ask for (issue 18: target 40 → expected RMSE 33.5 on the demographics cube).
Here the same strategy is kept and ε is lowered until the combined error just meets the
target (public inputs only: stored releases and the compiled batch).

The combined error decreases in ε (the new term's variance decreases, the old ones are
fixed), so the search brackets the target between ε / 2ᵏ and ε and closes it by regula
falsi on ``log error`` against ``log ε`` (Illinois variant), stopping when the error is
within 0.3% below the target; ε is then rounded up to three significant digits like every
accuracy-first charge (at most 1% more ε, so the error stays within 1% of the target).
"""

from __future__ import annotations

import math

import numpy as np

#: stop the search when the combined error is within this factor below the target
TOLERANCE = 0.997
_MAX_STEPS = 40


def _combined(pool, workload, best, record_for, eps, dlt, calibration,
              objective: str) -> float:
    """The batch's combined error (``objective``) with the new measurement at ``eps``."""
    from dpsql.mechanisms.matrix import noise_scale
    from dpsql.mechanisms.selection import _metric

    scale, _ = noise_scale(best.mechanism, best.plan, eps, dlt, calibration)
    variance = pool.trial(record_for(best, scale), workload.W).variance
    return _metric(np.sqrt(variance), objective)


def combined_epsilon(pool, workload, new, eps, dlt, calibration, target: float,
                     objective: str, reselect, record_for):
    """``(ε, selection)``: the smallest ε (three significant digits, rounded up) at which the
    chosen strategy of ``new`` (the selection for the rows not free, at ``eps``, which meets
    ``target`` alone) meets ``target`` combined with ``pool``; ``reselect(ε)`` selects again
    at the lower ε; ``record_for(candidate, scale)`` is the new measurement's record (the
    pool's kind, :func:`dpsql.mechanisms.reuse.records.record_of`). Unchanged when the pool cannot take the new measurement, or when the
    selection at the lower ε picks another strategy (the standalone answer then stands)."""
    from dpsql.mechanisms.target import _round_up
    from dpsql.noise.accounting import MIN_EPSILON

    best = next(c for c in new.candidates
                if c.strategy == new.strategy and c.mechanism == new.mechanism)
    if not pool.can_add(record_for(best, best.sigma)):
        return eps, new

    def g(u: float) -> float:     # log(error / target), decreasing in u = log ε
        err = _combined(pool, workload, best, record_for, _exact(u), dlt, calibration,
                        objective)
        return math.log(err / target) if err > 0 else -math.inf

    hi = math.log(float(eps))
    g_hi = g(hi)
    if g_hi > 0:                   # rounding: never charge more than the standalone ε
        return eps, new
    lo, g_lo, floor = hi, g_hi, math.log(float(MIN_EPSILON))
    for _ in range(_MAX_STEPS):   # bracket: halve ε until the target is missed
        if g_lo > 0 or lo <= floor:
            break
        hi, g_hi = lo, g_lo
        lo = max(lo - math.log(2.0), floor)
        g_lo = g(lo)
    if g_lo <= 0:                  # even the smallest ε meets it
        hi = lo
    else:
        hi = _regula_falsi(g, lo, g_lo, hi, g_hi)
    tight = min(max(_round_up(math.exp(hi)), MIN_EPSILON), eps)
    chosen = reselect(tight)
    if (chosen.strategy, chosen.mechanism) != (new.strategy, new.mechanism):
        return eps, new
    return tight, chosen


def _regula_falsi(g, lo: float, g_lo: float, hi: float, g_hi: float) -> float:
    """The smallest ``u`` found with ``g(u) <= 0``, within :data:`TOLERANCE` of the root
    (Illinois: the end that stayed put twice has its weight halved, so the bracket shrinks
    from both sides)."""
    w_lo, w_hi, side = g_lo, g_hi, 0
    for _ in range(_MAX_STEPS):
        if g_hi >= math.log(TOLERANCE) or hi - lo < 1e-7:
            break
        u = 0.5 * (lo + hi)
        if math.isfinite(w_hi) and w_lo != w_hi:
            u = (lo * w_hi - hi * w_lo) / (w_hi - w_lo)
            if not lo < u < hi:
                u = 0.5 * (lo + hi)
        g_u = g(u)
        if g_u <= 0:
            hi, g_hi, w_hi = u, g_u, g_u
            w_lo = w_lo / 2 if side == -1 else w_lo
            side = -1
        else:
            lo, g_lo, w_lo = u, g_u, g_u
            w_hi = w_hi / 2 if side == 1 else w_hi
            side = 1
    return hi


def _exact(u: float):
    from fractions import Fraction

    return Fraction(math.exp(u))

"""The accountant: the total privacy cost of a table's releases, never more than basic
composition, tighter through zero-concentrated DP when that is smaller.

Two valid bounds on the sequence of releases actually made; the ledger reports, and the
budget check enforces, the smaller ε of the two (at the same total δ):

1. **Basic composition** (Dwork & Roth 2014, Thm 3.16): ``(Σ εᵢ, Σ δᵢ)``, exact fractions.
2. **zCDP** (Bun & Steinke, TCC 2016): a Gaussian release with L2 sensitivity Δ (grid slack
   included) and scale σ is ``ρ = Δ²/2σ²``-zCDP (the discrete Gaussian too: Canonne, Kamath
   & Steinke, NeurIPS 2020, Thm 14); a pure ε-DP release is ``ε²/2``-zCDP (Bun & Steinke
   Prop. 1.4); zCDP composes by adding ρ (ibid. Lemma 1.7). The total ``ρ = Σ ρᵢ`` converts
   to ``(ε(ρ, δ), δ)``-DP for any δ > 0 with CKS 2020's conversion (Prop. 12 / Cor. 13):

       ε(ρ, δ) = inf_{α>1}  αρ + (ln(1/δ) + (α−1) ln(1 − 1/α) − ln α) / (α − 1),

   evaluated here at ``δ = Σ δᵢ`` (the same δ basic composition spends). Any α gives a valid
   bound, so a numerical minimiser only has to be close; the value at its α is rounded up.

The zCDP route needs every release's ρ; a Gaussian release recorded without one (none are)
would make the zCDP route unavailable and basic composition applies. Metric (d_X) releases
have their own budget and do not enter here. There is no mixture of the two accountings:
each is a theorem about the whole sequence; the smaller one is taken.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable

from dpsql.noise.accounting import PrivacyCost
from dpsql.errors import BudgetExceededError

#: relative and absolute upward margins on the float evaluation of ε(ρ, δ)
_MARGIN = 1e-9


@dataclass(frozen=True)
class Spend:
    """One release as the accountant sees it."""

    epsilon: Fraction
    delta: Fraction
    rho: Fraction | None          # zCDP bound; None when unknown

    @classmethod
    def of(cls, epsilon: Fraction, delta: Fraction, mechanism: str,
           rho: float | None) -> "Spend":
        """From a ledger row: pure releases (δ = 0) get ``ε²/2`` exactly; Gaussian ones their
        recorded ρ (a double, inflated by one part in 10¹² against its rounding)."""
        epsilon, delta = Fraction(epsilon), Fraction(delta)
        if delta == 0:
            return cls(epsilon, delta, epsilon * epsilon / 2)
        if rho is None or not math.isfinite(rho) or rho < 0:
            return cls(epsilon, delta, None)
        return cls(epsilon, delta, Fraction(rho) * (1 + Fraction(1, 10**12)))


def zcdp_epsilon(rho: float, delta: float) -> float:
    """Smallest ε (rounded up) with ρ-zCDP ⇒ (ε, δ)-DP by CKS 2020's conversion; inf when δ
    is 0 (zCDP gives no pure-DP guarantee)."""
    if rho < 0 or not 0 <= delta < 1:
        raise ValueError("need rho >= 0 and 0 <= delta < 1")
    if rho == 0:
        return 0.0
    if delta == 0:
        return math.inf
    log_inv_delta = -math.log(delta)

    def bound(alpha: float) -> float:
        a1 = alpha - 1.0
        return alpha * rho + (log_inv_delta + a1 * math.log1p(-1.0 / alpha)
                              - math.log(alpha)) / a1

    # minimise over t = log(α − 1) by golden-section search on a bracket wide enough for
    # every ρ and δ dpsql meets (α from 1 + e^-20 to 1 + e^20); the bound is valid at any α
    lo, hi = -20.0, 20.0
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = bound(1.0 + math.exp(a)), bound(1.0 + math.exp(b))
    for _ in range(200):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = bound(1.0 + math.exp(a))
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = bound(1.0 + math.exp(b))
    best = min(fa, fb)
    return best * (1.0 + _MARGIN) + _MARGIN * 1e-6


def compose(spends: Iterable[Spend]) -> tuple[PrivacyCost, str]:
    """The table's total cost and how it was accounted (``basic`` or ``zcdp``)."""
    spends = list(spends)
    eps = sum((s.epsilon for s in spends), Fraction(0))
    delta = sum((s.delta for s in spends), Fraction(0))
    basic = PrivacyCost(eps, delta)
    if delta == 0 or any(s.rho is None for s in spends):
        return basic, "basic"
    rho = sum((s.rho for s in spends), Fraction(0))
    z = zcdp_epsilon(float(rho) * (1 + 1e-12), float(delta))
    if not math.isfinite(z):
        return basic, "basic"
    z_exact = Fraction(z)
    if z_exact < eps:
        return PrivacyCost(z_exact, delta), "zcdp"
    return basic, "basic"


def check(table: str, before: list, request: Spend, limit: PrivacyCost) -> PrivacyCost:
    """Refuse ``request`` when the accountant's total with it exceeds ``limit``; returns the
    new total. The error reports the increment the request would add under the accountant."""
    old, _ = compose(before)
    new, _ = compose(before + [request])
    if new.epsilon > limit.epsilon:
        raise BudgetExceededError(table, "epsilon", old.epsilon, new.epsilon - old.epsilon,
                                  limit.epsilon)
    if new.delta > limit.delta:
        raise BudgetExceededError(table, "delta", old.delta, new.delta - old.delta,
                                  limit.delta)
    return new

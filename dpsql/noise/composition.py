"""The accountant: a privacy filter over a table's releases, with two routes and a δ split.

A table's budget is ``(ε_B, δ_B)`` and a share ``δ_z`` of ``δ_B`` (the policy's
``zcdp_delta``, fixed when the table is protected) reserved for the zCDP route. A request is
accepted when the releases so far *plus it* pass at least one route:

1. **Basic composition** (Dwork & Roth 2014, Thm 3.16; as a filter under fully adaptive
   choice of each ``εᵢ, δᵢ``: Rogers, Roth, Ullman & Vadhan 2016; Whitehouse, Ramdas, Rogers
   & Wu 2023): ``Σ εᵢ ≤ ε_B`` and ``Σ δᵢ ≤ δ_B − δ_z``, exact fractions.
2. **zCDP** (Bun & Steinke, TCC 2016; as a filter: Feldman & Zrnic 2021, Whitehouse et al.
   2023): a Gaussian release with L2 sensitivity Δ (grid slack included) and scale σ is
   ``ρ = Δ²/2σ²``-zCDP (the discrete Gaussian too: Canonne, Kamath & Steinke 2020, Thm 14);
   a pure ε-DP release is ``ε²/2``-zCDP (Bun & Steinke Prop. 1.4). The route passes when
   ``ε(Σ ρᵢ, δ_z) ≤ ε_B`` with CKS 2020's conversion (Prop. 12 / Cor. 13):

       ε(ρ, δ) = inf_{α>1}  αρ + (ln(1/δ) + (α−1) ln(1 − 1/α) − ln α) / (α − 1).

   Any α gives a valid bound, so the numerical minimiser only has to be close; ρ is rounded
   up, δ_z down and the value at the minimiser up (all against the spender).

The two routes spend *different* parts of δ_B (``δ_B − δ_z`` and ``δ_z``), and that is what
makes "either route accepts" a valid filter for ``(ε_B, δ_B)``: on every transcript one route
covers the whole sequence of releases, so the output distribution splits into two parts,
each bounded by its own filter, and the δ's add (docs/accounting.md, Theorem 1). Taking the
smaller of the two totals *at the same δ* — this module's rule before — is not a valid filter
for ``(ε_B, δ_B)``: docs/accounting.md gives an analyst that ends at ``(1, 1.2·10⁻⁵)`` on a
``(1, 10⁻⁵)`` budget, and the rule is valid only for ``(ε_B, 2δ_B)``.

``δ_z = 0`` turns the zCDP route off (basic composition alone, with all of ``δ_B``); tables
protected before the split existed read as ``δ_z = 0`` (:mod:`dpsql.policy.policy`), which never
leaves them more budget than the old rule did. A release recorded without ρ (none are,
except metric ones, which have their own budget and never enter here) closes the zCDP route.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable

from dpsql.noise.accounting import PrivacyCost
from dpsql.errors import BudgetExceededError, show_exact

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


@dataclass(frozen=True)
class Budget:
    """A table's standard budget ``(ε_B, δ_B)`` and the share ``δ_z`` of δ_B reserved for
    converting the zCDP total (0: basic composition alone)."""

    epsilon: Fraction
    delta: Fraction
    zcdp_delta: Fraction = Fraction(0)

    def __post_init__(self) -> None:
        for name in ("epsilon", "delta", "zcdp_delta"):
            object.__setattr__(self, name, Fraction(getattr(self, name)))
        if not 0 <= self.zcdp_delta <= self.delta:
            raise ValueError("need 0 <= zcdp_delta <= delta")

    @property
    def basic_delta(self) -> Fraction:
        """The δ basic composition may charge: ``δ_B − δ_z``."""
        return self.delta - self.zcdp_delta


@dataclass(frozen=True)
class Total:
    """The accountant's reading of a sequence of releases against a budget."""

    basic: PrivacyCost              # (Σ εᵢ, Σ δᵢ), exact
    rho: Fraction | None            # Σ ρᵢ (rounded up); None when some ρ is unknown
    zcdp_epsilon: Fraction | None   # ε(Σ ρᵢ, δ_z) rounded up; None when the route is off
    basic_fits: bool                # Σ εᵢ ≤ ε_B and Σ δᵢ ≤ δ_B − δ_z
    zcdp_fits: bool                 # ε(Σ ρᵢ, δ_z) ≤ ε_B

    @property
    def fits(self) -> bool:
        """Whether the filter accepts this sequence: at least one route covers all of it."""
        return self.basic_fits or self.zcdp_fits

    @property
    def method(self) -> str:
        """``basic`` while basic composition still covers every release, then ``zcdp``."""
        return "basic" if self.basic_fits or not self.zcdp_fits else "zcdp"

    def reported(self, budget: Budget) -> PrivacyCost:
        """The (ε, δ) shown as spent: basic composition's ``(Σ εᵢ, Σ δᵢ)`` while it covers
        every release, afterwards the zCDP route's ``(ε(Σ ρᵢ, δ_z), δ_z)``."""
        if self.method == "zcdp":
            return PrivacyCost(self.zcdp_epsilon, budget.zcdp_delta)
        return self.basic


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


def _float_down(value: Fraction) -> float:
    """The largest double not above ``value`` (δ rounded against the spender)."""
    f = float(value)
    return math.nextafter(f, -math.inf) if Fraction(f) > value else f


def _float_up(value: Fraction) -> float:
    """The smallest double not below ``value`` (ρ rounded against the spender)."""
    f = float(value)
    return math.nextafter(f, math.inf) if Fraction(f) < value else f


def zcdp_epsilon_exact(rho: Fraction, delta: Fraction) -> Fraction | None:
    """ε(ρ, δ) as an exact fraction, every rounding against the spender; None when δ = 0."""
    if delta <= 0:
        return None
    z = zcdp_epsilon(_float_up(rho), _float_down(delta))
    return Fraction(z) if math.isfinite(z) else None


def compose(spends: Iterable[Spend], budget: Budget) -> Total:
    """Read a sequence of releases against ``budget``: both routes' totals and which fit."""
    spends = list(spends)
    eps = sum((s.epsilon for s in spends), Fraction(0))
    delta = sum((s.delta for s in spends), Fraction(0))
    basic = PrivacyCost(eps, delta)
    basic_fits = eps <= budget.epsilon and delta <= budget.basic_delta
    rho = (None if any(s.rho is None for s in spends)
           else sum((s.rho for s in spends), Fraction(0)))
    z = None if rho is None else zcdp_epsilon_exact(rho, budget.zcdp_delta)
    return Total(basic, rho, z, basic_fits, z is not None and z <= budget.epsilon)


def check(table: str, before: list, request: Spend, budget: Budget) -> Total:
    """Refuse ``request`` unless the filter accepts the releases so far plus it (one of the
    two routes covers them all); returns the new total. The error names the quantity that
    stops the request and the increment it would add to the reported total."""
    new = compose(before + [request], budget)
    if new.fits:
        return new
    old = compose(before, budget)
    spent = old.reported(budget)
    if new.basic.epsilon <= budget.epsilon:      # basic composition failed on δ alone
        raise BudgetExceededError(
            table, "delta", old.basic.delta, request.delta, budget.basic_delta,
            note=_delta_note(budget))
    after = min([new.basic.epsilon] + ([new.zcdp_epsilon] if new.zcdp_epsilon is not None
                                       else []))
    increment = after - spent.epsilon
    raise BudgetExceededError(table, "epsilon", spent.epsilon,
                              increment if increment > 0 else request.epsilon, budget.epsilon)


def _delta_note(budget: Budget) -> str:
    if budget.zcdp_delta == 0:
        return ""
    return (f"a further {show_exact(budget.zcdp_delta)} of the table's delta "
            f"{show_exact(budget.delta)} is reserved for the zCDP accountant, which refuses "
            "this request too (docs/accounting.md)")

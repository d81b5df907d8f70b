"""Bounded values: what one row adds to a SUM, and the sensitivity of the per-cell sums.

A ``SUM`` (or the numerator of an ``AVG``) over a column with bounds ``[lo, hi]`` (declared
``min``/``max`` in the policy, or ``CLAMP(col, lo, hi)`` in the query) is a linear query on a
second data vector: ``s[j]`` = the sum over the rows in cell ``j`` of each row's value. The
engine computes each row's value as (:func:`dpsql.engines.duckdb.value_sql`):

- the column read as a number and clamped to ``[lo, hi]`` (NaN and +inf count as ``hi``,
  -inf as ``lo``); a NULL or a value that cannot be read as a number counts as ``0`` (the
  declared default), never as an error;
- rounded to the nearest multiple of the unit ``u = 2**exponent`` (:class:`ValueBound`:
  the largest bound spans at most ``2**VALUE_BITS`` units, so integers are exact for bounds
  up to 2**30) and clamped again, in whole units, to ``[ceil(lo/u), floor(hi/u)]``.

Every row's value ``v`` thus satisfies ``|v| <= M`` with ``M = bound`` = ``u *
max(|ceil(lo/u)|, |floor(hi/u)|) <= max(|lo|, |hi|)`` (the default 0 too). Sums are of
integers (units), exact in the engine (HUGEINT) and under 2**62 for tables under 2**32 rows.

Sensitivity (add/remove one row, in cell ``j`` with value ``v``): ``x`` changes by ``e_j`` and
``s`` by ``v e_j``, so ``||Δs||_1 = ||Δs||_2 = |v| <= M``; a strategy ``A`` on ``s`` moves by
``|v| ||A e_j|| <= M max_j ||A e_j||``: the value-sum vector's L1/L2 sensitivity is ``M``
per row, ``M`` times the strategy's. Counts and sums released together move by
``(A_c e_j, v A_s e_j)`` for the same ``j``: the joint sensitivity couples the blocks
column by column (:mod:`dpsql.kernel.joint`). Under user-level privacy one unit is at most
``k`` rows (``max_rows_per_unit``), so by the triangle inequality every sensitivity is ``k``
times the row-level one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

#: the largest bound spans at most 2**VALUE_BITS units: integers stay exact for bounds up to
#: 2**30, and a cell's sum of units stays under 2**62 for tables under 2**32 rows
VALUE_BITS = 30
#: bounds beyond this magnitude are refused (far past any sensible clamp of real data)
MAX_BOUND = Fraction(10) ** 15
#: ... and bounds all below this one (their unit would leave the doubles' exponent range)
MIN_BOUND = Fraction(1, 10 ** 9)


def times_contribution(k: int, sensitivity: float) -> float:
    """``k · sensitivity`` rounded up to a double (exact for ``k = 1``): a row-level
    sensitivity under user-level privacy (``k = max_rows_per_unit``). The planner and the
    kernel compute it with this one function, so their σ and ρ agree bit for bit."""
    exact = Fraction(int(k)) * Fraction(sensitivity)
    value = float(exact)
    while Fraction(value) < exact:
        value = math.nextafter(value, math.inf)
    return value


@dataclass(frozen=True)
class ValueBound:
    """The quantised bounds of one value column: ``[lo, hi]`` exactly, the unit
    ``u = 2**exponent`` and the bounds in whole units. Public: from the policy or the query."""

    lo: Fraction
    hi: Fraction

    def __post_init__(self) -> None:
        lo, hi = Fraction(self.lo), Fraction(self.hi)
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)
        if not lo < hi:
            raise ValueError("the lower bound must be below the upper bound")
        if max(abs(lo), abs(hi)) > MAX_BOUND:
            raise ValueError(f"bounds must be within ±{float(MAX_BOUND):g}")
        if max(abs(lo), abs(hi)) < MIN_BOUND:
            raise ValueError(f"a bound must reach at least {float(MIN_BOUND):g} in magnitude")
        if self.lo_units > self.hi_units:
            raise ValueError("the bounds are too close together to hold a value")

    @property
    def exponent(self) -> int:
        """``e`` with ``u = 2**e``: the smallest ``e`` such that ``max(|lo|, |hi|) <=
        2**(e + VALUE_BITS)``."""
        m = max(abs(self.lo), abs(self.hi))
        e = m.numerator.bit_length() - m.denominator.bit_length() - 1
        while Fraction(2) ** e < m:
            e += 1
        while Fraction(2) ** (e - 1) >= m:
            e -= 1
        return e - VALUE_BITS

    @property
    def unit(self) -> Fraction:
        return Fraction(2) ** self.exponent

    @property
    def lo_units(self) -> int:
        return math.ceil(self.lo / self.unit)

    @property
    def hi_units(self) -> int:
        return math.floor(self.hi / self.unit)

    @property
    def units_bound(self) -> int:
        """``max |v| / u`` over every value a row can add (the default 0 included)."""
        return max(abs(self.lo_units), abs(self.hi_units))

    @property
    def bound(self) -> Fraction:
        """``M``: the most one row adds to, or takes from, a cell's sum (exact)."""
        return self.units_bound * self.unit

    @property
    def avg_range(self) -> tuple[float, float]:
        """Where an average of values lies: ``[min(lo, 0), max(hi, 0)]`` (the default 0 of
        NULL and unreadable values included)."""
        return float(min(self.lo, 0)), float(max(self.hi, 0))


@dataclass(frozen=True)
class VectorPlan:
    """One measurement block of a joint release: a strategy on one data vector (the counts
    when ``value`` is None, else the per-cell sums of ``value``) and its noise scale (σ, or
    the Laplace scale ``b`` with ``epsilon`` this block's share of ε)."""

    value: object             # dpsql.sql.ir.Value, or None for the counts
    plan: object              # dpsql.workload.matrix.Plan on the batch's cells
    scale: float
    epsilon: Fraction | None = None

    @property
    def bound(self) -> Fraction:
        """``M``: the most one row moves this vector's cell (1 for a count)."""
        return Fraction(1) if self.value is None else ValueBound(self.value.lo,
                                                                 self.value.hi).bound


@dataclass(frozen=True)
class JointPlan:
    """Every block of a batch mixing COUNT and SUM: one release, one charge
    (:meth:`dpsql.kernel.boundary.Kernel.release_joint` checks the scales together)."""

    blocks: tuple             # VectorPlan, the counts first when present
    strategy: str             # as the ledger records it

    @property
    def n_measurements(self) -> int:
        return sum(b.plan.n_measurements for b in self.blocks)

    @property
    def values(self) -> tuple:
        return tuple(b.value for b in self.blocks if b.value is not None)

"""Ordered domains: integers on a step grid and reals cut into bins, compared exactly."""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from dpsql.errors import PolicyError
from dpsql.workload.units import (FALSE, MAX_UNITS_PER_COLUMN, TRUE, UNKNOWN, NotExpressible,
                                  _check_finite, _exact, _Units)


class _OrderedDomain(_Units):
    """Shared logic of integer and numeric domains: units are ordered value sets."""

    nullable: bool

    # subclasses provide: n_value_units, _bounds(unit) -> (lo, hi, hi_closed, integral)

    @property
    def n_units(self) -> int:
        return self.n_value_units + int(self.nullable)

    @property
    def null_unit(self) -> int | None:
        return self.n_value_units if self.nullable else None

    @property
    def other_unit(self) -> None:
        return None

    def group_units(self) -> list[int]:
        units = list(range(self.n_value_units))
        if self.nullable:
            units.append(self.null_unit)
        return units

    def compare(self, op: str, value: Any) -> np.ndarray:
        """Truth of ``column op value`` on every unit, vectorised (exact rational bounds)."""
        if isinstance(value, (str, bool)) or value is None:
            raise NotExpressible("compares a numeric column with a non-numeric literal")
        c = _exact(value)
        if op == "<>":
            out = TRUE - self.compare("=", c)
            if self.nullable:
                out[self.null_unit] = UNKNOWN
            return out.astype(np.int8)
        true_if, false_if = self._truth(op, c)
        mixed = ~(true_if | false_if)
        if mixed.any():
            unit = int(np.flatnonzero(mixed)[0])
            raise NotExpressible(
                f"the condition {op} {_show(c)} splits the declared unit "
                f"{self.unit_label(unit)}; {self._cut_hint()}")
        out = np.full(self.n_units, UNKNOWN, dtype=np.int8)  # the NULL unit stays UNKNOWN
        out[: self.n_value_units] = np.where(true_if, TRUE, FALSE)
        return out

    def compare_many(self, op: str, values: list) -> np.ndarray | None:
        """:meth:`compare` of many literals at once (one row each), or None when this kind,
        operator or literal is not vectorised or some literal splits a unit (then
        :meth:`compare`, literal by literal, says why)."""
        return None


#: ``column op literal`` on a unit holding one integer ``u``: ``_COMPARE[op](u, literal)``
_COMPARE = {"=": np.equal, "<": np.less, "<=": np.less_equal, ">": np.greater,
            ">=": np.greater_equal}


@functools.lru_cache(maxsize=64)
def _unit_bounds(lo: int, hi: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) integer of every unit of ``IntegerDomain(lo, hi, step)``, read-only:
    computed once per domain, not once per condition (a batch has thousands)."""
    k = np.arange((hi - lo) // step + 1, dtype=np.int64)
    first = lo + k * step
    last = np.minimum(first + step - 1, hi)
    first.flags.writeable = last.flags.writeable = False
    return first, last


def _show(c: Fraction) -> str:
    return str(c.numerator) if c.denominator == 1 else repr(float(c))


@dataclass(frozen=True)
class IntegerDomain(_OrderedDomain):
    """Integers ``min, min+step, ..., <= max``; unit ``k`` is the step-wide run from ``min+k*step``."""

    min: int
    max: int
    step: int = 1
    nullable: bool = False
    type: str = field(default="integer", init=False)

    def validate(self, table: str, column: str) -> None:
        for name in ("min", "max", "step"):
            v = getattr(self, name)
            _check_finite(table, column, name, v)
            if not isinstance(v, int):
                raise PolicyError(
                    f"table {table!r}, column {column!r}: integer domain {name} must be an "
                    f"integer, got {v!r}"
                )
        if self.min > self.max:
            raise PolicyError(
                f"table {table!r}, column {column!r}: min {self.min} is greater than max "
                f"{self.max} (empty domain)"
            )
        if self.step < 1:
            raise PolicyError(
                f"table {table!r}, column {column!r}: step must be >= 1, got {self.step}"
            )
        if max(abs(self.min), abs(self.max), self.step) > 2 ** 62:
            raise PolicyError(
                f"table {table!r}, column {column!r}: integer bounds must lie within "
                "+-2**62"
            )
        if self.n_value_units > MAX_UNITS_PER_COLUMN:
            raise PolicyError(
                f"table {table!r}, column {column!r}: {self.n_value_units} units exceed the "
                f"limit of {MAX_UNITS_PER_COLUMN}; use a larger step"
            )

    @property
    def n_value_units(self) -> int:
        return (self.max - self.min) // self.step + 1

    def _truth(self, op: str, c: Fraction):
        """(true, false) masks over value units; unit k holds the integers [lo_k, hi_k]."""
        lo, hi = _unit_bounds(self.min, self.max, self.step)
        floor_c = math.floor(c)
        ceil_c = math.ceil(c)
        lim = 2 ** 62  # bounds are validated within +-2**62; clip keeps int64 exact
        f_c, c_c = max(-lim, min(lim, floor_c)), max(-lim, min(lim, ceil_c))
        if op == "=":
            if c.denominator != 1:
                return np.zeros_like(lo, dtype=bool), np.ones_like(lo, dtype=bool)
            return (lo == c_c) & (hi == c_c), (hi < c_c) | (lo > c_c)
        # for an integer x: x < c <=> x < ceil(c); x <= c <=> x <= floor(c); etc.
        return {
            "<": (hi < c_c, lo >= c_c),
            "<=": (hi <= f_c, lo > f_c),
            ">": (lo > f_c, hi <= f_c),
            ">=": (lo >= c_c, hi < c_c),
        }[op]

    def compare_many(self, op: str, values: list) -> np.ndarray | None:
        """:meth:`compare` of plain integer literals (exactly: integers compare with the
        units' first and last integers as in :meth:`_truth`), one row per literal."""
        lim = 2 ** 62
        if op not in ("=", "<>", "<", "<=", ">", ">=") or \
                any(type(v) is not int or not -lim <= v <= lim for v in values):
            return None
        if op == "<>":
            eq = self.compare_many("=", values)
            if eq is None:
                return None
            out = (TRUE - eq).astype(np.int8)
            if self.nullable:
                out[:, self.null_unit] = UNKNOWN
            return out
        lo, hi = _unit_bounds(self.min, self.max, self.step)
        c = np.fromiter(values, dtype=np.int64, count=len(values))[:, None]
        if self.step == 1:          # a unit is one integer (lo == hi): TRUE or FALSE on it
            return self._one_integer_units(_COMPARE[op](lo, c))
        if op == "=":
            true_if, false_if = (lo == c) & (hi == c), (hi < c) | (lo > c)
        elif op == "<":
            true_if, false_if = hi < c, lo >= c
        elif op == "<=":
            true_if, false_if = hi <= c, lo > c
        elif op == ">":
            true_if, false_if = lo > c, hi <= c
        else:
            true_if, false_if = lo >= c, hi < c
        if not (true_if | false_if).all():
            return None
        out = np.full((len(values), self.n_units), UNKNOWN, dtype=np.int8)
        out[:, : self.n_value_units] = np.where(true_if, TRUE, FALSE)
        return out

    def _one_integer_units(self, true_if: np.ndarray) -> np.ndarray:
        """:meth:`compare_many`'s rows where ``true_if`` (a row per literal) is exact."""
        if not self.nullable:                  # the comparison's own array, FALSE 0 TRUE 2
            out = true_if.view(np.int8)
            out *= np.int8(TRUE)
            return out
        out = np.full((true_if.shape[0], self.n_units), UNKNOWN, dtype=np.int8)
        np.multiply(true_if.view(np.int8), np.int8(TRUE), out=out[:, : self.n_value_units])
        return out

    def _bounds(self, unit: int):
        lo = self.min + unit * self.step
        hi = min(lo + self.step - 1, self.max)
        return Fraction(lo), Fraction(hi), True, True

    def group_key(self, unit: int):
        return None if unit == self.null_unit else self.min + unit * self.step

    def unit_label(self, unit: int) -> str:
        if unit == self.null_unit:
            return "NULL"
        lo, hi, _, _ = self._bounds(unit)
        return str(lo.numerator) if lo == hi else f"[{lo.numerator}, {hi.numerator}]"

    def _cut_hint(self) -> str:
        return (f"the domain is declared in steps of {self.step} from {self.min}; "
                "compare against step boundaries")

    def describe(self) -> dict:
        return {"type": "integer", "min": self.min, "max": self.max, "step": self.step,
                "nullable": self.nullable}


@dataclass(frozen=True)
class NumericDomain(_OrderedDomain):
    """Reals in ``[min, max]`` cut into bins at ``edges`` (``min`` and ``max`` are edges)."""

    min: float
    max: float
    edges: tuple
    nullable: bool = False
    type: str = field(default="numeric", init=False)

    def validate(self, table: str, column: str) -> None:
        _check_finite(table, column, "min", self.min)
        _check_finite(table, column, "max", self.max)
        if self.min >= self.max:
            raise PolicyError(
                f"table {table!r}, column {column!r}: min {self.min} must be less than max "
                f"{self.max}"
            )
        if len(self.edges) < 2:
            raise PolicyError(
                f"table {table!r}, column {column!r}: numeric domain needs at least two edges "
                "(min and max)"
            )
        for e in self.edges:
            _check_finite(table, column, "edges", e)
        for a, b in zip(self.edges, self.edges[1:]):
            if not a < b:
                raise PolicyError(
                    f"table {table!r}, column {column!r}: edges must be strictly increasing, "
                    f"got {a!r} then {b!r}"
                )
        if self.edges[0] != self.min or self.edges[-1] != self.max:
            raise PolicyError(
                f"table {table!r}, column {column!r}: edges must start at min ({self.min}) "
                f"and end at max ({self.max}); got {self.edges[0]!r} .. {self.edges[-1]!r}"
            )
        if self.n_value_units > MAX_UNITS_PER_COLUMN:
            raise PolicyError(
                f"table {table!r}, column {column!r}: too many bins ({self.n_value_units})"
            )

    @property
    def n_value_units(self) -> int:
        return len(self.edges) - 1

    def _truth(self, op: str, c: Fraction):
        """(true, false) masks over bins [e_i, e_{i+1}) (the last one closed)."""
        edges = [_exact(e) for e in self.edges]
        n = self.n_value_units
        i = np.arange(n)
        n_lt = bisect.bisect_left(edges, c)    # edges < c
        n_le = bisect.bisect_right(edges, c)   # edges <= c
        lo_ge, lo_gt = i >= n_lt, i >= n_le    # e_i >= c, e_i > c
        hi_le, hi_lt = i + 1 < n_le, i + 1 < n_lt  # e_{i+1} <= c, e_{i+1} < c
        closed = i == n - 1
        below_all = hi_lt | (hi_le & ~closed)  # every value of the bin is < c
        if op == "=":
            return np.zeros(n, dtype=bool), lo_gt | below_all
        return {
            "<": (below_all, lo_ge),
            "<=": (hi_le, lo_gt),
            ">": (lo_gt, hi_le),
            ">=": (lo_ge, below_all),
        }[op]

    def _bounds(self, unit: int):
        lo, hi = _exact(self.edges[unit]), _exact(self.edges[unit + 1])
        return lo, hi, unit == self.n_value_units - 1, False

    def group_key(self, unit: int):
        return None if unit == self.null_unit else float(self.edges[unit])

    def unit_label(self, unit: int) -> str:
        if unit == self.null_unit:
            return "NULL"
        close = "]" if unit == self.n_value_units - 1 else ")"
        return f"[{self.edges[unit]}, {self.edges[unit + 1]}{close}"

    def _cut_hint(self) -> str:
        shown = ", ".join(str(e) for e in self.edges[:16])
        more = ", ..." if len(self.edges) > 16 else ""
        return (f"bins are [a, b) between the declared edges ({shown}{more}); use `col >= e` "
                "and `col < e` with e an edge")

    def describe(self) -> dict:
        return {"type": "numeric", "min": self.min, "max": self.max,
                "edges": list(self.edges), "nullable": self.nullable}

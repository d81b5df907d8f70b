"""Declared public domains of columns, and the *units* they are made of.

A column's declared domain is cut into **units**, the finest pieces dpsql ever
distinguishes for that column. Units come from the policy alone, never from the data:

- ``categorical``: one unit per declared value, then an implicit ``other`` unit (every
  non-NULL value that is not declared), then ``NULL`` when the column is nullable.
- ``integer`` (``min``, ``max``, ``step``): unit ``k`` holds the integers
  ``[min + k*step, min + (k+1)*step - 1]`` (the last one ends at ``max``).
- ``numeric`` (``min``, ``max``, ``edges``): one unit per bin ``[e_i, e_{i+1})``; the last bin
  is closed ``[e_{k-1}, max]``.

Out-of-domain rows (the documented rule, applied by the engine when it counts):

- integer / numeric values are clamped to ``[min, max]`` (integers are floored to the
  ``step`` grid); a predicate sees the clamped value. NaN counts as ``max`` (it sorts above
  every number), ``±inf`` as ``max`` / ``min``; a value that cannot be read as a number
  counts as NULL;
- integer categories match only values that are whole numbers (2.7 is ``other``, not 3);
- categorical values not declared fall in ``other``: ``=`` / ``IN`` on declared values never
  select it, ``<>`` / ``NOT IN`` do;
- ``NULL`` is its own unit when the column is ``nullable`` and follows SQL three-valued logic
  (every comparison with it is UNKNOWN). In a column *not* declared nullable a NULL is treated
  as out of domain: categorical -> ``other``, integer / numeric -> clamped to ``min``.

Predicates are evaluated per unit in Kleene logic with the encoding ``FALSE=0``,
``UNKNOWN=1``, ``TRUE=2`` (AND = min, OR = max, NOT = 2 - v). A comparison that is true for
part of a unit and false for the rest cannot be answered on the declared domain and raises
:class:`NotExpressible` (the compiler turns it into an error that points at the query text).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Union

import numpy as np

from dpsql.errors import PolicyError

FALSE, UNKNOWN, TRUE = 0, 1, 2

#: comparison operators the domains understand
COMPARISONS = ("=", "<>", "<", "<=", ">", ">=")

#: the largest number of units a single column may declare
MAX_UNITS_PER_COLUMN = 1_000_000


class NotExpressible(Exception):
    """A predicate splits a unit of the declared domain (internal; carries a plain reason)."""


def _check_finite(table: str, column: str, field_name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PolicyError(
            f"table {table!r}, column {column!r}: {field_name} must be a number, got "
            f"{type(value).__name__}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise PolicyError(
            f"table {table!r}, column {column!r}: {field_name} must be finite, got {value!r}"
        )


def _exact(value: Any) -> Fraction:
    """A literal or bound as an exact rational (floats through their shortest repr)."""
    if isinstance(value, Fraction):
        return value
    if isinstance(value, float):
        return Fraction(repr(value))
    return Fraction(value)


class _Units:
    """What every domain shares: the NULL unit's truth for IS NULL."""

    def is_null(self) -> np.ndarray:
        out = np.full(self.n_units, FALSE, dtype=np.int8)
        if self.nullable:
            out[self.null_unit] = TRUE
        return out


@dataclass(frozen=True)
class CategoricalDomain(_Units):
    """An explicit list of values (strings, or integers), plus implicit ``other`` and NULL."""

    values: tuple
    nullable: bool = False
    type: str = field(default="categorical", init=False)

    def validate(self, table: str, column: str) -> None:
        if len(self.values) == 0:
            raise PolicyError(
                f"table {table!r}, column {column!r}: categorical domain is empty; "
                "declare at least one value in `values`"
            )
        kinds = {type(v) for v in self.values}
        if bool in kinds or not (kinds <= {str} or kinds <= {int}):
            raise PolicyError(
                f"table {table!r}, column {column!r}: categorical values must all be strings "
                f"or all be integers, got types {sorted(k.__name__ for k in kinds)}"
            )
        seen = set()
        for v in self.values:
            if v in seen:
                raise PolicyError(
                    f"table {table!r}, column {column!r}: duplicate categorical value {v!r}"
                )
            seen.add(v)
        if len(self.values) > MAX_UNITS_PER_COLUMN:
            raise PolicyError(
                f"table {table!r}, column {column!r}: {len(self.values)} values exceed the "
                f"limit of {MAX_UNITS_PER_COLUMN}"
            )

    # units: declared values, other, [null]
    @property
    def n_units(self) -> int:
        return len(self.values) + 1 + int(self.nullable)

    @property
    def other_unit(self) -> int:
        return len(self.values)

    @property
    def null_unit(self) -> int | None:
        return len(self.values) + 1 if self.nullable else None

    def group_units(self) -> list[int]:
        """Units that are groups of a GROUP BY: declared values, then NULL."""
        units = list(range(len(self.values)))
        if self.nullable:
            units.append(self.null_unit)
        return units

    def group_key(self, unit: int):
        return None if unit == self.null_unit else self.values[unit]

    def unit_label(self, unit: int) -> str:
        if unit == self.null_unit:
            return "NULL"
        if unit == self.other_unit:
            return "<other>"
        return repr(self.values[unit])

    def _check_literal(self, value: Any) -> None:
        want_str = isinstance(self.values[0], str)
        if want_str != isinstance(value, str) or isinstance(value, bool):
            raise NotExpressible(
                f"compares a {'text' if want_str else 'integer'} categorical column with "
                f"{'a number' if want_str else 'a string'}"
            )

    def compare(self, op: str, value: Any) -> np.ndarray:
        out = np.empty(self.n_units, dtype=np.int8)
        if op not in ("=", "<>"):
            raise NotExpressible(
                f"ordering comparison {op} on a categorical column is not supported "
                "(use =, <>, IN or NOT IN)"
            )
        self._check_literal(value)
        if value not in self.values:
            shown = ", ".join(repr(v) for v in self.values[:12])
            more = ", ..." if len(self.values) > 12 else ""
            raise NotExpressible(
                f"value {value!r} is not in the declared domain ({shown}{more}); undeclared "
                "values are pooled in one 'other' cell that cannot be split"
            )
        idx = self.values.index(value)
        eq = np.full(self.n_units, FALSE, dtype=np.int8)
        eq[idx] = TRUE
        out[:] = eq if op == "=" else TRUE - eq
        if self.nullable:
            out[self.null_unit] = UNKNOWN
        return out

    def describe(self) -> dict:
        return {"type": "categorical", "values": list(self.values), "nullable": self.nullable}


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
        k = np.arange(self.n_value_units, dtype=np.int64)
        lo = self.min + k * self.step
        hi = np.minimum(lo + self.step - 1, self.max)
        floor_c = math.floor(c)
        ceil_c = math.ceil(c)
        lim = 2 ** 62  # bounds are validated within +-2**62; clip keeps int64 exact
        f_c, c_c = max(-lim, min(lim, floor_c)), max(-lim, min(lim, ceil_c))
        if op == "=":
            if c.denominator != 1:
                return np.zeros_like(k, dtype=bool), np.ones_like(k, dtype=bool)
            return (lo == c_c) & (hi == c_c), (hi < c_c) | (lo > c_c)
        # for an integer x: x < c <=> x < ceil(c); x <= c <=> x <= floor(c); etc.
        return {
            "<": (hi < c_c, lo >= c_c),
            "<=": (hi <= f_c, lo > f_c),
            ">": (lo > f_c, hi <= f_c),
            ">=": (lo >= c_c, hi < c_c),
        }[op]

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


Domain = Union[CategoricalDomain, IntegerDomain, NumericDomain]


def domain_from_spec(table: str, column: str, spec: Any) -> Domain:
    """Build and validate one column's domain from its policy entry (a dict)."""
    if not isinstance(spec, dict):
        raise PolicyError(
            f"table {table!r}, column {column!r}: expected a table like "
            "{ type = \"integer\", min = 0, max = 10 }, got " + type(spec).__name__
        )
    kind = spec.get("type")
    nullable = spec.get("nullable", False)
    if not isinstance(nullable, bool):
        raise PolicyError(f"table {table!r}, column {column!r}: nullable must be true or false")
    allowed = {
        "categorical": {"type", "values", "nullable"},
        "integer": {"type", "min", "max", "step", "nullable"},
        "numeric": {"type", "min", "max", "edges", "nullable"},
    }
    if not isinstance(kind, str) or kind not in allowed:
        raise PolicyError(
            f"table {table!r}, column {column!r}: type must be one of categorical, integer, "
            f"numeric; got {kind!r}"
        )
    unknown = set(spec) - allowed[kind]
    if unknown:
        raise PolicyError(
            f"table {table!r}, column {column!r}: unknown field(s) {sorted(unknown)} for a "
            f"{kind} domain (allowed: {sorted(allowed[kind])})"
        )
    try:
        if kind == "categorical":
            values = spec.get("values")
            if not isinstance(values, (list, tuple)):
                raise PolicyError(
                    f"table {table!r}, column {column!r}: categorical domain needs a list "
                    "`values`"
                )
            dom: Domain = CategoricalDomain(tuple(values), nullable)
        elif kind == "integer":
            for need in ("min", "max"):
                if need not in spec:
                    raise PolicyError(
                        f"table {table!r}, column {column!r}: integer domain needs `{need}`"
                    )
            dom = IntegerDomain(spec["min"], spec["max"], spec.get("step", 1), nullable)
        else:
            for need in ("min", "max", "edges"):
                if need not in spec:
                    raise PolicyError(
                        f"table {table!r}, column {column!r}: numeric domain needs `{need}`"
                    )
            edges = spec["edges"]
            if not isinstance(edges, (list, tuple)):
                raise PolicyError(
                    f"table {table!r}, column {column!r}: `edges` must be a list of numbers"
                )
            dom = NumericDomain(spec["min"], spec["max"], tuple(edges), nullable)
    except TypeError as exc:  # e.g. comparing str with int inside validation
        raise PolicyError(f"table {table!r}, column {column!r}: malformed domain ({exc})") from None
    dom.validate(table, column)
    return dom

"""What every declared domain is made of: units, their truth values, and exact numbers.

A column's declared domain is cut into **units**, the finest pieces dpsql ever distinguishes
for that column (the kinds: :mod:`dpsql.workload.categorical`, :mod:`dpsql.workload.ordered`;
the rules: :mod:`dpsql.workload.domain`). This module holds what the kinds share: the truth
encoding, the unit limit, the NULL unit's truth for IS NULL, and the exact-number checks.

Predicates are evaluated per unit in Kleene logic with the encoding ``FALSE=0``,
``UNKNOWN=1``, ``TRUE=2`` (AND = min, OR = max, NOT = 2 - v). A comparison that is true for
part of a unit and false for the rest cannot be answered on the declared domain and raises
:class:`NotExpressible` (the compiler turns it into an error that points at the query text).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

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

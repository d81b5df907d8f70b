"""Categorical domains: declared values, then an implicit ``other`` unit, then NULL."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpsql.errors import PolicyError
from dpsql.workload.units import FALSE, MAX_UNITS_PER_COLUMN, TRUE, UNKNOWN, NotExpressible, _Units


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
        if kinds <= {int} and any(not -2 ** 63 <= v < 2 ** 63 for v in self.values):
            raise PolicyError(
                f"table {table!r}, column {column!r}: integer categorical values must lie "
                "within the 64-bit integer range (-2**63 .. 2**63-1)")
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

    def compare_many(self, op: str, values: list) -> np.ndarray | None:
        """:meth:`compare` of many declared literals at once (one row each), or None when
        one is not declared or of the wrong kind (then :meth:`compare` says why)."""
        if op not in ("=", "<>"):
            return None
        want = str if isinstance(self.values[0], str) else int
        index = self._index
        if any(type(v) is not want or v not in index for v in values):
            return None
        eq = np.full((len(values), self.n_units), FALSE, dtype=np.int8)
        eq[np.arange(len(values)), [index[v] for v in values]] = TRUE
        out = eq if op == "=" else (TRUE - eq).astype(np.int8)
        if self.nullable:
            out[:, self.null_unit] = UNKNOWN
        return out

    @functools.cached_property
    def _index(self) -> dict:
        return {v: i for i, v in enumerate(self.values)}

    def describe(self) -> dict:
        return {"type": "categorical", "values": list(self.values), "nullable": self.nullable}

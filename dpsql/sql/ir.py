"""The query IR: what the allow-list hands the compiler (no syntax node, public text only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Atom:
    """``column op value``; op is a comparison, ``isnull`` (value None), or ``units`` (value:
    the truth per unit of the column's declared domain, a tuple; what a condition on a public
    table's column becomes, :mod:`dpsql.sql.joins`)."""

    column: str
    op: str
    value: Any
    line: int | None = None
    col: int | None = None


@dataclass(frozen=True)
class BoolOp:
    """``and`` / ``or`` over children, or ``not`` over one child."""

    op: str
    children: tuple


@dataclass(frozen=True)
class Const:
    """A literal TRUE or FALSE in a WHERE clause."""

    value: bool


Predicate = Atom | BoolOp | Const


@dataclass(frozen=True)
class Quantile:
    """``MEDIAN(col)``, ``QUANTILE_CONT/DISC(col, q)``, ``PERCENTILE_CONT/DISC(q) WITHIN GROUP
    (ORDER BY col)`` (:mod:`dpsql.sql.quantiles`)."""

    column: str                 # an integer or numeric column of the protected table
    q: Any                      # Fraction strictly between 0 and 1
    kind: str                   # "cont" or "disc"


@dataclass(frozen=True)
class DimGrouping:
    """A GROUP BY column of a public table: the key column's units grouped by their value in
    the public table (:mod:`dpsql.sql.joins`)."""

    name: str                   # as it appears in grouping sets: "public_table.column"
    key: str                    # the protected table's key column
    values: tuple               # the groups' values (the NULL group is None, last)
    unit_group: tuple           # per unit of the key column: its group's index, or -1
    sql_type: str               # the result column's type


@dataclass(frozen=True)
class Value:
    """The bounded column a SUM or AVG adds up: each row's value clamped to ``[lo, hi]``
    (exact; the policy's ``min``/``max`` unless ``clamped``: bounds from the query's
    ``CLAMP(col, lo, hi)`` / ``CLAMPED BETWEEN``). See :mod:`dpsql.workload.values`."""

    column: str
    lo: Any
    hi: Any
    clamped: bool = False

    @property
    def label(self) -> str:
        """How explain and the ledger name the value vector: ``hours_per_week[0, 100]``."""
        def show(v):
            return str(v.numerator) if v.denominator == 1 else repr(float(v))
        return f"{self.column}[{show(self.lo)}, {show(self.hi)}]"


@dataclass(frozen=True)
class Query:
    """One statement of a batch, validated against the allow-list."""

    index: int                  # position in the batch, from 0
    table: str                  # protected table (lower case)
    where: Predicate | None
    count_column: str | None    # COUNT(col), AVG(col): rows where col IS NOT NULL
    count_name: str             # output column of the aggregate ("count", "sum", "avg" unless
                                # aliased)
    key_columns: tuple          # output key columns: (source column, output name)
    grouping_sets: tuple        # tuple of tuples of source columns; ((),) when no GROUP BY
    target: str | None          # CREATE TABLE name
    replace: bool               # CREATE OR REPLACE
    sql: str                    # the statement, normalised
    quantile: Quantile | None = None    # the aggregate is a quantile (count_name: its name)
    derived: tuple = ()         # DimGrouping per public table column some grouping set uses
    aggregate: str = "count"    # count, sum (of ``value``), avg (sum of ``value`` / count)
    value: Value | None = None  # the bounded column of a sum or avg

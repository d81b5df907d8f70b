"""The aggregate of a SELECT: COUNT, SUM and AVG over bounded columns, in dpsql's spelling and
BigQuery's.

One aggregate per statement (a batch holds many statements, answered as one workload):

- ``COUNT(*)``, ``COUNT(1)``, ``COUNT(col)`` (rows where ``col`` is not NULL);
- ``SUM(col)`` / ``AVG(col)`` over a column declared ``integer`` or ``numeric``: each row's
  value is clamped to the column's declared ``[min, max]``;
- ``SUM(CLAMP(col, lo, hi))`` / ``AVG(CLAMP(col, lo, hi))``: clamped to the query's own bounds
  (numeric constants, ``lo < hi``), for any declared column (tighter bounds, less noise);
- BigQuery's ``ANON_COUNT(*)``, ``ANON_COUNT(col)``, ``ANON_SUM(col CLAMPED BETWEEN lo AND
  hi)``, ``ANON_AVG(col CLAMPED BETWEEN lo AND hi)`` (and without ``CLAMPED BETWEEN``: the
  declared bounds). :mod:`dpsql.sql.bigquery` turns ``CLAMPED BETWEEN lo AND hi`` into the
  arguments ``, lo, hi`` before sqlglot reads the text.

A NULL or unreadable value adds 0 to a SUM (:mod:`dpsql.workload.values`). ``AVG(col)`` is
``SUM(col) / COUNT(col)`` over the same rows: with ``col`` declared ``nullable`` that is SQL's
AVG (NULL and unreadable values are left out of both); otherwise they count as 0 in a row
that counts. Everything here is public (the query text and the declared policy).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from sqlglot import exp

from dpsql.sql import hints, quantiles
from dpsql.sql.ir import Quantile, Value
from dpsql.sql.literals import _literal
from dpsql.sql.refusals import _is_set, _reject
from dpsql.workload.values import ValueBound

#: BigQuery's spellings -> dpsql's aggregate
ANON = {"ANON_COUNT": "count", "ANON_SUM": "sum", "ANON_AVG": "avg"}
#: dpsql's aggregate functions (sqlglot node class -> aggregate)
NATIVE = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg"}


@dataclass(frozen=True)
class Aggregate:
    """What a statement aggregates: ``kind`` (count, sum, avg), the column whose NULLs it
    leaves out (COUNT(col), AVG(col)), the bounded value of a sum or avg, its output name."""

    kind: str
    count_column: str | None
    value: Value | None
    name: str
    quantile: Quantile | None = None     # a quantile (kind "count": it is counts, its CDF)


def is_aggregate(node: exp.Expression) -> bool:
    """Whether a SELECT item is an aggregate (dpsql's or BigQuery's spelling, supported or
    not: the unsupported ones are refused by :func:`read_aggregate` with a hint)."""
    return isinstance(node, exp.AggFunc) or quantiles.is_quantile(node) or (
        isinstance(node, exp.Anonymous) and str(node.name).upper() in ANON)


def read_aggregate(node: exp.Expression, item: exp.Expression, out_name: str | None,
                   column_name, policy: Any) -> Aggregate:
    """The statement's aggregate, or a refusal naming the construct and the fix."""
    if quantiles.is_quantile(node):          # counts of its column's CDF (dpsql.sql.quantiles)
        _, name, quantile = quantiles.aggregate(node, item, out_name, column_name, policy)
        return Aggregate("count", None, None, name, quantile)
    if isinstance(node, exp.Anonymous):
        kind, args = ANON[str(node.name).upper()], list(node.expressions)
    elif type(node) in NATIVE:
        kind, args = NATIVE[type(node)], [node.this]
        extra = [k for k, v in node.args.items() if _is_set(v) and k not in ("this", "big_int")]
        if extra:
            raise _reject(f"this {kind.upper()} form", node)
    else:
        fname = node.sql_name()
        raise _reject(f"function {fname}()", node, hints.hint("aggregate"), at=item)
    if kind == "count":
        return Aggregate("count", _counted(node, args, column_name), None, out_name or "count")
    column, bounds = _value_argument(node, kind, args)
    name = column_name(column)
    if "." in name:                          # a public table's column (dpsql.sql.joins)
        raise _reject(f"{kind.upper()} of a public table's column", column,
                      f"{kind.upper()} adds up a column of the protected table", at=item)
    value = _bounded(node, kind, name, bounds, policy)
    return Aggregate(kind, name if kind == "avg" else None, value, out_name or kind)


def _counted(node: exp.Expression, args: list, column_name) -> str | None:
    """COUNT's argument: None for rows (``*`` or ``1``), else the counted column."""
    arg = args[0] if len(args) == 1 else None
    if isinstance(arg, exp.Star) or (isinstance(arg, exp.Literal) and not arg.is_string
                                     and str(arg.this) == "1"):
        return None
    if isinstance(arg, exp.Column):
        return column_name(arg)
    if isinstance(arg, exp.Distinct):
        raise _reject("COUNT(DISTINCT ...)", node,
                      "distinct counts are not linear queries; use COUNT(*)")
    shown = ", ".join(a.sql() for a in args if a is not None)
    raise _reject(f"COUNT({shown})", node, "count rows with COUNT(*) or COUNT(column)")


def _value_argument(node: exp.Expression, kind: str, args: list):
    """(column node, (lo, hi) nodes or None) of SUM/AVG's argument: ``col``,
    ``CLAMP(col, lo, hi)``, or BigQuery's ``col, lo, hi`` (from CLAMPED BETWEEN)."""
    fix = (f"write {kind.upper()}(column) over a column declared with min and max, or "
           f"{kind.upper()}(CLAMP(column, lo, hi)) with constant bounds")
    if len(args) == 3:
        col, bounds = args[0], (args[1], args[2])
    elif len(args) == 1 and isinstance(args[0], exp.Anonymous) \
            and str(args[0].name).upper() == "CLAMP":
        inner = list(args[0].expressions)
        if len(inner) != 3:
            raise _reject(f"CLAMP with {len(inner)} arguments", args[0], fix)
        col, bounds = inner[0], (inner[1], inner[2])
    elif len(args) == 1:
        col, bounds = args[0], None
    else:
        raise _reject(f"{kind.upper()} with {len(args)} arguments", node, fix)
    if isinstance(col, exp.Distinct):
        raise _reject(f"{kind.upper()}(DISTINCT ...)", node,
                      "distinct sums are not linear queries; sum every row")
    if not isinstance(col, exp.Column):
        raise _reject(f"{kind.upper()} of {col.sql()!r}", col,
                      f"{kind.upper()} adds up one declared column; {fix}")
    return col, bounds


def _bounded(node: exp.Expression, kind: str, column: str, bounds, policy) -> Value:
    """The bounded value: the query's constants, or the column's declared min and max."""
    if bounds is None:
        dom = policy.column(column)
        if getattr(dom, "type", None) not in ("integer", "numeric"):
            raise _reject(
                f"{kind.upper()}({column}) without bounds", node,
                f"column {column!r} is declared {getattr(dom, 'type', 'without bounds')}, "
                f"with no min/max to clamp to; {hints.hint('bounds')}")
        lo, hi, clamped = Fraction(dom.min), Fraction(dom.max), False
    else:
        lo, hi = (_bound(b, node) for b in bounds)
        clamped = True
    try:
        ValueBound(lo, hi)
    except ValueError as exc:
        raise _reject(f"bounds [{float(lo):g}, {float(hi):g}] of {kind.upper()}({column})",
                      node, f"{exc}; give lo < hi") from None
    return Value(column, lo, hi, clamped)


def _bound(node: exp.Expression, at: exp.Expression) -> Fraction:
    value = _literal(node, at)
    if isinstance(value, str) or isinstance(value, bool):
        raise _reject(f"bound {node.sql()!r}", node, "clamp bounds are numeric constants",
                      at=at)
    return Fraction(value)

"""Quantile aggregates of the allow-list (issue 20 item 3): the SELECT item to a
:class:`~dpsql.sql.ir.Quantile`.

Accepted, over an integer or numeric column of the protected table (its declared units are
the CDF's bins), with one literal ``q`` strictly between 0 and 1:

- ``MEDIAN(col)`` (= ``QUANTILE_CONT(col, 0.5)``, as in DuckDB);
- ``QUANTILE_CONT(col, q)``, ``QUANTILE_DISC(col, q)``, ``QUANTILE(col, q)`` (DuckDB's
  ``QUANTILE`` is ``QUANTILE_DISC``);
- ``PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY col)``, ``PERCENTILE_DISC(...)`` likewise.

Refused with the reason: a list of quantiles (one per statement), ``q`` of 0 or 1 (the
minimum and maximum move with one row: no useful DP estimate), ``ORDER BY col DESC`` (write
``1 - q``), a categorical column (no order). How the answer is computed:
:mod:`dpsql.sql.expand` (the counts measured) and :mod:`dpsql.inference.quantiles`.
"""

from __future__ import annotations

from fractions import Fraction

from sqlglot import exp

from dpsql.sql.ir import Quantile
from dpsql.sql.literals import _literal
from dpsql.sql.refusals import _is_set, _reject

_KINDS = {exp.PercentileCont: "cont", exp.PercentileDisc: "disc"}


def is_quantile(node: exp.Expression) -> bool:
    """Whether a SELECT item (without its alias) is a quantile aggregate."""
    if isinstance(node, exp.WithinGroup):
        return type(node.this) in _KINDS
    return isinstance(node, (exp.Median, exp.Quantile)) or type(node) in _KINDS


def aggregate(node: exp.Expression, item: exp.Expression, out_name: str | None,
              column_name, policy) -> tuple:
    """``(None, output name, Quantile)`` for the SELECT list (see the module docstring)."""
    if isinstance(node, exp.WithinGroup):
        column, q_node, kind, name = _within_group(node)
    elif isinstance(node, exp.Median):
        column, q_node, kind, name = node.this, None, "cont", "median"
    elif isinstance(node, exp.Quantile):
        column, q_node, kind, name = node.this, node.args.get("quantile"), "disc", "quantile"
    else:
        column, q_node, kind = node.this, node.expression, _KINDS[type(node)]
        name = f"quantile_{kind}"
        if isinstance(q_node, exp.Order):        # sqlglot's DuckDB text of WITHIN GROUP
            q_node, name = _generated_within_group(q_node, column, kind, item)
    extra = [k for k, v in node.args.items()
             if _is_set(v) and k not in ("this", "expression", "quantile")]
    if extra or not isinstance(column, exp.Column):
        raise _reject(f"this form of {name.upper()}", node,
                      f"write {name.upper()}(column{', q' if q_node is not None else ''}) "
                      "over one declared column", at=item)
    source = column_name(column)
    if "." in source:                      # a public table's column (dpsql.sql.joins)
        raise _reject(f"{name.upper()} of a public table's column", column,
                      "take quantiles of the protected table's columns", at=item)
    domain = policy.column(source)
    if domain.type not in ("integer", "numeric"):
        raise _reject(f"{name.upper()} over the {domain.type} column {source!r}", node,
                      "quantiles need an ordered column: one declared integer or numeric",
                      at=item)
    q = Fraction(1, 2) if q_node is None else _fraction(q_node, node)
    return None, out_name or name, Quantile(source, q, kind)


def _within_group(node: exp.WithinGroup) -> tuple:
    """``PERCENTILE_CONT/DISC(q) WITHIN GROUP (ORDER BY col)``: (column, q, kind, name)."""
    func, order = node.this, node.expression
    kind = _KINDS[type(func)]
    name = f"percentile_{kind}"
    items = order.expressions if isinstance(order, exp.Order) else []
    if len(items) != 1 or not isinstance(items[0], exp.Ordered) or func.expression is not None:
        raise _reject(f"this form of {name.upper()}", node,
                      f"write {name.upper()}(q) WITHIN GROUP (ORDER BY column)")
    ordered = items[0]
    if ordered.args.get("desc"):
        raise _reject(f"{name.upper()} ... ORDER BY column DESC", ordered,
                      f"write {name.upper()}(1 - q) WITHIN GROUP (ORDER BY column)")
    return ordered.this, func.this, kind, name


def _generated_within_group(order: exp.Order, column, kind: str, item) -> tuple:
    """``QUANTILE_CONT(col, q ORDER BY col)``: how sqlglot writes ``PERCENTILE_CONT(q)
    WITHIN GROUP (ORDER BY col)`` in DuckDB's dialect (scripts and the shell re-read the
    normalised text), read as the same quantile: (its q, its name)."""
    name = f"percentile_{kind}"
    items = order.expressions
    if len(items) != 1 or not isinstance(items[0], exp.Ordered) \
            or items[0].args.get("desc") or items[0].this != column:
        raise _reject(f"this form of {name.upper()}", order,
                      f"write {name.upper()}(q) WITHIN GROUP (ORDER BY column)", at=item)
    return order.this, name


def _fraction(q_node: exp.Expression, at: exp.Expression) -> Fraction:
    """The quantile ``q``: one number strictly between 0 and 1, held exactly."""
    if isinstance(q_node, exp.Array):
        raise _reject("a list of quantiles", q_node,
                      "write one statement per quantile (a batch shares one measurement)",
                      at=at)
    value = _literal(q_node, at)
    if isinstance(value, str) or not 0 < value < 1:
        raise _reject(f"quantile {value!r}", q_node,
                      "q must be a number strictly between 0 and 1 (the minimum and maximum "
                      "move with a single row: no useful private estimate)", at=at)
    return Fraction(value)

"""WHERE conditions to the IR: AND / OR / NOT over one-column comparisons with constants.

One function per condition form, each turning one sqlglot node into an IR node or refusing
it: comparisons (``=, <>, <, <=, >, >=``, either side the column), ``BETWEEN``, ``IN`` lists
and ``IS [NOT] NULL``. Columns are resolved by the caller's ``column_name`` (declared columns
of the protected table only); constants by :func:`dpsql.sql.literals._literal`.
"""

from __future__ import annotations

from typing import Callable

from sqlglot import exp

from dpsql.sql import hints
from dpsql.sql.ir import Atom, BoolOp, Const, Predicate
from dpsql.sql.literals import _literal
from dpsql.sql.refusals import _construct_name, _is_set, _position, _reject

#: an IN list longer than this is refused (parsing and compiling stay cheap: explain is free)
MAX_IN_LIST = 10_000

_COMPARISONS: dict[type, str] = {
    exp.EQ: "=", exp.NEQ: "<>", exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">=",
}
_FLIP = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}

ColumnName = Callable[[exp.Column], str]


def _predicate(node: exp.Expression, column_name: ColumnName) -> Predicate:
    if isinstance(node, exp.Paren):
        return _predicate(node.this, column_name)
    if isinstance(node, exp.And):
        return BoolOp("and", (_predicate(node.this, column_name),
                              _predicate(node.expression, column_name)))
    if isinstance(node, exp.Or):
        return BoolOp("or", (_predicate(node.this, column_name),
                             _predicate(node.expression, column_name)))
    if isinstance(node, exp.Not):
        return BoolOp("not", (_predicate(node.this, column_name),))
    if isinstance(node, exp.Boolean):
        return Const(bool(node.this))
    if type(node) in _COMPARISONS:
        return _comparison(node, column_name)
    if isinstance(node, exp.Between):
        return _between(node, column_name)
    if isinstance(node, exp.In):
        return _in_list(node, column_name)
    if isinstance(node, exp.Is):
        return _is_null(node, column_name)
    if isinstance(node, exp.Column):
        raise _reject(f"bare column {node.sql()!r} as a condition", node,
                      "compare it with a constant")
    raise _reject(_construct_name(node) if not isinstance(node, exp.Func)
                  else f"function {node.sql()!r}", node,
                  hints.hint("one_table") if isinstance(node, (exp.Exists, exp.Subquery))
                  else hints.hint("conditions"))


def _comparison(node: exp.Expression, column_name: ColumnName) -> Atom:
    """``col op constant`` or ``constant op col`` (flipped to put the column first)."""
    op = _COMPARISONS[type(node)]
    line, col = _position(node)
    left, right = node.this, node.expression
    if isinstance(left, exp.Column) and not isinstance(right, exp.Column):
        return Atom(column_name(left), op, _literal(right, node), line, col)
    if isinstance(right, exp.Column) and not isinstance(left, exp.Column):
        return Atom(column_name(right), _FLIP[op], _literal(left, node), line, col)
    raise _reject(f"comparison {node.sql()!r}", node,
                  "compare one column with one literal constant; " + hints.hint("conditions"))


def _between(node: exp.Between, column_name: ColumnName) -> BoolOp:
    """``col BETWEEN low AND high`` as ``col >= low AND col <= high``."""
    if _is_set(node.args.get("symmetric")) or not isinstance(node.this, exp.Column):
        raise _reject(f"BETWEEN form {node.sql()!r}", node)
    line, col = _position(node)
    c = column_name(node.this)
    return BoolOp("and", (Atom(c, ">=", _literal(node.args["low"], node), line, col),
                          Atom(c, "<=", _literal(node.args["high"], node), line, col)))


def _in_list(node: exp.In, column_name: ColumnName) -> Predicate:
    """``col IN (constants)`` as an OR of equalities, each at its constant's position."""
    if any(_is_set(node.args.get(k)) for k in ("query", "unnest", "field")):
        raise _reject("IN with a subquery or list expression", node,
                      "list literal constants: col IN ('a', 'b'); " + hints.hint("one_table"))
    if not isinstance(node.this, exp.Column) or not node.expressions:
        raise _reject(f"IN form {node.sql()!r}", node)
    if len(node.expressions) > MAX_IN_LIST:
        raise _reject(f"an IN list of {len(node.expressions):,} values", node,
                      f"at most {MAX_IN_LIST:,} values per list")
    c = column_name(node.this)
    atoms = tuple(Atom(c, "=", _literal(v, node), *(_position(v)[0] and _position(v)
                                                     or _position(node)))
                  for v in node.expressions)
    return atoms[0] if len(atoms) == 1 else BoolOp("or", atoms)


def _is_null(node: exp.Is, column_name: ColumnName) -> Atom:
    """``col IS NULL`` (``IS NOT NULL`` arrives as NOT over it)."""
    if not isinstance(node.this, exp.Column) or not isinstance(node.expression, exp.Null):
        raise _reject(f"IS form {node.sql()!r}", node, "use IS NULL or IS NOT NULL")
    line, col = _position(node)
    return Atom(column_name(node.this), "isnull", None, line, col)

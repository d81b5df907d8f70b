"""A shape's later statements read without parsing them (issues 16 and 21). Public only.

Statements of one shape differ only in their literals and positions (:mod:`dpsql.sql.bulk`),
and :func:`dpsql.sql.select._select` reads every part of a statement but the WHERE from
token types and names alone. So when every literal lies inside the WHERE and no public table
is joined (a join rewrites the WHERE), another statement's IR is the shape's first one's with
its own index, text and WHERE (:func:`recipe`).

That WHERE is read one of two ways. The shape's *plan* (:func:`plan`) says, for every atom of
the first statement's condition, which literal token holds its constant (and whether it is
negated) and which tokens hold the position :func:`dpsql.sql.refusals._position` reports; a
later statement's condition is then built from its tokens alone — no tree, no walk — with the
constants read by :func:`dpsql.sql.literals.number`, the function the full read uses. Where a
plan cannot say (a form it does not know, a shape whose text cannot be spliced) or a constant
is refused, the statement's tree is instantiated and read by the same function as the first
one's (:func:`dpsql.sql.select.where_reader`), so it raises the same errors. A plan is used
only once it rebuilds its first statement's condition exactly, positions included.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.sql import bulk
from dpsql.sql.ir import Atom, BoolOp, Const, Query
from dpsql.sql.literals import number
from dpsql.sql.predicates import _COMPARISONS
from dpsql.sql.refusals import earliest
from dpsql.sql.select import _create_target, where_reader


class _NoPlan(Exception):
    """The plan cannot say (building), or a constant is refused (reading): read the tree."""


def recipe(shape: bulk.Template, query: Query, resolve_table, chunk: list | None = None):
    """``build(index, tree or None, text, tokens)``: the IR of the shape's other statements
    (a tree None: not instantiated yet), or False when they must be read in full. ``query``
    is the IR of the statement the template was made from, ``chunk`` its tokens."""
    select = _create_target(shape.tree)[2]
    where = select.args.get("where")
    inside = {id(n) for n in where.walk()} if where is not None else set()
    if any(id(shape.nodes[j]) not in inside for j, _ in shape.literals):
        return False
    read = where_reader(select, resolve_table)
    if read is None:
        return False
    steps = plan(shape, where, query.where, chunk)
    base = dict(query.__dict__)

    def build(index: int, stmt, text: str | None, tokens: list) -> Query:
        out = object.__new__(Query)          # a frozen dataclass without __post_init__
        out.__dict__.update(base)
        if steps is not None:
            try:
                out.__dict__.update(index=index, where=_run(steps, tokens),
                                    sql=bulk.chunk_text(shape, tokens))
                return out
            except _NoPlan:
                pass
        if stmt is None:
            stmt, text = bulk.instantiate(shape, tokens, copy=False), bulk.text(shape)
        out.__dict__.update(index=index, where=read(_create_target(stmt)[2]),
                            sql=text if text is not None else
                            stmt.sql(dialect="duckdb", copy=False))
        return out
    return build


def plan(shape: bulk.Template, where, condition, chunk: list | None):
    """The steps that build a statement's condition from its tokens (see the module's doc),
    or None. ``where``: the template's WHERE node; ``condition``: its IR, read from the
    statement whose tokens are ``chunk``."""
    if where is None or chunk is None or shape.text is None:
        return None
    token_of = {id(shape.nodes[j]): k for j, k in shape.literals}
    index = {id(n): j for j, n in enumerate(shape.nodes)}
    positions = dict(shape.positions)
    try:
        steps = _steps(where.this, condition, (token_of, index, positions))
        if _run(steps, chunk) != condition:
            return None
    except (_NoPlan, AttributeError, IndexError, KeyError, TypeError):
        return None
    return steps


def _steps(node, ir, where: tuple):
    """:func:`dpsql.sql.predicates._predicate`'s forms, node by node beside its IR."""
    while isinstance(node, exp.Paren):
        node = node.this
    kind = type(ir)
    if isinstance(node, (exp.And, exp.Or, exp.Not)) and kind is BoolOp:
        kids = (node.this,) if isinstance(node, exp.Not) else (node.this, node.expression)
        if len(kids) != len(ir.children):
            raise _NoPlan
        return ("bool", ir.op, tuple(_steps(k, c, where) for k, c in zip(kids, ir.children)))
    if isinstance(node, exp.Boolean) and kind is Const:
        return ("const", ir)
    if type(node) in _COMPARISONS and kind is Atom:
        side = node.expression if isinstance(node.this, exp.Column) else node.this
        return _atom(ir, side, node, where)
    if isinstance(node, exp.Between) and kind is BoolOp and len(ir.children) == 2:
        return ("bool", ir.op, (_atom(ir.children[0], node.args["low"], node, where),
                                _atom(ir.children[1], node.args["high"], node, where)))
    if isinstance(node, exp.In):
        atoms = (ir,) if kind is Atom else ir.children
        if len(atoms) != len(node.expressions):
            raise _NoPlan
        out = tuple(_atom(a, v, v if earliest(v) is not None else node, where)
                    for a, v in zip(atoms, node.expressions))
        return out[0] if kind is Atom else ("bool", ir.op, out)
    if isinstance(node, exp.Is) and kind is Atom:
        return _atom(ir, None, node, where)
    raise _NoPlan


def _atom(ir: Atom, constant, at, where: tuple) -> tuple:
    """An atom's step: its column and operator, where its constant and position come from."""
    if type(ir) is not Atom:
        raise _NoPlan
    token_of, index, positions = where
    best = earliest(at)
    pos = None
    if best is not None:
        fields = positions[index[id(best)]]
        pos = (fields["line"], fields.get("col"), fields.get("end"), fields["start"])
    return ("atom", ir.column, ir.op,
            None if constant is None else _constant(constant, token_of), pos)


def _constant(node, token_of: dict) -> tuple:
    """(literal token, negated, string) as :func:`dpsql.sql.literals._literal` reads it."""
    neg = False
    if isinstance(node, exp.Neg):
        neg, node = True, node.this
    if isinstance(node, exp.Paren):
        k, inner, string = _constant(node.this, token_of)
        if string and neg:
            raise _NoPlan
        return k, inner != neg, string
    if not isinstance(node, exp.Literal) or id(node) not in token_of or \
            node.is_string and neg:
        raise _NoPlan
    return token_of[id(node)], neg, bool(node.is_string)


def _run(steps: tuple, tokens: list):
    """The condition the steps build from a statement's tokens."""
    kind = steps[0]
    if kind == "bool":
        out = object.__new__(BoolOp)        # frozen dataclasses without __post_init__:
        out.__dict__.update(op=steps[1], children=tuple([_run(s, tokens) for s in steps[2]]))
        return out                          # their fields set as __init__ sets them
    if kind == "const":
        return steps[1]
    _, column, op, constant, pos = steps
    value = None
    if constant is not None:
        k, neg, string = constant
        value = tokens[k].text
        if not string:
            value = number(value)
            if value is None:
                raise _NoPlan
            if neg:
                value = -value
    line = col = None
    if pos is not None:
        kl, kc, ke, ks = pos
        start = tokens[ks].start
        line = tokens[kl].line
        col = max(1, (tokens[kc].col if kc is not None else 1) -
                  ((tokens[ke].end if ke is not None else 0) - start))
    out = object.__new__(Atom)
    out.__dict__.update(column=column, op=op, value=value, line=line, col=col)
    return out

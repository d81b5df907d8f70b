"""Refusing a construct: its name, its line and column in the text, and what to write instead.

Every part of the allow-list (:mod:`dpsql.sql.parse`, :mod:`dpsql.sql.select`,
:mod:`dpsql.sql.predicates`, :mod:`dpsql.sql.literals`) refuses through :func:`_reject`, so
each refusal names the construct and points at where it starts; the hint's words live in
:mod:`dpsql.sql.hints`.
"""

from __future__ import annotations

from typing import Any

from sqlglot import exp

from dpsql.errors import UnsupportedQueryError

ALLOWED_SUMMARY = (
    "dpsql answers SELECT COUNT(*) / COUNT(col) FROM <protected table> [WHERE ...] "
    "[GROUP BY ...], optionally as CREATE TABLE name AS SELECT ..."
)


def _position(node: exp.Expression | None) -> tuple[int | None, int | None]:
    """Line and column where ``node``'s text starts (its earliest positioned token).

    sqlglot keeps positions on leaf tokens only, with ``col`` at the token's last character;
    the start column is ``col - (end - start)``.
    """
    best = earliest(node) if node is not None else None
    if best is None:
        return None, None
    meta = best._meta
    return meta["line"], max(1, meta.get("col", 1) - (meta.get("end", 0) - meta["start"]))


def earliest(node: exp.Expression) -> exp.Expression | None:
    """The node of ``node``'s subtree whose position :func:`_position` reports (the first,
    in walk order, of those with the smallest start), or None."""
    best, start = None, None
    for sub in node.walk():
        meta = getattr(sub, "_meta", None)
        if meta and "line" in meta and "start" in meta:
            if best is None or meta["start"] < start:
                best, start = sub, meta["start"]
    return best


def _reject(what: str, node: exp.Expression | None, hint: str = "",
            at: exp.Expression | None = None) -> UnsupportedQueryError:
    line, col = _position(node)
    if line is None and at is not None:
        line, col = _position(at)
    msg = f"{what} is not supported"
    if hint:
        msg += f"; {hint}"
    return UnsupportedQueryError(msg, line, col)


def _is_set(value: Any) -> bool:
    return value not in (None, False, [], "", ())


def _construct_name(node: exp.Expression) -> str:
    if isinstance(node, exp.Command):
        return str(node.this).upper()
    if isinstance(node, (exp.Column, exp.Identifier, exp.Literal)):
        return repr(node.sql())
    if isinstance(node, exp.Anonymous):
        return f"function {node.name}()"
    if isinstance(node, exp.Func):
        return f"function {node.sql_name().lower()}()"
    return type(node).__name__.upper()

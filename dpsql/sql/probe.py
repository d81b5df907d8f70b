"""Schema probes: the queries tools send to learn a table's columns, never its rows.

JupySQL (``%sqlcmd columns``), DBeaver and Metabase ask ``SELECT * FROM t WHERE 1=0`` or
``SELECT * FROM t LIMIT 0`` for a table's columns. Over a protected table such a query
returns no row whatever the data, so it is answered from the declared columns alone (no
data read, nothing charged; :meth:`dpsql.session.Session.probe`, and the server's shadow,
whose protected tables are empty). Only the narrowest form is recognised: one SELECT of
``*`` or plain columns from one table, with a WHERE that is false on its own (sqlglot's
``simplify``) or ``LIMIT 0``; no join, subquery, aggregate, grouping or set operation. Any
other query goes where it went before (a release, or a refusal).
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.optimizer.simplify import simplify
from sqlglot.tokens import TokenType

from dpsql.sql import split

_ALLOWED = ("expressions", "from_", "from", "where", "limit")


@dataclass(frozen=True)
class Probe:
    table: str                   # lower case
    columns: tuple | None        # the columns asked for (lower case), None for *


def probe(sql: str, dialect: str = "duckdb") -> Probe | None:
    """The table and columns a schema probe asks for, or None when ``sql`` is anything
    else. A text of several statements is no probe: it is read up to its second statement
    (DuckDB's tokens in pieces, :mod:`dpsql.sql.split`) and not parsed (a batch's one
    parse is its request's)."""
    try:
        tokens = _one_statement(sql, dialect)
        if tokens is None:
            return None
        trees = [t for t in sqlglot.Dialect.get_or_raise(dialect).parser().parse(tokens, sql)
                 if t is not None]
    except sqlglot.errors.SqlglotError:
        return None
    if len(trees) != 1 or not isinstance(trees[0], exp.Select):
        return None
    tree = trees[0]
    if any(v for k, v in tree.args.items() if k not in _ALLOWED):
        return None
    source = tree.args.get("from_") or tree.args.get("from")
    table = source.this if source is not None else None
    if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier) \
            or table.args.get("catalog") or len(list(tree.find_all(exp.Table))) != 1:
        return None
    if table.args.get("db") and table.db.lower() not in ("main", "public"):
        return None
    if not (_false(tree.args.get("where")) or _limit_zero(tree.args.get("limit"))):
        return None
    columns = _columns(tree.expressions)
    return None if columns == () else Probe(table.name.lower(), columns)


def _one_statement(sql: str, dialect: str) -> list | None:
    """``sql``'s tokens, or None as soon as a token follows a ``;`` (a second statement)."""
    parts = split.pieces(sql) if dialect == "duckdb" else \
        [sqlglot.Dialect.get_or_raise(dialect).tokenize(sql)]
    out, ended = [], False
    for part in parts:
        for tok in part:
            if tok.token_type == TokenType.SEMICOLON:
                ended = True
            elif ended:
                return None
        out.extend(part)
    return out


def _false(where) -> bool:
    if where is None:
        return False
    condition = simplify(where.this.copy())
    return isinstance(condition, exp.Boolean) and not condition.this


def _limit_zero(limit) -> bool:
    value = limit.expression if isinstance(limit, exp.Limit) else None
    return isinstance(value, exp.Literal) and not value.is_string and value.this == "0"


def _columns(items) -> tuple | None:
    if len(items) == 1 and isinstance(items[0], exp.Star):
        return None
    names = []
    for item in items:
        if not isinstance(item, exp.Column) or item.table or not isinstance(item.this,
                                                                            exp.Identifier):
            return ()            # an expression: not a probe (an empty tuple is refused)
        names.append(item.name.lower())
    return tuple(names)

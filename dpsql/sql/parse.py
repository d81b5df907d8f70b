"""Parse a batch of SQL statements into dpsql's query IR, through an allow-list.

The allow-list (issue 2, item 3): one or more ``SELECT`` statements over one protected table
whose only aggregate is ``COUNT(*)`` or ``COUNT(col)``, an optional ``WHERE`` built from
``=, <>, <, <=, >, >=, BETWEEN, IN, NOT IN, IS [NOT] NULL, AND, OR, NOT``, parentheses and
literal constants, and an optional ``GROUP BY`` on declared columns, including ``CUBE``,
``ROLLUP``, ``GROUPING SETS`` and ``ALL``. A statement may be wrapped in
``CREATE [OR REPLACE] TABLE name AS ...`` to name its result table.

Everything else is rejected here, before any data is read, with an error naming the
construct and its line and column. The analyst's SQL is never executed: it is compiled to a
workload, and the engine runs only SQL that dpsql generates from the policy.
"""

from __future__ import annotations

import re

import itertools
import logging
from dataclasses import dataclass, replace as _with
from fractions import Fraction
from typing import Any, Callable, Sequence

import sqlglot
from sqlglot import exp

from dpsql.errors import ParseError, UnsupportedQueryError
from dpsql.sql import hints

# --------------------------------------------------------------------------- the IR


@dataclass(frozen=True)
class Atom:
    """``column op value``; op is a comparison, or ``isnull`` (value None)."""

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
class Query:
    """One statement of a batch, validated against the allow-list."""

    index: int                  # position in the batch, from 0
    table: str                  # protected table (lower case)
    where: Predicate | None
    count_column: str | None    # COUNT(col): rows where col IS NOT NULL
    count_name: str             # output column for the count ("count" unless aliased)
    key_columns: tuple          # output key columns: (source column, output name)
    grouping_sets: tuple        # tuple of tuples of source columns; ((),) when no GROUP BY
    target: str | None          # CREATE TABLE name
    replace: bool               # CREATE OR REPLACE
    sql: str                    # the statement, normalised


# --------------------------------------------------------------------------- helpers

_CLAUSE_NAMES = {
    "joins": "JOIN", "order": "ORDER BY", "limit": "LIMIT", "offset": "OFFSET",
    "having": "HAVING", "distinct": "DISTINCT", "with_": "WITH", "with": "WITH",
    "qualify": "QUALIFY", "windows": "WINDOW", "laterals": "LATERAL", "pivots": "PIVOT",
    "sample": "TABLESAMPLE", "into": "INTO", "kind": "SELECT modifier", "hint": "hint",
    "settings": "SETTINGS", "connect": "CONNECT BY", "match": "MATCH_RECOGNIZE",
    "locks": "FOR UPDATE", "prewhere": "PREWHERE", "cluster": "CLUSTER BY",
    "distribute": "DISTRIBUTE BY", "sort": "SORT BY", "operation_modifiers": "modifier",
}

_COMPARISONS: dict[type, str] = {
    exp.EQ: "=", exp.NEQ: "<>", exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">=",
}
_FLIP = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _position(node: exp.Expression | None) -> tuple[int | None, int | None]:
    """Line and column where ``node``'s text starts (its earliest positioned token).

    sqlglot keeps positions on leaf tokens only, with ``col`` at the token's last character;
    the start column is ``col - (end - start)``.
    """
    if node is None:
        return None, None
    best = None
    for sub in node.walk():
        meta = getattr(sub, "_meta", None) or {}
        if "line" in meta and "start" in meta:
            if best is None or meta["start"] < best["start"]:
                best = meta
    if best is None:
        return None, None
    return best["line"], max(1, best.get("col", 1) - (best.get("end", 0) - best["start"]))


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


#: columns every result table has besides its keys and count (plus grouping_id when the
#: statement has several grouping sets)
RESERVED_OUTPUT_COLUMNS = ("stderr", "ci_low", "ci_high")

ALLOWED_SUMMARY = (
    "dpsql answers SELECT COUNT(*) / COUNT(col) FROM <protected table> [WHERE ...] "
    "[GROUP BY ...], optionally as CREATE TABLE name AS SELECT ..."
)


# --------------------------------------------------------------------------- parsing


#: limits that keep parsing and compiling cheap (explain is free, so it must stay fast)
#: literals with a decimal exponent beyond this are refused (see _literal)
MAX_EXPONENT = 400
_EXPONENT = re.compile(r"[eE]([+-]?[0-9]+)$")
MAX_SQL_CHARS = 1_000_000

#: sqlglot logs warnings (unsupported constructs such as E'...' byte strings, fallbacks to
#: Command parsing) to stderr; dpsql reports its own error instead, so its logger is quiet
#: on every path that parses or prints SQL (set once, here, where dpsql parses)
logging.getLogger("sqlglot").setLevel(logging.CRITICAL)

MAX_IN_LIST = 10_000


def split_statements(sql: str | Sequence[str]) -> list[exp.Expression]:
    """Parse the text(s) with sqlglot's DuckDB dialect; errors point at line and column."""
    texts = [sql] if isinstance(sql, str) else list(sql)
    if not texts or any(not isinstance(t, str) for t in texts):
        raise ParseError("expected SQL text (a string, or a list of strings)")
    if sum(len(t) for t in texts) > MAX_SQL_CHARS:
        raise ParseError(f"the batch is longer than {MAX_SQL_CHARS:,} characters; split it")
    out: list[exp.Expression] = []
    for text in texts:
        try:
            parsed = sqlglot.parse(text, dialect="duckdb")
        except sqlglot.errors.ParseError as exc:
            first = exc.errors[0] if exc.errors else {}
            desc = str(first.get("description", "syntax error")).split(". Line")[0]
            raise ParseError(
                f"could not parse SQL: {desc}", first.get("line"), first.get("col"),
                first.get("highlight"),
            ) from None
        except sqlglot.errors.TokenError as exc:
            raise ParseError(f"could not read SQL: {exc}") from None
        except RecursionError:
            raise ParseError("the SQL is nested too deeply to parse") from None
        out.extend(e for e in parsed
                   if e is not None and not isinstance(e, exp.Semicolon))
    if not out:
        raise ParseError("no SQL statement given")
    return out


def parse_batch(sql: str | Sequence[str],
                resolve_table: Callable[[str, exp.Expression], Any]) -> list[Query]:
    """Validate every statement and build the IR.

    ``resolve_table(name, node)`` returns the protected table's policy or raises (so this
    module stays independent of how policies are stored).
    """
    statements = split_statements(sql)
    try:
        return [_statement(i, stmt, resolve_table) for i, stmt in enumerate(statements)]
    except RecursionError:
        raise ParseError("a condition is nested too deeply; simplify it") from None


def _statement(index: int, stmt: exp.Expression, resolve_table) -> Query:
    target, replace = None, False
    select = stmt
    if isinstance(stmt, exp.Create):
        kind = str(stmt.args.get("kind") or "").upper()
        if kind != "TABLE" or not isinstance(stmt.args.get("expression"), exp.Select):
            raise _reject(f"CREATE {kind or ''}".strip(), stmt,
                          "only CREATE TABLE name AS SELECT COUNT(*) ... is allowed")
        extra = [k for k, v in stmt.args.items()
                 if _is_set(v) and k not in ("this", "kind", "expression", "replace")]
        if extra:
            raise _reject(f"CREATE TABLE option {extra[0].upper()}", stmt,
                          "use CREATE [OR REPLACE] TABLE name AS SELECT ...")
        table = stmt.this
        if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
            raise _reject("this CREATE TABLE target", stmt, "name the table with an identifier")
        if table.args.get("catalog") or (table.args.get("db") and table.db.lower() != "main"):
            raise _reject("a result table outside the main schema", table)
        if any(_is_set(v) for k, v in table.args.items() if k not in ("this", "db")):
            raise _reject("this CREATE TABLE target", table)
        target = table.name
        replace = bool(stmt.args.get("replace"))
        select = stmt.args["expression"]
    if not isinstance(select, exp.Select):
        kind = hints.statement_kind(select)
        raise _reject(f"{_construct_name(select)} statement", select,
                      hints.hint(kind) if kind else ALLOWED_SUMMARY)
    query = _select(index, select, target, replace, "", resolve_table)
    # the IR holds no syntax node and the tree is not read again, so the normalised text is
    # printed without the defensive deep copy (a third of parsing's cost on large batches)
    return _with(query, sql=stmt.sql(dialect="duckdb", copy=False))


def _select(index, select: exp.Select, target, replace, text, resolve_table) -> Query:
    for key, value in select.args.items():
        if key in ("expressions", "from_", "from", "where", "group"):
            continue
        if _is_set(value):
            node = value if isinstance(value, exp.Expression) else select
            if isinstance(value, list) and value and isinstance(value[0], exp.Expression):
                node = value[0]
            kind = hints.CLAUSE_KINDS.get(key)
            raise _reject(_CLAUSE_NAMES.get(key, key.upper()), node,
                          hints.hint(kind) if kind else ALLOWED_SUMMARY, at=select)

    # FROM: exactly one protected table, optionally aliased
    frm = select.args.get("from_") or select.args.get("from")
    if frm is None:
        raise _reject("SELECT without FROM", select, ALLOWED_SUMMARY)
    table = frm.this
    if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
        inner = table.this if isinstance(table, exp.Table) else table
        raise _reject(f"reading from {_construct_name(inner)}", inner,
                      hints.hint("one_table"))
    if table.args.get("catalog") or (table.args.get("db") and table.db.lower() != "main"):
        raise _reject(f"table {table.sql()!r} outside the main schema", table,
                      "only protected tables can be queried")
    alias = table.args.get("alias")
    if alias is not None and (alias.args.get("columns") or not alias.name):
        raise _reject("a table alias with column names", alias)
    extra = [k for k, v in table.args.items() if _is_set(v) and k not in ("this", "db", "alias")]
    if extra:
        raise _reject(f"table modifier {extra[0].upper()}", table)
    table_name = table.name.lower()
    policy = resolve_table(table_name, table)
    # as in DuckDB, once the table is aliased only the alias qualifies its columns
    qualifiers = {alias.name.lower()} if alias is not None else {table_name}

    def column_name(col: exp.Column) -> str:
        if col.args.get("db") or col.args.get("catalog"):
            raise _reject(f"qualified column {col.sql()!r}", col)
        if col.table and col.table.lower() not in qualifiers:
            raise _reject(f"column {col.sql()!r} from another table", col)
        if isinstance(col.this, exp.Star):
            raise _reject("SELECT *", col, "select COUNT(*) and group-by columns only")
        name = col.name.lower()
        try:
            policy.column(name)
        except KeyError:
            line, c = _position(col)
            raise UnsupportedQueryError(
                f"column {col.name!r} is not declared in the policy of table {table_name!r} "
                f"(declared: {', '.join(policy.column_names)})", line, c) from None
        return name

    # SELECT list: exactly one COUNT, other items are group-by columns
    count_column, count_name, counts = None, "count", 0
    select_keys: list[tuple[str, str]] = []
    for item in select.expressions:
        node, out_name = item, None
        if isinstance(item, exp.Alias):
            node, out_name = item.this, item.alias
        if isinstance(node, exp.Count):
            counts += 1
            arg = node.this
            if isinstance(arg, exp.Star) or (isinstance(arg, exp.Literal) and not arg.is_string
                                             and str(arg.this) == "1"):
                count_column = None
            elif isinstance(arg, exp.Column):
                count_column = column_name(arg)
            elif isinstance(arg, exp.Distinct):
                raise _reject("COUNT(DISTINCT ...)", node,
                              "distinct counts are not linear queries; use COUNT(*)")
            else:
                raise _reject(f"COUNT({arg.sql() if arg is not None else ''})", node,
                              "count rows with COUNT(*) or COUNT(column)")
            if any(_is_set(v) for k, v in node.args.items() if k not in ("this", "big_int")):
                raise _reject("this COUNT form", node)
            count_name = out_name or "count"
        elif isinstance(node, exp.Column):
            select_keys.append((column_name(node), (out_name or node.name).lower()))
        elif isinstance(node, exp.Func):
            fname = node.name if isinstance(node, exp.Anonymous) else node.sql_name()
            kind = "aggregate" if isinstance(node, exp.AggFunc) else None
            raise _reject(f"function {fname}()", node, hints.hint(kind) if kind else
                          "the only aggregate is COUNT(*) or COUNT(column)", at=item)
        else:
            kind = hints.select_item_kind(node)
            what = {"window": "window function", "count_form": "COUNT(...) FILTER"}.get(
                kind, f"select item {node.sql()!r}")
            raise _reject(what, node, hints.hint(kind) if kind else ALLOWED_SUMMARY)
    if counts != 1:
        raise _reject("a SELECT without exactly one COUNT" if counts == 0 else
                      "more than one COUNT in a SELECT", select,
                      "write one COUNT(*) per statement (a batch may hold many statements)")

    where = None
    if select.args.get("where") is not None:
        where = _predicate(select.args["where"].this, column_name)

    grouping_sets, group_all = _grouping_sets(select.args.get("group"), column_name)
    if group_all:
        grouping_sets = (tuple(c for c, _ in select_keys),)
    grouped = []
    for gs in grouping_sets:
        for c in gs:
            if c not in grouped:
                grouped.append(c)
    for source, _ in select_keys:
        if source not in grouped:
            raise _reject(f"column {source!r} in SELECT but not in GROUP BY", select,
                          "every selected column must be grouped")
    seen_sources = [s for s, _ in select_keys]
    for s_ in seen_sources:
        if seen_sources.count(s_) > 1:
            raise _reject(f"column {s_!r} selected twice", select,
                          "each group-by column appears once in a result table")
    reserved = set(RESERVED_OUTPUT_COLUMNS)
    if len(grouping_sets) > 1:
        reserved.add("grouping_id")
    names = {count_name.lower(): "count"}
    if count_name.lower() in reserved:
        raise _reject(f"output column name {count_name!r}", select,
                      f"{', '.join(sorted(reserved))} are dpsql's own result columns")
    keys = []
    for source, out in select_keys + [(c, c) for c in grouped if c not in seen_sources]:
        if out.lower() in reserved:
            raise _reject(f"output column name {out!r}", select,
                          f"{', '.join(sorted(reserved))} are dpsql's own result columns")
        if out.lower() in names:
            raise _reject(f"duplicate output column name {out!r}", select)
        names[out.lower()] = source
        keys.append((source, out))
    return Query(index, table_name, where, count_column, count_name, tuple(keys),
                 grouping_sets, target, replace, text)


def _grouping_sets(group: exp.Group | None, column_name) -> tuple[tuple, bool]:
    if group is None:
        return ((),), False
    extra = [k for k, v in group.args.items() if _is_set(v) and k not in ("expressions", "all")]
    if extra:
        raise _reject(f"GROUP BY {extra[0].upper()}", group)
    if group.args.get("all"):
        if group.expressions:
            raise _reject("GROUP BY ALL with other items", group)
        return ((),), True

    def cols(items) -> tuple:
        out = []
        for it in items:
            if isinstance(it, exp.Paren):
                it = it.this
            if not isinstance(it, exp.Column):
                raise _reject(f"grouping by {it.sql()!r}", it, "group by declared columns")
            out.append(column_name(it))
        return tuple(out)

    factors: list[list[tuple]] = []
    for item in group.expressions:
        if isinstance(item, exp.Cube):
            c = cols(item.expressions)
            factors.append([tuple(s) for r in range(len(c), -1, -1)
                            for s in itertools.combinations(c, r)])
        elif isinstance(item, exp.Rollup):
            c = cols(item.expressions)
            factors.append([c[:r] for r in range(len(c), -1, -1)])
        elif isinstance(item, exp.GroupingSets):
            sets = []
            for s in item.expressions:
                if isinstance(s, exp.Tuple):
                    sets.append(cols(s.expressions))
                else:
                    sets.append(cols([s]))
            factors.append(sets)
        elif isinstance(item, (exp.Column, exp.Paren)):
            factors.append([cols([item])])
        else:
            raise _reject(f"grouping by {item.sql()!r}", item,
                          "group by declared columns, CUBE, ROLLUP or GROUPING SETS")
    result: list[tuple] = []
    for combo in itertools.product(*factors):
        merged: list[str] = []
        for s in combo:
            for c in s:
                if c not in merged:
                    merged.append(c)
        key = tuple(merged)
        if key not in result:
            result.append(key)
    return tuple(result), False


def _literal(node: exp.Expression, at: exp.Expression | None = None) -> Any:
    """A constant: string, integer, or exact decimal (as Fraction).

    ``at`` is the enclosing condition, to point at when the constant carries no position.
    """
    neg = False
    if isinstance(node, exp.Neg):
        neg, node = True, node.this
    if isinstance(node, exp.Paren):
        return _literal(node.this, at) if not neg else -_literal(node.this, at)
    if isinstance(node, exp.Literal):
        if node.is_string:
            if neg:
                raise _reject("negating a string", node, at=at)
            return str(node.this)
        text = str(node.this)
        exponent = _EXPONENT.search(text)
        if exponent is not None and abs(int(exponent.group(1))) > MAX_EXPONENT:
            # Fraction('1e100000000') would build a 100-million-digit integer (minutes, with
            # the database held); no declared domain needs such a number
            raise _reject(f"number {text[:40]!r} (exponent beyond ±{MAX_EXPONENT})", node,
                          at=at)
        try:
            value: Any = int(text) if text.lstrip("-").isdigit() else Fraction(text)
        except (ValueError, ZeroDivisionError):
            raise _reject(f"number {text!r}", node, at=at) from None
        if isinstance(value, Fraction) and value.denominator == 1:
            value = int(value)
        return -value if neg else value
    if isinstance(node, exp.Null):
        raise _reject("comparison with NULL", node,
                      "it is never true in SQL; use IS NULL or IS NOT NULL", at=at)
    if isinstance(node, exp.Placeholder):
        raise _reject("an unbound parameter placeholder", node,
                      "bind parameters before submitting", at=at)
    raise _reject(f"expression {node.sql()!r}", node,
                  "compare a column with a literal constant", at=at)


def _predicate(node: exp.Expression, column_name) -> Predicate:
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
    line, col = _position(node)
    op = _COMPARISONS.get(type(node))
    if op is not None:
        left, right = node.this, node.expression
        if isinstance(left, exp.Column) and not isinstance(right, exp.Column):
            return Atom(column_name(left), op, _literal(right, node), line, col)
        if isinstance(right, exp.Column) and not isinstance(left, exp.Column):
            return Atom(column_name(right), _FLIP[op], _literal(left, node), line, col)
        raise _reject(f"comparison {node.sql()!r}", node,
                      "compare one column with one literal constant; "
                      + hints.hint("conditions"))
    if isinstance(node, exp.Between):
        if _is_set(node.args.get("symmetric")) or not isinstance(node.this, exp.Column):
            raise _reject(f"BETWEEN form {node.sql()!r}", node)
        c = column_name(node.this)
        return BoolOp("and", (Atom(c, ">=", _literal(node.args["low"], node), line, col),
                              Atom(c, "<=", _literal(node.args["high"], node), line, col)))
    if isinstance(node, exp.In):
        if any(_is_set(node.args.get(k)) for k in ("query", "unnest", "field")):
            raise _reject("IN with a subquery or list expression", node,
                          "list literal constants: col IN ('a', 'b'); "
                          + hints.hint("one_table"))
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
    if isinstance(node, exp.Is):
        if not isinstance(node.this, exp.Column) or not isinstance(node.expression, exp.Null):
            raise _reject(f"IS form {node.sql()!r}", node, "use IS NULL or IS NOT NULL")
        return Atom(column_name(node.this), "isnull", None, line, col)
    if isinstance(node, exp.Column):
        raise _reject(f"bare column {node.sql()!r} as a condition", node,
                      "compare it with a constant")
    raise _reject(_construct_name(node) if not isinstance(node, exp.Func)
                  else f"function {node.sql()!r}", node,
                  hints.hint("one_table") if isinstance(node, (exp.Exists, exp.Subquery))
                  else hints.hint("conditions"))

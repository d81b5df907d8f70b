"""One SELECT of the allow-list to a :class:`~dpsql.sql.ir.Query`, as a sequence of small passes.

Each pass reads one part of the sqlglot tree and returns a value, or refuses the construct
with its position and a hint. :func:`_select` runs them in a fixed order (a statement with
several problems always reports the same one):

1. ``_refuse_clauses``: every clause outside the allow-list (JOIN, ORDER BY, HAVING, ...);
2. ``_from_table``: exactly one protected table, optionally aliased; ``_column_resolver``
   then resolves the declared columns for the later passes;
3. ``_output_columns``: the SELECT list, one aggregate (COUNT, SUM or AVG over a bounded
   column: :mod:`dpsql.sql.aggregates`) plus group-by columns;
4. ``_where``: the condition (:mod:`dpsql.sql.predicates`);
5. ``_grouping``: GROUP BY, CUBE, ROLLUP, GROUPING SETS and ALL to the grouping sets;
6. ``_check_keys`` and ``_result_keys``: selected columns grouped once, the result table's
   column names.

``_create_target`` reads the ``CREATE [OR REPLACE] TABLE name AS`` around a SELECT (called
by :func:`dpsql.sql.parse._statement`, before the statement is known to be a SELECT).
"""

from __future__ import annotations

import itertools
from typing import Any

from sqlglot import exp

from dpsql.errors import UnsupportedQueryError
from dpsql.sql import hints, joins
from dpsql.sql.aggregates import Aggregate, is_aggregate, read_aggregate
from dpsql.sql.ir import Predicate, Query
from dpsql.sql.predicates import ColumnName, _predicate
from dpsql.sql.refusals import ALLOWED_SUMMARY, _construct_name, _is_set, _position, _reject

_CLAUSE_NAMES = {
    "joins": "JOIN", "order": "ORDER BY", "limit": "LIMIT", "offset": "OFFSET",
    "having": "HAVING", "distinct": "DISTINCT", "with_": "WITH", "with": "WITH",
    "qualify": "QUALIFY", "windows": "WINDOW", "laterals": "LATERAL", "pivots": "PIVOT",
    "sample": "TABLESAMPLE", "into": "INTO", "kind": "SELECT modifier", "hint": "hint",
    "settings": "SETTINGS", "connect": "CONNECT BY", "match": "MATCH_RECOGNIZE",
    "locks": "FOR UPDATE", "prewhere": "PREWHERE", "cluster": "CLUSTER BY",
    "distribute": "DISTRIBUTE BY", "sort": "SORT BY", "operation_modifiers": "modifier",
}

#: columns every result table has besides its keys and count (plus grouping_id when the
#: statement has several grouping sets)
RESERVED_OUTPUT_COLUMNS = ("stderr", "ci_low", "ci_high")


def _select(index, select: exp.Select, target, replace, text, resolve_table) -> Query:
    _refuse_clauses(select)
    table, qualifiers = _from_table(select)
    table_name = table.name.lower()
    policy = resolve_table(table_name, table)
    column_name = _column_resolver(table_name, policy, qualifiers)
    join = joins.read(select, policy, qualifiers, column_name, resolve_table)
    if join is not None:                     # public tables: their columns resolve too
        column_name = join.column_name
    agg, select_keys = _output_columns(select, column_name, policy)
    where = _where(select, column_name)
    grouping_sets = _grouping(select, select_keys, column_name)
    grouped = _grouped(grouping_sets)
    _check_keys(select, select_keys, grouped)
    keys = _result_keys(select, agg.name, select_keys, grouped, len(grouping_sets) > 1)
    query = Query(index, table_name, where, agg.count_column, agg.name, keys,
                  grouping_sets, target, replace, text, quantile=agg.quantile,
                  aggregate=agg.kind, value=agg.value)
    return query if join is None else join.rewrite(query)


def where_reader(select: exp.Select, resolve_table):
    """``read(select)``: the WHERE of a statement with this one's FROM, as :func:`_select`
    reads it (the same column resolver); None when the statement joins public tables
    (their columns resolve, and their conditions rewrite, through the join)."""
    if select.args.get("joins"):
        return None
    table, qualifiers = _from_table(select)
    table_name = table.name.lower()
    column_name = _column_resolver(table_name, resolve_table(table_name, table), qualifiers)
    return lambda other: _where(other, column_name)


# --------------------------------------------------------------------------- CREATE TABLE


def _create_target(stmt: exp.Expression) -> tuple[str | None, bool, exp.Expression]:
    """``CREATE [OR REPLACE] TABLE name AS SELECT ...``: (name, replace, the SELECT).

    Any other statement comes back as ``(None, False, stmt)``.
    """
    if not isinstance(stmt, exp.Create):
        return None, False, stmt
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
    return table.name, bool(stmt.args.get("replace")), stmt.args["expression"]


# --------------------------------------------------------------------------- clauses, FROM


def _refuse_clauses(select: exp.Select) -> None:
    """Refuse the first clause outside SELECT list, FROM, WHERE and GROUP BY."""
    for key, value in select.args.items():
        if key in ("expressions", "from_", "from", "where", "group", "joins"):
            continue                         # joins: dpsql.sql.joins reads them
        if _is_set(value):
            node = value if isinstance(value, exp.Expression) else select
            if isinstance(value, list) and value and isinstance(value[0], exp.Expression):
                node = value[0]
            kind = hints.CLAUSE_KINDS.get(key)
            raise _reject(_CLAUSE_NAMES.get(key, key.upper()), node,
                          hints.hint(kind) if kind else ALLOWED_SUMMARY, at=select)


def _from_table(select: exp.Select) -> tuple[exp.Table, set[str]]:
    """FROM: exactly one table of the main schema, optionally aliased; (table, qualifiers)."""
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
    # as in DuckDB, once the table is aliased only the alias qualifies its columns
    return table, {alias.name.lower()} if alias is not None else {table.name.lower()}


def _column_resolver(table_name: str, policy: Any, qualifiers: set[str]) -> ColumnName:
    """The function every later pass names a column with: declared columns of this table."""

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

    return column_name


# --------------------------------------------------------------------------- SELECT list


def _output_columns(select: exp.Select, column_name: ColumnName, policy: Any
                    ) -> tuple[Aggregate, list[tuple[str, str]]]:
    """The SELECT list: its one aggregate (:mod:`dpsql.sql.aggregates`), and its group-by
    columns as (source, output name)."""
    aggregates, select_keys = [], []
    for item in select.expressions:
        node, out_name = item, None
        if isinstance(item, exp.Alias):
            node, out_name = item.this, item.alias
        if is_aggregate(node):
            aggregates.append(read_aggregate(node, item, out_name, column_name, policy))
        elif isinstance(node, exp.Column):
            select_keys.append((column_name(node), (out_name or node.name).lower()))
        else:
            raise _refused_item(node, item)
    if len(aggregates) != 1:
        raise _reject("a SELECT without exactly one COUNT, SUM, AVG or quantile" if not aggregates else
                      "more than one aggregate in a SELECT", select,
                      "write one aggregate per statement (a batch may hold many statements, "
                      "answered as one workload)")
    return aggregates[0], select_keys


def _refused_item(node: exp.Expression, item: exp.Expression) -> UnsupportedQueryError:
    """The refusal of a SELECT item that is neither an aggregate nor a column."""
    if isinstance(node, exp.Func):
        fname = node.name if isinstance(node, exp.Anonymous) else node.sql_name()
        return _reject(f"function {fname}()", node, hints.hint("aggregate"), at=item)
    kind = hints.select_item_kind(node)
    what = {"window": "window function", "count_form": "COUNT(...) FILTER"}.get(
        kind, f"select item {node.sql()!r}")
    return _reject(what, node, hints.hint(kind) if kind else ALLOWED_SUMMARY)


# --------------------------------------------------------------------------- WHERE


def _where(select: exp.Select, column_name: ColumnName) -> Predicate | None:
    where = select.args.get("where")
    return None if where is None else _predicate(where.this, column_name)


# --------------------------------------------------------------------------- GROUP BY


def _grouping(select: exp.Select, select_keys: list[tuple[str, str]],
              column_name: ColumnName) -> tuple:
    """The statement's grouping sets; GROUP BY ALL groups by the selected columns."""
    grouping_sets, group_all = _grouping_sets(select.args.get("group"), column_name)
    if group_all:
        return (tuple(c for c, _ in select_keys),)
    return grouping_sets


def _grouping_sets(group: exp.Group | None, column_name: ColumnName) -> tuple[tuple, bool]:
    if group is None:
        return ((),), False
    extra = [k for k, v in group.args.items() if _is_set(v) and k not in ("expressions", "all")]
    if extra:
        raise _reject(f"GROUP BY {extra[0].upper()}", group)
    if group.args.get("all"):
        if group.expressions:
            raise _reject("GROUP BY ALL with other items", group)
        return ((),), True
    factors = [_group_factor(item, column_name) for item in group.expressions]
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


def _group_factor(item: exp.Expression, column_name: ColumnName) -> list[tuple]:
    """One GROUP BY item as its list of column sets (the sets are the items' product)."""
    if isinstance(item, exp.Cube):
        c = _group_columns(item.expressions, column_name)
        return [tuple(s) for r in range(len(c), -1, -1) for s in itertools.combinations(c, r)]
    if isinstance(item, exp.Rollup):
        c = _group_columns(item.expressions, column_name)
        return [c[:r] for r in range(len(c), -1, -1)]
    if isinstance(item, exp.GroupingSets):
        return [_group_columns(s.expressions if isinstance(s, exp.Tuple) else [s], column_name)
                for s in item.expressions]
    if isinstance(item, (exp.Column, exp.Paren)):
        return [_group_columns([item], column_name)]
    raise _reject(f"grouping by {item.sql()!r}", item,
                  "group by declared columns, CUBE, ROLLUP or GROUPING SETS")


def _group_columns(items, column_name: ColumnName) -> tuple:
    out = []
    for it in items:
        if isinstance(it, exp.Paren):
            it = it.this
        if not isinstance(it, exp.Column):
            raise _reject(f"grouping by {it.sql()!r}", it, "group by declared columns")
        out.append(column_name(it))
    return tuple(out)


# --------------------------------------------------------------------------- result columns


def _grouped(grouping_sets: tuple) -> list[str]:
    """Every column some grouping set groups by, in order of first appearance."""
    grouped = []
    for gs in grouping_sets:
        for c in gs:
            if c not in grouped:
                grouped.append(c)
    return grouped


def _check_keys(select: exp.Select, select_keys: list[tuple[str, str]],
                grouped: list[str]) -> None:
    """Every selected column is grouped, and selected once."""
    for source, _ in select_keys:
        if source not in grouped:
            raise _reject(f"column {source!r} in SELECT but not in GROUP BY", select,
                          "every selected column must be grouped")
    seen_sources = [s for s, _ in select_keys]
    for s_ in seen_sources:
        if seen_sources.count(s_) > 1:
            raise _reject(f"column {s_!r} selected twice", select,
                          "each group-by column appears once in a result table")


def _result_keys(select: exp.Select, count_name: str, select_keys: list[tuple[str, str]],
                 grouped: list[str], several_sets: bool) -> tuple:
    """The result table's key columns (source, output name): the selected ones, then the
    grouped but not selected; names unique and none of dpsql's own result columns."""
    reserved = set(RESERVED_OUTPUT_COLUMNS)
    if several_sets:
        reserved.add("grouping_id")
    names = {count_name.lower(): "count"}
    if count_name.lower() in reserved:
        raise _reject(f"output column name {count_name!r}", select,
                      f"{', '.join(sorted(reserved))} are dpsql's own result columns")
    seen_sources = [s for s, _ in select_keys]
    keys = []
    for source, out in select_keys + [(c, c) for c in grouped if c not in seen_sources]:
        if out.lower() in reserved:
            raise _reject(f"output column name {out!r}", select,
                          f"{', '.join(sorted(reserved))} are dpsql's own result columns")
        if out.lower() in names:
            raise _reject(f"duplicate output column name {out!r}", select)
        names[out.lower()] = source
        keys.append((source, out))
    return tuple(keys)

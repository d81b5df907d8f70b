"""What to write instead: the hint of every refusal of a construct outside the allow-list.

A refusal names the construct (``function sum()``, ``JOIN``, ``ORDER BY`` ...), says what
dpsql answers instead and points to the section of ``docs/sql.md`` that explains why
(issue 18 item 7). The allow-list (:mod:`dpsql.sql.parse`, :mod:`dpsql.sql.select`,
:mod:`dpsql.sql.predicates`) picks the hint; the words live here, one row per kind of
construct, so every interface (CLI, shell, scripts, DB-API) says the same.
"""

from __future__ import annotations

from sqlglot import exp

DOC = "docs/sql.md"

#: kind -> (what to write instead, section of docs/sql.md)
HINTS: dict[str, tuple[str, str]] = {
    "aggregate": (
        "the aggregates are COUNT(*), COUNT(column), SUM(column) or AVG(column) over a "
        "bounded column (SUM(CLAMP(column, lo, hi)) for tighter bounds), and MEDIAN(column) "
        "or QUANTILE_CONT(column, q) over an integer or numeric column; MIN and MAX are not "
        "answered (a high or low quantile, say QUANTILE_CONT(column, 0.99), is their private "
        "counterpart)", "aggregates"),
    "bounds": (
        "SUM and AVG clamp each row's value to bounds: declare the column integer or numeric "
        "with min and max, or write SUM(CLAMP(column, lo, hi)) with constant bounds",
        "sums-and-averages"),
    "count_form": (
        "count rows with COUNT(*) or COUNT(column)", "aggregates"),
    "one_table": (
        "queries read one protected table by name (and public tables joined on their key); "
        "join or combine the result tables afterwards in DuckDB (they are plain tables)",
        "one-table-per-query"),
    "join": (
        "join a public table declared in the policy on its key, JOIN name USING (key) or "
        "ON table.key = name.key; join or combine result tables afterwards in DuckDB",
        "joins-to-public-tables"),
    "union": (
        "write each SELECT as its own statement, separated by `;`: a batch is answered "
        "as one workload", "one-table-per-query"),
    "window": (
        "ask for the counts per group with GROUP BY, ROLLUP or CUBE and compute running "
        "totals or ranks from the result table", "groups-and-ordering"),
    "filter_groups": (
        "every declared group is returned, zeros included (which groups exist is public, "
        "a filter on noisy counts is not); filter the result table afterwards, e.g. "
        "SELECT * FROM result WHERE count > 100", "groups-and-ordering"),
    "order": (
        "every declared group is returned; order or limit the result table afterwards, "
        "e.g. CREATE TABLE r AS SELECT ...; then SELECT * FROM r ORDER BY count DESC "
        "LIMIT 10", "groups-and-ordering"),
    "conditions": (
        "WHERE allows =, <>, <, <=, >, >=, BETWEEN, IN, IS NULL, AND, OR, NOT on declared "
        "columns and constants", "conditions"),
    "distinct": (
        "GROUP BY the columns lists every declared group with its count",
        "groups-and-ordering"),
}

#: clause keys of a sqlglot SELECT -> hint kind
CLAUSE_KINDS = {
    "joins": "join", "laterals": "one_table", "with_": "one_table", "with": "one_table",
    "having": "filter_groups", "qualify": "filter_groups", "windows": "window",
    "order": "order", "limit": "order", "offset": "order", "distinct": "distinct",
}


def hint(kind: str) -> str:
    """``what to write instead (see docs/sql.md#section)``."""
    instead, section = HINTS[kind]
    return f"{instead} (see {DOC}#{section})"


def select_item_kind(node: exp.Expression) -> str | None:
    """The hint kind of a select item other than COUNT or a column, if it has one."""
    if isinstance(node, exp.Window):
        return "window"
    if isinstance(node, (exp.AggFunc, exp.WithinGroup)):
        return "aggregate"
    if isinstance(node, exp.Filter):
        return "count_form"
    return None


def statement_kind(node: exp.Expression) -> str | None:
    """The hint kind of a statement that is not a SELECT (UNION, INTERSECT, EXCEPT)."""
    return "union" if isinstance(node, exp.SetOperation) else None

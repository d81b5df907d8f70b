"""Parse a batch of SQL statements into dpsql's query IR, through an allow-list.

The allow-list (issue 2, item 3): one or more ``SELECT`` statements over one protected table
whose only aggregate is ``COUNT(*)`` or ``COUNT(col)``, an optional ``WHERE`` built from
``=, <>, <, <=, >, >=, BETWEEN, IN, NOT IN, IS [NOT] NULL, AND, OR, NOT``, parentheses and
literal constants, and an optional ``GROUP BY`` on declared columns, including ``CUBE``,
``ROLLUP``, ``GROUPING SETS`` and ``ALL``. Since issue 20 the aggregate may also be a SUM or
AVG over a bounded column (:mod:`dpsql.sql.aggregates`), and BigQuery's
``SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (...)`` and ``ANON_*`` spellings are read
(:mod:`dpsql.sql.bigquery`). A statement may be wrapped in
``CREATE [OR REPLACE] TABLE name AS ...`` to name its result table.

Everything else is rejected here, before any data is read, with an error naming the
construct and its line and column. The analyst's SQL is never executed: it is compiled to a
workload, and the engine runs only SQL that dpsql generates from the policy.

This module splits the batch into statements and reads each one; the parts of the
allow-list live beside it: :mod:`dpsql.sql.select` (a SELECT, pass by pass),
:mod:`dpsql.sql.predicates` (WHERE), :mod:`dpsql.sql.literals` (constants),
:mod:`dpsql.sql.refusals` (a refusal's construct, position and hint) and the IR in
:mod:`dpsql.sql.ir`.
"""

from __future__ import annotations

import logging
from dataclasses import replace as _with
from typing import Any, Callable, Sequence

import sqlglot
from sqlglot import exp

from dpsql.errors import ParseError
from dpsql.sql import bigquery, hints
from dpsql.sql.ir import Query
from dpsql.sql.refusals import ALLOWED_SUMMARY, _construct_name, _reject
from dpsql.sql.select import _create_target, _select

#: limits that keep parsing and compiling cheap (explain is free, so it must stay fast)
MAX_SQL_CHARS = 1_000_000

#: sqlglot logs warnings (unsupported constructs such as E'...' byte strings, fallbacks to
#: Command parsing) to stderr; dpsql reports its own error instead, so its logger is quiet
#: on every path that parses or prints SQL (set once, here, where dpsql parses)
logging.getLogger("sqlglot").setLevel(logging.CRITICAL)


def split_statements(sql: str | Sequence[str]) -> list[exp.Expression]:
    """Parse the text(s) with sqlglot's DuckDB dialect; errors point at line and column."""
    texts = [sql] if isinstance(sql, str) else list(sql)
    if not texts or any(not isinstance(t, str) for t in texts):
        raise ParseError("expected SQL text (a string, or a list of strings)")
    if sum(len(t) for t in texts) > MAX_SQL_CHARS:
        raise ParseError(f"the batch is longer than {MAX_SQL_CHARS:,} characters; split it")
    out: list[exp.Expression] = []
    for text in texts:
        text = bigquery.rewrite(text)    # BigQuery's DP clause and CLAMPED BETWEEN, in place
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
    target, replace, select = _create_target(stmt)
    if not isinstance(select, exp.Select):
        kind = hints.statement_kind(select)
        raise _reject(f"{_construct_name(select)} statement", select,
                      hints.hint(kind) if kind else ALLOWED_SUMMARY)
    query = _select(index, select, target, replace, "", resolve_table)
    # the IR holds no syntax node and the tree is not read again, so the normalised text is
    # printed without the defensive deep copy (a third of parsing's cost on large batches)
    return _with(query, sql=stmt.sql(dialect="duckdb", copy=False))

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

import contextlib
import logging
from typing import Any, Callable, Sequence

import sqlglot
from sqlglot import exp

from dpsql import cancel
from dpsql.errors import ParseError
from dpsql.sql import bigquery, bulk, gcpause, hints
from dpsql.sql.ir import Query
from dpsql.sql.recipes import recipe as _shape_recipe
from dpsql.sql.refusals import ALLOWED_SUMMARY, _construct_name, _reject
from dpsql.sql.select import _create_target, _select

#: limits that keep parsing and compiling bounded (explain is free, so it must stay fast).
#: A batch of repeated statement shapes parses at about 0.3 ms per statement
#: (:mod:`dpsql.sql.bulk`), so the largest batch parses in about 15 s; each statement also
#: becomes a result table (about 1 ms to write and one 256 KB DuckDB block on disk). Larger
#: input is refused before it is parsed, naming the limit.
MAX_SQL_CHARS = 8_000_000
MAX_STATEMENTS = 50_000

#: sqlglot logs warnings (unsupported constructs such as E'...' byte strings, fallbacks to
#: Command parsing) to stderr; dpsql reports its own error instead, so its logger is quiet
#: on every path that parses or prints SQL (set once, here, where dpsql parses)
logging.getLogger("sqlglot").setLevel(logging.CRITICAL)


def split_statements(sql: str | Sequence[str]) -> list[exp.Expression]:
    """Parse the text(s) with sqlglot's DuckDB dialect; errors point at line and column."""
    with gcpause.young_only():
        out = [tree for tree, _, _, _ in _trees(sql, copy=True)]
    if not out:
        raise ParseError("no SQL statement given")
    return out


def _trees(sql: str | Sequence[str], copy: bool):
    """Yield each statement's ``(tree, DuckDB text or None, shape's template or None, its
    tokens or None)`` (:mod:`dpsql.sql.bulk`: each shape parsed once; ``copy`` False: a
    later statement of a shape comes without its tree (:func:`bulk.statements`), a yielded
    tree is valid until the next one is asked for, and its text, when given, is the tree's
    generated text)."""
    texts = [sql] if isinstance(sql, str) else list(sql)
    if not texts or any(not isinstance(t, str) for t in texts):
        raise ParseError("expected SQL text (a string, or a list of strings)")
    total = sum(len(t) for t in texts)
    if total > MAX_SQL_CHARS:
        raise ParseError(f"the batch has {total:,} characters, more than the limit of "
                         f"{MAX_SQL_CHARS:,}; split it into several requests")
    shapes: dict = {}
    count = 0
    with _sqlglot_errors():                  # one block for the batch, not one per text
        for text in cancel.checked(texts):
            text = bigquery.rewrite(text)    # BigQuery's DP clause, CLAMPED BETWEEN: in place
            parts = bulk.statement_tokens(text, MAX_STATEMENTS - count)
            trees = ((t, None, None, None) for t in sqlglot.parse(text, dialect="duckdb")) \
                if parts is None else bulk.statements(text, parts, _parse_chunk, shapes, copy)
            for tree, generated, shape, chunk in trees:
                if shape is None and (tree is None or isinstance(tree, exp.Semicolon)):
                    continue
                count += 1
                if count > MAX_STATEMENTS:
                    raise _too_many()
                cancel.check()            # a token cancel lands between statements
                gcpause.tick()
                yield tree, generated, shape, chunk


@contextlib.contextmanager
def _sqlglot_errors():
    """sqlglot's errors as dpsql's ParseError (line, column, highlight)."""
    try:
        yield
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
    except bulk.TooManyStatements:
        raise _too_many() from None


def _too_many() -> ParseError:
    return ParseError(f"the batch has more than {MAX_STATEMENTS:,} statements, the limit "
                      "for one request; split it into several requests")


def _parse_chunk(tokens: list, text: str):
    """One statement's tokens parsed by sqlglot (the text for its error messages)."""
    trees = bulk.dialect().parser().parse(tokens, text)
    return trees[0] if trees else None


def parse_batch(sql: str | Sequence[str],
                resolve_table: Callable[[str, exp.Expression], Any]) -> list[Query]:
    """Validate every statement and build the IR.

    ``resolve_table(name, node)`` returns the protected table's policy or raises (so this
    module stays independent of how policies are stored).
    """
    recipes: dict = {}       # a shape's template (by id: it lives as long as the batch) ->
    try:                     # its statements' IR from their WHERE alone (:func:`_recipe`)
        with gcpause.young_only():
            out = [_statement(i, stmt, resolve_table, text, shape, recipes, chunk)
                   for i, (stmt, text, shape, chunk) in enumerate(_trees(sql, copy=False))]
    except RecursionError:
        raise ParseError("a condition is nested too deeply; simplify it") from None
    if not out:
        raise ParseError("no SQL statement given")
    return out


def _statement(index: int, stmt: exp.Expression | None, resolve_table, text: str | None,
               shape: bulk.Template | None = None, recipes: dict | None = None,
               chunk: list | None = None) -> Query:
    recipe = recipes.get(id(shape)) if shape is not None else None
    if recipe:
        return recipe(index, stmt, text, chunk)
    if stmt is None:                       # a later statement of its shape, not read yet
        stmt, text = bulk.instantiate(shape, chunk, copy=False), bulk.text(shape)
    target, replace, select = _create_target(stmt)
    if not isinstance(select, exp.Select):
        kind = hints.statement_kind(select)
        raise _reject(f"{_construct_name(select)} statement", select,
                      hints.hint(kind) if kind else ALLOWED_SUMMARY)
    query = _select(index, select, target, replace, "", resolve_table)
    # the IR holds no syntax node and the tree is not read again, so the normalised text is
    # printed without the defensive deep copy (a third of parsing's cost on large batches)
    # (a templated statement's text is spliced from its shape's: :func:`bulk.text`). The
    # query was made just above and nothing else holds it, so its text is set in place:
    # dataclasses.replace costs more than the rest of a templated statement's IR
    object.__setattr__(query, "sql", text if text is not None else
                       stmt.sql(dialect="duckdb", copy=False))
    if shape is not None and id(shape) not in recipes:
        recipes[id(shape)] = _recipe(shape, query, resolve_table, chunk)
    return query


def _recipe(shape: bulk.Template, query: Query, resolve_table, chunk: list | None = None):
    """The shape's other statements' IR from their WHERE alone, or False
    (:func:`dpsql.sql.recipes.recipe`)."""
    return _shape_recipe(shape, query, resolve_table, chunk)

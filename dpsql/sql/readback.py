"""Which tables a plain query reads: the public half of reading result tables back.

A result table holds released numbers, so reading it (``SELECT * FROM t_sex WHERE ...``)
is post-processing and costs nothing (:mod:`dpsql.store.readback` runs it on a shadow that
holds only those tables). This module only reads the SQL text: it says whether a statement
is one query (SELECT, UNION/INTERSECT/EXCEPT, with CTEs and subqueries) and names every
table it references, anywhere in the tree; CTE names are not tables. A table function
(``read_csv(...)``, ``range(3)``, ``duckdb_tables()``) or a table qualified by another
schema or catalog is reported as such, so the caller refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from dpsql import cancel


@dataclass(frozen=True)
class References:
    """The tables one query names (lower case, in order of first appearance)."""

    tables: tuple
    functions: tuple       # table functions (their SQL), e.g. "read_csv('x')"
    qualified: tuple       # names qualified by a schema or catalog other than main


def tree_of(sql: str) -> exp.Expression | None:
    """``sql``'s one statement, parsed; None when it is not exactly one (several
    statements, a syntax error: the release path reports those)."""
    try:
        trees = [t for t in sqlglot.parse(sql, read="duckdb") if t is not None]
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError):
        return None
    return trees[0] if len(trees) == 1 else None


def references(sql: str, tree: exp.Expression | None | bool = False) -> References | None:
    """The tables one query reads; None when ``sql`` is not exactly one query (several
    statements, DDL, a syntax error: the release path reports those). ``tree``: its
    :func:`tree_of`, when the caller has it (the text is then not parsed again)."""
    tree = tree_of(sql) if tree is False else tree
    if not isinstance(tree, (exp.Select, exp.SetOperation)):
        return None
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    tables, functions, qualified = [], [], []
    for node in tree.find_all(exp.Table):
        if not isinstance(node.this, exp.Identifier):
            functions.append(node.this.sql("duckdb")[:80])
            continue
        name = node.name.lower()
        if node.catalog or (node.db and node.db.lower() != "main"):
            qualified.append(node.sql("duckdb")[:80])
        elif not node.db and name in ctes:
            continue
        elif name not in tables:
            tables.append(name)
    for node in tree.find_all(exp.Lateral, exp.Unnest):
        if isinstance(node, exp.Lateral) and isinstance(node.this, exp.Subquery):
            continue
        functions.append(node.sql("duckdb")[:80])
    return References(tuple(tables), tuple(functions), tuple(qualified))


def created(sql: str, tree: exp.Expression | None | bool = False) -> str | None:
    """The table a ``CREATE TABLE name AS ...`` statement names (lower case), else None.
    ``tree``: as for :func:`references`."""
    tree = tree_of(sql) if tree is False else tree
    if isinstance(tree, exp.Create) and isinstance(tree.this, (exp.Table, exp.Schema)):
        table = tree.this if isinstance(tree.this, exp.Table) else tree.this.this
        return table.name.lower() if isinstance(table, exp.Table) else None
    return None


def split(statements, protected, results,
          trees: list | None = None) -> list[tuple[str, list[str]]] | None:
    """A submission's statements in order as ("answer", [statements]) workloads and
    ("read", [statement]) result-table reads; None when no statement reads a result table
    (answer the submission as given, one workload). A statement is a read when it names a
    table in ``results`` or one an earlier statement of the submission creates (the release
    before it runs first); one naming only protected or unknown tables stays in its
    workload, so a typo still refuses the whole workload before any charge. ``trees``:
    each statement's :func:`tree_of`, when the caller has them."""
    out: list[tuple[str, list[str]]] = []
    pending: list[str] = []
    for text, read in zip(statements, reads(statements, protected, results, trees)):
        if read:
            if pending:
                out.append(("answer", pending))
                pending = []
            out.append(("read", [text]))
            continue
        pending.append(text)
    if not any(kind == "read" for kind, _ in out):
        return None
    return out + ([("answer", pending)] if pending else [])


def reads(statements, protected, results, trees: list | None = None) -> list[bool]:
    """Which of ``statements`` (texts, in order) read result tables back: those naming a
    table of ``results`` or one an earlier statement creates, and no protected table
    among those (the rule of :func:`split`; scripts use it too). Each statement is parsed
    once (``trees``: already parsed, by :func:`tree_of`); a cancel lands between them."""
    out, made = [], set()
    for k, text in enumerate(cancel.checked(statements)):
        tree = tree_of(text) if trees is None else trees[k]
        refs = references(text, tree)
        known = set(results) | made
        read = refs is not None and any(t in known and t not in protected
                                        for t in refs.tables)
        out.append(read)
        if not read:
            made.add(created(text, tree))
    return out

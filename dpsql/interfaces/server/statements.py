"""Splitting a query message into statements and deciding where each one goes.

Kinds: ``empty``; ``marker`` (``BEGIN WORKLOAD``, ``COMMIT``, ``ROLLBACK``, plain ``BEGIN``:
recognised by :mod:`dpsql.sql.marker`, the one recognition, and handled by the DB-API
connection's workload block); ``set`` and ``show``
(``dpsql.*`` settings through the one declaration; the driver settings PostgreSQL clients
send are accepted and ignored); ``explain``; ``noop`` (DISCARD, DEALLOCATE, ...);
``release`` (reads a protected table: only through a charged release, except a schema
probe, :mod:`dpsql.sql.probe`, which the shadow's empty table answers); ``public``
(catalog, one's own result tables, tables shared with one as ``owner.name``,
``dpsql_budget``: the shadow catalog);
``denied`` (any other table: another analyst's results, dpsql's internal tables).
"""

from __future__ import annotations

import re

import sqlglot
from sqlglot import exp
from sqlglot.tokens import TokenType

from dpsql.sql import marker
from dpsql.sql.probe import probe

_WORD = re.compile(r"\s*([A-Za-z_]+)")
_SET = re.compile(r"^\s*SET\s+(?:SESSION\s+|LOCAL\s+)?([A-Za-z_][\w.]*)\s*(?:=|\bTO\b)\s*(.*?)"
                  r"\s*;?\s*$", re.I | re.S)
_SHOW = re.compile(r"^\s*SHOW\s+(.+?)\s*;?\s*$", re.I | re.S)
_NOOP = ("DISCARD", "DEALLOCATE", "CLOSE", "LISTEN", "UNLISTEN", "RESET", "CHECKPOINT",
         "SAVEPOINT", "RELEASE")
_ROLLBACK_TO = re.compile(r"^\s*ROLLBACK\s+(WORK\s+|TRANSACTION\s+)?TO\b", re.I)
PUBLIC_SCHEMAS = ("pg_catalog", "information_schema")


def split(sql: str) -> list[str]:
    """The statements of a query message (split at top-level semicolons, by tokens)."""
    try:
        tokens = sqlglot.tokenize(sql, read="postgres")
    except sqlglot.errors.TokenError:
        return [sql] if sql.strip() else []
    out, start = [], 0
    for tok in tokens:
        if tok.token_type == TokenType.SEMICOLON:
            out.append(sql[start:tok.end + 1])
            start = tok.end + 1
    out.append(sql[start:])
    return [s for s in out if s.strip().strip(";").strip()]


def first_word(sql: str) -> str:
    m = _WORD.match(sql)
    return m.group(1).upper() if m else ""


def set_target(sql: str) -> tuple[str, str] | None:
    m = _SET.match(sql)
    if not m:
        return None
    value = m.group(2).strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    return m.group(1).lower(), value


def show_target(sql: str) -> str:
    m = _SHOW.match(sql)
    return m.group(1).strip().lower() if m else ""


def tables_of(sql: str) -> set[tuple[str, str]] | None:
    """(schema, table) of every relation the statement reads (lower case; CTE names
    excluded), or None when it does not parse as PostgreSQL."""
    try:
        trees = [t for t in sqlglot.parse(sql, read="postgres") if t is not None]
    except sqlglot.errors.SqlglotError:
        return None
    out = set()
    for tree in trees:
        ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
        for t in tree.find_all(exp.Table):
            name = t.name.lower()
            if not name or (not t.db and name in ctes):
                continue
            out.add(((t.db or "").lower(), name))
        for f in tree.find_all(exp.Anonymous):   # table functions (read_csv, ...)
            if isinstance(f.parent, exp.Table):
                out.add(("", f.name.lower()))
    return out


def kind(sql: str, protected: set, visible: set) -> str:
    """Where one statement goes (see the module docstring)."""
    if not sql.strip().strip(";").strip():
        return "empty"
    if marker_of(sql):
        return "marker"
    word = first_word(sql)
    if _ROLLBACK_TO.match(sql):     # savepoints (drivers' nested transactions): no-ops
        return "noop"
    if word == "SET":
        return "set"
    if word == "SHOW":
        return "show"
    if word == "EXPLAIN":
        return "explain"
    if word in _NOOP:
        return "noop"
    if word == "CALL":
        return "admin"
    return _reads(sql, protected, visible)


def marker_of(sql: str) -> str | None:
    """The workload marker one statement is (:func:`dpsql.sql.marker.pieces`), or None."""
    found = marker.pieces(sql)
    return found[0].marker if len(found) == 1 else None


def _reads(sql: str, protected: set, visible: set) -> str:
    tables = tables_of(sql)
    if tables is None:                    # a catalog query sqlglot cannot read goes to the
        low = sql.lower()                 # shadow; anything else to dpsql's own parser
        words = set(re.findall(r"[a-z_][a-z0-9_$]*", low))
        catalog = ("pg_catalog" in low or "information_schema" in low)
        return "public" if catalog and not (words & protected) else "release"
    names = {name for _, name in tables}
    if names & protected:     # a schema probe (WHERE 1=0, LIMIT 0) returns no row: the
        asked = probe(sql, "postgres")          # shadow's empty table answers it
        return "public" if asked is not None and asked.table in protected else "release"
    if first_word(sql) not in ("SELECT", "WITH", "TABLE", "VALUES"):
        return "release" if first_word(sql) == "CREATE" else "unsupported"
    for schema, name in tables:
        if schema in PUBLIC_SCHEMAS or (schema in ("", "main", "public") and name in visible):
            continue
        if schema and f"{schema}.{name}" in visible:      # shared with this analyst
            continue
        if schema == "" and (name.startswith("pg_") or name.startswith("duckdb_")):
            continue
        return "denied"
    return "public"


def denied_name(sql: str, visible: set) -> str:
    for schema, name in sorted(tables_of(sql) or ()):
        qualified = f"{schema}.{name}" if schema else name
        if schema not in PUBLIC_SCHEMAS and name not in visible and qualified not in visible:
            return qualified
    return "?"

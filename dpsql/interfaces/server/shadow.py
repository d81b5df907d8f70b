"""The public catalog a connection sees: an in-memory DuckDB holding no protected row.

It holds, for one analyst: every protected table they may query as an EMPTY table with
its declared columns (so ``\\dt``, ``\\d``, SQLAlchemy's inspector and pgcli's completion
see names and types, never rows), the analyst's OWN result tables with their released
rows (post-processing: reading them costs nothing), ``dpsql_budget`` (their allowance and
what is left of it), and for the data owner ``dpsql_ledger``. Catalog queries, reads of
one's result tables and budget look-ups run here, after a small rewrite of the PostgreSQL
spellings DuckDB lacks (``OPERATOR(pg_catalog.~)``, ``COLLATE pg_catalog.default``,
``pg_catalog.`` function prefixes); the file's own DuckDB connection never runs them.
"""

from __future__ import annotations

import re

from dpsql.interfaces.server import pgcompat
from dpsql.store import shadow as base
from dpsql.store.database import key_sql_type, quote_ident


#: functions PostgreSQL clients call that DuckDB's pg_catalog lacks (name, macro body)
_MACROS = (
    ("pg_table_is_visible(x)", "true"),
    ("pg_type_is_visible(x)", "true"),
    ("pg_function_is_visible(x)", "true"),
    ("pg_get_indexdef(a, b := 0, c := false)", "NULL::VARCHAR"),
    ("pg_get_constraintdef(a, b := false)", "NULL::VARCHAR"),
    ("pg_get_statisticsobjdef_columns(x)", "NULL::VARCHAR"),
    ("pg_relation_is_publishable(x)", "false"),
    ("pg_encoding_to_char(x)", "'UTF8'"),
    ("obj_description(a, b := '')", "NULL::VARCHAR"),
    ("col_description(a, b)", "NULL::VARCHAR"),
    ("shobj_description(a, b)", "NULL::VARCHAR"),
    ("pg_get_expr(a, b, c := false)", "NULL::VARCHAR"),
    ("pg_table_size(x)", "0"),
    ("pg_relation_size(x)", "0"),
    ("pg_total_relation_size(x)", "0"),
    ("pg_size_pretty(x)", "'0 bytes'"),
    ("pg_get_partkeydef(x)", "NULL::VARCHAR"),
    ("pg_get_viewdef(a, b := false)", "NULL::VARCHAR"),
    ("pg_get_triggerdef(a, b := false)", "NULL::VARCHAR"),
    ("pg_get_function_result(x)", "NULL::VARCHAR"),
    ("pg_get_function_arguments(x)", "NULL::VARCHAR"),
    ("pg_get_serial_sequence(a, b)", "NULL::VARCHAR"),
    ("current_setting(x)", "''"),
    ("pg_backend_pid()", "0"),
    ("pg_postmaster_start_time()", "TIMESTAMP '2026-01-01'"),
    ("has_table_privilege(a, b, c := '')", "true"),
    ("to_regclass(x)", "NULL::VARCHAR"),
    ("to_regtype(x)", "(SELECT min(oid) FROM pg_catalog.pg_type WHERE typname = x)"),
    ("array_upper(a, d)", "len(a)"),
    ("format_type(t, m)", "CASE t WHEN 20 THEN 'bigint' WHEN 23 THEN 'integer' WHEN 21 THEN "
     "'smallint' WHEN 701 THEN 'double precision' WHEN 700 THEN 'real' WHEN 25 THEN 'text' "
     "WHEN 1043 THEN 'character varying' WHEN 16 THEN 'boolean' WHEN 1082 THEN 'date' "
     "WHEN 1114 THEN 'timestamp without time zone' WHEN 1700 THEN 'numeric' "
     "ELSE pg_catalog.format_type(t, m) END"),
    ("array_lower(a, d)", "1"),
    ("pg_get_statisticsobjdef(x)", "NULL::VARCHAR"),
    ("pg_get_ruledef(a, b := false)", "NULL::VARCHAR"),
    ("pg_get_userbyid(x)", "'dpsql'"),
)
SERVER_VERSION = "15.0 (dpsql)"
_REWRITES = (
    (re.compile(r"OPERATOR\s*\(\s*pg_catalog\s*\.\s*([~!=<>*]+)\s*\)", re.I), r"\1"),
    (re.compile(r"COLLATE\s+pg_catalog\s*\.\s*\"?default\"?", re.I), ""),
    (re.compile(r"\bpg_catalog\s*\.\s*(?=[a-z_]+\s*\()", re.I), ""),
    (re.compile(r"::\s*pg_catalog\s*\.\s*", re.I), "::"),
    (re.compile(r"::\s*\"?(regclass|regtype|regproc|regprocedure|regnamespace|regrole|"
                r"regoper|regconfig|name|\"char\"|char)\"?(?![\w(])", re.I), "::VARCHAR"),
    (re.compile(r"\bAS\s+\"?(regclass|regtype|regproc|regnamespace|regrole|name)\"?\s*\)",
                re.I), "AS VARCHAR)"),
    (re.compile(r"\bAS\s+OID\s*\)", re.I), "AS BIGINT)"),
    (re.compile(r"::\s*oid\b", re.I), "::BIGINT"),
    (re.compile(r"\bjson_build_object\s*\(", re.I), "json_object("),
    (re.compile(r"\bversion\s*\(\s*\)", re.I), f"'PostgreSQL {SERVER_VERSION}'"),
)


_ANY_LITERAL = re.compile(r"=\s*ANY\s*\(\s*'\{([^}']*)\}'(?:\s*::\s*[\w\[\]\"]+)?\s*\)", re.I)


def _in_list(m) -> str:
    items = [i.strip().strip('"') for i in m.group(1).split(",") if i.strip()]
    return "IN (" + ", ".join("'" + i.replace("'", "''") + "'" for i in items) + ")" \
        if items else "IN (NULL)"


def rewrite(sql: str) -> str:
    """The PostgreSQL spellings of catalog queries that DuckDB does not read."""
    sql = _ANY_LITERAL.sub(_in_list, pgcompat.rewrite(sql))
    for pattern, repl in _REWRITES:
        sql = pattern.sub(repl, sql)
    return sql


class Shadow(base.Shadow):
    """One connection's public catalog (a private in-memory DuckDB, :mod:`dpsql.store.shadow`)
    with the functions and spellings PostgreSQL clients use."""

    def __init__(self):
        super().__init__()
        pgcompat.install(self.con)
        for signature, body in _MACROS:
            self.con.execute(f"CREATE OR REPLACE MACRO {signature} AS {body}")

    def protected(self, policy) -> None:
        """An empty table with ``policy``'s declared columns and their SQL types."""
        cols = ", ".join(f"{quote_ident(c)} {key_sql_type(policy.column(c))}"
                         for c in policy.column_names)
        self._create(policy.table, f"CREATE OR REPLACE TABLE {quote_ident(policy.table)} "
                                   f"({cols})")

    def _sql(self, sql: str) -> str:
        return rewrite(sql)

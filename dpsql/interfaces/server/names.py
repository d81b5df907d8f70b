"""Each analyst's result tables in a namespace of their own.

Over the wire, ``CREATE [OR REPLACE] TABLE mine AS SELECT ...`` from analyst alice writes
the table ``"@alice/mine"`` in the database file: the server moves every ``CREATE TABLE``
target into the sender's namespace (:func:`rewrite`) before the statement reaches the
DB-API, and checks again, on the parsed batch, that every target is there
(:func:`check_targets`) before anything is reserved or charged. So an analyst can neither
overwrite another's table (``CREATE OR REPLACE TABLE mine`` by bob writes ``"@bob/mine"``)
nor learn that a name is taken (``CREATE TABLE mine`` never says "already exists" about
someone else's table). Each analyst sees their own tables under the names they gave
(:func:`logical`); a table shared with them appears as ``owner.name`` (read only). User
names contain no ``/`` (:func:`check_user_name`), so the physical name says who owns it.

Unnamed results keep the release path's names (``dp_r<release>_q<statement>``, unique in
the file); names of that form are refused as targets so that one analyst never holds two
tables under one name.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import sqlglot
from sqlglot import exp

from dpsql import errors as dp
from dpsql.store.database import quote_ident
from dpsql.store.results import check_result_names

#: user names: letters, digits and ``_ . @ -`` (at most 63, PostgreSQL's identifier length)
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,62}")
#: user names that would clash with a schema of the catalog (a shared table is owner.name)
RESERVED_USERS = ("main", "public", "pg_catalog", "information_schema", "temp", "system",
                  "dpsql")
_UNNAMED = re.compile(r"dp_r\d+_q\d+(_\d+)?", re.I)
#: schemas that mean "my own tables" in a CREATE TABLE target
OWN_SCHEMAS = ("main", "public")


def check_user_name(user: str) -> None:
    """Refuse a user name that could not name a namespace and a schema."""
    if not _USER.fullmatch(user or ""):
        raise dp.DpsqlError(f"user name {user!r} is not allowed: use at most 63 letters, "
                            "digits and _ . @ - (starting with a letter, digit or _)")
    low = user.lower()
    if low in RESERVED_USERS or low.startswith(("pg_", "duckdb_")):
        raise dp.DpsqlError(f"user name {user!r} is reserved (a catalog schema's name); "
                            "choose another")


def prefix(user: str) -> str:
    return f"@{user.lower()}/"


def physical(user: str, name: str) -> str:
    """The table in the file that holds ``user``'s table ``name``."""
    return prefix(user) + name


def logical(user: str, table: str) -> str:
    """The name ``user`` gives their table ``table`` (tables written before namespaces, and
    unnamed results, keep their names)."""
    p = prefix(user)
    return table[len(p):] if table.lower().startswith(p) else table


def owner(table: str) -> str | None:
    """The user whose namespace holds ``table`` (lower case), or None."""
    if table.startswith("@") and "/" in table:
        return table[1:table.index("/")]
    return None


def unprefixed(user: str, text: str) -> str:
    """A message or plan as ``user`` reads it: their own tables under their own names."""
    return re.sub(re.escape(prefix(user)), "", text, flags=re.I)


def rewrite(text: str, user: str, protected) -> str:
    """One statement with its ``CREATE TABLE`` target in ``user``'s namespace (any other
    statement unchanged). A target in another schema (another analyst's ``owner.name``)
    is refused with 42501; a reserved name as every interface refuses it (0A000)."""
    try:
        trees = [t for t in sqlglot.parse(text, read="duckdb")
                 if t is not None and not isinstance(t, exp.Semicolon)]
    except sqlglot.errors.SqlglotError:
        return text           # the release path reports the syntax error
    if len(trees) != 1 or not isinstance(trees[0], exp.Create) \
            or str(trees[0].args.get("kind") or "").upper() != "TABLE":
        return text           # not a result table (the release path refuses CREATE VIEW ...)
    table = trees[0].this
    table = table.this if isinstance(table, exp.Schema) else table
    if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
        return text           # refused by the release path (only CREATE TABLE name AS ...)
    schema = (table.args.get("catalog"), table.args.get("db"))
    if schema[0] is not None or (schema[1] is not None and schema[1].name.lower()
                                 not in OWN_SCHEMAS + (user.lower(),)):
        raise dp.AccessDenied(
            f"result tables are written only under your own names: write CREATE TABLE "
            f"{table.name} AS SELECT ...; a table shared with you (owner.name) is read only")
    name = table.name
    if name.startswith("@"):
        raise dp.UnsupportedQueryError(f"result table name {name!r} starts with @, the "
                                       "server's spelling of an analyst's namespace; "
                                       "choose another name")
    if _UNNAMED.fullmatch(name):
        raise dp.UnsupportedQueryError(
            f"result table name {name!r} has the form dpsql gives unnamed results "
            "(dp_r<release>_q<statement>); choose another name")
    check_result_names([SimpleNamespace(target=name, index=0)], protected)
    first = schema[1] if schema[1] is not None else table.this
    start, end = first.meta.get("start"), table.this.meta.get("end")
    if start is None or end is None:
        raise dp.UnsupportedQueryError("this CREATE TABLE target is not supported; write "
                                       "CREATE TABLE name AS SELECT ...")
    return text[:start] + quote_ident(physical(user, name)) + text[end + 1:]



def check_targets(user: str, queries) -> None:
    """Every result table a parsed batch names is in ``user``'s namespace (checked before
    the reservation: fail closed if a statement escaped :func:`rewrite`)."""
    for q in queries:
        if q.target is not None and not q.target.lower().startswith(prefix(user)):
            raise dp.AccessDenied("result tables are written only under your own names; "
                                  "nothing was charged")

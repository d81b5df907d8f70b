"""The data owner's statements over the wire (role ``admin`` only).

    CALL dpsql.protect('adult', '<policy TOML of the table>' [, true])   -- true: replace
    CALL dpsql.allow('alice', 'adult', '0.5', '1e-6')    -- alice's allowance of adult

``protect`` declares a table's public domains and budget exactly as ``dpsql protect`` does
(:meth:`dpsql.session.Session.protect`); ``allow`` writes the users file (an analyst's new
allowance applies from their next connection). Anyone else gets 42501.
"""

from __future__ import annotations

import re
import tomllib

import sqlglot
from sqlglot import exp

from dpsql import errors as dp
from dpsql.interfaces.server import accounts
from dpsql.interfaces.server.results import Result

_CALL = re.compile(r"^\s*CALL\s+dpsql\s*\.\s*(\w+)\s*\((.*)\)\s*;?\s*$", re.I | re.S)
USAGE = ("CALL dpsql.protect('table', '<policy TOML>' [, true]) or "
         "CALL dpsql.allow('analyst', 'table', 'epsilon', 'delta')")


def arguments(text: str) -> tuple[str, list]:
    """(procedure, literal arguments) of ``CALL dpsql.name(...)``."""
    m = _CALL.match(text)
    if not m:
        raise dp.ParseError(f"not a dpsql procedure call; write {USAGE}")
    try:
        tree = sqlglot.parse_one(f"SELECT {m.group(2)}", read="postgres")
    except sqlglot.errors.SqlglotError:
        raise dp.ParseError(f"the arguments of dpsql.{m.group(1)} must be literals; "
                            f"write {USAGE}") from None
    values = []
    for e in tree.expressions:
        if isinstance(e, exp.Literal):
            values.append(e.this)
        elif isinstance(e, exp.Boolean):
            values.append(e.this)
        else:
            raise dp.ParseError(f"the arguments of dpsql.{m.group(1)} must be literals "
                                f"(strings, numbers, true/false); write {USAGE}")
    return m.group(1).lower(), values


def call(connection, text: str) -> Result:
    """Run one admin procedure for ``connection`` (an AnalystConnection)."""
    if not connection.account.admin:
        raise dp.AccessDenied("only the data owner (role admin) may protect tables or change "
                              "allowances")
    name, args = arguments(text)
    if name == "protect" and len(args) in (2, 3):
        return _protect(connection, *args)
    if name == "allow" and len(args) == 4:
        user, table, eps, delta = (str(a) for a in args)
        connection.views.policies = connection.views.session.policies()
        if table.lower() not in connection.views.policies:
            raise dp.UnknownTableError(f"table {table!r} is not protected; protect it first")
        accounts.set_allowance(connection.server.users_path, user, table, eps, delta)
        return Result("CALL")
    raise dp.ParseError(f"unknown dpsql procedure or wrong arguments; write {USAGE}")


def _protect(connection, table, policy_text, replace=False) -> Result:
    try:
        policy = tomllib.loads(str(policy_text))
    except tomllib.TOMLDecodeError as exc:
        raise dp.PolicyError(f"the policy is not valid TOML ({exc}); fix its syntax") from None
    tp = connection.views.session.protect(str(table), policy, replace=replace is True)
    connection.views.policies = connection.views.session.policies()
    connection.views.shadow.protected(tp)
    return Result("CALL")

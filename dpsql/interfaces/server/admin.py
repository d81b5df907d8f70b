"""The procedures over the wire: the data owner's (role ``admin``) and sharing.

    CALL dpsql.protect('adult', '<policy TOML of the table>' [, true])   -- true: replace
    CALL dpsql.allow('alice', 'adult', '0.5', '1e-6' [, '0.2'])  -- alice's allowance of adult
    CALL dpsql.share('mine', 'bob')       -- bob may read my table mine (as alice.mine)
    CALL dpsql.unshare('mine', 'bob')

``protect`` declares a table's public domains and budget exactly as ``dpsql protect`` does
(:meth:`dpsql.session.Session.protect`); ``allow`` writes the users file (ε, δ and, when
given, the metric ε of d_X releases; an analyst's new allowance applies from their next
connection). Anyone but the data owner gets 42501 for these two.

``share`` and ``unshare`` are the owner's of a result table (and the data owner's, naming
it ``owner.name``): the grantee reads it as ``owner.name`` (post-processing: free), never
writes it; a table that is not the caller's is reported as not existing (42P01), as a read
of it would be.
"""

from __future__ import annotations

import re
import tomllib

import sqlglot
from sqlglot import exp

from dpsql import errors as dp
from dpsql.interfaces.server import accounts, names
from dpsql.interfaces.server.results import Result

_CALL = re.compile(r"^\s*CALL\s+dpsql\s*\.\s*(\w+)\s*\((.*)\)\s*;?\s*$", re.I | re.S)
USAGE = ("CALL dpsql.share('table', 'analyst'), CALL dpsql.unshare('table', 'analyst'), "
         "or for the data owner CALL dpsql.protect('table', '<policy TOML>' [, true]) and "
         "CALL dpsql.allow('analyst', 'table', 'epsilon', 'delta' [, 'metric epsilon'])")


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
    """Run one procedure for ``connection`` (an AnalystConnection)."""
    name, args = arguments(text)
    if name in ("share", "unshare") and len(args) == 2:
        return _share(connection, str(args[0]), str(args[1]), name == "share")
    if name in ("protect", "allow") and not connection.account.admin:
        raise dp.AccessDenied("only the data owner (role admin) may protect tables or change "
                              "allowances")
    if name == "protect" and len(args) in (2, 3):
        return _protect(connection, *args)
    if name == "allow" and len(args) in (4, 5):
        user, table, *amounts = (str(a) for a in args)
        connection.views.policies = connection.views.session.policies()
        if table.lower() not in connection.views.policies:
            raise dp.UnknownTableError(f"table {table!r} is not protected; protect it first")
        accounts.set_allowance(connection.server.users_path, user, table, *amounts)
        return Result("CALL")
    raise dp.ParseError(f"unknown dpsql procedure or wrong arguments; write {USAGE}")


def _share(connection, table: str, grantee: str, shared: bool) -> Result:
    """Let ``grantee`` read (or no longer read) one of the caller's result tables; the
    data owner may name anyone's as ``owner.name``."""
    server, user = connection.server, connection.account.user
    owner, _, name = table.rpartition(".") if "." in table else (user, "", table)
    if owner.lower() != user.lower() and not connection.account.admin:
        owner, name = user, table           # not theirs to name: looked up as their own
    physical = next((t for t in (names.physical(owner, name), name)
                     if (server.journal.owner_of(t) or "").lower() == owner.lower()), None)
    if physical is None:
        raise dp.UnknownTableError(f"relation {table!r} does not exist or is not yours: "
                                   "you can share your own result tables")
    accounts_now = server.accounts()
    if grantee not in accounts_now:
        raise dp.UnknownTableError(f"there is no analyst {grantee!r} to share with; check "
                                   "the name")
    if grantee.lower() == owner.lower():
        raise dp.UsageError(f"{grantee!r} owns {table!r} already")
    server.journal.share(physical, grantee, user, shared)
    return Result("CALL")


def _protect(connection, table, policy_text, replace=False) -> Result:
    try:
        policy = tomllib.loads(str(policy_text))
    except tomllib.TOMLDecodeError as exc:
        raise dp.PolicyError(f"the policy is not valid TOML ({exc}); fix its syntax") from None
    tp = connection.views.session.protect(str(table), policy, replace=replace is True)
    connection.views.policies = connection.views.session.policies()
    connection.views.shadow.protected(tp)
    return Result("CALL")

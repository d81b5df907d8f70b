"""Analyst accounts: the users file (TOML).

The users file, one table per analyst::

    [users.alice]
    verifier = "SCRAM-SHA-256$4096:...$...:..."   # `dpsql user add`, never a password
    role = "analyst"                                 # or "admin" (the data owner)
    [users.alice.allowance.adult]                    # the tables alice may query
    epsilon = "0.5"                                  # her share of adult's budget
    delta = "1e-6"
    metric_epsilon = "0.2"                           # and of its metric (d_X) budget

An analyst may query only the tables with an allowance; the table's own budgets still cap
the sum over everyone (the kernel's check-and-charge). What each analyst spent is kept in
the journal (:mod:`dpsql.interfaces.server.journal`). User names are checked
(:func:`dpsql.interfaces.server.names.check_user_name`: each names a namespace of result
tables) and unique in any case.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field
from fractions import Fraction

from dpsql.errors import DpsqlError, InputFileError, read_input_file
from dpsql.interfaces.server import names, scram
from dpsql.interfaces.server.journal import Spend
from dpsql.noise.accounting import number_from_text

ROLES = ("analyst", "admin")


@dataclass(frozen=True)
class Allowance:
    epsilon: Fraction
    delta: Fraction
    metric_epsilon: Fraction = Fraction(0)

    @property
    def spend(self) -> Spend:
        return Spend(self.epsilon, self.delta, self.metric_epsilon)


@dataclass(frozen=True)
class Account:
    user: str
    verifier: scram.Verifier
    role: str = "analyst"
    allowances: dict = field(default_factory=dict)   # table -> Allowance

    @property
    def admin(self) -> bool:
        return self.role == "admin"

    def may_use(self, table: str) -> bool:
        return self.admin or table.lower() in self.allowances


def _number(raw, where: str) -> Fraction:
    text = raw if isinstance(raw, str) else repr(raw)
    return number_from_text(text, where, "0.5")


def _account(user: str, entry: dict, path: str) -> Account:
    where = f"users file {path!r}, user {user!r}"
    try:
        names.check_user_name(user)
    except DpsqlError as exc:
        raise InputFileError(f"users file {path!r}: {exc}") from None
    if not isinstance(entry, dict) or "verifier" not in entry:
        raise InputFileError(f"{where}: no verifier; set the password with `dpsql user "
                             "passwd`")
    role = entry.get("role", "analyst")
    if role not in ROLES:
        raise InputFileError(f"{where}: role must be one of {ROLES}, got {role!r}")
    try:
        verifier = scram.Verifier.parse(entry["verifier"])
    except ValueError as exc:
        raise InputFileError(f"{where}: {exc}") from None
    allowances = {}
    for table, a in (entry.get("allowance") or {}).items():
        if not isinstance(a, dict):
            raise InputFileError(f"{where}: allowance.{table} must be a table with epsilon "
                                 "and delta")
        allowances[table.lower()] = Allowance(*(
            _number(a.get(key, "0"), f"{where} allowance.{table}.{key}")
            for key in ("epsilon", "delta", "metric_epsilon")))
    return Account(user, verifier, role, allowances)


def load_users(path: str) -> dict[str, Account]:
    """Every account of the users file (refused as a whole if one entry is bad)."""
    try:
        data = tomllib.loads(read_input_file(path, "users file"))
    except tomllib.TOMLDecodeError as exc:
        raise InputFileError(f"users file {path!r} is not valid TOML ({exc})") from None
    users = data.get("users") or {}
    seen: dict = {}
    for name in users:
        if name.lower() in seen:
            raise InputFileError(f"users file {path!r}: users {seen[name.lower()]!r} and "
                                 f"{name!r} differ only in case; rename one")
        seen[name.lower()] = name
    return {name: _account(name, entry, path) for name, entry in users.items()}


# --------------------------------------------------------------------------- editing the file

def _toml_text(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)      # a TOML basic string


def _raw(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    return tomllib.loads(read_input_file(path, "users file")).get("users") or {}


def _write(path: str, users: dict) -> None:
    lines = ["# dpsql server accounts: `dpsql user add/passwd/remove` edit this file", ""]
    for name in sorted(users):
        entry = users[name]
        lines += [f"[users.{_toml_text(name)}]",
                  f"verifier = {_toml_text(entry['verifier'])}",
                  f"role = {_toml_text(entry.get('role', 'analyst'))}"]
        for table, a in sorted((entry.get("allowance") or {}).items()):
            lines.append(f"[users.{_toml_text(name)}.allowance.{_toml_text(table)}]")
            lines += [f"{key} = {_toml_text(str(a[key]))}"
                      for key in ("epsilon", "delta", "metric_epsilon") if key in a]
        lines.append("")
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w",
              encoding="utf-8") as f:
        f.write("\n".join(lines))
    os.replace(tmp, path)


def add_user(path: str, user: str, password: str, *, role: str = "analyst",
             allowances: dict | None = None, replace: bool = False) -> None:
    """Add ``user`` (or, with ``replace``, change it); ``allowances``: table -> (ε, δ) or
    (ε, δ, metric ε) as text. The password is stored only as its SCRAM verifier."""
    if role not in ROLES:
        raise DpsqlError(f"role must be one of {ROLES}, got {role!r}")
    names.check_user_name(user)
    users = _raw(path)
    same = [u for u in users if u.lower() == user.lower() and u != user]
    if (user in users and not replace) or same:
        raise DpsqlError(f"user {(same or [user])[0]!r} already exists; use `dpsql user "
                         "passwd` to change the password")
    entry = dict(users.get(user, {}), verifier=scram.make_verifier(password), role=role)
    if allowances is not None:
        entry["allowance"] = {t.lower(): _allowance_entry(*amounts)
                              for t, amounts in allowances.items()}
    users[user] = entry
    _write(path, users)
    load_users(path)                           # what was written must load


def set_password(path: str, user: str, password: str) -> None:
    users = _raw(path)
    if user not in users:
        raise DpsqlError(f"there is no user {user!r} in {path!r}; add it with `dpsql user add`")
    users[user]["verifier"] = scram.make_verifier(password)
    _write(path, users)


def _allowance_entry(epsilon, delta, metric_epsilon=None) -> dict:
    """An allowance as the users file writes it; each amount checked (at least 0)."""
    entry = {"epsilon": str(epsilon), "delta": str(delta)}
    if metric_epsilon is not None:
        entry["metric_epsilon"] = str(metric_epsilon)
    for what, value in entry.items():
        if _number(value, f"allowance {what}") < 0:
            raise DpsqlError(f"the allowance's {what} must be at least 0, got {value}")
    return entry


def set_allowance(path: str, user: str, table: str, epsilon: str, delta: str,
                  metric_epsilon: str | None = None) -> None:
    """Give ``user`` an allowance of ``table``'s budget (replacing its ε and δ; its metric
    ε too when given, else kept); checked on write."""
    users = _raw(path)
    if user not in users:
        raise DpsqlError(f"there is no user {user!r}; add it with `dpsql user add`")
    allowance = users[user].setdefault("allowance", {})
    old = allowance.get(table.lower(), {})
    metric = metric_epsilon if metric_epsilon is not None else old.get("metric_epsilon")
    allowance[table.lower()] = _allowance_entry(epsilon, delta, metric)
    _write(path, users)
    load_users(path)


def remove_user(path: str, user: str) -> None:
    users = _raw(path)
    if users.pop(user, None) is None:
        raise DpsqlError(f"there is no user {user!r} in {path!r}")
    _write(path, users)

"""Analyst accounts: the users file (TOML) and who spent what (the allowance journal).

The users file, one table per analyst::

    [users.alice]
    verifier = "SCRAM-SHA-256$4096:...$...:..."   # `dpsql user add`, never a password
    role = "analyst"                                 # or "admin" (the data owner)
    [users.alice.allowance.adult]                    # the tables alice may query
    epsilon = "0.5"                                  # her share of adult's budget
    delta = "1e-6"

An analyst may query only the tables with an allowance; the table's own budget still caps
the sum over everyone (the kernel's check-and-charge). An allowance is checked against the
analyst's basic-composition sum of charged (ε, δ): before a release its full cost is
*reserved* in the journal (an append-only JSON-lines file beside the database), after it the
actual charge is *settled* (zero when past releases answered it). A reservation never
settled (the server died mid-release) counts as spent: rounding against the spender.
"""

from __future__ import annotations

import json
import os
import threading
import tomllib
import uuid
from dataclasses import dataclass, field
from fractions import Fraction

from dpsql.errors import BudgetExceededError, DpsqlError, InputFileError, show_exact
from dpsql.errors import read_input_file
from dpsql.interfaces.server import scram
from dpsql.noise.accounting import number_from_text

ROLES = ("analyst", "admin")


@dataclass(frozen=True)
class Allowance:
    epsilon: Fraction
    delta: Fraction


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
        allowances[table.lower()] = Allowance(
            _number(a.get("epsilon", "0"), f"{where} allowance.{table}.epsilon"),
            _number(a.get("delta", "0"), f"{where} allowance.{table}.delta"))
    return Account(user, verifier, role, allowances)


def load_users(path: str) -> dict[str, Account]:
    """Every account of the users file (refused as a whole if one entry is bad)."""
    try:
        data = tomllib.loads(read_input_file(path, "users file"))
    except tomllib.TOMLDecodeError as exc:
        raise InputFileError(f"users file {path!r} is not valid TOML ({exc})") from None
    users = data.get("users") or {}
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
            lines += [f"[users.{_toml_text(name)}.allowance.{_toml_text(table)}]",
                      f"epsilon = {_toml_text(str(a.get('epsilon', '0')))}",
                      f"delta = {_toml_text(str(a.get('delta', '0')))}"]
        lines.append("")
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w",
              encoding="utf-8") as f:
        f.write("\n".join(lines))
    os.replace(tmp, path)


def add_user(path: str, user: str, password: str, *, role: str = "analyst",
             allowances: dict | None = None, replace: bool = False) -> None:
    """Add ``user`` (or, with ``replace``, change it); ``allowances``: table -> (ε, δ)
    as text. The password is stored only as its SCRAM verifier."""
    if role not in ROLES:
        raise DpsqlError(f"role must be one of {ROLES}, got {role!r}")
    if not user or any(c in user for c in "\0\n\r"):
        raise DpsqlError("a user name must be non-empty plain text")
    users = _raw(path)
    if user in users and not replace:
        raise DpsqlError(f"user {user!r} already exists; use `dpsql user passwd` to change "
                         "the password")
    entry = dict(users.get(user, {}), verifier=scram.make_verifier(password), role=role)
    if allowances is not None:
        entry["allowance"] = {t.lower(): {"epsilon": str(e), "delta": str(d)}
                              for t, (e, d) in allowances.items()}
    users[user] = entry
    _write(path, users)
    load_users(path)                           # what was written must load


def set_password(path: str, user: str, password: str) -> None:
    users = _raw(path)
    if user not in users:
        raise DpsqlError(f"there is no user {user!r} in {path!r}; add it with `dpsql user add`")
    users[user]["verifier"] = scram.make_verifier(password)
    _write(path, users)


def set_allowance(path: str, user: str, table: str, epsilon: str, delta: str) -> None:
    """Give ``user`` an allowance of ``table``'s budget (replacing any); checked on write."""
    users = _raw(path)
    if user not in users:
        raise DpsqlError(f"there is no user {user!r}; add it with `dpsql user add`")
    for value, what in ((epsilon, "epsilon"), (delta, "delta")):
        if _number(value, f"allowance {what}") < 0:
            raise DpsqlError(f"the allowance's {what} must be at least 0, got {value}")
    users[user].setdefault("allowance", {})[table.lower()] = {"epsilon": epsilon,
                                                              "delta": delta}
    _write(path, users)
    load_users(path)


def remove_user(path: str, user: str) -> None:
    users = _raw(path)
    if users.pop(user, None) is None:
        raise DpsqlError(f"there is no user {user!r} in {path!r}")
    _write(path, users)


# --------------------------------------------------------------------------- the journal

class Journal:
    """Who spent what, and which result tables each analyst owns (append-only JSON lines,
    fsynced). One per database; every connection of the server shares it."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self.spent: dict = {}        # (user, table) -> [ε, δ] (reserved or settled)
        self.owners: dict = {}       # result table (lower) -> user
        self.releases: dict = {}     # release id -> user
        self._open: dict = {}        # reservation id -> (user, table, ε, δ)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if text and not text.endswith("\n"):
                with open(path, "a", encoding="utf-8") as f:
                    f.write("\n")               # the next record starts on its own line
            lines = [ln for ln in text.split("\n") if ln.strip()]
            for i, line in enumerate(lines):
                try:
                    self._apply(json.loads(line))
                except (ValueError, KeyError):
                    # a crash mid-write leaves a partial LAST line: its release never started
                    # (the reservation is written before it); anything else is damage
                    if i != len(lines) - 1:
                        raise InputFileError(f"the allowance journal {path!r} is damaged at "
                                             f"line {i + 1}; restore it from a backup") from None

    def _apply(self, rec: dict) -> None:
        key = (rec["user"], rec["table"])
        eps, dlt = Fraction(rec["epsilon"]), Fraction(rec["delta"])
        cur = self.spent.setdefault(key, [Fraction(0), Fraction(0)])
        if rec["op"] == "reserve":
            self._open[rec["id"]] = (eps, dlt)
            cur[0] += eps
            cur[1] += dlt
            return
        held = self._open.pop(rec["id"], (Fraction(0), Fraction(0)))
        cur[0] += eps - held[0]          # settle: the actual charge replaces the reservation
        cur[1] += dlt - held[1]
        if rec.get("release_id") is not None:
            self.releases[int(rec["release_id"])] = rec["user"]
        for t in rec.get("tables", ()):
            self.owners[t.lower()] = rec["user"]

    def _append(self, rec: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._apply(rec)

    def reserve(self, account: Account, table: str, eps: Fraction, dlt: Fraction) -> str:
        """Check the analyst's allowance and hold (ε, δ); refused with nothing held."""
        with self._lock:
            if not account.admin:
                allowance = account.allowances[table]
                used = self.spent.get((account.user, table), [Fraction(0), Fraction(0)])
                for quantity, have, ask, limit in (("epsilon", used[0], eps, allowance.epsilon),
                                                   ("delta", used[1], dlt, allowance.delta)):
                    if have + ask > limit:
                        raise BudgetExceededError(
                            table, quantity, have, ask, limit,
                            note=f"this is analyst {account.user!r}'s allowance of the "
                                 f"table's budget (remaining {show_exact(max(limit - have, 0))})")
            rid = uuid.uuid4().hex
            self._append({"op": "reserve", "id": rid, "user": account.user, "table": table,
                          "epsilon": str(eps), "delta": str(dlt)})
            return rid

    def settle(self, rid: str, account: Account, table: str, eps=0, dlt=0,
               release_id=None, tables=()) -> None:
        with self._lock:
            self._append({"op": "settle", "id": rid, "user": account.user, "table": table,
                          "epsilon": str(Fraction(eps)), "delta": str(Fraction(dlt)),
                          "release_id": release_id, "tables": list(tables)})

    def used(self, user: str, table: str) -> tuple[Fraction, Fraction]:
        with self._lock:
            e, d = self.spent.get((user, table), [Fraction(0), Fraction(0)])
            return e, d

    def owned(self, user: str) -> list[str]:
        with self._lock:
            return sorted(t for t, u in self.owners.items() if u == user)

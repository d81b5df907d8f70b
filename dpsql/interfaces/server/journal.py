"""Who spent what, who owns which result table and with whom it is shared: the server's
journal (``DB.analysts.jsonl``, append-only JSON lines, each fsynced before it counts).

Spending is checked against the analyst's allowance (:class:`Spend`: ε, δ and the metric
ε of d_X releases, each summed exactly by basic composition) and journalled in two steps:
the full cost is *reserved* before a release runs, the actual charge *settled* after it
(zero when past releases answered it; the reservation when the outcome is unknown). A
reservation never settled (the server died mid-release) counts as spent: rounding against
the spender. A settle also records the release id and its result tables: they belong to
that analyst (their reuse pool, :meth:`Journal.paid_by`, and their tables,
:meth:`Journal.owned`). ``share``/``unshare`` records say which other analysts may read a
table (:meth:`Journal.shared_with`).
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from dataclasses import dataclass
from fractions import Fraction

from dpsql.errors import BudgetExceededError, InputFileError, show_exact

_ZERO = Fraction(0)


@dataclass(frozen=True)
class Spend:
    """A cost or a total: ε and δ (the table's standard budget), the metric ε (its d_X
    budget, per unit of the record distance)."""

    epsilon: Fraction = _ZERO
    delta: Fraction = _ZERO
    metric: Fraction = _ZERO

    QUANTITIES = ("epsilon", "delta", "metric epsilon")

    def __add__(self, other: "Spend") -> "Spend":
        return Spend(*(a + b for a, b in zip(self, other)))

    def __sub__(self, other: "Spend") -> "Spend":
        return Spend(*(a - b for a, b in zip(self, other)))

    def __iter__(self):
        return iter((self.epsilon, self.delta, self.metric))

    @classmethod
    def of(cls, rec: dict) -> "Spend":
        return cls(Fraction(rec["epsilon"]), Fraction(rec["delta"]),
                   Fraction(rec.get("metric", "0")))

    def fields(self) -> dict:
        return {"epsilon": str(self.epsilon), "delta": str(self.delta),
                "metric": str(self.metric)}


ZERO = Spend()


class Journal:
    """One per database; every connection of the server shares it (thread-safe)."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self.spent: dict = {}        # (user, table) -> Spend (reserved or settled)
        self.owners: dict = {}       # result table (lower) -> user
        self.releases: dict = {}     # release id -> user
        self.shares: dict = {}       # result table (lower) -> set of grantees
        self._seen: dict = {}        # user -> changes to the tables shared with them
        self._open: dict = {}        # reservation id -> Spend
        if os.path.exists(path):
            self._replay()

    def _replay(self) -> None:
        with open(self.path, encoding="utf-8") as f:
            text = f.read()
        if text and not text.endswith("\n"):
            with open(self.path, "a", encoding="utf-8") as f:
                f.write("\n")               # the next record starts on its own line
        lines = [ln for ln in text.split("\n") if ln.strip()]
        for i, line in enumerate(lines):
            try:
                self._apply(json.loads(line))
            except (ValueError, KeyError):
                # a crash mid-write leaves a partial LAST line: its release never started
                # (the reservation is written before it); anything else is damage
                if i != len(lines) - 1:
                    raise InputFileError(f"the allowance journal {self.path!r} is damaged "
                                         f"at line {i + 1}; restore it from a backup") from None

    def _apply(self, rec: dict) -> None:
        op = rec["op"]
        if op in ("share", "unshare"):
            grantees = self.shares.setdefault(rec["table"].lower(), set())
            (grantees.add if op == "share" else grantees.discard)(rec["user"])
            self._changed(rec["user"])
            return
        key, cost = (rec["user"], rec["table"]), Spend.of(rec)
        if op == "reserve":
            self._open[rec["id"]] = cost
            self.spent[key] = self.spent.get(key, ZERO) + cost
            return
        held = self._open.pop(rec["id"], ZERO)   # settle: the charge replaces the reservation
        self.spent[key] = self.spent.get(key, ZERO) + cost - held
        if rec.get("release_id") is not None:
            self.releases[int(rec["release_id"])] = rec["user"]
        for t in rec.get("tables", ()):
            self.owners[t.lower()] = rec["user"]
            for grantee in self.shares.get(t.lower(), ()):   # a shared table rewritten
                self._changed(grantee)

    def _changed(self, user: str) -> None:
        self._seen[user] = self._seen.get(user, 0) + 1

    def _append(self, rec: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._apply(rec)

    # ---------------------------------------------------------------- spending
    def reserve(self, account, table: str, cost: Spend) -> str:
        """Check the analyst's allowance and hold ``cost``; refused with nothing held."""
        with self._lock:
            if not account.admin:
                allowance = account.allowances[table].spend
                used = self.spent.get((account.user, table), ZERO)
                for quantity, have, ask, limit in zip(Spend.QUANTITIES, used, cost,
                                                      allowance):
                    if have + ask > limit:
                        raise BudgetExceededError(
                            table, quantity, have, ask, limit,
                            note=f"this is analyst {account.user!r}'s allowance of the "
                                 f"table's budget (remaining {show_exact(max(limit - have, 0))})")
            rid = uuid.uuid4().hex
            self._append({"op": "reserve", "id": rid, "user": account.user, "table": table,
                          **cost.fields()})
            return rid

    def settle(self, rid: str, account, table: str, cost: Spend = ZERO,
               release_id=None, tables=()) -> None:
        with self._lock:
            self._append({"op": "settle", "id": rid, "user": account.user, "table": table,
                          **cost.fields(), "release_id": release_id, "tables": list(tables)})

    def used(self, user: str, table: str) -> Spend:
        with self._lock:
            return self.spent.get((user, table), ZERO)

    # ---------------------------------------------------------------- ownership
    def owned(self, user: str) -> list[str]:
        with self._lock:
            return sorted(t for t, u in self.owners.items() if u == user)

    def owner_of(self, table: str) -> str | None:
        with self._lock:
            return self.owners.get(table.lower())

    def paid_by(self, user: str) -> frozenset:
        """The releases charged to ``user``: the only past releases their answers may be
        built from (reuse)."""
        with self._lock:
            return frozenset(r for r, u in self.releases.items() if u == user)

    # ---------------------------------------------------------------- sharing
    def share(self, table: str, grantee: str, by: str, shared: bool = True) -> None:
        """``grantee`` may (``shared``) or may no longer read ``table`` (its owner's)."""
        with self._lock:
            self._append({"op": "share" if shared else "unshare", "table": table,
                          "user": grantee, "by": by})

    def shared_with(self, user: str) -> list[tuple[str, str]]:
        """(owner, table) of every table shared with ``user`` (its owner still holding it)."""
        with self._lock:
            return sorted((self.owners[t], t) for t, grantees in self.shares.items()
                          if user in grantees and t in self.owners)

    def shared_version(self, user: str) -> int:
        """Changes so far to what is shared with ``user`` (a share, an unshare, a shared
        table written again): a connection copies the shared tables again when it moves."""
        with self._lock:
            return self._seen.get(user, 0)

    def grantees(self, table: str) -> set:
        with self._lock:
            return set(self.shares.get(table.lower(), ()))

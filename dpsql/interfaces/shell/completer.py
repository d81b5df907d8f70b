"""Completion of meta-commands, SQL keywords, protected tables, columns and declared values.

Everything offered comes from the declared policies (public), never from the data. The
context is read from the text before the cursor: after ``FROM`` / ``TABLE`` come tables;
after ``col =``, ``col <>`` or ``col IN (`` come ``col``'s declared categorical values
(quoted when they are strings); otherwise columns, tables and keywords.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

from prompt_toolkit.completion import Completer, Completion

from dpsql.interfaces.shell import metacommands
from dpsql.interfaces.shell.settings import DECLARED, FLAGS, SETTINGS, TARGETS

KEYWORDS = (
    "SELECT", "FROM", "WHERE", "GROUP BY", "COUNT(*)", "COUNT", "AND", "OR", "NOT", "IN",
    "NOT IN", "BETWEEN", "IS NULL", "IS NOT NULL", "AS", "CREATE TABLE",
    "CREATE OR REPLACE TABLE", "CUBE", "ROLLUP", "GROUPING SETS", "ALL", "NULL",
)


def strategy_words() -> list[str]:
    """``auto``, every strategy name (either noise family, ``mwem``) and ``dx_laplace``.
    Options are typed after the name: ``eigen(principal_vectors=8)``."""
    from dpsql.mechanisms.matrix import all_names

    return ["auto", *all_names(), "dx_laplace"]


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")
_VALUE = re.compile(
    r"([A-Za-z_][A-Za-z0-9_]*)\s*"                       # the column
    r"(?:=|<>|!=|\s(?:NOT\s+)?IN\s*\((?:[^()]*,)?)\s*"    # compared by =, <>, IN (...,
    r"('[^']*|[^\s',()]*)$",                              # the value typed so far
    re.IGNORECASE)
_TABLE_CONTEXT = re.compile(r"\b(FROM|TABLE|\\domain|\\budget|\\ledger)\s+[A-Za-z0-9_]*$",
                            re.IGNORECASE)
_FROM = re.compile(r"\bFROM\s+([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)


class DpsqlCompleter(Completer):
    """Completes from ``get_policies()`` ({table: TablePolicy}), read on every call."""

    def __init__(self, get_policies: Callable[[], dict]):
        self.get_policies = get_policies

    def get_completions(self, document, complete_event) -> Iterable[Completion]:
        text = document.text_before_cursor
        line = text.split("\n")[-1]
        policies = self.get_policies() or {}
        stripped = line.lstrip()
        if stripped.startswith("\\"):
            yield from self._meta(stripped, policies)
            return
        value = _VALUE.search(text)
        if value and text.count("'") % 2 == (1 if value.group(2).startswith("'") else 0):
            found = list(self._values(value.group(1), value.group(2), policies))
            if found or value.group(2).startswith("'"):
                yield from found
                return
        if text.count("'") % 2:
            return  # inside a string literal that is no declared value
        m = _WORD.search(text)
        word = m.group(0) if m else ""
        if _TABLE_CONTEXT.search(text):
            yield from _matching(word, sorted(policies), "table")
            return
        used = [t.lower() for t in _FROM.findall(document.text) if t.lower() in policies]
        columns: list[str] = []
        for table in used or sorted(policies):
            columns += [c for c in policies[table].column_names if c not in columns]
        if not word and not (complete_event and complete_event.completion_requested):
            return  # nothing typed yet: no menu after every space (Tab still lists all)
        yield from _matching(word, columns, "column")
        yield from _matching(word, sorted(policies), "table")
        yield from _matching(word, KEYWORDS, "keyword")

    def _meta(self, line: str, policies) -> Iterable[Completion]:
        parts = line.split()
        if len(parts) <= 1 and not line.endswith(" "):
            yield from _matching(line, metacommands.names(), "command", case=False)
            return
        name, args = parts[0], parts[1:]
        if line.endswith(" "):
            args.append("")
        if name == "\\set" and len(args) == 1:
            yield from _matching(args[0], SETTINGS, "setting", case=False)
        elif name == "\\set" and len(args) == 2 and args[0].lower() == "strategy":
            yield from _matching(args[1], strategy_words(), "strategy", case=False)
        elif name == "\\set" and len(args) == 2 and args[0].lower() in DECLARED \
                and DECLARED[args[0].lower()].choices:
            key = args[0].lower()
            yield from _matching(args[1], DECLARED[key].choices, key, case=False)
        elif name == "\\set" and len(args) == 2 and args[0].lower() in FLAGS:
            yield from _matching(args[1], ("on", "off"), "value", case=False)
        elif name == "\\set" and len(args) == 2 and args[0].lower() in TARGETS:
            yield from _matching(args[1], ("off",), "value", case=False)
        elif name in ("\\domain", "\\d", "\\budget", "\\ledger") and len(args) == 1:
            yield from _matching(args[0], sorted(policies), "table", case=False)
        elif name == "\\explain":
            rest = line[len(name):]
            yield from self.get_completions(_Doc(rest, rest), None)

    @staticmethod
    def _values(column: str, typed: str, policies) -> Iterable[Completion]:
        column = column.lower()
        for table, policy in sorted(policies.items()):
            if column not in policy.column_names:
                continue
            domain = policy.column(column)
            for v in getattr(domain, "values", ()) if domain.type == "categorical" else ():
                shown = "'" + v.replace("'", "''") + "'" if isinstance(v, str) else str(v)
                if shown.lower().startswith(typed.lower()) or \
                        shown[1:].lower().startswith(typed.lower()):
                    yield Completion(shown, -len(typed), display_meta=f"{table}.{column}")
            return


class _Doc:
    """The two attributes of a prompt_toolkit Document the completer reads."""

    def __init__(self, text: str, before: str):
        self.text = text
        self.text_before_cursor = before


def _matching(word: str, candidates, meta: str, case: bool = True) -> Iterable[Completion]:
    low = word.lower()
    for c in candidates:
        if c.lower().startswith(low) and c.lower() != low:
            text = c.lower() if case and word and word == low and meta == "keyword" else c
            yield Completion(text, -len(word), display_meta=meta)

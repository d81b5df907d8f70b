"""Lists of SQL statements kept as data: ``tests/sql/fixtures/*.sql`` read back as strings.

A list file holds entries. Each starts with a marker line ``-- accept: <group>`` or
``-- refuse: <group>`` (``group`` says which test reads it) and runs to the next marker. The
statement is the text after the marker verbatim (several lines, inner comments, ``{tmp}``
placeholders and all; a trailing ``;`` only when written), without leading and trailing blank
lines and whole-line ``--`` comments (notes and section headings). Tests parametrize over the
statements themselves, so a failing case is named by its SQL text; :func:`where` gives the
entry's ``file:line``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"

_MARKER = re.compile(r"^--\s*(accept|refuse):\s*([\w-]+)\s*$")


@dataclass(frozen=True)
class Statement:
    kind: str                       # "accept" or "refuse"
    group: str
    line: int                       # the marker's line in the file
    sql: str


def _strip(body: list[str]) -> str:
    def dropped(line: str) -> bool:
        return not line.strip() or line.lstrip().startswith("--")

    while body and dropped(body[-1]):
        body.pop()
    while body and dropped(body[0]):
        body.pop(0)
    return "\n".join(body)


@functools.cache
def read(name: str) -> tuple[Statement, ...]:
    """Every entry of ``tests/sql/fixtures/<name>``, in file order."""
    path = FIXTURES / name
    entries: list[Statement] = []
    marker, body = None, []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = _MARKER.match(line)
        if m is None:
            if marker is not None:
                body.append(line)
            continue
        if marker is not None:
            entries.append(Statement(*marker, _strip(body)))
        marker, body = (m.group(1), m.group(2), number), []
    if marker is not None:
        entries.append(Statement(*marker, _strip(body)))
    empty = [f"{name}:{s.line}" for s in entries if not s.sql]
    assert not empty, f"entries without a statement: {empty}"
    return tuple(entries)


def statements(name: str, kind: str, group: str) -> list[str]:
    """The statements of one group, in file order (the list a test parametrizes over)."""
    found = [s.sql for s in read(name) if (s.kind, s.group) == (kind, group)]
    assert found, f"{name}: no `-- {kind}: {group}` entries"
    return found


def where(name: str, sql: str) -> str:
    """``file:line`` of the entry holding ``sql`` (for messages)."""
    lines = [s.line for s in read(name) if s.sql == sql]
    return f"tests/sql/fixtures/{name}:{lines[0] if lines else '?'}"

"""How results reach the screen, as in psql: aligned or expanded (``\\x``), into a file
(``\\o FILE``), through a pager (``$PAGER``, ``\\pset pager``) when taller than the
terminal, with ``\\timing``. Nothing here computes a number: it lays out what a release,
the budget or the ledger returned.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field

from dpsql.errors import DpsqlError
from dpsql.store.results import format_table

EXPANDED = ("off", "on", "auto")
PAGER = ("on", "off", "always")


@dataclass
class Display:
    """The display settings of one shell (psql's defaults: aligned, pager on, no timing)."""

    expanded: str = "off"
    pager: str = "on"
    timing: bool = False
    file: object = None           # the stream \o opened, or None (the terminal)
    file_name: str = ""
    paged: list = field(default_factory=list)   # the pager commands run (for \pset)


def _show(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) >= 100 else f"{v:.4g}"
    return str(v)


def expanded_table(columns, rows, title: str | None = None, max_rows: int = 1000) -> str:
    """psql's expanded display: one ``-[ RECORD n ]`` block per row, a column per line."""
    width = max((len(str(c)) for c in columns), default=0)
    out = [title] if title else []
    for n, row in enumerate(rows[:max_rows], 1):
        out.append(f"-[ RECORD {n} ]" + "-" * max(1, width - len(str(n)) - 8))
        out.extend(f"{str(c):<{width}} | {_show(v)}" for c, v in zip(columns, row))
    if not rows:
        out.append("(no rows)")
    if len(rows) > max_rows:
        out.append(f"... ({len(rows) - max_rows} more rows)")
    return "\n".join(out)


def render(display: Display, columns, rows, title=None, max_rows: int = 1000) -> str:
    """A table as the display settings say: aligned, expanded, or (auto) expanded only when
    the aligned one is wider than the terminal."""
    if display.expanded == "on":
        return expanded_table(columns, rows, title, max_rows)
    text = format_table(columns, rows, title=title, max_rows=max_rows)
    if display.expanded == "auto":
        wide = max((len(line) for line in text.split("\n")), default=0)
        if wide > shutil.get_terminal_size().columns:
            return expanded_table(columns, rows, title, max_rows)
    return text


def pager_command() -> str:
    """``$PAGER``, else ``less -FRX`` or ``more`` when installed (``""``: none)."""
    chosen = os.environ.get("PAGER", "").strip()
    if chosen:
        return chosen
    if shutil.which("less"):
        return "less -FRX"
    return "more" if shutil.which("more") else ""


def emit(display: Display, out, text: str, *, interactive: bool) -> None:
    """Write ``text`` (with a newline) to ``out``; on an interactive terminal, through the
    pager when it is taller than the screen (or always, with ``\\pset pager always``)."""
    lines = text.count("\n") + 1
    terminal = interactive and display.file is None and _isatty(out)
    height = shutil.get_terminal_size().lines
    command = pager_command() if terminal and display.pager != "off" else ""
    if command and (display.pager == "always" or lines > height - 2):
        out.flush()
        try:
            done = subprocess.run(command, shell=True, input=text + "\n", text=True)
            display.paged.append(command)
            if done.returncode == 0:
                return
        except OSError:
            pass
    print(text, file=out, flush=True)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def set_expanded(display: Display, arg: str) -> str:
    """``\\x`` toggles on/off; ``\\x on|off|auto`` sets it."""
    value = arg.strip().lower()
    if not value:
        value = "off" if display.expanded != "off" else "on"
    if value not in EXPANDED:
        raise DpsqlError(f"\\x takes on, off or auto, got {arg.strip()!r}")
    display.expanded = value
    return {"on": "Expanded display is on.", "off": "Expanded display is off.",
            "auto": "Expanded display is used automatically."}[value]


def set_timing(display: Display, arg: str) -> str:
    value = arg.strip().lower()
    if value not in ("", "on", "off"):
        raise DpsqlError(f"\\timing takes on or off, got {arg.strip()!r}")
    display.timing = (not display.timing) if not value else value == "on"
    return f"Timing is {'on' if display.timing else 'off'}."


def set_pager(display: Display, arg: str) -> str:
    """``\\pset pager [on|off|always]`` (``\\pset`` alone shows it)."""
    parts = arg.split()
    if not parts:
        return f"pager is {display.pager} ({pager_command() or 'no pager found'})"
    if parts[0].lower() != "pager" or len(parts) > 2:
        raise DpsqlError("\\pset sets only the pager here: \\pset pager on|off|always "
                         "(\\x is the expanded display)")
    value = parts[1].lower() if len(parts) == 2 else ("off" if display.pager != "off"
                                                       else "on")
    if value not in PAGER:
        raise DpsqlError(f"\\pset pager takes on, off or always, got {parts[1]!r}")
    display.pager = value
    return {"on": "Pager is used for long output.", "off": "Pager usage is off.",
            "always": "Pager is always used."}[value]


def redirect(display: Display, arg: str) -> str:
    """``\\o FILE`` sends results to FILE (created or truncated); ``\\o`` alone back to the
    terminal. Remarks and errors stay on the terminal."""
    name = arg.strip()
    if display.file is not None:
        display.file.close()
        display.file, display.file_name = None, ""
    if not name:
        return "results go to the terminal"
    try:
        display.file = open(os.path.expanduser(name), "w", encoding="utf-8")
    except OSError as exc:
        raise DpsqlError(f"\\o cannot write {name!r} ({exc.strerror or type(exc).__name__}); "
                         "give a writable file path") from None
    display.file_name = name
    return f"results go to {name!r} (\\o alone: back to the terminal)"


"""The prompt_toolkit loop: history, multi-line entry, completion, highlighting, toolbar.

Enter submits when the text is complete (empty, or its last line ends with ``;`` or is a
meta-command, or ``exit`` / ``quit`` / ``help`` alone) and otherwise starts a new line; Esc
then Enter submits anyway. Ctrl-C at the prompt clears the line; Ctrl-D leaves. Ctrl-R
searches the history (Ctrl-G or Ctrl-C abandons the search); every default key binding is
exercised by tests/interfaces/test_shell_keys.py. While a workload block is open the prompt
shows it: ``(workload 2) dpsql> ``.
"""

from __future__ import annotations

import logging
import os
import sys

from prompt_toolkit import PromptSession
from prompt_toolkit.application.current import get_app
from prompt_toolkit.filters import Condition
from prompt_toolkit.history import FileHistory, History, InMemoryHistory

from dpsql.errors import Terminated
from dpsql.interfaces.shell import batch
from dpsql.interfaces.shell.executor import submission_complete
from dpsql.interfaces.shell.settings import show_exact, show_target

PROMPT = "dpsql> "
CONTINUATION = "  ...> "


def history() -> History:
    """``$DPSQL_HISTORY`` or ``~/.dpsql_history``; in memory when neither can be written."""
    path = os.environ.get("DPSQL_HISTORY") or os.path.join(os.path.expanduser("~"),
                                                           ".dpsql_history")
    try:
        with open(path, "a", encoding="utf-8"):
            pass
        return FileHistory(path)
    except OSError:
        print(f"note: cannot write the history file {path!r}; history is kept in memory "
              "only (set DPSQL_HISTORY to choose another file)", file=sys.stderr)
        return InMemoryHistory()


def sql_lexer():
    """pygments' SqlLexer for prompt_toolkit, or None (no highlighting) without pygments."""
    try:
        from prompt_toolkit.lexers import PygmentsLexer
        from pygments.lexers.sql import SqlLexer
    except ImportError:
        return None
    return PygmentsLexer(SqlLexer)


def toolbar_text(state) -> str:
    """The table in use with its remaining budget, and what the next query would spend."""
    budget = state.budget
    if state.table and budget is not None:
        where = (f" {state.table}: epsilon {show_exact(budget['epsilon_remaining'])} of "
                 f"{show_exact(budget['epsilon_limit'])} remaining, delta "
                 f"{show_exact(budget['delta_remaining'])} of "
                 f"{show_exact(budget['delta_limit'])}")
        metric = state.metric_budget()
        if metric is not None:
            where += f", metric epsilon {show_exact(metric[0])} of {show_exact(metric[1])}"
    else:
        where = " no table in use"
    target = state.target()
    if (state.epsilon is None and target is None) or state.delta is None:
        spend = "epsilon/delta not set (\\set epsilon 0.1, \\set delta 1e-6)"
    elif target is not None:
        spend = (f"ask {target[0]}={show_target(target[1])} delta={show_exact(state.delta)}"
                 f" strategy={state.strategy}"
                 + (" (confirm on)" if state.confirm else " (asks before spending)"))
    else:
        eps = "metric epsilon" if state.model == "metric" else "epsilon"
        spend = (f"spend {eps}={show_exact(state.epsilon)} delta={show_exact(state.delta)}"
                 f" strategy={state.strategy}")
    flags = [k for k in ("nonnegative", "integer") if getattr(state, k)]
    if not state.reuse:
        flags.append("reuse off")
    if flags:
        spend += " " + " ".join(flags)
    return f"{where} | {spend} | \\help "


def confirm(reason: str) -> bool:
    """Ask y/N at the terminal; anything but y/yes (including Ctrl-C, Ctrl-D) is no."""
    try:
        reply = PromptSession().prompt(f"{reason}. Spend it? [y/N] ")
    except (KeyboardInterrupt, EOFError):
        return False
    return reply.strip().lower() in ("y", "yes")


def banner(state, db_path: str) -> str:
    tables = ", ".join(sorted(state.policies)) or "none (a data owner runs `dpsql protect`)"
    lines = [f"dpsql shell on {db_path}; protected tables: {tables}"]
    if (state.epsilon is None and state.target() is None) or state.delta is None:
        lines.append("Set what each query may spend first: \\set epsilon 0.1 and "
                     "\\set delta 1e-6 (your own values), or ask by accuracy: "
                     "\\set target_rmse 50.")
    lines.append("End statements with ';'. \\help lists the commands, \\q or Ctrl-D quits.")
    return "\n".join(lines)


class _CtrlCTasks(logging.Filter):
    """Ctrl-C ends a prompt with KeyboardInterrupt; when the finished prompt task is
    collected later, asyncio logs "Task exception was never retrieved" with a traceback
    (seen with Ctrl-C pressed quickly after another key). The shell already handled it."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, KeyboardInterrupt)


def run(executor, completer, db_path: str, *, hist: History | None = None) -> int:
    """Read and run submissions until ``\\q`` or Ctrl-D; returns the exit status (0)."""
    state = executor.state
    logging.getLogger("asyncio").addFilter(_CtrlCTasks())
    holder: list = []

    def unfinished() -> bool:
        # the text being entered, never the search field's: while Ctrl-R searches, the
        # current buffer is the search text, and a multi-line state flipping with it left
        # prompt_toolkit's search links inconsistent (Ctrl-G then crashed the prompt)
        buffer = holder[0].default_buffer if holder else get_app().current_buffer
        return not submission_complete(buffer.text)

    def toolbar() -> str:
        try:
            return toolbar_text(state)
        except Exception:  # the toolbar must never break the prompt
            return " \\help "

    prompt = PromptSession(
        message=lambda: batch.prompt_of(executor, PROMPT), multiline=Condition(unfinished),
        prompt_continuation=CONTINUATION,
        history=hist if hist is not None else history(), completer=completer,
        complete_while_typing=True, lexer=sql_lexer(), bottom_toolbar=toolbar,
        enable_history_search=False)
    holder.append(prompt)
    executor.say(banner(state, db_path))
    while True:
        try:
            text = prompt.prompt()
        except Terminated:
            raise               # SIGTERM: the shell ends (status from the error table)
        except KeyboardInterrupt:
            continue            # Ctrl-C at the prompt: clear the line
        except EOFError:
            break               # Ctrl-D
        if not text.strip():
            continue
        try:
            if executor.submit(text) is False:
                break
        except Terminated:
            raise
        except KeyboardInterrupt:
            executor.note("interrupted")
    batch.finish(executor, interactive=True)
    return 0

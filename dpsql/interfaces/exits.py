"""How the command-line interfaces (``dpsql``, ``dpsql shell``) end: one line, one status.

Every failure prints exactly one line on stderr (``error: ...``, ``cancelled: ...``), never
a traceback, and exits with the status :data:`dpsql.errors.ERROR_TABLE` assigns to its
class. Command-line mistakes found by argparse become :class:`~dpsql.errors.UsageError`
(64) instead of argparse's own multi-line message and status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
import threading
from typing import Callable

from dpsql.request.declared import CONNECTION_SETTINGS
from dpsql.store.interrupts import interrupts_restored
from dpsql.errors import (EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, InputFileError, RequestCancelled,
                          Terminated, UsageError, exit_status, exit_statuses_text, one_line,
                          read_input_file)


class Parser(argparse.ArgumentParser):
    """argparse, but a malformed command line raises :class:`UsageError` (status 64) with
    one line naming the problem and where the help is."""

    def error(self, message: str):
        raise UsageError(f"{message}; see `{self.prog} --help`")


def read_script(path: str) -> str:
    """A script file's text, or standard input's for ``-``: not UTF-8, missing, a directory
    or unreadable is an :class:`InputFileError` (66); a UTF-8 byte order mark is dropped."""
    if path != "-":
        return read_input_file(path, "script")
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:                     # a text stream (tests, embedding)
        text = sys.stdin.read()
    else:
        try:
            text = stream.read().decode("utf-8")
        except UnicodeDecodeError:
            raise InputFileError("standard input is not UTF-8 text; save the script as "
                                 "UTF-8") from None
    return text[1:] if text.startswith("\ufeff") else text


def epilog() -> str:
    """The exit-status section of ``--help``, generated from the error table."""
    return ("exit status (one line `error: ...` on stderr, never a traceback):\n"
            + exit_statuses_text())


def report(error: BaseException, err=None) -> int:
    """Print ``error`` as one line on ``err`` (stderr) and return its exit status."""
    print(f"error: {one_line(error)}", file=err or sys.stderr, flush=True)
    return exit_status(error)


def guarded(fn: Callable[[], int], err=None) -> int:
    """Run an interface's body; every way it can end becomes one line and a status.
    SIGTERM cancels like Ctrl-C (:func:`sigterm_cancels`) and exits with the status the
    error table gives :class:`~dpsql.errors.Terminated`."""
    err = err or sys.stderr
    terminated: list = []
    try:
        with sigterm_cancels(terminated), interrupts_restored():
            return fn()
    except KeyboardInterrupt as exc:
        detail = " ".join(str(exc).split())   # a script's interruption says what was released
        print(f"cancelled: {detail}" if detail else "cancelled", file=err, flush=True)
        if terminated or _by_sigterm(exc):
            return exit_status(Terminated)
        return EXIT_INTERRUPTED
    except BrokenPipeError:     # e.g. `dpsql ledger DB | head`: the reader went away
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return EXIT_BROKEN_PIPE
    except Exception as exc:    # DpsqlError: its row; anything else: an internal failure
        status = report(exc, err)
        if terminated and isinstance(exc, RequestCancelled):   # SIGTERM, seen as a cancel
            return exit_status(Terminated)                     # (e.g. inside a statement)
        return status


@contextlib.contextmanager
def sigterm_cancels(seen: list):
    """While the block runs (main thread), SIGTERM raises :class:`Terminated` (a
    ``KeyboardInterrupt``): a request in planning is cancelled with nothing charged, one
    past its charge completes first (the release path holds SIGTERM there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        seen.append(signum)
        raise Terminated("terminated (SIGTERM)")

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _by_sigterm(exc: BaseException | None) -> bool:
    """Whether SIGTERM caused ``exc`` (or an exception it wraps)."""
    while exc is not None:
        if isinstance(exc, Terminated) or getattr(exc, "signum", None) == signal.SIGTERM:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def lock_notice(stream=None):
    """The ``on_lock_wait`` of the command-line interfaces: while another process holds the
    database, one line per second on stderr naming the holder (its pid, when DuckDB says)
    and the seconds left of the wait, e.g. ``database locked by pid 4242 (python3);
    waiting up to 28 s more (--lock-timeout), Ctrl-C cancels``."""
    def notice(holder, remaining) -> None:
        out = stream or sys.stderr
        if remaining is None:
            return
        clear = "\r\x1b[K" if out.isatty() else ""     # over the shell's spinner line
        who = holder or "another process"
        print(f"{clear}database locked by {who}; waiting up to {math.ceil(remaining)} s more "
              f"({CONNECTION_SETTINGS['lock_timeout'].flag}), Ctrl-C cancels", file=out,
              flush=True)
    return notice

"""How the command-line interfaces (``dpsql``, ``dpsql shell``) end: one line, one status.

Every failure prints exactly one line on stderr (``error: ...``, ``cancelled: ...``), never
a traceback, and exits with the status :data:`dpsql.errors.ERROR_TABLE` assigns to its
class. Command-line mistakes found by argparse become :class:`~dpsql.errors.UsageError`
(64) instead of argparse's own multi-line message and status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from dpsql.errors import (EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, InputFileError, UsageError,
                          exit_status, exit_statuses_text, one_line, read_input_file)


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
    """Run an interface's body; every way it can end becomes one line and a status."""
    err = err or sys.stderr
    try:
        return fn()
    except KeyboardInterrupt as exc:
        detail = " ".join(str(exc).split())   # a script's interruption says what was released
        print(f"cancelled: {detail}" if detail else "cancelled", file=err, flush=True)
        return EXIT_INTERRUPTED
    except BrokenPipeError:     # e.g. `dpsql ledger DB | head`: the reader went away
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return EXIT_BROKEN_PIPE
    except Exception as exc:    # DpsqlError: its row; anything else: an internal failure
        return report(exc, err)

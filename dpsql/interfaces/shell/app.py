"""``dpsql shell DB``: arguments, then a batch (``-e``, ``-f``, piped input) or the REPL.

    dpsql shell DB [--epsilon E | --target-rmse R | --max-stderr S] [--delta D]
                   [--strategy S] [--model dp|metric] [--nonnegative] [--integer]
                   [--no-reuse] [--confirm] [--confirm-share X] [-e SQL]... [-f FILE]...
                   [--csv] [--spark-master URL | --spark-remote sc://HOST:PORT]

Each ``-e`` string and each ``-f`` file is one submission (its SQL is ONE workload), run in
the order given; the first error stops the batch with the exit status
:data:`dpsql.errors.ERROR_TABLE` assigns to it (``dpsql shell --help`` lists them).
"""

from __future__ import annotations

import argparse
import os
import sys

from dpsql.errors import InputFileError
from dpsql.interfaces.exits import Parser, epilog, guarded, lock_notice, read_script
from dpsql.request.declared import CONNECTION_SETTINGS, PLANNING_LIMITS, given, settings_for
from dpsql.workload import limits as planning


class _Batch(argparse.Action):
    """-e and -f append to one list, so they run in the order given."""

    def __call__(self, parser, namespace, values, option_string=None):
        items = list(getattr(namespace, self.dest) or [])
        items.append((option_string, values))
        setattr(namespace, self.dest, items)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="dpsql shell",
        description="Interactive shell answering SQL COUNT workloads under differential "
                    "privacy. Statements entered together are answered as one workload.",
        epilog=epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("db", metavar="DB", help="DuckDB database with protected tables")
    p.add_argument("-e", dest="batch", action=_Batch, metavar="SQL",
                   help="run SQL (one workload; a line starting with \\ is a meta-command) "
                        "and exit; repeatable")
    p.add_argument("-f", dest="batch", action=_Batch, metavar="FILE",
                   help="run a SQL file (- for standard input) as one workload and exit; "
                        "repeatable")
    p.add_argument("--csv", action="store_true", help="print results as CSV")
    for setting in settings_for("shell") + settings_for("shell", CONNECTION_SETTINGS):
        p.add_argument(setting.flag, **setting.argparse_options())
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``dpsql shell``; returns the exit status (0 ok, else the error table's
    status for the first error, 130 Ctrl-C)."""
    argv = sys.argv[1:] if argv is None else argv
    return guarded(lambda: _main(build_parser().parse_args(argv)))


def _main(args) -> int:
    from dpsql.session import connect
    from dpsql.interfaces.shell import batch as blocks
    from dpsql.interfaces.shell.completer import DpsqlCompleter
    from dpsql.interfaces.shell.executor import Executor
    from dpsql.interfaces.shell.settings import ShellState

    settings = given(args, "shell")
    opening = given(args, "shell", CONNECTION_SETTINGS)   # lock_timeout, spark_*
    limits = {k: opening.pop(k) for k in PLANNING_LIMITS if k in opening}
    if not os.path.exists(args.db):
        raise InputFileError(f"database {args.db!r} does not exist; check the path (`dpsql "
                             "demo --db PATH` builds a demo database)")
    if os.path.isdir(args.db):
        raise InputFileError(f"database {args.db!r} is a directory; give the path of a "
                             "DuckDB database file")
    batch = list(args.batch or [])
    interactive = not batch and sys.stdin.isatty()
    if not batch and not interactive:
        batch = [("-f", "-")]          # piped input: one workload, like -f -
    with connect(args.db, on_lock_wait=lock_notice(), **opening) as session, \
            planning.applied(**limits):
        state = ShellState(session, interactive=interactive, **settings)
        state.refresh()
        if interactive:
            from dpsql.interfaces.shell import repl
            ex = Executor(state, sys.stdout, sys.stderr, repl.confirm,
                          csv_output=args.csv, show_progress=True)
            return repl.run(ex, DpsqlCompleter(lambda: state.policies), args.db)
        ex = Executor(state, sys.stdout, sys.stderr, _batch_confirm, csv_output=args.csv,
                      show_progress=sys.stderr.isatty(), stop_on_error=True)
        for option, value in batch:
            text = value if option == "-e" else read_script(value)
            keep_going = ex.submit(text)
            if ex.failed:
                return ex.status
            if keep_going is False:
                break
        blocks.finish(ex, interactive=False)      # an unclosed block: an error, as in scripts
    return ex.status


def _batch_confirm(reason: str) -> bool:
    """Batch mode asks on a terminal; without one it refuses (nothing is spent; the
    executor adds how to spend without asking)."""
    from dpsql.interfaces.shell.executor import NoTerminal

    if sys.stdin.isatty():
        print(f"{reason}. Spend it? [y/N] ", end="", file=sys.stderr, flush=True)
        return sys.stdin.readline().strip().lower() in ("y", "yes")
    raise NoTerminal(f"{reason}; there is no terminal to confirm on, so nothing was spent")

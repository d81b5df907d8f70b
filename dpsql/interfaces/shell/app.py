"""``dpsql shell DB``: arguments, then a batch (``-e``, ``-f``, piped input) or the REPL.

    dpsql shell DB [--epsilon E | --target-rmse R | --max-stderr S] [--delta D]
                   [--strategy S] [--model dp|metric] [--nonnegative] [--integer]
                   [--no-reuse] [--confirm] [--confirm-share X] [-e SQL]... [-f FILE]...
                   [--csv]

Each ``-e`` string and each ``-f`` file is one submission (its SQL is ONE workload), run in
the order given; the first error stops the batch with the exit status
:data:`dpsql.errors.ERROR_TABLE` assigns to it (``dpsql shell --help`` lists them).
"""

from __future__ import annotations

import argparse
import os
import sys

from dpsql.errors import InputFileError
from dpsql.interfaces.exits import Parser, epilog, guarded, read_script
from dpsql.interfaces.shell.settings import (DEFAULT_CONFIRM_SHARE, parse_delta, parse_epsilon, parse_model,
                       parse_share, parse_strategy, parse_target)


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
    p.add_argument("--epsilon", help="epsilon each submission spends (no default)")
    p.add_argument("--delta", help="delta each submission spends (no default; 0 asks for "
                                   "pure epsilon-DP)")
    p.add_argument("--strategy", default="auto",
                   help="auto (default: the lowest expected error), a strategy name, or a "
                        "spec with options such as 'eigen(principal_vectors=32)' or "
                        "'mwem(rounds=20)' (mwem needs delta 0)")
    p.add_argument("--model", default="dp",
                   help="dp (default: differential privacy) or metric (d_X privacy under "
                        "the table's declared metric: epsilon per unit distance, delta 0)")
    p.add_argument("--target-rmse", metavar="R",
                   help="ask by accuracy instead of --epsilon: each submission spends the "
                        "smallest epsilon whose expected RMSE is at most R, shown first and "
                        "spent only once confirmed")
    p.add_argument("--max-stderr", metavar="S",
                   help="ask by accuracy: the smallest epsilon giving every answer a standard "
                        "error of at most S (as --target-rmse)")
    p.add_argument("--confirm", action="store_true",
                   help="spend the epsilon an accuracy target needs without asking (needed "
                        "to spend by accuracy without a terminal)")
    p.add_argument("--nonnegative", action="store_true",
                   help="answers from non-negative least squares (post-processing, no "
                        "privacy cost)")
    p.add_argument("--integer", action="store_true",
                   help="round the answers to integers (post-processing, no privacy cost)")
    p.add_argument("--no-reuse", dest="reuse", action="store_false",
                   help="measure every query afresh (\\set reuse off); by default answers "
                        "come from past releases wherever they are at least as accurate, at "
                        "no privacy cost")
    p.add_argument("--confirm-share", default=None, metavar="SHARE",
                   help="ask before spending more than this share of the remaining epsilon "
                        "(default 0.25; 25%% works too; 1 never asks)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``dpsql shell``; returns the exit status (0 ok, else the error table's
    status for the first error, 130 Ctrl-C)."""
    argv = sys.argv[1:] if argv is None else argv
    return guarded(lambda: _main(build_parser().parse_args(argv)))


def _main(args) -> int:
    from dpsql.session import connect
    from dpsql.interfaces.shell.completer import DpsqlCompleter
    from dpsql.interfaces.shell.executor import Executor
    from dpsql.interfaces.shell.settings import ShellState

    epsilon = parse_epsilon(args.epsilon) if args.epsilon is not None else None
    delta = parse_delta(args.delta) if args.delta is not None else None
    strategy = parse_strategy(args.strategy)
    model = parse_model(args.model)
    share = (parse_share(args.confirm_share) if args.confirm_share is not None
             else DEFAULT_CONFIRM_SHARE)
    targets = {k: parse_target(v, k) for k, v in (("target_rmse", args.target_rmse),
                                                  ("max_stderr", args.max_stderr))
               if v is not None}
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
    with connect(args.db) as session:
        state = ShellState(session, epsilon=epsilon, delta=delta, strategy=strategy,
                           model=model, confirm_share=share, interactive=interactive,
                           nonnegative=args.nonnegative, integer=args.integer,
                           confirm=args.confirm, reuse=args.reuse, **targets)
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
    return 0


def _batch_confirm(reason: str) -> bool:
    """Batch mode asks on a terminal; without one it refuses (nothing is spent; the
    executor adds how to spend without asking)."""
    from dpsql.interfaces.shell.executor import NoTerminal

    if sys.stdin.isatty():
        print(f"{reason}. Spend it? [y/N] ", end="", file=sys.stderr, flush=True)
        return sys.stdin.readline().strip().lower() in ("y", "yes")
    raise NoTerminal(f"{reason}; there is no terminal to confirm on, so nothing was spent")

"""The ``dpsql`` command line.

    dpsql --version
    dpsql demo [--db PATH]
    dpsql shell DB [-e SQL] [-f FILE] [--csv] [--epsilon E] [--delta D]
    dpsql protect DB POLICY.toml [--table T] [--replace] [--lock-timeout SECONDS]
                                 [--spark-master URL | --spark-remote sc://HOST:PORT]
    dpsql run DB SCRIPT.sql [--epsilon E | --target-rmse R | --max-stderr S] [--delta D]
                            [--strategy S] [--calibration C] [--model dp|metric]
                            [--confirm] [--nonnegative] [--integer] [--no-reuse]
                            [--release NAME] [--replace] [--dry-run]
                            [--csv [DIR] | --json | --quiet]
    dpsql explain DB SCRIPT.sql [same options]      (= run --dry-run)
    dpsql budget DB [--json] [--lock-timeout SECONDS]
    dpsql ledger DB [--json] [--lock-timeout SECONDS]
    dpsql serve DB [--port 5433] [--users USERS.toml]     (docs/server.md)
    dpsql user add|passwd|remove USERS.toml NAME

Every command that opens a database takes ``--spark-master URL`` or ``--spark-remote
sc://HOST:PORT`` for the tables whose policy names a Spark source (docs/spark.md); the
session is started only when such a table is read or protected.

``run`` answers a reporting script workload by workload (see :mod:`dpsql.interfaces.scripts` and
docs/scripts.md); the privacy options are defaults that the script's ``SET dpsql.*``
statements override, ``--release`` overrides ``SET dpsql.release``.

Exit status: 0 success; otherwise the status :data:`dpsql.errors.ERROR_TABLE` assigns to the
error's class (64 usage, 65 bad SQL / settings / policy, 66 input file, 69 database
unavailable, 70 internal, 75 database busy, 77 budget exhausted; ``dpsql --help`` lists
them), with one line on stderr and never a traceback; 130 interrupted (Ctrl-C). On success
nothing is written to stderr.

The parser, the help texts and the argument errors are built from light modules only (the
settings' declaration, the error table): each subcommand imports what it runs (the
release path, the shell, the server) in its handler, so ``dpsql --help``, ``dpsql
--version``, ``dpsql SUB --help`` and a usage error load neither numpy, scipy, DuckDB nor
sqlglot (``tests/interfaces/test_cli_startup.py``, ``benchmarks/startup.py``).
"""

from __future__ import annotations

import argparse
import sys

from dpsql.errors import (DpsqlError, RequestCancelled, Terminated,
                          check_database_path)
from dpsql.interfaces.exits import Parser, epilog, guarded, lock_notice, read_script
from dpsql.request.declared import (CONNECTION_SETTINGS, PLANNING_LIMITS, SPARK_SETTINGS, given,
                                    settings_for)
from dpsql.workload import limits as planning


def _privacy_args(p: argparse.ArgumentParser) -> None:
    """One option per setting the declaration exposes to the command line
    (:data:`dpsql.request.declared.SETTINGS`); values are parsed after argparse, with the declared
    parsers, so a bad one is one line on stderr like every other refusal."""
    for setting in settings_for("cli"):
        p.add_argument(setting.flag, **setting.argparse_options())
    _connection_args(p)


#: the connection settings of a subcommand that only opens the database (no planning)
OPENING = ("lock_timeout",) + SPARK_SETTINGS


def _connection_args(p: argparse.ArgumentParser, names: tuple | None = None) -> None:
    """The connection settings the declaration exposes to the command line
    (:data:`dpsql.request.declared.CONNECTION_SETTINGS`; only ``names`` when given)."""
    for setting in settings_for("cli", CONNECTION_SETTINGS):
        if names is None or setting.name in names:
            p.add_argument(setting.flag, **setting.argparse_options())


def _open(args):
    """The session on ``args.db``: while another process holds the file, a countdown on
    stderr, and :class:`~dpsql.errors.LockTimeoutError` after ``--lock-timeout``."""
    from dpsql.session import connect

    opening = {k: v for k, v in given(args, "cli", CONNECTION_SETTINGS).items()
               if k in OPENING}
    return connect(args.db, on_lock_wait=lock_notice(), **opening)


def _defaults(args) -> dict:
    """The command line's settings, parsed (unset ones are left to the script)."""
    return given(args, "cli")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="dpsql", description="Differentially private answers to SQL COUNT workloads.",
        epilog=epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_Version, help="print dpsql's version and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="build a demo database from the Adult census data and "
                                    "answer a batch")
    d.add_argument("--db", help="where to create the demo database (default: a temp dir)")

    p = sub.add_parser("protect", help="declare public domains and budgets from a TOML policy")
    p.add_argument("db")
    p.add_argument("policy")
    p.add_argument("--table", help="protect only this table of the policy")
    p.add_argument("--replace", action="store_true", help="replace an existing policy")
    _connection_args(p, OPENING)

    _script_commands(sub)
    for name, helptext in (("budget", "spent and remaining budget per protected table"),
                           ("ledger", "every release charged to the database")):
        b = sub.add_parser(name, help=helptext)
        b.add_argument("db")
        _connection_args(b, OPENING)
        b.add_argument("--json", action="store_true",
                       help=f"one JSON document on stdout (for jobs): the {name}, exact "
                            "budgets as fractions next to floats")
    sh = sub.add_parser("shell", help="interactive shell (dpsql shell DB --help)",
                        add_help=False)
    sh.add_argument("argv", nargs=argparse.REMAINDER)
    from dpsql.interfaces.server import cli as server_cli   # serve, user: docs/server.md
    server_cli.add_subcommands(sub)
    return parser


def _script_commands(sub) -> None:
    """``run`` and ``explain``: a script, the settings the declaration exposes, outputs."""
    for name, helptext in (("run", "answer a SQL reporting script, workload by workload "
                                   "(spends budget)"),
                           ("explain", "expected errors of a script's workloads (run "
                                       "--dry-run): reads no data, spends nothing")):
        r = sub.add_parser(name, help=helptext, description=helptext + ". The settings "
                           "are defaults that the script's SET dpsql.<name> statements "
                           "override; --release overrides SET dpsql.release.")
        r.add_argument("db")
        r.add_argument("script", help="SQL file, or - for standard input")
        _privacy_args(r)
        r.add_argument("--replace", action="store_true",
                       help="overwrite existing result tables named by CREATE TABLE")
        if name == "run":
            r.add_argument("--dry-run", action="store_true",
                           help="check everything and show the expected errors; reads no "
                                "data, spends nothing")
        out = r.add_mutually_exclusive_group()
        out.add_argument("--csv", nargs="?", const="-", metavar="DIR",
                         help="results as CSV: with DIR, one file per result table "
                              "(DIR/<table>.csv; a dry run: DIR/plan.csv); alone, CSV "
                              "blocks on stdout, one per result table")
        out.add_argument("--json", action="store_true",
                         help="one JSON document on stdout (for jobs): every workload's "
                              "release, cost, answers with standard errors and intervals, "
                              "and the budget left")
        out.add_argument("--quiet", action="store_true",
                         help="print only a one-line summary per workload")


class _Version(argparse.Action):
    """``--version`` where :func:`main` does not answer it first (``dpsql --vers``): the
    text is read from the installed packages' metadata only when asked for, not each time
    the parser is built (``dpsql --help``)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())           # on stdout, as argparse's "version" action
        parser.exit()


def version_text() -> str:
    """``dpsql --version``: dpsql's version and those of the libraries its answers rest on."""
    from importlib.metadata import PackageNotFoundError, version

    from dpsql import __version__

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"
    return (f"dpsql {__version__} (duckdb {of('duckdb')}, sqlglot {of('sqlglot')}, "
            f"opendp {of('opendp')})")


def _require_db(path: str) -> None:
    """The command line never creates a database (only ``dpsql demo`` does)."""
    check_database_path(path, False, "`dpsql demo --db PATH` builds a demo database")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``dpsql``; returns the exit status (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["--version"], ["-V"]):
        print(version_text())
        return 0
    if argv[:1] == ["shell"]:  # the shell parses its own options (including --help)
        from dpsql.interfaces import shell

        return shell.main(argv[1:])
    return guarded(lambda: _dispatch(build_parser().parse_args(argv)))


def _dispatch(args) -> int:
    if args.command == "shell":
        from dpsql.interfaces import shell

        return shell.main(args.argv)
    if args.command == "demo":
        from dpsql.interfaces.demo import demo

        return demo(args.db)
    if args.command in ("serve", "user"):
        from dpsql.interfaces.server import cli as server_cli

        return server_cli.run(args)
    if args.command == "protect":
        from dpsql.policy.policy import load_policy

        _require_db(args.db)
        declared = load_policy(args.policy)     # the whole file checked before any write
        tables = [args.table] if args.table else list(declared)
        with _open(args) as db:
            for t in tables:
                tp = db.protect(t, args.policy, replace=args.replace)
                print(f"protected {tp.table}: epsilon={float(tp.epsilon):g} "
                      f"delta={float(tp.delta):g}, {len(tp.columns)} columns")
        return 0
    if args.command in ("run", "explain"):
        return _script(args, dry_run=args.command == "explain" or args.dry_run)
    if args.command in ("budget", "ledger"):
        from dpsql.interfaces.output import budget_json, budget_table, ledger_json, ledger_table

        _require_db(args.db)
        with _open(args) as db:
            read = db.budget() if args.command == "budget" else db.ledger()
        show = {"budget": (budget_json, budget_table),
                "ledger": (ledger_json, ledger_table)}[args.command]
        print(show[0](read) if args.json else show[1](read))
        return 0
    raise DpsqlError(f"unknown command {args.command!r}")


def _script(args, *, dry_run: bool) -> int:
    """``run`` / ``explain``: check the whole script, then release it workload by workload."""
    from dpsql.interfaces.output import ScriptOutput, csv_directory
    from dpsql.interfaces.scripts import parse_script, run_script
    from dpsql.interfaces.scripts_check import check_script

    _require_db(args.db)
    if args.csv not in (None, "-"):
        csv_directory(args.csv)          # before anything is read or spent
    defaults = _defaults(args)
    text = read_script(args.script)
    limits = {k: v for k, v in given(args, "cli", CONNECTION_SETTINGS).items()
              if k in PLANNING_LIMITS}                   # the others are _open's
    with _open(args) as db, planning.applied(**limits):
        # the database's tables tell reads of result tables from workloads
        script = parse_script(text, db.table_names(), **defaults)
        out = ScriptOutput(args, len(script.workloads))
        try:        # plans every workload (the long part): a cancel here charged nothing
            plan = check_script(db, script, replace=args.replace)
        except KeyboardInterrupt as exc:
            stopped = Terminated if isinstance(exc, Terminated) else RequestCancelled
            raise stopped("while checking the script, before any release; nothing was "
                          "charged") from None
        if dry_run:
            out.plan(plan)
        if plan.budget_error is not None:
            raise plan.budget_error
        if dry_run:   # a dry run is how one learns what an unconfirmed target would spend
            out.finish(db, {i.explanation.table for i in plan.items}, dry_run=True)
            return 0
        if plan.confirm_error is not None:
            raise plan.confirm_error
        outcomes = run_script(db, plan, replace=args.replace, on_outcome=out.outcome,
                              on_read=out.read)
        out.finish(db, {o.release.table for o in outcomes}, dry_run=False)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

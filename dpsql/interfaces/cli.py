"""The ``dpsql`` command line.

    dpsql demo [--db PATH]
    dpsql shell DB [-e SQL] [-f FILE] [--csv] [--epsilon E] [--delta D]
    dpsql protect DB POLICY.toml [--table T] [--replace]
    dpsql run DB SCRIPT.sql [--epsilon E | --target-rmse R | --max-stderr S] [--delta D]
                            [--strategy S] [--calibration C] [--model dp|metric]
                            [--confirm] [--nonnegative] [--integer] [--no-reuse]
                            [--release NAME] [--replace] [--dry-run] [--csv | --quiet]
    dpsql explain DB SCRIPT.sql [same options]      (= run --dry-run)
    dpsql budget DB
    dpsql ledger DB
    dpsql serve DB [--port 5433] [--users USERS.toml]     (docs/server.md)
    dpsql user add|passwd|remove USERS.toml NAME

``run`` answers a reporting script workload by workload (see :mod:`dpsql.interfaces.scripts` and
docs/scripts.md); the privacy options are defaults that the script's ``SET dpsql.*``
statements override, ``--release`` overrides ``SET dpsql.release``.

Exit status: 0 success; otherwise the status :data:`dpsql.errors.ERROR_TABLE` assigns to the
error's class (64 usage, 65 bad SQL / settings / policy, 66 input file, 69 database
unavailable, 70 internal, 75 database busy, 77 budget exhausted; ``dpsql --help`` lists
them), with one line on stderr and never a traceback; 130 interrupted (Ctrl-C). On success
nothing is written to stderr.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import tempfile
from importlib import resources

from dpsql.errors import DpsqlError, InputFileError, RequestCancelled, Terminated
from dpsql.interfaces.exits import Parser, epilog, guarded, lock_notice, read_script
from dpsql.request import CONNECTION_SETTINGS, given, settings_for
from dpsql.workload import limits as planning
from dpsql.store.results import format_table


def _privacy_args(p: argparse.ArgumentParser) -> None:
    """One option per setting the declaration exposes to the command line
    (:data:`dpsql.request.SETTINGS`); values are parsed after argparse, with the declared
    parsers, so a bad one is one line on stderr like every other refusal."""
    for setting in settings_for("cli") + settings_for("cli", CONNECTION_SETTINGS):
        p.add_argument(setting.flag, **setting.argparse_options())


def _defaults(args) -> dict:
    """The command line's settings, parsed (unset ones are left to the script)."""
    return given(args, "cli")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="dpsql", description="Differentially private answers to SQL COUNT workloads.",
        epilog=epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="build a demo database from the Adult census data and "
                                    "answer a batch")
    d.add_argument("--db", help="where to create the demo database (default: a temp dir)")

    p = sub.add_parser("protect", help="declare public domains and budgets from a TOML policy")
    p.add_argument("db")
    p.add_argument("policy")
    p.add_argument("--table", help="protect only this table of the policy")
    p.add_argument("--replace", action="store_true", help="replace an existing policy")

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
        out.add_argument("--csv", action="store_true",
                         help="results as CSV on stdout (one block per result table)")
        out.add_argument("--quiet", action="store_true",
                         help="print only a one-line summary per workload")

    b = sub.add_parser("budget", help="spent and remaining budget per protected table")
    b.add_argument("db")
    sh = sub.add_parser("shell", help="interactive shell (dpsql shell DB --help)",
                        add_help=False)
    sh.add_argument("argv", nargs=argparse.REMAINDER)
    lg = sub.add_parser("ledger", help="every release charged to the database")
    lg.add_argument("db")
    from dpsql.interfaces.server import cli as server_cli   # serve, user: docs/server.md
    server_cli.add_subcommands(sub)
    return parser


BUDGET_COLUMNS = ("table", "eps_spent", "eps_limit", "eps_left", "delta_spent", "delta_limit",
                  "delta_left")
METRIC_COLUMNS = ("metric_eps_spent", "metric_eps_limit", "metric_eps_left")
_METRIC_KEYS = ("metric_epsilon_spent", "metric_epsilon_limit", "metric_epsilon_remaining")


def _budget_rows(budgets: dict) -> list:
    metric = any("metric_epsilon_limit" in b for b in budgets.values())
    rows = []
    for t, b in sorted(budgets.items()):
        row = (t, float(b["epsilon_spent"]), float(b["epsilon_limit"]),
               float(b["epsilon_remaining"]), float(b["delta_spent"]), float(b["delta_limit"]),
               float(b["delta_remaining"]))
        if metric:
            row += tuple(float(b[k]) if k in b else None for k in _METRIC_KEYS)
        rows.append(row)
    return rows


def budget_table(budgets: dict, title: str | None = None) -> str:
    """The budget per table; metric (d_X) budget columns when a table declares a metric
    (epsilon per unit distance; NULL for tables without one)."""
    metric = any("metric_epsilon_limit" in b for b in budgets.values())
    return format_table(BUDGET_COLUMNS + (METRIC_COLUMNS if metric else ()),
                        _budget_rows(budgets), title=title)


def _rmse(value) -> str:
    """An expected RMSE for display: ``n/a`` when there is none (MWEM: data-dependent)."""
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.4g}"


def release_text(release) -> str:
    """A release as printed: ``expected RMSE=n/a`` when the error is data-dependent."""
    return str(release).replace("expected RMSE=nan", "expected RMSE=n/a")


def _require_db(path: str) -> None:
    if not os.path.exists(path):
        raise InputFileError(f"database {path!r} does not exist; check the path (`dpsql "
                             "demo --db PATH` builds a demo database)")
    if os.path.isdir(path):
        raise InputFileError(f"database {path!r} is a directory; give the path of a DuckDB "
                             "database file")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``dpsql``; returns the exit status (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["shell"]:  # the shell parses its own options (including --help)
        from dpsql.interfaces import shell

        return shell.main(argv[1:])
    return guarded(lambda: _dispatch(build_parser().parse_args(argv)))


def _dispatch(args) -> int:
    from dpsql.session import connect

    if args.command == "shell":
        from dpsql.interfaces import shell

        return shell.main(args.argv)
    if args.command == "demo":
        return demo(args.db)
    if args.command in ("serve", "user"):
        from dpsql.interfaces.server import cli as server_cli

        return server_cli.run(args)
    if args.command == "protect":
        from dpsql.policy.policy import load_policy

        _require_db(args.db)
        declared = load_policy(args.policy)     # the whole file checked before any write
        tables = [args.table] if args.table else list(declared)
        with connect(args.db, on_lock_wait=lock_notice()) as db:
            for t in tables:
                tp = db.protect(t, args.policy, replace=args.replace)
                print(f"protected {tp.table}: epsilon={float(tp.epsilon):g} "
                      f"delta={float(tp.delta):g}, {len(tp.columns)} columns")
        return 0
    if args.command in ("run", "explain"):
        return _script(args, dry_run=args.command == "explain" or args.dry_run)
    if args.command == "budget":
        _require_db(args.db)
        with connect(args.db, on_lock_wait=lock_notice()) as db:
            print(budget_table(db.budget()))
        return 0
    if args.command == "ledger":
        _require_db(args.db)
        with connect(args.db, on_lock_wait=lock_notice()) as db:
            rows = db.ledger()
        cols = ("release_id", "release_name", "created_at", "table_name", "epsilon", "delta",
                "mechanism", "strategy", "n_queries", "result_tables", "private", "status")
        if any(r.get("metric_epsilon") is not None for r in rows):
            cols = cols[:6] + ("metric_epsilon",) + cols[6:]
        print(format_table(cols, [tuple(str(r[c]) if c in ("created_at", "result_tables")
                                        else r[c] for c in cols) for r in rows]))
        return 0
    raise DpsqlError(f"unknown command {args.command!r}")


def _script(args, *, dry_run: bool) -> int:
    """``run`` / ``explain``: check the whole script, then release it workload by workload."""
    from dpsql.interfaces.scripts import check_script, parse_script, run_script
    from dpsql.session import connect

    _require_db(args.db)
    defaults = _defaults(args)
    script = parse_script(read_script(args.script), **defaults)
    out = _ScriptOutput(args, len(script.workloads))
    limits = given(args, "cli", CONNECTION_SETTINGS)     # max_memory, time_limit, lock_timeout
    lock = limits.pop("lock_timeout", CONNECTION_SETTINGS["lock_timeout"].default)
    with connect(args.db, lock_timeout=lock, on_lock_wait=lock_notice()) as db, \
            planning.applied(**limits):
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
            return 0
        if plan.confirm_error is not None:
            raise plan.confirm_error
        outcomes = run_script(db, plan, replace=args.replace, on_outcome=out.outcome)
        if not (args.csv or args.quiet):
            tables = sorted({o.release.table for o in outcomes})
            print()
            print(budget_table({t: db.budget(t) for t in tables}, title="budget"))
    return 0


def _cost(eps, dlt, model: str = "dp") -> str:
    if model == "metric":
        return f"metric epsilon={float(eps):g} (per unit distance)"
    return f"epsilon={float(eps):g}, delta={float(dlt):g}"


def _csv_number(value):
    """NaN (no sigma or expected RMSE: MWEM, d_X) as an empty CSV field."""
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value


class _ScriptOutput:
    """What ``run`` prints: text (default), ``--quiet`` (one line per workload) or ``--csv``."""

    def __init__(self, args, n_workloads: int):
        self.csv = csv.writer(sys.stdout, lineterminator="\n") if args.csv else None
        self.quiet = args.quiet
        self.n = n_workloads
        self.blocks = 0

    def _head(self, w) -> str:
        where = "" if self.quiet else f" ({w.lines})"
        return f"workload {w.number}/{self.n}{where} {w.name!r}"

    def _block(self, header) -> None:
        if self.blocks:
            print()
        self.blocks += 1
        self.csv.writerow(header)

    def plan(self, plan) -> None:
        from dpsql.interfaces.scripts import target_text

        if self.csv is not None:
            self._block(("workload", "lines", "release", "status", "table", "epsilon", "delta",
                         "strategy", "sigma", "expected_rmse", "n_queries", "n_cells",
                         "model"))
        for item in plan.items:
            w, e, rec = item.workload, item.explanation, item.recorded
            cost = _cost(item.epsilon, item.delta, w.model)
            if w.target is not None:
                cost += (f" (the smallest epsilon for {target_text(w)}"
                         + ("" if w.confirm else "; a run needs SET dpsql.confirm = true")
                         + ")")
            if self.csv is not None:
                status = "recorded" if rec is not None else "free" if item.free else "new"
                self.csv.writerow((w.number, w.lines, w.name, status, e.table,
                                   float(item.epsilon), float(item.delta), e.strategy,
                                   _csv_number(e.sigma), _csv_number(e.rmse), e.n_queries,
                                   e.n_cells, w.model))
            elif rec is not None:
                print(f"{self._head(w)}: already released as release {rec['release_id']}; "
                      "nothing would be charged")
            elif item.free:
                print(f"{self._head(w)}: past releases answer it; nothing would be charged"
                      + (f" (strategy reuse, expected RMSE {_rmse(e.rmse)})" if self.quiet
                         else f"\n{e}\n"))
            elif self.quiet:
                print(f"{self._head(w)}: would charge {cost} on {e.table}; strategy "
                      f"{e.strategy}, expected RMSE {_rmse(e.rmse)}")
            else:
                print(f"{self._head(w)}: would charge {cost}\n{e}\n")
        if self.csv is None and not self.quiet:
            totals = [f"{t} {_cost(c.epsilon, c.delta)} of the remaining "
                      f"{_cost(plan.remaining[t].epsilon, plan.remaining[t].delta)}"
                      for t, c in plan.to_charge.items()]
            totals += [f"{t} {_cost(eps, 0, 'metric')} of the remaining "
                       f"{_cost(plan.remaining_metric[t], 0, 'metric')}"
                       if plan.remaining_metric.get(t) is not None else
                       f"{t} {_cost(eps, 0, 'metric')}"
                       for t, eps in plan.to_charge_metric.items()]
            print("dry run: nothing was read or spent; a run would charge "
                  + ("; ".join(totals) or "nothing"))

    def outcome(self, o) -> None:
        w, r = o.workload, o.release
        if self.csv is not None:
            for t in r.results:
                self._block(("release", "table") + tuple(t.columns))
                for row in t.rows:
                    self.csv.writerow((w.name, t.name) + tuple("" if v is None else v
                                                               for v in row))
            sys.stdout.flush()
            return
        if r.reused:
            what = f"already released as release {r.release_id}, nothing charged"
        elif r.strategy == "reuse":
            what = (f"answered from past releases as release {r.release_id} on {r.table}, "
                    "nothing charged")
        else:
            what = f"released as release {r.release_id} on {r.table}"
        if self.quiet:
            cost = ("" if r.reused or r.strategy == "reuse" else
                    f" ({_cost(r.epsilon, r.delta, w.model)}, strategy {r.strategy})")
            print(f"{self._head(w)}: {what}{cost}; tables: {', '.join(r.tables)}", flush=True)
        else:
            print(("\n" if self.blocks else "") + f"{self._head(w)}: {what}\n"
                  f"{release_text(r)}", flush=True)
            self.blocks += 1


def demo(path: str | None = None) -> int:
    """Build a demo database from the shipped Adult extract, explain and answer a batch."""
    from dpsql.store.database import Database, engine_errors
    from dpsql.session import connect

    data = resources.files("dpsql") / "data"
    csv = str(data / "adult.csv.gz")
    policy = str(data / "adult_policy.toml")
    sql = (data / "demo.sql").read_text(encoding="utf-8")
    if path is None:
        path = os.path.join(tempfile.mkdtemp(prefix="dpsql-demo-"), "demo.duckdb")
    if os.path.exists(path):
        raise DpsqlError(f"{path!r} already exists; the demo builds a new database: give "
                         "--db a new path")
    print(f"dpsql demo: loading the UCI Adult census extract into {path}")
    owner = Database(path)
    with owner.connect(owner=True) as con, engine_errors("loading the demo data"):
        con.execute("CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true)", [csv])
    with connect(path) as db:
        db.protect("adult", policy)
        print("protected table 'adult' (budget epsilon=2, delta=1e-5), declared domains from "
              "the data set's documentation\n")
        print("The batch, answered as one workload:\n")
        print("\n".join("    " + line for line in sql.strip().splitlines()))
        print()
        explanation = db.explain(sql, epsilon=0.5, delta=1e-6)
        print("explain (no data read, nothing spent):")
        print(explanation)
        print()
        release = db.answer(sql, epsilon=0.5, delta=1e-6)
        print(release_text(release))
        print()
        print(budget_table(db.budget(), title="budget"))
        print(f"\nResult tables are plain DuckDB tables in {path}: e.g.\n"
              f"    duckdb {path} \"SELECT * FROM demo_income\"")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

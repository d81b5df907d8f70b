"""The ``dpsql`` command line.

    dpsql demo [--db PATH]
    dpsql protect DB POLICY.toml [--table T] [--replace]
    dpsql explain DB SCRIPT.sql --epsilon E --delta D [--strategy S]
    dpsql run DB SCRIPT.sql --epsilon E --delta D [--strategy S] [--calibration C]
    dpsql budget DB
    dpsql ledger DB

Errors print as one line on stderr (exit status 2), never as a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import tomllib
from importlib import resources

from .errors import DpsqlError
from .results import format_table


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _read_script(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    if not os.path.isfile(path):
        raise DpsqlError(f"script {path!r} does not exist")
    with open(path, encoding="utf-8") as f:
        return f.read()


def _privacy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epsilon", type=_number, required=True, help="epsilon to spend")
    p.add_argument("--delta", type=_number, required=True, help="delta to spend (> 0)")
    p.add_argument("--strategy", default="auto", help="auto (default), identity or workload")
    p.add_argument("--calibration", default="analytic", choices=["analytic", "classic"],
                   help="Gaussian calibration (classic only for epsilon < 1)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpsql", description="Differentially private answers to SQL COUNT workloads.")
    sub = parser.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="build a demo database from the Adult census data and "
                                    "answer a batch")
    d.add_argument("--db", help="where to create the demo database (default: a temp dir)")

    p = sub.add_parser("protect", help="declare public domains and budgets from a TOML policy")
    p.add_argument("db")
    p.add_argument("policy")
    p.add_argument("--table", help="protect only this table of the policy")
    p.add_argument("--replace", action="store_true", help="replace an existing policy")

    for name, helptext in (("run", "answer a SQL script as one workload (spends budget)"),
                           ("explain", "expected error of a script; reads no data, spends "
                                       "nothing")):
        r = sub.add_parser(name, help=helptext)
        r.add_argument("db")
        r.add_argument("script", help="SQL file, or - for standard input")
        _privacy_args(r)
        if name == "run":
            r.add_argument("--replace", action="store_true",
                           help="overwrite existing result tables named by CREATE TABLE")

    b = sub.add_parser("budget", help="spent and remaining budget per protected table")
    b.add_argument("db")
    lg = sub.add_parser("ledger", help="every release charged to the database")
    lg.add_argument("db")
    return parser


def _budget_rows(budgets: dict) -> list:
    return [(t, float(b["epsilon_spent"]), float(b["epsilon_limit"]),
             float(b["epsilon_remaining"]), float(b["delta_spent"]), float(b["delta_limit"]),
             float(b["delta_remaining"])) for t, b in sorted(budgets.items())]


BUDGET_COLUMNS = ("table", "eps_spent", "eps_limit", "eps_left", "delta_spent", "delta_limit",
                  "delta_left")


def _require_db(path: str) -> None:
    if not os.path.exists(path):
        raise DpsqlError(f"database {path!r} does not exist")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except DpsqlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("cancelled", file=sys.stderr)
        return 130


def _dispatch(args) -> int:
    from .session import connect

    if args.command == "demo":
        return demo(args.db)
    if args.command == "protect":
        _require_db(args.db)
        with open(args.policy, "rb") as f:
            try:
                doc = tomllib.load(f)
            except tomllib.TOMLDecodeError as exc:
                raise DpsqlError(f"policy file {args.policy!r} is not valid TOML: {exc}") from None
        tables = [args.table] if args.table else list(doc.get("tables", {}))
        if not tables:
            raise DpsqlError("the policy declares no [tables.<name>] section")
        with connect(args.db) as db:
            for t in tables:
                tp = db.protect(t, args.policy, replace=args.replace)
                print(f"protected {tp.table}: epsilon={float(tp.epsilon):g} "
                      f"delta={float(tp.delta):g}, {len(tp.columns)} columns")
        return 0
    if args.command in ("run", "explain"):
        _require_db(args.db)
        sql = _read_script(args.script)
        with connect(args.db) as db:
            if args.command == "explain":
                print(db.explain(sql, epsilon=args.epsilon, delta=args.delta,
                                 strategy=args.strategy, calibration=args.calibration))
                return 0
            release = db.answer(sql, epsilon=args.epsilon, delta=args.delta,
                                strategy=args.strategy, calibration=args.calibration,
                                replace=args.replace)
            print(release)
            print()
            print(format_table(BUDGET_COLUMNS, _budget_rows({release.table:
                                                             db.budget(release.table)}),
                               title="budget"))
        return 0
    if args.command == "budget":
        _require_db(args.db)
        with connect(args.db) as db:
            print(format_table(BUDGET_COLUMNS, _budget_rows(db.budget())))
        return 0
    if args.command == "ledger":
        _require_db(args.db)
        with connect(args.db) as db:
            rows = db.ledger()
        cols = ("release_id", "created_at", "table_name", "epsilon", "delta", "strategy",
                "n_queries", "result_tables", "private", "status")
        print(format_table(cols, [tuple(str(r[c]) if c in ("created_at", "result_tables")
                                        else r[c] for c in cols) for r in rows]))
        return 0
    raise DpsqlError(f"unknown command {args.command!r}")


def demo(path: str | None = None) -> int:
    """Build a demo database from the shipped Adult extract, explain and answer a batch."""
    from .engine import Database, engine_errors
    from .session import connect

    data = resources.files("dpsql") / "data"
    csv = str(data / "adult.csv.gz")
    policy = str(data / "adult_policy.toml")
    sql = (data / "demo.sql").read_text(encoding="utf-8")
    if path is None:
        path = os.path.join(tempfile.mkdtemp(prefix="dpsql-demo-"), "demo.duckdb")
    if os.path.exists(path):
        raise DpsqlError(f"{path!r} already exists; the demo builds a new database")
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
        print(release)
        print()
        print(format_table(BUDGET_COLUMNS, _budget_rows(db.budget()), title="budget"))
        print(f"\nResult tables are plain DuckDB tables in {path}: e.g.\n"
              f"    duckdb {path} \"SELECT * FROM demo_income\"")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

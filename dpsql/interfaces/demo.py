"""``dpsql demo``: build a database from the shipped Adult extract, explain and answer a batch.

Without ``--db`` the database lives in a temporary directory that is removed when the demo
ends, however it ends; with ``--db PATH`` the file is kept (and removed again if the demo
fails before finishing, so a retry with the same path works). The commands it suggests
afterwards are ones that exist here: ``dpsql shell``, ``dpsql budget``, ``dpsql ledger`` and
DuckDB's Python module (a dependency); there is no ``duckdb`` command-line program.
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from importlib import resources

from dpsql.errors import DpsqlError
from dpsql.interfaces.output import budget_table, release_text

#: what the demo spends of the demo policy's budget (epsilon=2, delta=1e-5)
EPSILON, DELTA = 0.5, 1e-6


def demo(path: str | None = None) -> int:
    """Run the demo; keep the database only when ``path`` is given."""
    if path is None:
        with tempfile.TemporaryDirectory(prefix="dpsql-demo-") as tmp:
            _build_and_answer(os.path.join(tmp, "demo.duckdb"))
        print("\nThe demo database was temporary and has been removed. To keep one and "
              "continue from it:\n" + _next_steps("census.duckdb", built=False))
        return 0
    if os.path.exists(path):
        raise DpsqlError(f"{path!r} already exists; the demo builds a new database: give "
                         "--db a new path")
    try:
        _build_and_answer(path)
    except BaseException:
        for leftover in (path, path + ".wal"):      # what this run created, nothing else
            if os.path.isfile(leftover):
                os.remove(leftover)
        raise
    print("\nThe result tables are plain DuckDB tables in " + path + ". Next:\n"
          + _next_steps(path, built=True))
    return 0


def _next_steps(path: str, *, built: bool) -> str:
    db = shlex.quote(path)
    query = shlex.quote("SELECT sex, COUNT(*) FROM adult GROUP BY sex;")
    read = shlex.quote(f"import duckdb; print(duckdb.connect({path!r}, read_only=True)"
                       ".sql('SELECT * FROM demo_income'))")
    steps = [] if built else [f"dpsql demo --db {db}"]
    steps += [f"dpsql shell {db}                      # interactive: \\help, \\budget",
              f"dpsql shell {db} --epsilon 0.1 --delta 1e-6 -e {query}",
              f"dpsql budget {db}", f"dpsql ledger {db}",
              f"{shlex.quote(sys.executable)} -c {read}"]
    return "\n".join("    " + s for s in steps)


def _build_and_answer(path: str) -> None:
    from dpsql.session import connect
    from dpsql.store.database import Database, engine_errors

    data = resources.files("dpsql") / "data"
    csv = str(data / "adult.csv.gz")
    policy = str(data / "adult_policy.toml")
    sql = (data / "demo.sql").read_text(encoding="utf-8")
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
        print("explain (no data read, nothing spent):")
        print(db.explain(sql, epsilon=EPSILON, delta=DELTA))
        print()
        print(release_text(db.answer(sql, epsilon=EPSILON, delta=DELTA)))
        print()
        print(budget_table(db.budget(), title="budget"))

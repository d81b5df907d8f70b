"""Managing a privacy budget with dpsql: python examples/budget_management.py

Builds its own database from the shipped Adult extract (budget epsilon=2, delta=1e-5) and
shows: checking the budget, explaining before spending, a refused over-budget request
(nothing charged), named releases that return their recorded answers, reading the ledger,
and a reporting script run twice from Python.
"""

import os
import tempfile
from importlib import resources

import duckdb

import dpsql
from dpsql.interfaces import scripts

data = resources.files("dpsql") / "data"
path = os.path.join(tempfile.mkdtemp(), "census.duckdb")
with duckdb.connect(path) as con:
    con.execute("CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true)",
                [str(data / "adult.csv.gz")])
db = dpsql.connect(path)
db.protect("adult", str(data / "adult_policy.toml"))


def show_budget(when: str) -> None:
    b = db.budget("adult")  # exact Fractions; float() only for display
    print(f"{when}: spent epsilon={float(b['epsilon_spent']):g} of "
          f"{float(b['epsilon_limit']):g}, delta={float(b['delta_spent']):g} of "
          f"{float(b['delta_limit']):g}; remaining epsilon="
          f"{float(b['epsilon_remaining']):g}, delta={float(b['delta_remaining']):g}")


def check(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"unexpected: {what}")


show_budget("1. fresh database")

# 2. Explain is free: compare a few epsilons by expected error before spending anything.
sql = """
CREATE TABLE income_by_sex AS SELECT sex, income, COUNT(*) AS people FROM adult
GROUP BY CUBE (sex, income);
SELECT COUNT(*) AS seniors FROM adult WHERE age >= 65;
"""
for eps in (0.1, 0.25, 0.5):
    e = db.explain(sql, epsilon=eps, delta=1e-6)
    print(f"2. epsilon={eps}: strategy {e.strategy}, expected RMSE {e.rmse:.1f} per answer")
print(db.explain(sql, epsilon=0.25, delta=1e-6))
show_budget("   after explaining (nothing spent)")

# 3. A named release: charged once.
release = db.answer(sql, epsilon=0.25, delta=1e-6, name="income-2026-11")
print(f"\n3. {release}\n")
show_budget("   after the release")

# 4. The same name, SQL and parameters again: the recorded answers, no charge, no new noise.
again = db.answer(sql, epsilon=0.25, delta=1e-6, name="income-2026-11")
check(again.reused and again.results == release.results, "a named release was re-noised")
print(f"4. asked again: release {again.release_id}, reused={again.reused}")
show_budget("   unchanged")

# 5. The same name for a different batch is refused (nothing charged).
try:
    db.answer("SELECT COUNT(*) FROM adult WHERE age < 30", epsilon=0.25, delta=1e-6,
              name="income-2026-11")
except dpsql.DpsqlError as exc:
    print(f"5. refused: {exc}")

# 6. More than what is left: refused before any data is read; the ledger does not change.
left = db.budget("adult")["epsilon_remaining"]
rows_before = len(db.ledger())
try:
    db.answer("SELECT COUNT(*) FROM adult", epsilon=float(left) + 0.5, delta=1e-6)
except dpsql.BudgetExceededError as exc:
    print(f"6. refused: {exc}")
check(len(db.ledger()) == rows_before, "a refused request was charged")
show_budget("   still")

# 7. A reporting script from Python: two workloads, each its own ledger row; running it
#    again returns the recorded answers (see docs/scripts.md for the rules).
script = """
SET dpsql.release = 'weekly-2026-47';
SET dpsql.epsilon = 0.2;
SET dpsql.delta = 1e-6;
CREATE TABLE weekly_hours AS SELECT hours_per_week, COUNT(*) AS people FROM adult
GROUP BY hours_per_week;
SET dpsql.epsilon = 0.1;  -- a SET after queries starts workload 2
CREATE TABLE weekly_part_time AS SELECT COUNT(*) AS people FROM adult
WHERE hours_per_week < 35;
"""
plan = scripts.check_script(db, scripts.parse_script(script))  # a dry run: spends nothing
for item in plan.items:
    print(f"7. would release {item.workload.name!r}: epsilon={float(item.workload.epsilon):g},"
          f" expected RMSE {item.explanation.rmse:.1f}")
for run in (1, 2):
    for outcome in scripts.run(db, script):
        r = outcome.release
        print(f"   run {run}: {outcome.workload.name!r} -> release {r.release_id}"
              f"{' (recorded answers, nothing charged)' if r.reused else ''}")
show_budget("   after the script")

# 8. The ledger: one row per charge, readable from Python or with plain DuckDB.
print("\n8. ledger")
for row in db.ledger():
    print(f"   release {row['release_id']}: {row['release_name'] or '(unnamed)'} "
          f"epsilon={row['epsilon']:g} delta={row['delta']:g} strategy={row['strategy']} "
          f"status={row['status']} tables={list(row['result_tables'])}")
db.close()

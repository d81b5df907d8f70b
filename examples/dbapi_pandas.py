"""dpsql through its DB-API 2.0 driver and pandas: python examples/dbapi_pandas.py

Builds a demo database from the Adult extract shipped inside dpsql (in a temp dir), then
asks questions the PEP 249 way. Every execute / executemany / read_sql is ONE release,
charged to the privacy ledger with the connection's current epsilon and delta.
"""

import os
import tempfile
import warnings
from importlib import resources

import duckdb
import pandas as pd

import dpsql
from dpsql.interfaces import dbapi

# --- the data owner: load the table with plain DuckDB, declare its public domains + budget
path = os.path.join(tempfile.mkdtemp(prefix="dpsql-dbapi-"), "census.duckdb")
data = resources.files("dpsql") / "data"
with duckdb.connect(path) as con:
    con.execute("CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true)",
                [str(data / "adult.csv.gz")])
with dpsql.connect(path) as owner:
    owner.protect("adult", str(data / "adult_policy.toml"))   # budget: epsilon 2, delta 1e-5

# --- the analyst: a DB-API connection; each execute charges (epsilon, delta)
with dbapi.connect(path, epsilon=0.25, delta=1e-7) as conn:
    cur = conn.cursor()

    # qmark parameters are bound as SQL literals (never pasted into the text)
    cur.execute("SELECT sex, COUNT(*) AS people FROM adult "
                "WHERE age BETWEEN ? AND ? AND income = ? GROUP BY sex", (30, 49, ">50K"))
    print("columns:", [d[0] for d in cur.description])
    for sex, people, stderr, low, high in cur:
        print(f"  {sex:<7} {people:9.1f}  ± {stderr:.1f}  (95% CI {low:.1f} .. {high:.1f})")

    # executemany: every parameter set in ONE workload, ONE charge; nextset() walks them
    cur.executemany("SELECT COUNT(*) AS full_time FROM adult "
                    "WHERE hours_per_week >= 40 AND education = ?",
                    [("Bachelors",), ("Masters",), ("Doctorate",)])
    for degree in ("Bachelors", "Masters", "Doctorate"):
        count, stderr, _, _ = cur.fetchone()
        print(f"  full-time, {degree:<9} {count:9.1f}  ± {stderr:.1f}")
        cur.nextset()
    print(f"executemany was release {cur.release.release_id} "
          f"({len(cur.release.tables)} result tables, one ledger entry)")

    # several statements in one string: one workload, one result set each
    cur.execute("SELECT COUNT(*) FROM adult WHERE race = 'White'; "
                "SELECT race, COUNT(*) FROM adult GROUP BY race")
    print("white:", round(cur.fetchone()[0], 1))
    cur.nextset()
    print("by race:", {race: round(n, 1) for race, n, *_ in cur.fetchall()})

    # pandas: read_sql over the DB-API connection returns the noisy table
    conn.epsilon = 0.5          # the next release charges epsilon 0.5
    with warnings.catch_warnings():  # pandas warns that it only tests SQLAlchemy/sqlite3
        warnings.simplefilter("ignore", UserWarning)
        df = pd.read_sql("SELECT marital_status, COUNT(*) FROM adult WHERE sex = ? "
                         "GROUP BY marital_status", conn, params=("Female",))
    print(df.round(1).to_string(index=False))

    left = conn.session.budget("adult")
    print(f"budget left: epsilon {float(left['epsilon_remaining']):g}, "
          f"delta {float(left['delta_remaining']):g}")

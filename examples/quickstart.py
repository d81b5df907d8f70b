"""A first dpsql session on the shipped Adult extract: python examples/quickstart.py"""

import os
import tempfile
from importlib import resources

import duckdb

import dpsql

path = os.path.join(tempfile.mkdtemp(), "census.duckdb")
csv = str(resources.files("dpsql") / "data" / "adult.csv.gz")
policy = os.path.join(os.path.dirname(os.path.abspath(__file__)), "adult_policy.toml")

# The data owner loads the table with plain DuckDB and declares its policy.
with duckdb.connect(path) as con:
    con.execute("CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true)", [csv])
db = dpsql.connect(path)
db.protect("adult", policy)

# The analyst asks a batch: first the expected error (free), then the release (charged).
sql = """
SELECT education_num, COUNT(*) FROM adult WHERE income = '>50K' GROUP BY education_num;
SELECT COUNT(*) AS over_40h FROM adult WHERE hours_per_week >= 45;
"""
print(db.explain(sql, epsilon=0.5, delta=1e-6))
release = db.answer(sql, epsilon=0.5, delta=1e-6)
print(release)
print(db.budget("adult"))

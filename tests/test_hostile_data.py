"""Regressions from review: no row value and no request shape may give a free outcome.

Passing means: the release outcome (success, with a charge) does not depend on whether a
hostile row is present; refused requests leave the ledger and the table list untouched.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

import dpsql
from dpsql.engines import duckdb as data_engine
from dpsql.errors import UnsupportedQueryError
from dpsql.policy.policy import table_policy_from_spec

from .conftest import make_adult_db, snapshot

HOSTILE = {
    "DOUBLE": ["'NaN'", "'Infinity'", "'-Infinity'", "1e308", "-1e308", "2.7", "NULL"],
    "BIGINT": ["9223372036854775807", "-9223372036854775808", "NULL"],
    "VARCHAR": ["'nan'", "'inf'", "'-inf'", "'1e400'", "'abc'", "''", "'2.7'", "NULL"],
}

POLICY = {"epsilon": 100.0, "delta": 1e-3, "columns": {
    "i": {"type": "integer", "min": 0, "max": 100, "step": 5},
    "n": {"type": "numeric", "min": 0, "max": 10, "edges": [0, 5, 10]},
    "c": {"type": "categorical", "values": [1, 2, 3]},
}}
SQL = ("SELECT i, COUNT(*) FROM t GROUP BY i; SELECT n, COUNT(*) FROM t GROUP BY n; "
       "SELECT c, COUNT(*) FROM t GROUP BY c")


@pytest.mark.parametrize("sql_type, value", [(t, v) for t, vs in HOSTILE.items() for v in vs])
def test_any_value_is_counted_somewhere(tmp_path, sql_type, value):
    path = str(tmp_path / "h.duckdb")
    con = duckdb.connect(path)
    con.execute(f"CREATE TABLE t (i {sql_type}, n {sql_type}, c {sql_type})")
    con.execute(f"INSERT INTO t VALUES ({value}, {value}, {value})")
    con.close()
    db = dpsql.connect(path)
    db.protect("t", POLICY)
    policy = db.policies()["t"]
    from dpsql.sql.compile import compile_workload
    from dpsql.sql.parse import parse_batch
    w = compile_workload(parse_batch(SQL, lambda name, node: policy), policy)
    with db.db.connect() as c:
        cols = [(p.column, policy.column(p.column), p.unit_to_part) for p in w.partitions]
        x = data_engine.data_vector(c, "t", cols, w.n_cells)
    assert x.sum() == 1  # the one row lands in exactly one cell
    r = db.answer(SQL, epsilon=0.5, delta=1e-6)  # and a release simply succeeds
    assert len(r.tables) == 3 and len(db.ledger()) == 1


def test_integer_categories_on_a_double_column_are_not_rounded(tmp_path):
    path = str(tmp_path / "r.duckdb")
    con = duckdb.connect(path)
    con.execute("CREATE TABLE t AS SELECT * FROM (VALUES (2.7::DOUBLE), (3.0)) v(c)")
    con.close()
    policy = table_policy_from_spec("t", {"epsilon": 1, "delta": 1e-6, "columns": {
        "c": {"type": "categorical", "values": [1, 2, 3]}}})
    db = dpsql.connect(path)
    with db.db.connect() as c:
        x = data_engine.data_vector(c, "t", [("c", policy.column("c"), np.arange(4))], 4)
    assert list(x) == [0, 0, 1, 1]  # 3.0 is category 3; 2.7 is 'other', as `c = 3` says


@pytest.mark.parametrize("sql", [
    "SELECT sex AS stderr, COUNT(*) FROM adult GROUP BY sex",
    "SELECT COUNT(*) AS CI_LOW FROM adult",
    "SELECT sex, race, COUNT(*) AS grouping_id FROM adult GROUP BY CUBE(sex, race)",
    "SELECT sex, sex AS s2, COUNT(*) FROM adult GROUP BY sex",
    "SELECT sex AS n, COUNT(*) AS N FROM adult GROUP BY sex",
])
def test_output_name_collisions_are_refused_before_the_charge(adult_db, sql):
    before = snapshot(adult_db)
    with pytest.raises(UnsupportedQueryError):
        adult_db.answer(sql, epsilon=0.1, delta=1e-7)
    assert snapshot(adult_db) == before


def test_only_dpsql_result_tables_can_be_replaced(tmp_path):
    db = make_adult_db(str(tmp_path / "v.duckdb"))
    with db.db.connect(owner=True) as con:
        con.execute("CREATE TABLE owners_notes AS SELECT 42 AS x")
        con.execute("CREATE VIEW some_view AS SELECT 1 AS x")
    before = snapshot(db)
    for name in ("owners_notes", "some_view"):
        with pytest.raises(UnsupportedQueryError, match="not created by dpsql"):
            db.answer(f"CREATE OR REPLACE TABLE {name} AS SELECT COUNT(*) FROM adult",
                      epsilon=0.1, delta=1e-7)
        with pytest.raises(UnsupportedQueryError, match="not created by dpsql"):
            db.answer(f"CREATE TABLE {name} AS SELECT COUNT(*) FROM adult", epsilon=0.1,
                      delta=1e-7, replace=True)
    assert snapshot(db) == before
    with db.db.connect() as con:
        assert con.execute("SELECT x FROM owners_notes").fetchone() == (42,)


def test_deep_nesting_is_a_clear_error(adult_db):
    from dpsql.errors import ParseError
    sql = "SELECT COUNT(*) FROM adult WHERE " + "NOT " * 3000 + "age < 30"
    with pytest.raises(ParseError, match="nested too deeply"):
        adult_db.explain(sql, epsilon=1, delta=1e-6)

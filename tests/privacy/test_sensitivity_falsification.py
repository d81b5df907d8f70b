"""Sensitivity, falsified from both ends (items 10 and 11 of the adversarial suite): a
hostile row moves the data vector by one unit vector, and no add/remove neighbour moves
``A x`` by more than the plan claims. Helpers in ``hostile.py``."""

from __future__ import annotations

import dataclasses
import functools
import math
from fractions import Fraction

import duckdb
import numpy as np
import pytest
import scipy.sparse as sp

from dpsql.engines import duckdb as data_engine
from dpsql.policy.policy import table_policy_from_spec
from dpsql.sql.compile import compile_workload
from dpsql.sql.parse import parse_batch
from dpsql.strategies import REGISTRY, WorkloadInfo



# =========================================================================== item 10
# test_hostile_data.py puts each hostile value alone in a table and shows it lands in exactly
# one cell and that the release succeeds. Added: on a populated table, adding the hostile row
# once, three times, or removing it again moves the data vector by exactly one unit vector
# per row (the sensitivity argument), for more types.

HOSTILE_VALUES = {
    "DOUBLE": ["'NaN'", "'Infinity'", "'-Infinity'", "1e308", "-0.0", "5e-324", "2.7", "NULL"],
    "BIGINT": ["9223372036854775807", "-9223372036854775808", "NULL"],
    "HUGEINT": ["170141183460469231731687303715884105727"],
    "UBIGINT": ["18446744073709551615"],
    "DECIMAL(38, 0)": ["99999999999999999999999999999999999999"],
    "FLOAT": ["'NaN'", "'inf'"],
    "VARCHAR": ["'nan'", "'-inf'", "'1e400'", "''", "'2.7'", "'x'", "' 3 '", "NULL",
                "repeat('9', 10000)"],
    "BOOLEAN": ["true"],
    "DATE": ["'2024-02-29'"],
}
SMALL_POLICY = table_policy_from_spec("t", {"epsilon": 1, "delta": 1e-6, "columns": {
    "i": {"type": "integer", "min": 0, "max": 100, "step": 5},
    "n": {"type": "numeric", "min": 0, "max": 10, "edges": [0, 5, 10]},
    "c": {"type": "categorical", "values": [1, 2, 3]},
    "s": {"type": "categorical", "values": ["x", "y"], "nullable": True},
}})
SMALL_BATCH = ("SELECT i, COUNT(*) FROM t GROUP BY i; SELECT n, c, COUNT(*) FROM t GROUP BY n, c;"
               " SELECT s, COUNT(*) FROM t WHERE i >= 50 GROUP BY s")


@functools.lru_cache(maxsize=1)
def _small_workload():
    w = compile_workload(parse_batch(SMALL_BATCH, lambda name, node: SMALL_POLICY), SMALL_POLICY)
    cols = [(p.column, SMALL_POLICY.column(p.column), p.unit_to_part) for p in w.partitions]
    return cols, w.n_cells


def _small_vector(con):
    cols, n_cells = _small_workload()
    return data_engine.data_vector(con, "t", cols, n_cells)


@pytest.mark.parametrize("sql_type, value", [(t, v) for t, vs in HOSTILE_VALUES.items()
                                             for v in vs])
def test_a_hostile_row_moves_one_cell_by_one(sql_type, value):
    """Passing: x(T + r) - x(T) is one unit vector e_j, x(T + 3r) - x(T) = 3 e_j (duplicates
    count once each, in the same cell), and removing r again gives x(T) back."""
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t (i {sql_type}, n {sql_type}, c {sql_type}, s {sql_type})")
    base_value = {"VARCHAR": "'7'", "BOOLEAN": "false", "DATE": "'2000-01-01'"}.get(
        sql_type, "3")
    con.execute(f"INSERT INTO t SELECT {base_value}, {base_value}, {base_value}, {base_value} "
                f"FROM range(5)")
    x0 = _small_vector(con)
    con.execute(f"INSERT INTO t VALUES ({value}, {value}, {value}, {value})")
    x1 = _small_vector(con)
    diff = x1 - x0
    assert sorted(diff[diff != 0].tolist()) == [1.0], diff
    con.execute("INSERT INTO t SELECT * FROM t WHERE rowid = 5 UNION ALL "
                "SELECT * FROM t WHERE rowid = 5")
    assert np.array_equal(_small_vector(con) - x0, 3 * diff)
    con.execute("DELETE FROM t WHERE rowid >= 5")
    assert np.array_equal(_small_vector(con), x0)
    con.close()


# =========================================================================== item 11
# Sensitivity falsification: for every strategy and small workloads, every add/remove
# neighbour of a real data vector moves A x by at most the plan's claimed sensitivity.
# (Item 10 shows any one row moves x by one unit vector, so neighbours are x ± e_j.)

FALSIFY_POLICY = table_policy_from_spec("f", {"epsilon": 1, "delta": 1e-6, "columns": {
    "a": {"type": "integer", "min": 0, "max": 7},
    "b": {"type": "categorical", "values": ["x", "y", "z"], "nullable": True},
    "h": {"type": "numeric", "min": 0, "max": 10, "edges": [0, 5, 10]},
}})
FALSIFY_BATCHES = {
    "ranges": "SELECT COUNT(*) FROM f WHERE a < 3; SELECT COUNT(*) FROM f WHERE a BETWEEN 2 "
              "AND 6; SELECT a, COUNT(*) FROM f GROUP BY a",
    "marginals": "SELECT b, h, COUNT(*) FROM f GROUP BY b, h; SELECT COUNT(*) FROM f WHERE "
                 "b = 'x' OR h >= 5; SELECT h, COUNT(*) FROM f GROUP BY h",
    "cube": "SELECT a, b, COUNT(*) FROM f WHERE a <= 3 GROUP BY CUBE(a, b)",
    "one": "SELECT COUNT(*) FROM f WHERE b IS NULL",
}


def sensitivity_violations(plan, x) -> list[str]:
    """Every add/remove-one-row neighbour x' = x ± e_j of ``x``: exact ||A(x - x')||_2 and _1
    against the plan's claims (A x is exact on the 2**-20 grid, so are the differences)."""
    problems = []
    claimed_l2 = Fraction(plan.sensitivity) ** 2
    claimed_l1 = Fraction(plan.l1_sensitivity) if math.isfinite(plan.l1_sensitivity) else None
    y = plan.measure(x)
    for j in range(x.size):
        for sign in (1, -1):
            if sign < 0 and x[j] < 1:
                continue                      # no row to remove from an empty cell
            neighbour = x.copy()
            neighbour[j] += sign
            diff = [Fraction(v) for v in (y - plan.measure(neighbour)).tolist()]
            l2 = sum(d * d for d in diff)
            if l2 > claimed_l2:
                problems.append(f"cell {j}: ||A(x-x')||_2^2 = {float(l2)} > "
                                f"{float(claimed_l2)}")
            if claimed_l1 is not None and sum(abs(d) for d in diff) > claimed_l1:
                problems.append(f"cell {j}: ||A(x-x')||_1 > {float(claimed_l1)}")
    return problems


def _falsify_table():
    con = duckdb.connect()
    rng = np.random.default_rng(11)   # test data only
    rows = [(int(rng.integers(-2, 10)), str(rng.choice(["x", "y", "z", "w"])),
             float(rng.uniform(-1, 12))) for _ in range(40)]
    con.execute("CREATE TABLE f (a BIGINT, b VARCHAR, h DOUBLE)")
    con.executemany("INSERT INTO f VALUES (?, ?, ?)", rows)
    con.execute("INSERT INTO f VALUES (NULL, NULL, NULL)")
    return con


@pytest.fixture(scope="module")
def falsify_cases():
    con = _falsify_table()
    cases = {}
    for name, sql in FALSIFY_BATCHES.items():
        w = compile_workload(parse_batch(sql, lambda n, node: FALSIFY_POLICY), FALSIFY_POLICY)
        cols = [(p.column, FALSIFY_POLICY.column(p.column), p.unit_to_part)
                for p in w.partitions]
        x = data_engine.data_vector(con, "f", cols, w.n_cells)
        assert x.sum() == 41
        cases[name] = (WorkloadInfo.from_matrix(w.W, w.shape), x)
    con.close()
    return cases


@pytest.mark.parametrize("strategy", sorted(REGISTRY))
def test_no_neighbour_exceeds_the_claimed_sensitivity(falsify_cases, strategy):
    """Passing: on every workload the strategy supports (at least one), no neighbour moves A x
    by more than plan.sensitivity (L2) or plan.l1_sensitivity (L1); and the same check catches
    mutants: the sensitivity halved, the L1 sensitivity halved, one column of A doubled."""
    from dpsql.errors import StrategyError

    checked = 0
    for name, (info, x) in falsify_cases.items():
        if strategy == "coa" and name in ("cube", "marginals"):
            continue                          # seconds of optimisation each, same code path
        try:
            plan = REGISTRY[strategy].plan(info)
        except StrategyError:
            continue
        assert sensitivity_violations(plan, x) == [], (strategy, name)
        assert sensitivity_violations(dataclasses.replace(
            plan, sensitivity=plan.sensitivity / 2), x)
        if math.isfinite(plan.l1_sensitivity):
            assert sensitivity_violations(dataclasses.replace(
                plan, l1_sensitivity=plan.l1_sensitivity / 2), x)
        A = np.eye(plan.n) if plan.A is None else (
            plan.A.toarray() if sp.issparse(plan.A) else np.array(plan.A))
        A[:, int(np.argmax((A ** 2).sum(axis=0)))] *= 2
        assert sensitivity_violations(dataclasses.replace(plan, A=A), x)
        checked += 1
    assert checked >= 1, f"{strategy} supports none of the test workloads"


def test_plans_chosen_by_the_pipeline_pass_the_same_check(mem):
    """Passing: the plans explain() actually compares for a batch on the Adult policy (from
    the strategy cache when cached) pass the falsification check on the Adult data vector."""
    sql = ("SELECT race, sex, COUNT(*) FROM adult WHERE age < 30 GROUP BY race, sex; "
           "SELECT COUNT(*) FROM adult WHERE hours_per_week >= 40")
    db = mem.session
    e = db.explain(sql, epsilon=1, delta=1e-6)
    policy = db.policies()["adult"]
    w = compile_workload(parse_batch(sql, lambda n, node: policy), policy)
    with db.db.connect() as con:
        cols = [(p.column, policy.column(p.column), p.unit_to_part) for p in w.partitions]
        x = data_engine.data_vector(con, "adult", cols, w.n_cells)
    plans = [c.plan for c in e.candidates if c.plan is not None]
    assert len(plans) >= 4
    for plan in plans:
        assert sensitivity_violations(plan, x) == [], plan.strategy

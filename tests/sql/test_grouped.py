"""The compile's steps 1 and 3 shape by shape (dpsql.sql.grouped, dpsql.sql.cells) equal the
statement-by-statement definitions on varied batches: the same partitions, W, outputs and
truth per unit, and the same first error."""

from __future__ import annotations

import numpy as np
import pytest

from dpsql.errors import UnsupportedQueryError
from dpsql.policy.policy import table_policy_from_spec
from dpsql.sql import cells, compile as compile_module, grouped
from dpsql.sql.compile import compile_parts, compile_workload, dense_workload
from dpsql.sql.parse import parse_batch

SPEC = {"epsilon": 1.0, "delta": 1e-6, "columns": {
    "x": {"type": "integer", "min": 0, "max": 99, "step": 1, "nullable": True},
    "y": {"type": "integer", "min": -20, "max": 39, "step": 5},
    "v": {"type": "numeric", "min": 0.0, "max": 10.0, "edges": [0.0, 2.5, 5.0, 7.5, 10.0],
          "nullable": True},
    "c": {"type": "categorical", "values": ["a", "b", "c", "d"], "nullable": True},
    "k": {"type": "categorical", "values": [1, 2, 3]},
    "z": {"type": "integer", "min": -3, "max": 12},
}}

VARIED = (
    [f"SELECT COUNT(*) FROM t WHERE x = {v}" for v in (0, 5, 5, 99, 17)]
    + [f"SELECT COUNT(*) FROM t WHERE x BETWEEN {a} AND {b}" for a, b in
       ((0, 9), (10, 10), (50, 20), (-5, 200), (3, 97))]
    + [f"SELECT COUNT(*) FROM t WHERE x {op} {v}" for op in ("<", "<=", ">", ">=", "<>")
       for v in (0, 42, 99, 150, -3)]
    + ["SELECT COUNT(*) FROM t WHERE x < 2.5", "SELECT COUNT(*) FROM t WHERE x >= 7.0",
       "SELECT COUNT(*) FROM t WHERE x IN (1, 2, 30)", "SELECT COUNT(*) FROM t WHERE x IN (4)",
       "SELECT COUNT(*) FROM t WHERE x NOT IN (1, 2, 30)",
       "SELECT COUNT(*) FROM t WHERE x IS NULL", "SELECT COUNT(*) FROM t WHERE x IS NOT NULL",
       "SELECT COUNT(*) FROM t WHERE NOT (x > 10 AND x < 20)",
       "SELECT COUNT(*) FROM t WHERE NOT (x > 11 AND x < 20)",
       "SELECT COUNT(*) FROM t WHERE x < 10 OR x > 90",
       "SELECT COUNT(*) FROM t WHERE (x < 10 OR c = 'a') AND y >= 0",
       "SELECT COUNT(*) FROM t WHERE (x < 12 OR c = 'b') AND y >= 5",
       "SELECT COUNT(*) FROM t WHERE NOT (x = 3 OR c <> 'd')",
       "SELECT COUNT(*) FROM t WHERE y BETWEEN -20 AND 4", "SELECT COUNT(*) FROM t WHERE y < 15",
       "SELECT COUNT(*) FROM t WHERE v >= 2.5 AND v < 7.5", "SELECT COUNT(*) FROM t WHERE v < 5",
       "SELECT COUNT(*) FROM t WHERE c IN ('a', 'c')", "SELECT COUNT(*) FROM t WHERE c <> 'a'",
       "SELECT COUNT(*) FROM t WHERE c NOT IN ('a', 'b')", "SELECT COUNT(*) FROM t WHERE k = 2",
       "SELECT COUNT(*) FROM t WHERE k <> 3", "SELECT COUNT(*) FROM t WHERE TRUE",
       "SELECT COUNT(*) FROM t WHERE FALSE", "SELECT COUNT(*) FROM t WHERE x = 3 AND TRUE",
       "SELECT COUNT(*) FROM t WHERE NOT (x = 4 OR FALSE)",
       "SELECT COUNT(*) FROM t", "SELECT COUNT(x) FROM t", "SELECT COUNT(v) FROM t WHERE x > 5",
       "SELECT c, COUNT(*) FROM t GROUP BY c", "SELECT c, COUNT(*) FROM t WHERE x > 50 GROUP BY c",
       "SELECT c, COUNT(*) FROM t WHERE x > 60 GROUP BY c",
       "SELECT c, k, COUNT(*) FROM t WHERE y < 10 GROUP BY CUBE (c, k)",
       "SELECT k, c, COUNT(x) FROM t WHERE x BETWEEN 5 AND 50 GROUP BY ROLLUP (k, c)",
       "SELECT y, COUNT(*) FROM t WHERE c = 'a' GROUP BY y",
       "CREATE TABLE r AS SELECT COUNT(*) FROM t WHERE x = 8",
       "SELECT COUNT(*) FROM t WHERE z BETWEEN -1 AND 7", "SELECT COUNT(*) FROM t WHERE z <> 3",
       "SELECT COUNT(*) FROM t WHERE z = 20 OR z < -2", "SELECT COUNT(*) FROM t WHERE z >= 12"]
)


def _policy():
    return table_policy_from_spec("t", dict(SPEC))


def _per_statement_rows(queries, policy, parts):
    where = cells._Cells(parts)
    rows, cols, outputs, m = [], [], [], 0
    for q in queries:
        r, c, out = cells.query_rows(q, policy, where, m)
        rows += r
        cols += c
        outputs.append(out)
        m = out.stop
    return rows, cols, outputs, m


def _both(monkeypatch, sql):
    policy = _policy()
    queries = parse_batch(sql, lambda name, node: policy)
    fast_parts = compile_parts(queries, policy)
    fast = dense_workload(queries, policy, fast_parts)
    with monkeypatch.context() as m:
        m.setattr(grouped, "conditions", lambda shapes, policy: None)
        m.setattr(compile_module, "statement_rows", _per_statement_rows)
        slow_parts = compile_parts(queries, policy)
        slow = dense_workload(queries, policy, slow_parts)
    return fast_parts, fast, slow_parts, slow


def _same(fast_parts, fast, slow_parts, slow):
    assert fast_parts.unit_truth.keys() == slow_parts.unit_truth.keys()
    for key, truth in slow_parts.unit_truth.items():
        assert np.array_equal(fast_parts.unit_truth[key], truth), key
        assert fast_parts.unit_truth[key].dtype == truth.dtype
    for a, b in zip(fast.partitions, slow.partitions, strict=True):
        assert (a.column, a.n_parts, a.part_units) == (b.column, b.n_parts, b.part_units)
        assert np.array_equal(a.unit_to_part, b.unit_to_part)
    assert fast.W.shape == slow.W.shape
    for name in ("indptr", "indices", "data"):
        assert np.array_equal(getattr(fast.W, name), getattr(slow.W, name)), name
    assert fast.outputs == slow.outputs
    assert compile_module.workload_hash(fast.W) == compile_module.workload_hash(slow.W)


def test_varied_batch_compiles_as_statement_by_statement(monkeypatch):
    _same(*_both(monkeypatch, VARIED))
    _same(*_both(monkeypatch, list(reversed(VARIED))))


def test_one_text_with_many_statements(monkeypatch):
    _same(*_both(monkeypatch, ";\n".join(VARIED)))


def test_points_and_ranges_in_chunks(monkeypatch):
    """More statements than one chunk holds: the chunks' rows line up."""
    rng = np.random.default_rng(7)
    ends = np.sort(rng.integers(0, 100, (300, 2)), axis=1)
    sql = ([f"SELECT COUNT(*) FROM t WHERE x = {v}" for v in range(100)]
           + [f"SELECT COUNT(*) FROM t WHERE x BETWEEN {a} AND {b}" for a, b in ends]
           + [f"SELECT c, COUNT(*) FROM t WHERE x < {b} GROUP BY c" for _, b in ends[:50]])
    monkeypatch.setattr(cells, "CHUNK_VALUES", 7 * 101)
    monkeypatch.setattr(grouped, "CHUNK_VALUES", 5 * 101)
    _same(*_both(monkeypatch, sql))


@pytest.mark.parametrize("bad", ["SELECT COUNT(*) FROM t WHERE y = 3",
                                 "SELECT COUNT(*) FROM t WHERE c = 'zz'",
                                 "SELECT COUNT(*) FROM t WHERE v < 3",
                                 "SELECT COUNT(*) FROM t WHERE k < 2"])
def test_the_first_error_is_the_statement_by_statement_one(monkeypatch, bad):
    policy = _policy()
    sql = VARIED[:10] + ["SELECT COUNT(*) FROM t WHERE y = 7", bad] + VARIED[10:]
    queries = parse_batch(sql, lambda name, node: policy)
    with pytest.raises(UnsupportedQueryError) as fast:
        compile_workload(queries, policy)
    monkeypatch.setattr(grouped, "conditions", lambda shapes, policy: None)
    with pytest.raises(UnsupportedQueryError) as slow:
        compile_workload(queries, policy)
    assert str(fast.value) == str(slow.value)
    assert "y" in str(fast.value) and "7" in str(fast.value)    # the first bad statement


def test_vectorised_compares_equal_compare():
    policy = _policy()
    for column, values in (("x", [-5, 0, 1, 50, 99, 100, 2 ** 62]),
                           ("y", [-20, -15, 0, 35, 39, 40, -25, 60]),
                           ("z", [-5, -3, 0, 12, 13, 2 ** 62, -2 ** 62])):
        dom = policy.column(column)
        for op in ("=", "<>", "<", "<=", ">", ">="):
            ok = []
            for v in values:
                try:
                    ok.append(dom.compare(op, v))
                except Exception:     # noqa: BLE001 — splits a unit: the batch is not vectorised
                    ok.append(None)
            many = dom.compare_many(op, values)
            if any(o is None for o in ok):
                assert many is None
            else:
                assert np.array_equal(many, np.stack(ok)) and many.dtype == np.int8
    dom = policy.column("c")
    for op in ("=", "<>"):
        assert np.array_equal(dom.compare_many(op, ["a", "d", "a"]),
                              np.stack([dom.compare(op, v) for v in ["a", "d", "a"]]))
    assert dom.compare_many("=", ["a", "zz"]) is None
    assert dom.compare_many("<", ["a"]) is None
    assert policy.column("k").compare_many("=", ["1"]) is None
    assert policy.column("x").compare_many("=", [True]) is None


def test_parts_that_are_units_and_sets_without_groups(monkeypatch):
    """Every unit of a column its own part (no gather of parts), statements with and
    without GROUP BY and COUNT(col) in one batch, in two orders."""
    sql = ([f"SELECT COUNT(*) FROM t WHERE z = {v}" for v in range(-3, 13)]
           + [f"SELECT COUNT(*) FROM t WHERE z BETWEEN {a} AND {a + 4}" for a in range(-5, 14)]
           + ["SELECT k, COUNT(*) FROM t WHERE z > 2 GROUP BY k",
              "SELECT COUNT(z) FROM t WHERE z <> 5", "SELECT k, COUNT(*) FROM t GROUP BY k",
              "SELECT z, COUNT(*) FROM t WHERE NOT z < 0 GROUP BY ROLLUP (z)"])
    for batch in (sql, list(reversed(sql))):
        fast_parts, fast, slow_parts, slow = _both(monkeypatch, batch)
        assert "z" in fast_parts.unit_parts and "k" in fast_parts.unit_parts
        _same(fast_parts, fast, slow_parts, slow)

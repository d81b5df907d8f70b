"""Quantiles (issue 20 item 3): the allow-list, the CDF counts a quantile adds to the batch,
and the post-processing (estimate, interval, empty groups) on exact and noisy counts.

DuckDB is the oracle of the counts (``W @ x`` against its own ``COUNT``s) and of the
quantiles (the rule on exact counts against ``quantile_disc`` / ``quantile_cont``).
"""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

from dpsql.errors import UnsupportedQueryError
from dpsql.inference.quantiles import quantiles
from dpsql.policy.policy import table_policy_from_spec
from dpsql.sql.compile import compile_workload
from dpsql.sql.expand import units_of
from dpsql.sql.implicit import compile_batch
from dpsql.sql.parse import parse_batch
from dpsql.workload.ordered import IntegerDomain, NumericDomain

POLICY = table_policy_from_spec("t", {
    "epsilon": 1, "delta": 1e-6,
    "columns": {
        "x": {"type": "integer", "min": 0, "max": 9, "nullable": True},
        "g": {"type": "categorical", "values": ["a", "b", "c"]},
        "h": {"type": "numeric", "min": 0, "max": 10, "edges": [0, 2, 5, 10]},
        "s": {"type": "integer", "min": 0, "max": 9, "step": 3},
    },
})


def parse(sql):
    return parse_batch(sql, lambda name, node: POLICY)


# --------------------------------------------------------------------------- allow-list


@pytest.mark.parametrize("sql,kind,q,name", [
    ("SELECT MEDIAN(x) FROM t", "cont", 0.5, "median"),
    ("SELECT QUANTILE_CONT(x, 0.9) FROM t", "cont", 0.9, "quantile_cont"),
    ("SELECT QUANTILE_DISC(h, 0.25) AS p25 FROM t", "disc", 0.25, "p25"),
    ("SELECT QUANTILE(x, 0.1) FROM t", "disc", 0.1, "quantile"),
    ("SELECT PERCENTILE_CONT(0.75) WITHIN GROUP (ORDER BY x) FROM t", "cont", 0.75,
     "percentile_cont"),
    ("SELECT g, PERCENTILE_DISC(0.5) WITHIN GROUP (ORDER BY x ASC) FROM t GROUP BY g",
     "disc", 0.5, "percentile_disc"),
])
def test_quantile_forms_parse(sql, kind, q, name):
    (query,) = parse(sql)
    assert (query.quantile.kind, float(query.quantile.q), query.count_name) == (kind, q, name)
    # scripts and the shell re-read sqlglot's DuckDB text of the statement (WITHIN GROUP
    # comes back as QUANTILE_CONT(x, q ORDER BY x)): the same quantile, the same name
    (again,) = parse(query.sql)
    assert (again.quantile, again.count_name) == (query.quantile, query.count_name)


@pytest.mark.parametrize("sql,words", [
    ("SELECT MEDIAN(g) FROM t", "MEDIAN over the categorical column 'g' is not supported"),
    ("SELECT QUANTILE_CONT(x, [0.1, 0.5]) FROM t", "a list of quantiles"),
    ("SELECT QUANTILE_CONT(x, 0) FROM t", "strictly between 0 and 1"),
    ("SELECT QUANTILE_DISC(x, 1) FROM t", "strictly between 0 and 1"),
    ("SELECT QUANTILE_CONT(x, 1.5) FROM t", "strictly between 0 and 1"),
    ("SELECT QUANTILE_CONT(x, 'a') FROM t", "strictly between 0 and 1"),
    ("SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY x DESC) FROM t", "write PERCENTILE_CONT(1 - q)"),
    ("SELECT MEDIAN(x + 1) FROM t", "this form of MEDIAN"),
    ("SELECT MEDIAN(x), COUNT(*) FROM t", "more than one aggregate"),
    ("SELECT MEDIAN(nope) FROM t", "column 'nope' is not declared"),
])
def test_quantile_refusals_name_the_reason(sql, words):
    with pytest.raises(UnsupportedQueryError) as info:
        parse(sql)
    assert words in str(info.value)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- the counts


def test_a_quantile_adds_prefix_suffix_and_total_counts_per_group():
    """MEDIAN(x) GROUP BY g: per group, x < e and x >= e at the 9 interior edges, and
    COUNT(x): 19 rows; a second quantile of the same column, condition and groups adds none."""
    queries = parse("SELECT g, MEDIAN(x) FROM t GROUP BY g; "
                    "SELECT g, QUANTILE_DISC(x, 0.9) FROM t GROUP BY g; "
                    "SELECT COUNT(*) FROM t")
    w = compile_workload(queries, POLICY)
    first, second, count = w.outputs
    assert first.rows.shape == (3, 19) and np.array_equal(first.rows, second.rows)
    assert w.n_queries == 3 * 19 + 1 and count.stop - count.start == 1
    assert first.keys == (("a",), ("b",), ("c",))


def _data(con):
    con.execute("CREATE TABLE t (x INTEGER, g VARCHAR, h DOUBLE, s INTEGER)")
    rng = np.random.default_rng(5)
    n = 600
    x = rng.binomial(9, 0.35, n).astype(object)
    x[rng.random(n) < 0.1] = None
    rows = list(zip(x.tolist(), rng.choice(["a", "b"], n).tolist(),   # no 'c': an empty group
                    rng.uniform(0, 10, n).round(2).tolist(), rng.integers(0, 10, n).tolist()))
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows)


def _exact_answers(con, w) -> np.ndarray:
    from dpsql.engines import duckdb as data_engine

    cols = [(p.column, POLICY.column(p.column), p.unit_to_part) for p in w.partitions]
    x = data_engine.data_vector(con, "t", cols, w.n_cells)
    return np.asarray(w.W @ x).reshape(-1)


def test_rule_on_exact_counts_matches_duckdb_within_one_unit():
    """On exact counts the DISC rule returns DuckDB's quantile_disc of an integer column
    exactly, CONT and numeric bins are within one unit of DuckDB's; the empty group is
    NULL; the interval (zero variance) is the estimate's unit."""
    con = duckdb.connect()
    _data(con)
    sql = ("SELECT g, QUANTILE_DISC(x, 0.3) FROM t GROUP BY g; "
           "SELECT g, MEDIAN(x) FROM t GROUP BY g; "
           "SELECT g, QUANTILE_CONT(h, 0.8) FROM t GROUP BY g; "
           "SELECT QUANTILE_DISC(s, 0.5) FROM t")
    w = compile_workload(parse(sql), POLICY)
    y = _exact_answers(con, w)
    zero = np.zeros_like(y)
    tables = [dict(zip([k[0] if k else None for k in o.keys],
                       zip(*[c[2] for c in o.columns(y, zero, zero, lambda s: "VARCHAR")[-4:]])))
              for o in w.outputs]
    exact = {r[0]: r[1:] for r in con.execute(
        "SELECT g, quantile_disc(x, 0.3), median(x), quantile_cont(h, 0.8) FROM t GROUP BY g"
    ).fetchall()}
    for g in ("a", "b"):
        assert tables[0][g][0] == exact[g][0]
        assert abs(tables[1][g][0] - exact[g][1]) <= 1
        bins = [0, 2, 5, 10]
        assert abs(np.searchsorted(bins, tables[2][g][0], "right")
                   - np.searchsorted(bins, exact[g][2], "right")) <= 1
        assert tables[0][g][2] == tables[0][g][3] == tables[0][g][0]   # interval = its unit
    assert tables[0]["c"] == (None, None, None, None)                    # empty group: NULL
    (s_exact,) = con.execute("SELECT quantile_disc(s, 0.5) FROM t").fetchone()
    assert tables[3][None][0] == s_exact - s_exact % 3                   # the step's first integer


def test_implicit_path_rows_equal_dense_rows():
    """A quantile batch compiled to Kronecker blocks answers the same counts as the dense W."""
    from dpsql.sql import implicit

    sql = "SELECT g, MEDIAN(x) FROM t GROUP BY g; SELECT g, QUANTILE_CONT(h, 0.5) FROM t GROUP BY g"
    queries = parse(sql)
    old = implicit.DENSE_MAX_CELLS
    implicit.DENSE_MAX_CELLS = 10
    try:
        blocks = compile_batch(queries, POLICY)
    finally:
        implicit.DENSE_MAX_CELLS = old
    dense = compile_workload(queries, POLICY)
    assert getattr(blocks, "implicit", False)
    con = duckdb.connect()
    _data(con)
    x_rows = _exact_answers(con, dense)
    for a, b in zip(blocks.outputs, dense.outputs):
        assert np.array_equal(a.rows, b.rows) and a.keys == b.keys
    # the blocks' own rows, summed from the dense data vector, equal the dense answers
    from dpsql.engines import duckdb as data_engine
    cols = [(p.column, POLICY.column(p.column), p.unit_to_part) for p in dense.partitions]
    x = data_engine.data_vector(con, "t", cols, dense.n_cells)
    per_block = [block.matvec(x) for block in blocks.union.blocks]
    assert np.allclose(blocks.assemble(per_block), x_rows)


# --------------------------------------------------------------------------- post-processing


def _noisy(F, U, N, sd, rng):
    return (F + rng.normal(0, sd, F.shape), U + rng.normal(0, sd, U.shape),
            N + rng.normal(0, sd, N.shape))


def test_monotone_fit_and_clipping_keep_the_estimate_inside_its_interval():
    units = units_of(IntegerDomain(0, 19))
    rng = np.random.default_rng(1)
    counts = rng.integers(0, 5, (50, 20)).astype(float)
    C = np.cumsum(counts, axis=1)
    F, N = C[:, :-1], C[:, -1]
    U = N[:, None] - F
    for kind in ("cont", "disc"):
        Fn, Un, Nn = _noisy(F, U, N, 4.0, rng)
        v = np.full(F.shape, 16.0)
        out = quantiles(Fn, Un, Nn, v, v, np.full(N.shape, 16.0), 0.5, kind, units)
        ok = ~np.isnan(out.value)
        assert np.all(out.ci_low[ok] <= out.value[ok]) and np.all(out.value[ok] <= out.ci_high[ok])
        assert np.all((out.value[ok] >= 0) & (out.value[ok] <= 19))


def test_empty_group_rule_reads_the_fitted_count():
    """NULL when the monotone fit's count of non-NULL values is below 1/2 or below 1.96
    standard errors of the count; a value at either threshold."""
    units = units_of(NumericDomain(0.0, 3.0, (0, 1, 2, 3)))
    F = np.array([[0.0, 0.0], [0.2, 0.3], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    U = np.array([[0.0, 0.0], [0.1, 0.1], [0.6, 0.6], [3.0, 3.0], [4.0, 4.0]])
    N = np.array([0.0, 0.4, 0.6, 3.0, 4.0])
    v = np.full((5, 2), 1e-4)
    out = quantiles(F, U, N, v, v, np.array([1e-4, 1e-4, 1e-4, 4.0, 4.0]), 0.5, "cont", units)
    assert np.isnan(out.value[[0, 1, 3]]).all() and np.isnan(out.ci_low[[0, 1, 3]]).all()
    assert 2.0 <= out.value[2] <= 3.0 and 2.0 <= out.value[4] <= 3.0


def test_interval_ends_are_the_runs_of_confident_edges():
    """With standard errors far below the counts, the interval is the estimate's unit (the
    rank 0.45·N is inside unit 4); with noise of the counts' size it widens."""
    units = units_of(IntegerDomain(0, 9))
    counts = np.full((1, 10), 100.0)
    C = np.cumsum(counts, axis=1)
    F, N = C[:, :-1], C[:, -1]
    U = N[:, None] - F
    tiny = quantiles(F, U, N, np.full(F.shape, 1e-6), np.full(F.shape, 1e-6),
                     np.full(1, 1e-6), 0.45, "disc", units)
    assert tiny.ci_low[0] == tiny.ci_high[0] == tiny.value[0] == 4
    wide = quantiles(F, U, N, np.full(F.shape, 1e4), np.full(F.shape, 1e4),
                     np.full(1, 2e4), 0.45, "disc", units)
    assert wide.ci_low[0] < 4 and wide.ci_high[0] > 4

"""SUM and AVG over bounded columns (issue 20 item 1): what the parser reads (dpsql's spelling
and BigQuery's ANON_* names), how a batch splits into data vectors, and the bounds'
arithmetic. No data."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp

from dpsql.errors import UnsupportedQueryError
from dpsql.policy.policy import load_policy
from dpsql.sql.compile import compile_workload
from dpsql.sql.ir import Value
from dpsql.sql.parse import parse_batch
from dpsql.sql.vectors import split
from dpsql.workload.values import VALUE_BITS, ValueBound, merge_cells, merged_cells

from ..conftest import ADULT_POLICY

POLICY = load_policy(ADULT_POLICY, "adult")["adult"]


def parse(sql):
    return parse_batch(sql, lambda name, node: POLICY)


@pytest.mark.parametrize("sql, kind, value, name, counted", [
    ("SELECT SUM(hours_per_week) FROM adult", "sum", ("hours_per_week", 0, 100, False),
     "sum", None),
    ("SELECT SUM(CLAMP(age, 20, 60)) AS s FROM adult", "sum", ("age", 20, 60, True), "s",
     None),
    ("SELECT AVG(age) FROM adult", "avg", ("age", 17, 90, False), "avg", "age"),
    ("SELECT AVG(CLAMP(hours_per_week, -1.5, 2)) FROM adult", "avg",
     ("hours_per_week", Fraction(-3, 2), 2, True), "avg", "hours_per_week"),
    ("SELECT ANON_SUM(age, 0, 50) FROM adult", "sum", ("age", 0, 50, True), "sum", None),
    ("SELECT ANON_AVG(age) FROM adult", "avg", ("age", 17, 90, False), "avg", "age"),
    ("SELECT ANON_COUNT(*) FROM adult", "count", None, "count", None),
    ("SELECT ANON_COUNT(age) AS n FROM adult", "count", None, "n", "age"),
])
def test_each_spelling_reads_as_its_aggregate(sql, kind, value, name, counted):
    (q,) = parse(sql)
    assert (q.aggregate, q.count_name, q.count_column) == (kind, name, counted)
    assert q.value == (None if value is None else Value(*value))


@pytest.mark.parametrize("sql, words", [
    ("SELECT SUM(sex) FROM adult", "SUM(sex) without bounds is not supported"),
    ("SELECT SUM(CLAMP(age, 90, 17)) FROM adult", "lower bound must be below"),
    ("SELECT SUM(CLAMP(age, 1, 1)) FROM adult", "lower bound must be below"),
    ("SELECT SUM(CLAMP(age, 0, 1e16)) FROM adult", "within ±1e+15"),
    ("SELECT SUM(CLAMP(age, -1e-300, 1e-300)) FROM adult", "at least 1e-09 in magnitude"),
    ("SELECT SUM(CLAMP(age, 0)) FROM adult", "CLAMP with 2 arguments"),
    ("SELECT SUM(age + 1) FROM adult", "SUM of 'age + 1'"),
    ("SELECT AVG(DISTINCT age) FROM adult", "AVG(DISTINCT ...)"),
    ("SELECT SUM(CLAMP(age, 0, 'x')) FROM adult", "clamp bounds are numeric constants"),
    ("SELECT COUNT(*), SUM(age) FROM adult", "more than one aggregate"),
    ("SELECT SUM(nope) FROM adult", "column 'nope' is not declared"),
])
def test_bad_sums_are_refused_with_the_fix(sql, words):
    with pytest.raises(UnsupportedQueryError) as info:
        parse(sql)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_batch_splits_into_one_vector_per_bounded_value():
    w = compile_workload(parse(
        "SELECT sex, SUM(hours_per_week) FROM adult GROUP BY sex;"
        "SELECT AVG(age) FROM adult WHERE sex = 'Male';"
        "SELECT race, COUNT(*) FROM adult GROUP BY race;"
        "SELECT SUM(CLAMP(hours_per_week, 0, 100)) FROM adult"), POLICY)
    s = split(w)
    assert [v.label for v in s.vectors] == ["COUNT", "SUM(hours_per_week[0, 100])",
                                           "SUM(age[17, 90])"]
    assert s.kinds == ["sum", "sum", "avg", "count", "count", "count", "count", "count", "sum"]
    # each answer reads its row of its vector; an AVG also its count's row
    for r, (v, i) in enumerate(s.numerator):
        assert (_on_batch(s.vectors[v], i) != w.W[r]).nnz == 0
        c, j = s.denominator[r]
        assert (c, j) == (-1, -1) if s.kinds[r] != "avg" else \
            (c == 0 and (_on_batch(s.vectors[0], j) != w.W[r]).nnz == 0)
    assert s.vectors[1].rows.tolist() == [0, 1, 8]       # one vector for one (column, lo, hi)


def test_each_block_reads_only_the_cells_its_rows_tell_apart():
    """A SUM by sex reads two merged cells, whatever the batch's other statements cut the
    table into; a quantile's CDF counts are a block of their own (the other counts keep a
    strategy on their own few cells); every answer still reads its own row."""
    w = compile_workload(parse(
        "SELECT sex, SUM(hours_per_week) FROM adult GROUP BY sex;"
        "SELECT race, MEDIAN(age) FROM adult GROUP BY race;"
        "SELECT income, COUNT(*) FROM adult GROUP BY income;"
        "SELECT sex, AVG(age) FROM adult GROUP BY sex"), POLICY)
    s = split(w)
    assert [v.label for v in s.vectors] == ["COUNT", "SUM(hours_per_week[0, 100])",
                                           "COUNT [CDF of statement 2]", "SUM(age[17, 90])"]
    for v in s.vectors:
        W = w.W[v.rows].toarray()
        assert v.workload.n_cells == len({tuple(W[:, j]) for j in range(w.n_cells)})
    assert [v.workload.n_cells for v in s.vectors] == [9, 3, 371, 3] and w.n_cells == 3996
    assert all(v.cells is not None and v.cells.shape == (w.n_cells,) for v in s.vectors)
    for r, (v, i) in enumerate(s.numerator):
        assert (_on_batch(s.vectors[v], i) != w.W[r]).nnz == 0
        c, j = s.denominator[r]
        if s.kinds[r] == "avg":
            assert c == 0 and (_on_batch(s.vectors[0], j) != w.W[r]).nnz == 0
    x = np.arange(w.n_cells, dtype=np.int64)
    for v in s.vectors:             # the merged vector answers every row as the batch's does
        assert np.array_equal(v.workload.W @ v.on_cells(x), w.W[v.rows] @ x)


def test_merged_cells_merges_exactly_the_equal_columns():
    rng = np.random.default_rng(7)
    base = sp.random(30, 12, density=0.3, random_state=3, format="csr")
    picks = rng.integers(0, 12, size=200)
    W = sp.csr_matrix(base[:, picks])
    cells = merged_cells(W)
    distinct = {tuple(np.asarray(W[:, j].todense()).ravel()) for j in range(200)}
    assert cells is not None and cells.max() + 1 == len(distinct)
    assert cells[0] == 0 and np.all(np.diff(np.maximum.accumulate(cells)) <= 1)  # first use
    for j in range(200):
        k = int(np.flatnonzero(cells == cells[j])[0])
        assert (W[:, j] != W[:, k]).nnz == 0
    assert merged_cells(sp.identity(5, format="csr")) is None
    assert merge_cells(cells, np.ones(200, dtype=np.int64), int(cells.max()) + 1).sum() == 200


def _on_batch(vector, i):
    """Row ``i`` of a block's workload over the batch's cells (undoing the merge)."""
    W = vector.workload.W
    return W[i] if vector.cells is None else W[i][:, vector.cells]


@pytest.mark.parametrize("lo, hi, bound, exponent", [
    (0, 100, 100, 7 - VALUE_BITS), (17, 90, 90, 7 - VALUE_BITS), (-3, 2, 3, 2 - VALUE_BITS),
    (Fraction(-1, 10), Fraction(1, 10), None, -3 - VALUE_BITS), (0, 1, 1, -VALUE_BITS),
    (0, 2 ** 40, 2 ** 40, 40 - VALUE_BITS)])
def test_value_bound_units(lo, hi, bound, exponent):
    b = ValueBound(lo, hi)
    assert b.exponent == exponent
    assert b.units_bound <= 2 ** VALUE_BITS and b.bound <= max(abs(b.lo), abs(b.hi))
    assert b.lo_units * b.unit >= b.lo and b.hi_units * b.unit <= b.hi
    if bound is not None:                # bounds on the unit grid are kept exactly
        assert b.bound == bound
    else:                                # else inside them, by less than one unit
        assert max(abs(b.lo), abs(b.hi)) - b.bound < b.unit

"""SUM and AVG over bounded columns (issue 20 item 1): what the parser reads (dpsql's spelling
and BigQuery's ANON_* names), how a batch splits into data vectors, and the bounds'
arithmetic. No data."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dpsql.errors import UnsupportedQueryError
from dpsql.policy.policy import load_policy
from dpsql.sql.compile import compile_workload
from dpsql.sql.ir import Value
from dpsql.sql.parse import parse_batch
from dpsql.sql.vectors import split
from dpsql.workload.values import VALUE_BITS, ValueBound

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
        assert (s.vectors[v].workload.W[i] != w.W[r]).nnz == 0
        c, j = s.denominator[r]
        assert (c, j) == (-1, -1) if s.kinds[r] != "avg" else \
            (c == 0 and (s.vectors[0].workload.W[j] != w.W[r]).nnz == 0)
    assert s.vectors[1].rows.tolist() == [0, 1, 8]       # one vector for one (column, lo, hi)


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

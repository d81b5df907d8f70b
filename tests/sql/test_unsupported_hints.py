"""Unsupported SQL gets a hint (issue 18 item 7): the refusal names the construct, says what
is supported instead and points to a section of docs/sql.md that exists."""

from __future__ import annotations

import re

import pytest

from dpsql.errors import UnsupportedQueryError
from dpsql.sql.hints import HINTS
from dpsql.sql.parse import parse_batch

from ..conftest import ROOT, ADULT_POLICY

T = "FROM adult"
# (sql, the construct as named, words of what to write instead, docs section)
CASES = [
    (f"SELECT SUM(sex) {T}", "SUM(sex) without bounds", "SUM(CLAMP(column, lo, hi))",
     "sums-and-averages"),
    (f"SELECT MIN(age) {T}", "function MIN()", "MIN and MAX are not answered",
     "aggregates"),
    (f"SELECT MAX(age) {T}", "function MAX()", "QUANTILE_CONT(column, 0.99)", "aggregates"),
    (f"SELECT stddev(age) {T}", "function STDDEV()", "COUNT(column)", "aggregates"),
    (f"SELECT COUNT(*) FILTER (WHERE age > 30) {T}", "COUNT(...) FILTER", "COUNT(*)",
     "aggregates"),
    (f"SELECT COUNT(*) {T} JOIN people ON adult.age = people.age", "JOIN with table 'people'",
     "declare it as [tables.adult.public.people]", "joins-to-public-tables"),
    ("SELECT COUNT(*) FROM (SELECT * FROM adult)", "reading from SUBQUERY",
     "one protected table by name", "one-table-per-query"),
    (f"SELECT COUNT(*) {T} WHERE age IN (SELECT 1)", "IN with a subquery or list expression",
     "col IN ('a', 'b')", "one-table-per-query"),
    (f"SELECT COUNT(*) {T} WHERE EXISTS (SELECT 1)", "function 'EXISTS(SELECT 1)'", "one protected table",
     "one-table-per-query"),
    (f"WITH a AS (SELECT * FROM adult) SELECT COUNT(*) {T}", "WITH", "result tables",
     "one-table-per-query"),
    (f"SELECT COUNT(*) {T} UNION SELECT COUNT(*) {T}", "UNION statement",
     "its own statement", "one-table-per-query"),
    (f"SELECT sex, COUNT(*) OVER () {T}", "window function", "GROUP BY, ROLLUP or CUBE",
     "groups-and-ordering"),
    (f"SELECT sex, COUNT(*) {T} GROUP BY sex HAVING COUNT(*) > 10", "HAVING",
     "filter the result table afterwards", "groups-and-ordering"),
    (f"SELECT sex, COUNT(*) {T} GROUP BY sex ORDER BY 2", "ORDER BY",
     "order or limit the result table afterwards", "groups-and-ordering"),
    (f"SELECT sex, COUNT(*) {T} GROUP BY sex LIMIT 1", "LIMIT", "result table afterwards",
     "groups-and-ordering"),
    (f"SELECT DISTINCT sex, COUNT(*) {T} GROUP BY sex", "DISTINCT", "GROUP BY the columns",
     "groups-and-ordering"),
    (f"SELECT COUNT(*) {T} WHERE age + 1 > 30", "comparison 'age + 1 > 30'",
     "compare one column with one literal constant", "conditions"),
    (f"SELECT COUNT(*) {T} WHERE upper(sex) = 'MALE'", "comparison \"UPPER(sex) = 'MALE'\"", "WHERE allows",
     "conditions"),
]


def resolve(name, node):
    from dpsql.policy.policy import load_policy

    if name != "adult":
        from dpsql.errors import UnknownTableError
        raise UnknownTableError(f"{name!r} is not a protected table")
    return load_policy(ADULT_POLICY, "adult")["adult"]


def headings() -> set[str]:
    """GitHub's anchors of docs/sql.md's headings."""
    text = (ROOT / "docs" / "sql.md").read_text(encoding="utf-8")
    return {re.sub(r"[^a-z0-9 -]", "", h.lower()).strip().replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("sql,construct,instead,section", CASES, ids=[c[0][:50] for c in CASES])
def test_each_unsupported_construct_gets_its_hint(sql, construct, instead, section):
    with pytest.raises(UnsupportedQueryError) as info:
        parse_batch(sql, resolve)
    message = str(info.value)
    assert f"{construct} is not supported; " in message, message
    assert instead in message, message
    assert f"(see docs/sql.md#{section})" in message, message
    assert "\n" not in message and info.value.line == 1


def test_every_hint_points_to_a_section_that_exists():
    anchors = headings()
    assert {section for _, section in HINTS.values()} <= anchors, anchors
    assert {c[3] for c in CASES} == {section for _, section in HINTS.values()}

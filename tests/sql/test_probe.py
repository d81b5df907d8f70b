"""Schema probes (dpsql.sql.probe): only queries that return no row whatever the data."""

from __future__ import annotations

import pytest

from dpsql.sql.probe import Probe, probe


@pytest.mark.parametrize("sql, expected", [
    ("SELECT * FROM adult WHERE 1=0", Probe("adult", None)),
    ('SELECT * FROM "Adult" WHERE 1 = 0', Probe("adult", None)),
    ("SELECT * FROM main.adult WHERE false", Probe("adult", None)),
    ("SELECT age, Sex FROM adult WHERE 1 <> 1 AND age > 3", Probe("adult", ("age", "sex"))),
    ("SELECT * FROM adult LIMIT 0", Probe("adult", None)),
    ("select * from public.adult where 0=1 limit 0", Probe("adult", None)),
])
def test_probes_are_recognised(sql, expected):
    assert probe(sql) == expected
    assert probe(sql, "postgres") == expected


@pytest.mark.parametrize("sql", [
    "SELECT * FROM adult", "SELECT * FROM adult WHERE 1=1", "SELECT * FROM adult LIMIT 1",
    "SELECT * FROM adult WHERE age > 200", "SELECT count(*) FROM adult WHERE 1=0",
    "SELECT age + 1 FROM adult WHERE 1=0", "SELECT adult.age FROM adult WHERE 1=0",
    "SELECT * FROM adult a JOIN adult b ON true WHERE 1=0",
    "SELECT * FROM adult WHERE 1=0 OR age IN (SELECT age FROM adult)",
    "SELECT * FROM adult WHERE 1=0 GROUP BY age", "SELECT * FROM adult WHERE 1=0 ORDER BY 1",
    "SELECT * FROM adult LIMIT 0 OFFSET 3", "SELECT * FROM other.adult WHERE 1=0",
    "SELECT * FROM db.main.adult WHERE 1=0", "SELECT * FROM read_csv('x') WHERE 1=0",
    "SELECT * FROM adult WHERE 1=0 UNION SELECT * FROM adult",
    "WITH t AS (SELECT * FROM adult) SELECT * FROM t WHERE 1=0",
    "SELECT * FROM adult WHERE 1=0; SELECT * FROM adult", "not sql at all (",
])
def test_anything_else_is_not_a_probe(sql):
    assert probe(sql) is None

"""Bulk parsing (issue 16): each statement shape is parsed once, later statements of the shape
are its tree with their own literals and positions — which must be exactly what sqlglot
parses, node for node and position for position."""

from __future__ import annotations

import itertools
import random

import pytest
import sqlglot
from sqlglot import exp

from dpsql.errors import ParseError, UnsupportedQueryError
from dpsql.policy.policy import table_policy_from_spec
from dpsql.sql import bulk, parse, split
from dpsql.sql.parse import parse_batch, split_statements
from tests.sql.statements import read

SPEC = {"epsilon": 1, "delta": 1e-6, "columns": {
    "age": {"type": "integer", "min": 17, "max": 90},
    "sex": {"type": "categorical", "values": ["F", "M"]},
    "city": {"type": "categorical", "values": ["a b", "it's", "c"], "nullable": True}}}

SHAPES = [
    "SELECT sex, COUNT(*) FROM t WHERE age BETWEEN {a} AND {b} GROUP BY sex",
    "SELECT COUNT(*) FROM t WHERE age >= {a} AND city IN ({s}, {s2}) /* note {a} */",
    "CREATE TABLE r{b} AS SELECT city, COUNT(*) AS n FROM t WHERE age <> -{a} GROUP BY city",
    "SELECT COUNT(city) FROM t WHERE (age < {a} OR age > {b}) AND city = {s}",
    "SELECT sex, COUNT(*) FROM t WHERE city = {s} GROUP BY ROLLUP (sex)",
]


def _statements(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    words = ["'a b'", "'it''s'", "'c'", "'zz'", "''"]
    out = []
    for _ in range(n):
        a = rng.choice([rng.randint(0, 9), rng.randint(10, 99999), 1.5, "1e3"])
        out.append(rng.choice(SHAPES).format(a=a, b=rng.randint(0, 120), s=rng.choice(words),
                                             s2=rng.choice(words)))
    return out


def _same(mine: exp.Expression, theirs: exp.Expression) -> None:
    assert mine == theirs
    assert mine.sql(dialect="duckdb") == theirs.sql(dialect="duckdb")
    for a, b in itertools.zip_longest(mine.walk(), theirs.walk()):
        assert type(a) is type(b)
        assert a.meta == b.meta, (a, b)
        assert a.comments == b.comments


@pytest.mark.parametrize("joined", [None, ";\n", "; ", ";", " ;\t"])
def test_templated_trees_are_sqlglots_trees(joined, monkeypatch):
    """Also on one line (statements separated by ``;`` alone): the text is cut mid-line,
    in small pieces here so that most statements follow a cut."""
    texts = _statements(1, 300)
    given = joined.join(texts) if joined else texts
    real = split.pieces
    monkeypatch.setattr(split, "pieces", lambda text: real(text, 200))
    mine = split_statements(given)
    theirs = [t for t in (sqlglot.parse(given, dialect="duckdb") if joined else
                          [sqlglot.parse_one(s, dialect="duckdb") for s in texts])
              if t is not None]
    assert len(mine) == len(theirs) == 300
    for a, b in zip(mine, theirs):
        _same(a, b)


def test_shapes_are_parsed_once():
    texts = _statements(2, 200)
    tokens = [bulk.statement_tokens(t, 10)[0] for t in texts]
    keys = {bulk.shape(c) for c in tokens}
    assert None not in keys and len(keys) < 100   # names and comments make shapes too
    parsed = []

    def count(chunk, text):
        parsed.append(text)
        return parse._parse_chunk(chunk, text)

    cache: dict = {}
    for text, chunk in zip(texts, tokens):
        list(bulk.statements(text, [chunk], count, cache))
    assert len(parsed) == len(keys)


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM t WHERE d = DATE '2020-01-01'",
    "SELECT COUNT(*) FROM t WHERE d > CAST('5' AS INTEGER) + INTERVAL '5 day'",
    "SELECT COUNT(*) FROM t GROUP BY 1"])
def test_literals_that_could_steer_the_parse_are_not_templated(sql):
    (chunk,) = bulk.statement_tokens(sql, 10)
    assert bulk.shape(chunk) is None


def test_fixture_statements_parse_as_before():
    """Every accepted and refused fixture statement: the same trees or the same error."""
    for name in ("accept.sql", "reject.sql", "adult_accept.sql", "adult_reject.sql"):
        for entry in read(name):
            text = entry.sql.replace("{tmp}", "/tmp/x")
            try:
                theirs = [t for t in sqlglot.parse(text, dialect="duckdb")
                          if t is not None and not isinstance(t, exp.Semicolon)]
            except (sqlglot.errors.ParseError, sqlglot.errors.TokenError):
                with pytest.raises(ParseError):
                    split_statements(text)
                continue
            if not theirs:
                continue
            mine = split_statements([text, text])       # the second copy is templated
            for a, b in zip(mine, theirs + theirs):
                _same(a, b)


def test_parse_batch_matches_statement_by_statement():
    policy = table_policy_from_spec("t", SPEC)
    texts = _statements(3, 150)
    batch = parse_batch(texts, lambda name, node: policy)
    one = [parse_batch([t], lambda name, node: policy)[0] for t in texts]
    for k, (a, b) in enumerate(zip(batch, one)):
        assert a == b.__class__(**{**b.__dict__, "index": k})


def test_refusals_in_templated_statements_point_at_their_own_text():
    """A statement refused for its literal, the second of its shape (so templated), gets the
    error a parse of it alone gives, at its own line and column."""
    policy = table_policy_from_spec("t", SPEC)
    bad = "SELECT COUNT(*) FROM t WHERE age = 1e100000000 AND sex = 'F'"
    with pytest.raises(UnsupportedQueryError) as alone:
        parse_batch([bad], lambda name, node: policy)
    with pytest.raises(UnsupportedQueryError) as batch:
        parse_batch(["SELECT COUNT(*) FROM t WHERE age = 17 AND sex = 'M'", bad],
                    lambda name, node: policy)
    assert str(batch.value) == str(alone.value)
    assert "column 36" in str(batch.value)
    with pytest.raises(UnsupportedQueryError) as joined:
        parse_batch("SELECT COUNT(*) FROM t WHERE age = 17 AND sex = 'M';\n   " + bad,
                    lambda name, node: policy)
    assert "line 2, column 39" in str(joined.value)


def test_absurd_batches_are_refused_before_parsing(monkeypatch):
    monkeypatch.setattr(parse, "MAX_STATEMENTS", 5)
    with pytest.raises(ParseError, match="more than 5 statements.*split it"):
        split_statements(";".join(["SELECT COUNT(*) FROM t"] * 6))
    with pytest.raises(ParseError, match="more than 5 statements"):
        split_statements(["SELECT COUNT(*) FROM t"] * 6)
    monkeypatch.setattr(parse, "MAX_SQL_CHARS", 100)
    with pytest.raises(ParseError, match="characters, more than the limit of 100"):
        split_statements("SELECT COUNT(*) FROM t WHERE " + " AND ".join(["a = 1"] * 20))


RECIPE_SHAPES = SHAPES + [
    "SELECT QUANTILE_CONT(age, 0.{b}) FROM t WHERE age > {a}",     # a literal outside WHERE
    "SELECT sex, SUM(CLAMP(age, {a}, 100)) FROM t GROUP BY sex",
    "SELECT COUNT(*) FROM t",
    "CREATE OR REPLACE TABLE q AS SELECT COUNT(*) AS n FROM t AS x WHERE x.age = {a}",
]


def _recipe_statements(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    words = ["'a b'", "'it''s'", "'c'", "'zz'"]
    return [rng.choice(RECIPE_SHAPES).format(a=rng.randint(17, 60), b=rng.randint(1, 9),
                                             s=rng.choice(words), s2=rng.choice(words))
            for _ in range(n)]


@pytest.mark.parametrize("joined", [None, ";\n"])
def test_statements_of_a_shape_built_from_their_where_equal_the_full_parse(joined,
                                                                          monkeypatch):
    policy = table_policy_from_spec("t", SPEC)
    texts = _recipe_statements(5, 400)
    given = joined.join(texts) if joined else texts
    built = []
    real = parse._recipe

    def spy(*args):
        recipe = real(*args)
        built.append(bool(recipe))
        return recipe
    monkeypatch.setattr(parse, "_recipe", spy)
    fast = parse_batch(given, lambda name, node: policy)
    assert True in built and False in built       # some shapes have literals elsewhere
    monkeypatch.setattr(parse, "_recipe", lambda *args: False)
    slow = parse_batch(given, lambda name, node: policy)
    assert fast == slow
    assert [q.sql for q in fast] == [q.sql for q in slow]


def test_a_later_statement_of_a_shape_is_refused_as_in_the_full_parse(monkeypatch):
    policy = table_policy_from_spec("t", SPEC)
    good = "SELECT COUNT(*) FROM t WHERE age = 17 AND sex = 'M'"
    bad = "SELECT COUNT(*) FROM t WHERE age = 17 AND nope = 'M'"
    errors = []
    for recipes in (True, False):
        if not recipes:
            monkeypatch.setattr(parse, "_recipe", lambda *args: False)
        for sql in ([good, good, "SELECT COUNT(*) FROM t WHERE age = 1e999 AND sex = 'F'"],
                    ";\n".join([good, good, "SELECT COUNT(*) FROM t WHERE age = 18 AND sex = 1"
                                " AND age = 1e999"])):
            with pytest.raises(UnsupportedQueryError) as caught:
                parse_batch(sql, lambda name, node: policy)
            errors.append(str(caught.value))
        with pytest.raises(UnsupportedQueryError) as caught:
            parse_batch([good, bad], lambda name, node: policy)
        errors.append(str(caught.value))
    assert errors[:3] == errors[3:]

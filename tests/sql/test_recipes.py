"""A shape's later statements read from their tokens (dpsql.sql.recipes) equal the same
statements read from their trees, and the full statement-by-statement parse: the same IR
(constants, positions and normalised text) on varied batches, and the same first error."""

from __future__ import annotations

import random

import pytest

from dpsql.errors import DpsqlError
from dpsql.policy.policy import table_policy_from_spec
from dpsql.sql import parse, recipes
from dpsql.sql.parse import parse_batch

SPEC = {"epsilon": 1.0, "delta": 1e-6, "columns": {
    "x": {"type": "integer", "min": -50, "max": 99, "nullable": True},
    "v": {"type": "numeric", "min": 0.0, "max": 10.0, "edges": [0.0, 2.5, 5.0, 7.5, 10.0]},
    "c": {"type": "categorical", "values": ["a", "it's", "c d"], "nullable": True},
    "k": {"type": "categorical", "values": [1, 2, 3]}}}

SHAPES = [
    "SELECT COUNT(*) FROM t WHERE x = {n}",
    "SELECT COUNT(*) FROM t WHERE x BETWEEN {n} AND {m}",
    "SELECT COUNT(*) FROM t WHERE x NOT BETWEEN {n} AND {m}",
    "SELECT COUNT(*) FROM t WHERE x IN ({n}, {m}, -{p})",
    "SELECT COUNT(*) FROM t WHERE x NOT IN ({n})",
    "SELECT COUNT(*) FROM t WHERE NOT (x > {n} OR c = {s}) AND k <> {k}",
    "SELECT COUNT(*) FROM t WHERE x = -{p} OR x = (-{p}) OR x = -({n}) OR x IS NULL",
    "SELECT COUNT(*) FROM t WHERE v >= {d} AND v < {d2}",
    "SELECT COUNT(*) FROM t WHERE c IN ({s}, {s2}) AND TRUE",
    "SELECT COUNT(x) FROM t WHERE {n} < x",
    "SELECT c, COUNT(*) FROM t WHERE x >= {n} GROUP BY c",
    "SELECT c, k, COUNT(*) FROM t WHERE x < {m} AND NOT c IS NULL GROUP BY CUBE (c, k)",
    "CREATE TABLE r AS SELECT COUNT(*) AS n FROM t WHERE (x <= {n}) -- x {n}\n",
    "SELECT COUNT(*)\n  FROM t\n WHERE x > {n}\n   AND   c <> {s} /* {s} */",
]


def _texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    numbers = lambda: rng.choice([rng.randint(0, 99), rng.randint(-9, 9), "1.5", "2.50",
                                  "1e1", "07", "0"])  # noqa: E731
    strings = ["'a'", "'it''s'", "'c d'", "'zz'", "''"]
    return [rng.choice(SHAPES).format(
        n=numbers(), m=numbers(), p=rng.choice([rng.randint(0, 60), "2.5", "0"]), k=rng.randint(1, 3), d=rng.choice(["2.5", "0", "7.5e0"]),
        d2=rng.choice(["5", "10.0", "9.99"]), s=rng.choice(strings), s2=rng.choice(strings))
        for _ in range(count)]


def _read(given, mode: str, monkeypatch):
    """The batch's IR (or its error) read with plans, with trees only, or in full."""
    with monkeypatch.context() as m:
        if mode != "plan":
            m.setattr(recipes, "plan", lambda *args: None)
        if mode == "full":
            m.setattr(parse, "_recipe", lambda *args: False)
        policy = table_policy_from_spec("t", SPEC)
        try:
            return parse_batch(given, lambda name, node: policy)
        except DpsqlError as exc:
            return type(exc), str(exc), getattr(exc, "line", None), getattr(exc, "column", None)


def _spied(monkeypatch) -> list:
    made = []
    real = recipes.plan

    def spy(*args):
        made.append(real(*args))
        return made[-1]
    monkeypatch.setattr(recipes, "plan", spy)
    return made


@pytest.mark.parametrize("joined", [None, ";\n", "; ", ";\n\n  "])
@pytest.mark.parametrize("seed", [1, 2])
def test_plans_read_what_the_trees_read(joined, seed, monkeypatch):
    texts = _texts(seed, 600)
    given = joined.join(texts) if joined else texts
    tree = _read(given, "tree", monkeypatch)
    full = _read(given, "full", monkeypatch)
    made = _spied(monkeypatch)
    fast = _read(given, "plan", monkeypatch)
    assert isinstance(fast, list) and len(fast) == 600
    assert fast == tree == full
    assert [q.sql for q in fast] == [q.sql for q in tree] == [q.sql for q in full]
    assert [repr(q.where) for q in fast] == [repr(q.where) for q in full]   # int vs Fraction
    assert sum(p is not None for p in made) >= 10          # most shapes have a plan


@pytest.mark.parametrize("bad", [
    "SELECT COUNT(*) FROM t WHERE x = 1e999",
    "SELECT COUNT(*) FROM t WHERE x BETWEEN 3 AND 1e-401",
    "SELECT COUNT(*) FROM t WHERE x IN (1, 2, 1e500)",
    "SELECT COUNT(*) FROM t WHERE c = -'a'",               # another shape: read in full
    "SELECT COUNT(*) FROM t WHERE nope = 3",
    "SELECT COUNT(*) FROM t WHERE x = 3 ORDER BY 1",
    "SELECT COUNT(*) FROM t WHERE x = (3",
])
@pytest.mark.parametrize("joined", [None, ";\n"])
def test_a_bad_statement_in_the_middle_fails_as_in_the_full_parse(bad, joined, monkeypatch):
    texts = _texts(3, 200)
    texts = texts[:120] + ["  " + bad] + texts[120:]
    given = joined.join(texts) if joined else texts
    errors = [_read(given, mode, monkeypatch) for mode in ("plan", "tree", "full")]
    assert not isinstance(errors[0], list)
    assert errors[0] == errors[1] == errors[2]


def test_a_plan_is_checked_against_its_first_statement(monkeypatch):
    """A plan that would not rebuild its first statement's condition is not used."""
    made = _spied(monkeypatch)
    real_run = recipes._run
    monkeypatch.setattr(recipes, "_run", lambda steps, tokens: real_run(steps, tokens[:0]))
    texts = [f"SELECT COUNT(*) FROM t WHERE x = {v}" for v in range(20)]
    out = _read(texts, "plan", monkeypatch)
    assert made == [None]
    monkeypatch.undo()
    assert out == _read(texts, "full", monkeypatch)

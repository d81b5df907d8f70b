"""Domain comparisons against brute force: every unit TRUE, FALSE, or refused as split."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from dpsql.workload.domain import domain_from_spec
from dpsql.workload.ordered import IntegerDomain, NumericDomain
from dpsql.workload.units import FALSE, TRUE, UNKNOWN, NotExpressible
from dpsql.errors import PolicyError

OPS = {"=": lambda x, c: x == c, "<>": lambda x, c: x != c, "<": lambda x, c: x < c,
       "<=": lambda x, c: x <= c, ">": lambda x, c: x > c, ">=": lambda x, c: x >= c}


def brute(points_per_unit, op, c):
    out = []
    for pts in points_per_unit:
        vals = {OPS[op](p, c) for p in pts}
        out.append(None if len(vals) == 2 else (TRUE if vals == {True} else FALSE))
    return out


def check(domain, points_per_unit, op, c):
    expected = brute(points_per_unit, op, c)
    if None in expected:
        with pytest.raises(NotExpressible):
            domain.compare(op, c)
        return
    got = domain.compare(op, c)
    assert list(got[: len(expected)]) == expected, (domain, op, c)
    if domain.nullable:
        assert got[-1] == UNKNOWN


def test_integer_domain_matches_brute_force():
    rng = random.Random(7)  # test-only (seeded, for reproducible cases)
    for _ in range(400):
        lo = rng.randint(-20, 20)
        hi = lo + rng.randint(0, 25)
        step = rng.choice([1, 1, 2, 3, 5])
        d = IntegerDomain(lo, hi, step, nullable=rng.random() < 0.3)
        units = [[x for x in range(lo + k * step, min(lo + (k + 1) * step, hi + 1))]
                 for k in range(d.n_value_units)]
        c = Fraction(rng.randint(2 * lo - 10, 2 * hi + 10), rng.choice([1, 2]))
        check(d, units, rng.choice(list(OPS)), c)


def test_numeric_domain_matches_brute_force():
    rng = random.Random(11)  # test-only (seeded, for reproducible cases)
    for _ in range(400):
        edges = sorted({rng.randint(0, 40) / 2 for _ in range(rng.randint(2, 6))})
        if len(edges) < 2:
            continue
        d = NumericDomain(edges[0], edges[-1], tuple(edges), nullable=rng.random() < 0.3)
        c = Fraction(rng.randint(-4, 84), 4)
        tiny = Fraction(1, 10**9)
        units = []
        for i in range(len(edges) - 1):
            a, b = Fraction(edges[i]), Fraction(edges[i + 1])
            closed = i == len(edges) - 2
            pts = {a, (a + b) / 2, b - tiny} | ({b} if closed else set())
            for p in (c - tiny, c, c + tiny):
                if a <= p < b or (closed and p == b):
                    pts.add(p)
            units.append(pts)
        check(d, units, rng.choice(list(OPS)), c)


def test_large_integer_domain_is_fast_enough_to_compile():
    d = IntegerDomain(0, 999_999)
    out = d.compare("<", 500_000)
    assert out.sum() == 500_000 * TRUE and d.compare(">=", 7).shape == (1_000_000,)


def test_categorical_rules():
    d = domain_from_spec("t", "c", {"type": "categorical", "values": ["a", "b"],
                                    "nullable": True})
    assert list(d.compare("=", "a")) == [TRUE, FALSE, FALSE, UNKNOWN]
    assert list(d.compare("<>", "a")) == [FALSE, TRUE, TRUE, UNKNOWN]   # 'other' selected
    with pytest.raises(NotExpressible, match="not in the declared domain"):
        d.compare("=", "zz")
    with pytest.raises(NotExpressible, match="ordering"):
        d.compare("<", "a")
    with pytest.raises(NotExpressible):
        d.compare("=", 3)


@pytest.mark.parametrize("spec, msg", [
    ({"type": "categorical", "values": []}, "empty"),
    ({"type": "categorical", "values": ["a", "a"]}, "duplicate"),
    ({"type": "categorical", "values": ["a", 1]}, "all be strings"),
    ({"type": "integer", "min": 5, "max": 1}, "greater than max"),
    ({"type": "integer", "min": 0, "max": 10, "step": 0}, "step"),
    ({"type": "integer", "min": 0.5, "max": 10}, "integer"),
    ({"type": "integer", "min": 0, "max": 2 ** 70}, "2\\*\\*62"),
    ({"type": "numeric", "min": 0, "max": 10, "edges": [0, 5, 5, 10]}, "strictly increasing"),
    ({"type": "numeric", "min": 0, "max": 10, "edges": [0, 7, 3, 10]}, "strictly increasing"),
    ({"type": "numeric", "min": 0, "max": 10, "edges": [1, 10]}, "start at min"),
    ({"type": "numeric", "min": 0, "max": float("inf"), "edges": [0, 1]}, "finite"),
    ({"type": "numeric", "min": 0, "max": 10, "edges": [0, float("nan"), 10]}, "finite"),
    ({"type": "numeric", "min": 10, "max": 10, "edges": [10, 10]}, "less than max"),
    ({"type": "text"}, "type must be one of"),
    ({"type": "integer", "min": 0, "max": 1, "bogus": 1}, "unknown field"),
    ({"type": "integer", "min": 0, "max": 1, "nullable": "yes"}, "nullable"),
])
def test_bad_domains_are_refused_by_name(spec, msg):
    with pytest.raises(PolicyError, match=msg) as exc:
        domain_from_spec("t", "col", spec)
    assert "col" in str(exc.value)


@pytest.mark.parametrize("change, msg", [
    ({"epsilon": 0}, "epsilon"), ({"epsilon": -1}, "epsilon"), ({"delta": 1}, "delta"),
    ({"delta": -0.1}, "delta"), ({"epsilon": float("nan")}, "epsilon"),
    ({"columns": {}}, "at least one column"), ({"extra": 1}, "unknown field"),
])
def test_bad_table_policies_are_refused(change, msg):
    from dpsql.policy.policy import table_policy_from_spec
    spec = {"epsilon": 1.0, "delta": 1e-6, "columns": {"a": {"type": "integer", "min": 0,
                                                             "max": 3}}}
    spec.update(change)
    with pytest.raises(PolicyError, match=msg):
        table_policy_from_spec("t", spec)

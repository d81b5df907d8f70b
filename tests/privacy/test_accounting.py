"""Exact privacy arithmetic: conversion, validation, composition and budget checks."""

from __future__ import annotations

import dataclasses
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from dpsql.noise.accounting import (
    MAX_EPSILON,
    MIN_EPSILON,
    PrivacyCost,
    check_budget,
    fraction_from_text,
    fraction_to_text,
    to_exact,
    validate_delta,
    validate_epsilon,
)
from dpsql.errors import BudgetExceededError, PrivacyParameterError


def eps(value) -> PrivacyCost:
    return PrivacyCost(value, 0)


# --- to_exact ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    (0.1, Fraction(1, 10)),
    (0.3, Fraction(3, 10)),
    (1e-4, Fraction(1, 10_000)),
    (3, Fraction(3)),
    (Fraction(2, 7), Fraction(2, 7)),
    (Decimal("0.125"), Fraction(1, 8)),
    (Decimal("1e-6"), Fraction(1, 10**6)),
    (np.float64(0.1), Fraction(1, 10)),
    (np.int64(4), Fraction(4)),
])
def test_to_exact_converts_through_shortest_repr(value, expected):
    result = to_exact(value, "epsilon")
    assert type(result) is Fraction
    assert result == expected


@pytest.mark.parametrize("value, fragment", [
    (True, "bool"), (False, "bool"), ("1", "str"), (None, "NoneType"), ([0.1], "list"),
    (float("nan"), "finite"), (float("inf"), "finite"), (-math.inf, "finite"),
    (Decimal("NaN"), "finite"), (Decimal("Infinity"), "finite"),
])
def test_to_exact_refuses_non_numbers_and_non_finite(value, fragment):
    with pytest.raises(PrivacyParameterError, match="my_param") as info:
        to_exact(value, "my_param")
    assert fragment in str(info.value)


# --- validation -------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [0, -1, 0.0, float("nan"), math.inf, -math.inf, 5e-324,
                                 1e-10, "1", True, None, 101, 1e300, Fraction(-1, 2)])
def test_validate_epsilon_refuses(bad):
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        validate_epsilon(bad)


def test_tiny_epsilon_message_states_the_allowed_range():
    with pytest.raises(PrivacyParameterError, match="allowed range") as info:
        validate_epsilon(5e-324)
    assert "1e-09" in str(info.value) and "100" in str(info.value)


def test_large_epsilon_message_says_why():
    with pytest.raises(PrivacyParameterError, match="no meaningful privacy"):
        validate_epsilon(100.5)


def test_validate_epsilon_bounds_are_inclusive_and_exact():
    assert validate_epsilon(MIN_EPSILON) == MIN_EPSILON
    assert validate_epsilon(1e-9) == MIN_EPSILON  # the float 1e-9 reads as exactly 1/10^9
    assert validate_epsilon(100) == MAX_EPSILON
    assert validate_epsilon(0.5) == Fraction(1, 2)
    with pytest.raises(PrivacyParameterError):
        validate_epsilon(MIN_EPSILON - Fraction(1, 10**30))
    with pytest.raises(PrivacyParameterError):
        validate_epsilon(MAX_EPSILON + Fraction(1, 10**30))


def test_validate_epsilon_uses_the_given_name():
    with pytest.raises(PrivacyParameterError, match="epsilon of table t"):
        validate_epsilon(-1, name="epsilon of table t")


@pytest.mark.parametrize("bad", [-0.1, 1, 1.0, 1.5, float("nan"), math.inf, "0.1", True,
                                 None])
def test_validate_delta_refuses(bad):
    with pytest.raises(PrivacyParameterError, match="delta"):
        validate_delta(bad)


@pytest.mark.parametrize("good, expected", [
    (0, Fraction(0)), (1e-6, Fraction(1, 10**6)), (0.999, Fraction(999, 1000)),
    (Decimal("1e-12"), Fraction(1, 10**12)),
])
def test_validate_delta_accepts(good, expected):
    assert validate_delta(good) == expected


# --- PrivacyCost ------------------------------------------------------------------------------

def test_privacy_cost_is_frozen_exact_and_composes():
    a = PrivacyCost(0.1, 1e-6)
    b = PrivacyCost(Fraction(1, 5), Decimal("2e-6"))
    assert a.epsilon == Fraction(1, 10) and a.delta == Fraction(1, 10**6)
    total = a + b
    assert total == PrivacyCost(Fraction(3, 10), Fraction(3, 10**6))
    assert PrivacyCost.zero() + a == a
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.epsilon = Fraction(1)  # type: ignore[misc]
    with pytest.raises(TypeError):
        a + 1  # type: ignore[operator]


def test_privacy_cost_refuses_bad_coordinates():
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        PrivacyCost(-0.1, 0)
    with pytest.raises(PrivacyParameterError, match="delta"):
        PrivacyCost(0.1, -1e-9)
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        PrivacyCost(float("nan"), 0)


def test_privacy_cost_str_and_fits_within():
    cost = PrivacyCost(0.3, 1e-6)
    assert str(cost) == "(epsilon=0.3, delta=1e-06)"
    assert cost.fits_within(PrivacyCost(0.3, 1e-6))
    assert cost.fits_within(PrivacyCost(1, 1e-5))
    assert not cost.fits_within(PrivacyCost(0.29, 1))
    assert not cost.fits_within(PrivacyCost(1, 9e-7))
    assert "exactly 1/3" in str(PrivacyCost(Fraction(1, 3), 0))


# --- budget checks ----------------------------------------------------------------------------

def test_exact_boundary_point_one_plus_point_two_then_point_three():
    limit = eps(0.6)
    spent = eps(0.1) + eps(0.2)
    assert spent.epsilon == Fraction(3, 10)  # with floats, 0.1 + 0.2 != 0.3
    check_budget("t", spent, eps(0.3), limit)  # lands exactly on the limit: allowed
    just_above = math.nextafter(0.3, 1)
    with pytest.raises(BudgetExceededError) as info:
        check_budget("t", spent, eps(just_above), limit)
    error = info.value
    assert error.table == "t" and error.quantity == "epsilon"
    assert error.spent == Fraction(3, 10)
    assert error.requested == Fraction(repr(just_above))
    assert error.limit == Fraction(3, 5)
    assert "nothing was charged" in str(error)


def test_ten_thousand_charges_of_1e_minus_4_sum_to_exactly_one():
    spent = PrivacyCost.zero()
    for _ in range(10_000):
        check_budget("t", spent, eps(1e-4), eps(1))
        spent = spent + eps(1e-4)
    assert spent.epsilon == 1
    with pytest.raises(BudgetExceededError):
        check_budget("t", spent, eps(1e-4), eps(1))
    assert sum([1e-4] * 10_000) != 1.0  # the float sum would have drifted


def test_delta_budget_is_checked_too():
    limit = PrivacyCost(10, 1e-5)
    spent = PrivacyCost(1, 6e-6)
    check_budget("people", spent, PrivacyCost(1, 4e-6), limit)
    with pytest.raises(BudgetExceededError) as info:
        check_budget("people", spent, PrivacyCost(1, 4.000001e-6), limit)
    assert info.value.quantity == "delta"
    assert info.value.spent == Fraction(6, 10**6)
    assert info.value.requested == Fraction("4.000001e-6")
    assert info.value.limit == Fraction(1, 10**5)


def test_check_budget_refuses_non_costs():
    with pytest.raises(TypeError):
        check_budget("t", PrivacyCost.zero(), 0.1, eps(1))  # type: ignore[arg-type]


# --- storage as text --------------------------------------------------------------------------

@pytest.mark.parametrize("value", [Fraction(3, 10), Fraction(0), Fraction(1, 10**30),
                                   Fraction(-7, 3), Fraction(10**40 + 1, 3)])
def test_fraction_text_round_trip(value):
    text = fraction_to_text(value)
    assert text == f"{value.numerator}/{value.denominator}"
    assert fraction_from_text(text) == value


def test_fraction_to_text_accepts_what_to_exact_accepts():
    assert fraction_to_text(0.1) == "1/10"
    assert fraction_to_text(2) == "2/1"
    with pytest.raises(PrivacyParameterError):
        fraction_to_text(float("nan"))


@pytest.mark.parametrize("bad", ["", "0.1", "1/0", "1/-2", "a/b", "1/2/3", "1 / 2", None])
def test_fraction_from_text_refuses_malformed(bad):
    with pytest.raises(PrivacyParameterError):
        fraction_from_text(bad)  # type: ignore[arg-type]

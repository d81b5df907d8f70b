"""The accountant: basic composition or zCDP, whichever is smaller; the same for the budget
check and the ledger."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import pytest

from dpsql.noise.composition import Spend, compose, zcdp_epsilon
from dpsql.errors import BudgetExceededError
from dpsql.noise.samplers import SeededTestSampler

from .conftest import make_adult_db, snapshot

Q = "SELECT COUNT(*) FROM adult WHERE sex = 'Female'"


def _reference_epsilon(rho: float, delta: float) -> float:
    """CKS 2020's conversion minimised over α with 30-digit mpmath (independent code)."""
    mpmath.mp.dps = 30
    rho, delta = mpmath.mpf(rho), mpmath.mpf(delta)

    def f(t):
        a = 1 + mpmath.exp(t)
        return a * rho + (mpmath.log(1 / delta) + (a - 1) * mpmath.log(1 - 1 / a)
                          - mpmath.log(a)) / (a - 1)

    best = min((mpmath.mpf(x) / 20 for x in range(-400, 401)), key=f)   # t in [-20, 20]
    fine = min((best + mpmath.mpf(k) / 20000 for k in range(-1000, 1001)), key=f)
    return float(f(fine))


@pytest.mark.parametrize("rho, delta", [(1e-4, 1e-6), (0.01, 1e-6), (0.5, 1e-9), (3.0, 1e-3),
                                        (1e-6, 1e-12)])
def test_conversion_is_never_below_the_true_minimum_and_close_to_it(rho, delta):
    ours = zcdp_epsilon(rho, delta)
    ref = _reference_epsilon(rho, delta)
    assert ours >= ref * (1 - 1e-12)            # any α is valid; ours must not undercut
    assert ours <= ref * (1 + 1e-6)             # and the minimiser finds the optimum
    # the classic bound ρ + 2√(ρ ln 1/δ) is never better than the exact conversion
    assert ours <= rho + 2 * math.sqrt(rho * math.log(1 / delta)) + 1e-12


def test_k_identical_gaussian_releases_cost_less_than_k_epsilon_from_k_4(tmp_path):
    db = make_adult_db(str(tmp_path / "a.duckdb"), reuse=False, epsilon=100, delta=1e-3,
                       sampler=SeededTestSampler(1))
    for k in range(1, 9):
        db.answer(Q, epsilon=0.5, delta=1e-6, strategy="identity")   # Gaussian pinned
        b = db.budget("adult")
        assert b["delta_spent"] == Fraction(k, 10**6)
        assert b["epsilon_spent"] <= Fraction(k, 2)              # never above basic
        if k >= 4:
            assert b["epsilon_spent"] < Fraction(k, 2) and b["accounting"] == "zcdp"


def test_large_per_release_epsilon_falls_back_to_basic_composition():
    spends = [Spend(Fraction(5), Fraction(1, 10**6), Fraction(20)) for _ in range(2)]
    total, method = compose(spends)
    assert method == "basic" and total.epsilon == 10


def test_pure_releases_alone_use_basic_composition():
    total, method = compose([Spend.of(Fraction(1, 10), Fraction(0), "laplace", None)] * 50)
    assert method == "basic" and total.epsilon == 5 and total.delta == 0


def test_a_release_without_a_recorded_rho_disables_the_zcdp_route():
    spends = [Spend.of(Fraction(1, 2), Fraction(1, 10**6), "gaussian", 0.001)] * 10
    assert compose(spends)[1] == "zcdp"
    assert compose(spends + [Spend.of(Fraction(1, 2), Fraction(1, 10**6), "gaussian",
                                      None)])[1] == "basic"


def test_the_budget_check_uses_the_same_accountant_as_the_ledger(tmp_path):
    """Eight releases of 0.5 fit a budget of 3 only because zCDP accounts them below 3; the
    check admits exactly what the reported total allows, and refuses past it."""
    db = make_adult_db(str(tmp_path / "a.duckdb"), reuse=False, epsilon=3, delta=1e-5,
                       sampler=SeededTestSampler(2))
    for _ in range(7):
        db.answer(Q, epsilon=0.5, delta=1e-6, strategy="identity")
    b = db.budget("adult")
    assert b["accounting"] == "zcdp" and b["epsilon_spent"] < 3 < Fraction(7, 2)
    n = 7
    while True:
        before = snapshot(db)
        try:
            db.answer(Q, epsilon=0.5, delta=1e-6, strategy="identity")
        except BudgetExceededError as exc:
            assert snapshot(db) == before
            assert exc.quantity in ("epsilon", "delta")
            break
        n += 1
        assert db.budget("adult")["epsilon_spent"] <= 3
        assert db.budget("adult")["delta_spent"] <= Fraction(1, 10**5)
    assert n >= 8                         # more releases than basic composition allows (6)

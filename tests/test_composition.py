"""The accountant (docs/accounting.md): a privacy filter that accepts a request when basic
composition (with δ_B − δ_z) or zCDP (converted at δ_z) covers every release so far plus it;
the same for the budget check and the ledger; old ledgers read conservatively."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import mpmath
import pytest
from scipy import integrate
from scipy.stats import norm

from dpsql.store import ledger
from dpsql.noise.composition import Budget, Spend, check, compose, zcdp_epsilon
from dpsql.errors import BudgetExceededError, PolicyError
from dpsql.noise.gaussian import analytic_gaussian_sigma, zcdp_rho
from dpsql.noise.samplers import SeededTestSampler
from dpsql.policy.policy import TablePolicy, table_policy_from_spec

from tests.conftest import ADULT_POLICY, make_adult_db, snapshot

Q = "SELECT COUNT(*) FROM adult WHERE sex = 'Female'"
F = Fraction
E5 = F(1, 10**5)
#: the worked example of docs/accounting.md: (1, 1e-5) with the default δ_z = δ_B / 2
TABLE = Budget(1, E5, E5 / 2)


def gaussian(epsilon, delta) -> Spend:
    """An analytic Gaussian release at (ε, δ), sensitivity 1, as the ledger records it."""
    sigma = analytic_gaussian_sigma(float(epsilon), float(delta), 1.0)
    return Spend.of(F(epsilon), F(delta), "gaussian", zcdp_rho(sigma, 1.0))


def laplace(epsilon) -> Spend:
    return Spend.of(F(epsilon), F(0), "laplace", None)


def accepted(spend: Spend, budget: Budget) -> int:
    """How many copies of ``spend`` the filter accepts one after the other."""
    done: list = []
    while compose(done + [spend], budget).fits:
        done.append(spend)
    return len(done)


def old_rule(spends, limit_epsilon, limit_delta) -> tuple[bool, Fraction]:
    """The rule before docs/accounting.md (for the migration and the counterexample): the
    smaller of Σεᵢ and ε(Σρᵢ, Σδᵢ), both at δ = Σδᵢ ≤ δ_B. Returns (fits, reported ε)."""
    eps = sum((s.epsilon for s in spends), F(0))
    delta = sum((s.delta for s in spends), F(0))
    total = eps
    if delta > 0 and all(s.rho is not None for s in spends):
        rho = sum((s.rho for s in spends), F(0))
        z = zcdp_epsilon(float(rho) * (1 + 1e-12), float(delta))
        if math.isfinite(z) and F(z) < eps:
            total = F(z)
    return total <= limit_epsilon and delta <= limit_delta, total


# --- the conversion ---------------------------------------------------------------------------

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


# --- the filter's decisions on worked examples (exact fractions) -----------------------------

def test_pure_releases_fill_the_basic_route_exactly_then_are_refused():
    """(1, 1e-5), δ_z = 5e-6: ten Laplace releases of 0.1 land exactly on ε_B = 1; the
    eleventh is refused by both routes (zCDP: ε(11/200, 5e-6) ≈ 1.43 > 1)."""
    ten = [laplace(F(1, 10))] * 10
    total = compose(ten, TABLE)
    assert total.basic_fits and total.basic.epsilon == 1 and total.basic.delta == 0
    assert total.method == "basic" and total.reported(TABLE).epsilon == 1
    assert total.rho == F(10, 200)
    with pytest.raises(BudgetExceededError) as info:
        check("t", ten, laplace(F(1, 10)), TABLE)
    assert info.value.quantity == "epsilon"
    assert (info.value.spent, info.value.requested, info.value.limit) == (1, F(1, 10), 1)
    assert compose(ten + [laplace(F(1, 10))], TABLE).zcdp_epsilon > 1


def test_many_small_pure_releases_benefit_from_zcdp():
    """100 releases of 0.01 fill basic composition; zCDP at δ_z takes 567 of them."""
    assert accepted(laplace(F(1, 100)), Budget(1, E5, 0)) == 100
    assert accepted(laplace(F(1, 100)), TABLE) == 567
    assert accepted(laplace(F(1, 100)), Budget(1, 0, 0)) == 100     # δ_B = 0: no zCDP


def test_a_single_full_budget_gaussian_needs_the_basic_share_of_delta():
    """The analyst asking the whole (1, 1e-5) in one Gaussian release: basic composition may
    charge only δ_B − δ_z = 5e-6, and zCDP converts its ρ at δ_z to ε ≈ 1.14 > 1, so it is
    refused, naming δ; (1, 5e-6) fits exactly; on a table with zcdp_delta = 0 the whole
    (1, 1e-5) fits exactly."""
    with pytest.raises(BudgetExceededError) as info:
        check("t", [], gaussian(1, E5), TABLE)
    assert info.value.quantity == "delta"
    assert (info.value.spent, info.value.requested, info.value.limit) == (0, E5, E5 / 2)
    assert "reserved for the zCDP accountant" in str(info.value)
    fits = check("t", [], gaussian(1, E5 / 2), TABLE)
    assert fits.basic_fits and fits.basic == (fits.basic.__class__(1, E5 / 2))
    assert not fits.zcdp_fits
    basic_only = check("t", [], gaussian(1, E5), Budget(1, E5, 0))
    assert basic_only.basic_fits and basic_only.basic.epsilon == 1
    assert basic_only.basic.delta == E5 and basic_only.zcdp_epsilon is None


def test_many_small_gaussian_releases_benefit_from_zcdp():
    """(0.1, 1e-7) Gaussian releases on (1, 1e-5): basic composition stops at 10; the zCDP
    route (ρ ≈ 0.00012 each, converted at δ_z = 5e-6) takes 97. The old rule's 100 were
    not a valid filter for (1, 1e-5) (see the counterexample below)."""
    small = gaussian(F(1, 10), F(1, 10**7))
    assert accepted(small, Budget(1, E5, 0)) == 10
    assert accepted(small, TABLE) == 97
    total = compose([small] * 97, TABLE)
    assert total.method == "zcdp" and not total.basic_fits
    assert total.reported(TABLE).delta == E5 / 2 and total.reported(TABLE).epsilon <= 1
    assert total.basic.delta == F(97, 10**7)      # the δᵢ are not what the zCDP route spends
    with pytest.raises(BudgetExceededError) as info:
        check("t", [small] * 97, small, TABLE)
    assert info.value.quantity == "epsilon" and info.value.limit == 1


def test_the_reported_total_is_basic_while_it_covers_every_release_then_zcdp():
    """(2, 1e-3), δ_z = 5e-4, Gaussian (0.5, 1e-6) releases: four are basic composition's
    (2, 4e-6); from the fifth on the zCDP route carries them, at (ε(Σρ, 5e-4), 5e-4)."""
    budget = Budget(2, F(1, 1000), F(1, 2000))
    one = gaussian(F(1, 2), F(1, 10**6))
    for k in range(1, 9):
        total = compose([one] * k, budget)
        assert total.fits
        reported = total.reported(budget)
        if k <= 4:
            assert total.method == "basic" and reported.epsilon == F(k, 2)
            assert reported.delta == F(k, 10**6)
        else:
            assert total.method == "zcdp" and reported.epsilon < 2 < F(k, 2)
            assert reported.delta == F(1, 2000) and reported.epsilon == total.zcdp_epsilon


def test_a_release_without_a_recorded_rho_closes_the_zcdp_route():
    spends = [Spend.of(F(1, 2), F(1, 10**6), "gaussian", 0.001)] * 10
    budget = Budget(3, F(1, 1000), F(1, 2000))
    assert compose(spends, budget).method == "zcdp"
    closed = compose(spends + [Spend.of(F(1, 2), F(1, 10**6), "gaussian", None)], budget)
    assert closed.rho is None and closed.zcdp_epsilon is None and not closed.fits


def test_large_per_release_epsilon_stays_with_basic_composition():
    spends = [Spend(F(5), F(1, 10**6), F(20)) for _ in range(2)]
    total = compose(spends, Budget(10, F(1, 10**5), F(1, 10**6)))
    assert total.method == "basic" and total.basic_fits and total.basic.epsilon == 10
    assert not total.zcdp_fits


def test_the_zcdp_route_rounds_against_the_spender():
    """δ_z is rounded down to a double and ρ up before the conversion, whose value is
    rounded up: the exact ε at the float inputs is never undercut."""
    rho, dz = F(1, 3), F(1, 3 * 10**6)             # neither is a double
    total = compose([Spend(F(1), F(0), rho)], Budget(10, F(1, 10**5), dz))
    assert total.rho == rho
    assert total.zcdp_epsilon >= F(_reference_epsilon(float(rho), float(dz))) * (1 - F(1, 10**12))


# --- the old rule is not a valid filter ------------------------------------------------------

def _gaussian_profile(eps: float, mu: float) -> float:
    """Exact hockey-stick divergence of N(μ, 1) from N(0, 1) at e^ε (any real ε)."""
    return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


def test_the_old_min_rule_lets_an_adaptive_analyst_exceed_the_tables_delta():
    """docs/accounting.md, "The old rule is not a filter for (ε_B, δ_B)": on (1, 1e-5) the
    analyst releases a Gaussian G₁ (μ₁ = 0.198, recorded (1, δ₁ ≈ 1.3e-8)). If its answer
    y₁ ≤ 2.5 it asks a (0, 1e-5 − δ₁) release that prints "leak" with probability δ under
    D and never under D' (basic composition accepts: Σε = 1, Σδ = 1e-5); otherwise a second
    Gaussian (μ₂ = 0.148) that zCDP accepts (ε(ρ₁ + ρ₂, 1e-5) = 1). The old rule accepts both
    branches, yet the transcript's hockey-stick divergence at e¹ is 1.22e-5 > 1e-5. The new
    filter refuses the leak branch (it needs more than δ_B − δ_z)."""
    eps_b, delta_b = 1.0, 1e-5
    lo, hi = 0.0, 1.0                       # the zCDP budget: ε(ρ_B, δ_B) = ε_B
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if zcdp_epsilon(mid, delta_b) <= eps_b else (lo, mid)
    mu = math.sqrt(2 * lo * (1 - 1e-9))
    mu1, cut = 0.8 * mu, 2.5
    mu2 = math.sqrt(mu * mu - mu1 * mu1)
    d1 = F(_gaussian_profile(eps_b, mu1)) * (1 + F(1, 10**6))  # G₁ recorded at (1, d1)
    leak_exact = E5 - d1
    leak = float(leak_exact)
    g1 = Spend(F(1), d1, F(mu1 * mu1 / 2))
    g2 = Spend(F(50), leak_exact, F(mu2 * mu2 / 2))  # its recorded ε is irrelevant here
    leak_release = Spend(F(0), leak_exact, None)
    assert old_rule([g1, leak_release], F(1), E5)[0]
    assert old_rule([g1, g2], F(1), E5)[0]

    # P = transcript under D (G₁ ~ N(μ₁, 1)), Q under D' (N(0, 1)); the event
    # {y₁ ≤ cut, leak} ∪ {y₁ > cut, (y₁, y₂) in the Gaussian's tail} alone has
    # P − e·Q above δ_B.
    branch_a = norm.cdf(cut - mu1) * leak   # Q(leak) = 0

    def tail(y1):
        loss1 = mu1 * y1 - mu1 * mu1 / 2
        return norm.pdf(y1 - mu1) * _gaussian_profile(eps_b - loss1, mu2)

    branch_b, _ = integrate.quad(tail, cut, cut + 40, limit=400, epsabs=1e-16)
    assert branch_a + branch_b > 1.2 * delta_b

    budget = Budget(F(1), E5, E5 / 2)
    with pytest.raises(BudgetExceededError) as info:
        check("t", [g1], leak_release, budget)
    assert info.value.quantity == "delta"


# --- policies: the δ split is fixed up front --------------------------------------------------

def _spec(**extra):
    return {"epsilon": 1, "delta": 1e-5, "columns": {"a": {"type": "integer", "min": 0,
                                                           "max": 1}}, **extra}


def test_policy_zcdp_delta_defaults_to_half_of_delta_and_round_trips():
    p = table_policy_from_spec("t", _spec())
    assert p.zcdp_delta == E5 / 2 and p.budget == Budget(1, E5, E5 / 2)
    assert TablePolicy.from_json(p.to_json()).zcdp_delta == E5 / 2
    q = table_policy_from_spec("t", _spec(zcdp_delta=1e-6))
    assert q.zcdp_delta == F(1, 10**6) and q.budget.basic_delta == F(9, 10**6)
    assert table_policy_from_spec("t", _spec(zcdp_delta=0)).zcdp_delta == 0
    assert table_policy_from_spec("t", dict(_spec(), delta=0)).zcdp_delta == 0
    for bad in (2e-5, -1e-9, "x"):
        with pytest.raises(PolicyError, match="zcdp_delta"):
            table_policy_from_spec("t", _spec(zcdp_delta=bad))


def test_a_policy_saved_before_the_split_reads_as_basic_composition_alone():
    p = table_policy_from_spec("t", _spec())
    raw = json.loads(p.to_json())
    del raw["zcdp_delta"]
    assert TablePolicy.from_json(json.dumps(raw)).zcdp_delta == 0


# --- through the ledger and real releases -----------------------------------------------------

def test_the_budget_check_uses_the_same_accountant_as_the_ledger(tmp_path):
    """Gaussian releases of (0.5, 1e-6) on (3, 1e-5): five fill basic composition's share of
    δ (5e-6); from the sixth the zCDP route carries them at δ_z = 5e-6, and the check admits
    exactly what the reported total allows (27 releases), refusing the next with nothing
    written."""
    db = make_adult_db(str(tmp_path / "a.duckdb"), reuse=False, epsilon=3, delta=1e-5,
                       sampler=SeededTestSampler(2))
    for k in range(1, 8):
        db.answer(Q, epsilon=0.5, delta=1e-6, strategy="identity")
        b = db.budget("adult")
        assert b["accounting"] == ("basic" if k <= 5 else "zcdp")
    assert b["epsilon_spent"] < 3 < F(7, 2) and b["delta_spent"] == F(1, 2 * 10**5)
    assert b["basic_epsilon"] == F(7, 2) and b["basic_delta"] == F(7, 10**6)
    n = 7
    while True:
        before = snapshot(db)
        try:
            db.answer(Q, epsilon=0.5, delta=1e-6, strategy="identity")
        except BudgetExceededError as exc:
            assert snapshot(db) == before
            assert exc.quantity == "epsilon"
            break
        n += 1
        b = db.budget("adult")
        assert b["epsilon_spent"] <= 3 and b["delta_spent"] == F(1, 2 * 10**5)
        assert b["epsilon_remaining"] == 3 - b["epsilon_spent"]
        assert b["delta_remaining"] == 0             # basic composition's δ is gone
    assert n == 27            # basic composition alone allows 6


def test_a_single_full_budget_gaussian_release(tmp_path):
    """A table protected with zcdp_delta = 0 takes the whole (1, 1e-5) in one Gaussian
    release; with the default split, the analyst asks (1, 5e-6) instead."""
    whole = make_adult_db(str(tmp_path / "w.duckdb"), reuse=False, zcdp_delta=0,
                          sampler=SeededTestSampler(3))
    whole.answer(Q, epsilon=1, delta=1e-5, strategy="identity")
    b = whole.budget("adult")
    assert (b["epsilon_spent"], b["delta_spent"], b["epsilon_remaining"],
            b["delta_remaining"]) == (1, E5, 0, 0)
    whole.close()
    split = make_adult_db(str(tmp_path / "s.duckdb"), reuse=False,
                          sampler=SeededTestSampler(3))
    before = snapshot(split)
    with pytest.raises(BudgetExceededError, match="reserved for the zCDP accountant"):
        split.answer(Q, epsilon=1, delta=1e-5, strategy="identity")
    assert snapshot(split) == before
    split.answer(Q, epsilon=1, delta=5e-6, strategy="identity")
    b = split.budget("adult")
    assert (b["epsilon_spent"], b["delta_spent"], b["accounting"]) == (1, E5 / 2, "basic")
    assert b["delta_remaining"] == 0 and b["zcdp_delta"] == E5 / 2
    split.close()


def _make_legacy(db) -> None:
    """Rewrite the stored policy as an earlier dpsql wrote it (no zcdp_delta)."""
    with db.db.connect() as con:
        (text,) = con.execute("SELECT policy FROM dpsql.policies WHERE table_name = 'adult'"
                              ).fetchone()
        raw = json.loads(text)
        del raw["zcdp_delta"]
        con.execute("UPDATE dpsql.policies SET policy = ? WHERE table_name = 'adult'",
                    [json.dumps(raw)])


def test_old_ledgers_open_and_never_get_more_budget_than_under_the_old_rule(tmp_path):
    """A ledger the old rule filled past basic composition (seven Gaussian releases of 0.5 on
    (3, 1e-5): Σε = 3.5, old reported total ≈ 1.39) opens; under the new rule it reads as
    basic composition alone, with no ε left, and refuses even a tiny pure release. The
    remaining budget is never above the old rule's, coordinate by coordinate."""
    path = str(tmp_path / "old.duckdb")
    db = make_adult_db(path, reuse=False, epsilon=3, delta=1e-5, zcdp_delta=0,
                       sampler=SeededTestSampler(4))
    for _ in range(6):
        db.answer(Q, epsilon=0.5, delta=1e-6, strategy="identity")
    with db.db.connect() as con:        # the seventh, as the old rule admitted it
        spends = ledger.spends(con, "adult")
        row = con.execute("SELECT * FROM dpsql.ledger WHERE release_id = 6").fetchdf()
        row["release_id"] = 7
        con.register("seventh", row)
        con.execute("INSERT INTO dpsql.ledger SELECT * FROM seventh")
    spends = spends + spends[:1]
    fits, old_eps = old_rule(spends, F(3), E5)
    assert fits and old_eps < 3 < F(7, 2)
    _make_legacy(db)
    db.close()

    db = make_reopened(path)
    b = db.budget("adult")
    assert b["zcdp_delta"] == 0 and b["accounting"] == "basic"
    assert b["epsilon_spent"] == F(7, 2) and b["delta_spent"] == F(7, 10**6)
    assert b["epsilon_remaining"] == 0 <= 3 - old_eps
    assert b["delta_remaining"] == E5 - F(7, 10**6)             # as under the old rule
    before = snapshot(db)
    with pytest.raises(BudgetExceededError):
        db.answer(Q, epsilon=1e-9, delta=0)
    assert snapshot(db) == before
    db.close()


def make_reopened(path):
    import dpsql

    return dpsql.connect(path, reuse=False, sampler=SeededTestSampler(5))


def test_old_ledgers_within_basic_composition_keep_working(tmp_path):
    """A legacy table whose releases basic composition covers keeps the old numbers (the old
    rule reported the same Σε there) and goes on under basic composition with all of δ_B."""
    path = str(tmp_path / "old2.duckdb")
    db = make_adult_db(path, reuse=False, sampler=SeededTestSampler(6))
    db.answer(Q, epsilon=0.25, delta=1e-6, strategy="identity")
    _make_legacy(db)
    db.close()
    db = make_reopened(path)
    b = db.budget("adult")
    assert (b["epsilon_spent"], b["delta_spent"], b["epsilon_remaining"],
            b["delta_remaining"]) == (F(1, 4), F(1, 10**6), F(3, 4), F(9, 10**6))
    db.answer(Q, epsilon=0.75, delta=9e-6, strategy="identity")     # lands exactly
    assert db.budget("adult")["delta_remaining"] == 0
    db.close()


def test_reprotecting_a_legacy_table_with_charges_keeps_basic_composition(tmp_path):
    """Re-protecting (replace=True) a legacy table that has charges does not switch on the
    zCDP route under its old releases: zcdp_delta stays 0 (docs/accounting.md)."""
    path = str(tmp_path / "old3.duckdb")
    db = make_adult_db(path, reuse=False, sampler=SeededTestSampler(7))
    db.answer(Q, epsilon=0.25, delta=1e-6, strategy="identity")
    _make_legacy(db)
    db.protect("adult", dict(ADULT_POLICY, epsilon=2), replace=True)
    assert db.policies()["adult"].zcdp_delta == 0
    assert db.budget("adult")["epsilon_remaining"] == F(7, 4)
    db.close()


def _script(n, epsilon, delta):
    lines = [f"SET dpsql.epsilon = {epsilon};", f"SET dpsql.delta = {delta};",
             "SET dpsql.strategy = 'identity';"]
    for i in range(n):
        lines += [f"SET dpsql.release = 'w{i}';",
                  f"SELECT COUNT(*) AS c{i} FROM adult WHERE age < {30 + i};"]
    return "\n".join(lines) + "\n"


def test_a_script_of_many_small_gaussian_workloads_is_checked_by_the_same_filter(tmp_path):
    """Twelve Gaussian workloads of (0.1, 1e-7) on (1, 1e-5): more than basic composition
    allows (10), within the zCDP route; the script's pre-check admits them all. Two of
    (0.9, 1e-7) fit neither route: refused before anything is charged."""
    from dpsql.interfaces import scripts

    assert not compose([gaussian(F(9, 10), F(1, 10**7))] * 2, TABLE).fits
    db = make_adult_db(str(tmp_path / "s.duckdb"), reuse=False, sampler=SeededTestSampler(8))
    outcomes = scripts.run(db, _script(12, 0.1, 1e-7))
    assert len(outcomes) == 12 and len(db.ledger()) == 12
    b = db.budget("adult")
    assert b["accounting"] == "zcdp" and b["epsilon_spent"] <= 1
    assert b["basic_epsilon"] == F(12, 10)
    db.close()
    db = make_adult_db(str(tmp_path / "t.duckdb"), reuse=False, sampler=SeededTestSampler(9))
    before = snapshot(db)
    with pytest.raises(BudgetExceededError, match="total of workloads"):
        scripts.run(db, _script(2, 0.9, 1e-7))
    assert snapshot(db) == before
    db.close()

"""Budget arithmetic games and partial batches (items 2 and 3 of the adversarial suite):
exact sums and boundaries through the ledger, no positive charge recorded as zero, and a
batch with one bad statement (or over budget) releasing nothing on any interface. Helpers
in ``hostile.py``."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import duckdb
import pytest

from dpsql.store import ledger
from dpsql.noise.accounting import (MIN_EPSILON, PrivacyCost, fraction_from_text, fraction_to_text,
                              to_exact)
from dpsql.errors import BudgetExceededError, DpsqlError
from dpsql.policy.policy import table_policy_from_spec

from tests.conftest import snapshot
from tests.privacy.hostile import build_db, state, via_dbapi, via_script, via_shell


# =========================================================================== item 2
# 0.1 + 0.2 then 0.3 against 0.6, one ulp more, and 10,000 x 1e-4 are covered at the
# accounting level by test_accounting.py; here the same boundaries through the ledger and
# real releases, and tiny positive charges.

def _charge(con, policy, epsilon, delta=0):
    request = ledger.Charge(table=policy.table, cost=PrivacyCost(epsilon, delta),
                            mechanism="gaussian", strategy="identity", calibration="analytic",
                            sigma=1.0, sensitivity=1.0, rho=None, n_queries=1, n_cells=1,
                            expected_rmse=1.0, sql_text="SELECT COUNT(*) FROM t",
                            result_tables=[], private=True)
    return ledger.charge(con, policy, request)


def test_ledger_sums_ten_thousand_charges_exactly(tmp_path):
    """Passing: 9,999 stored charges of 1e-4 plus one through ledger.charge land exactly on
    a budget of 1 (read back from the ledger's text), and the smallest further charge
    (5e-324) is refused with nothing written. (Basic composition alone, zcdp_delta = 0: on
    the default split the zCDP route would account these 10,000 pure charges at ε ≈ 0.06.)"""
    policy = table_policy_from_spec("t", {"epsilon": 1, "delta": 1e-6, "zcdp_delta": 0,
                                          "columns": {"a": {"type": "integer", "min": 0,
                                                            "max": 1}}})
    con = duckdb.connect(str(tmp_path / "l.duckdb"))
    ledger.ensure_schema(con)
    con.execute(
        "INSERT INTO dpsql.ledger (release_id, table_name, epsilon, delta, epsilon_exact, "
        "delta_exact, mechanism, strategy, n_queries, n_cells, sql_text, private, status) "
        "SELECT i, 't', 1e-4, 0, ?, '0/1', 'gaussian', 'identity', 1, 1, 'x', true, "
        "'released' FROM range(1, 10000) r(i)", [fraction_to_text(1e-4)])
    assert ledger.spent(con, "t").epsilon == Fraction(9999, 10000)
    _charge(con, policy, 1e-4)
    assert ledger.spent(con, "t").epsilon == 1
    with pytest.raises(BudgetExceededError, match="nothing was charged"):
        _charge(con, policy, 5e-324)
    assert con.execute("SELECT count(*) FROM dpsql.ledger").fetchone() == (10_000,)
    con.close()


def test_boundary_through_the_ledger():
    """Passing: against a budget of 0.6, ledger.charge (the real check-and-charge) accepts
    0.1 and 0.2, refuses 0.3 plus one ulp without writing anything, then accepts exactly
    0.3, after which the budget is exactly spent. (The charges carry no zCDP rho, so every
    accountant must use basic composition, the binding case; the same boundaries through real
    releases are test_release.py::test_budget_exact_fit_then_refusal_charges_nothing.)"""
    policy = table_policy_from_spec("t", {"epsilon": 0.6, "delta": 1e-6, "columns": {
        "a": {"type": "integer", "min": 0, "max": 1}}})
    con = duckdb.connect()
    ledger.ensure_schema(con)
    _charge(con, policy, 0.1)
    _charge(con, policy, 0.2)
    with pytest.raises(BudgetExceededError) as info:
        _charge(con, policy, math.nextafter(0.3, 1))
    assert info.value.spent == Fraction(3, 10)
    assert con.execute("SELECT count(*) FROM dpsql.ledger").fetchone() == (2,)
    _charge(con, policy, 0.3)
    assert ledger.spent(con, "t").epsilon == Fraction(3, 5)
    con.close()


@pytest.mark.parametrize("epsilon, delta", [
    (MIN_EPSILON, 5e-324), (1e-9, 1e-300), (Fraction(1, 3), Fraction(1, 7 * 10**6)),
    (Decimal("1e-9"), Decimal("1e-200")), (1e-9, Fraction(1, 10**400))])
def test_no_positive_charge_is_recorded_as_zero(spend, epsilon, delta):
    """A tiny or non-decimal charge on the Gaussian path (strategy `identity`). Passing: it
    is either refused with nothing charged, or its ledger row holds exactly the requested,
    positive amounts (num/den text, read as dpsql reads parameters: floats through their
    shortest repr), and the reported spent total never goes down and never exceeds the
    exact sum of the ledger (basic composition bounds every accountant)."""
    db = spend.session
    eps, dlt = to_exact(epsilon, "epsilon"), to_exact(delta, "delta")
    assert fraction_from_text(fraction_to_text(epsilon)) == eps > 0
    before = snapshot(db)
    spent = db.budget("adult")
    try:
        db.answer("SELECT COUNT(*) FROM adult", epsilon=epsilon, delta=delta,
                  strategy="identity", reuse=False)
    except DpsqlError as exc:
        assert "delta" in str(exc) and snapshot(db) == before
        return
    entry = db.ledger()[-1]
    with db.db.connect() as con:
        rows = con.execute("SELECT release_id, epsilon_exact, delta_exact FROM dpsql.ledger"
                           ).fetchall()
    exact = {r[0]: (fraction_from_text(r[1]), fraction_from_text(r[2])) for r in rows}
    assert exact[entry["release_id"]] == (eps, dlt) and entry["epsilon"] > 0
    after = db.budget("adult")
    assert after["epsilon_spent"] >= spent["epsilon_spent"] and after["delta_spent"] > 0
    assert after["epsilon_spent"] <= sum(e for e, _ in exact.values())
    assert after["delta_spent"] == sum(d for _, d in exact.values())


# =========================================================================== item 3
# Python API: test_release.py::test_batch_with_one_bad_statement_releases_nothing and
# ::test_batch_over_budget_releases_nothing; scripts: test_scripts.py::
# test_error_in_workload_two_is_found_before_anything_is_spent; DB-API executemany:
# test_dbapi.py::test_executemany_refusals_charge_nothing. Added: one bad statement among
# good ones through DB-API execute, the shell and a script; over budget in the shell.

@pytest.mark.parametrize("bad", [
    "SELECT COUNT(*) FROM adult WHERE nonsense = 1",
    "SELECT SUM(sex) FROM adult",
    "SELECT COUNT(*) FROM adult WHERE hours_per_week > 30",
    "DROP TABLE adult",
])
def test_one_bad_statement_releases_nothing_on_any_interface(mem, spare_db, no_charge, tmp_path,
                                                             capsys, bad):
    """Passing: a batch of two good statements and one bad one is refused whole by the
    DB-API, the shell and a script; the error names the bad statement's problem; nothing is
    charged and no result table appears."""
    batch = f"SELECT COUNT(*) FROM adult;\n{bad};\nSELECT sex, COUNT(*) FROM adult GROUP BY sex;"
    before = snapshot(mem.session)
    messages = [via_dbapi(mem, batch), via_shell(capsys, spare_db, batch),
                via_script(capsys, tmp_path, spare_db,
                           "SET dpsql.epsilon = 0.1; SET dpsql.delta = 1e-6; " + batch)]
    for out in messages:
        assert out.refused and "line 2" in out.message, out.message
    assert snapshot(mem.session) == before


def test_over_budget_batch_in_the_shell_releases_nothing(tmp_path, capsys):
    """Passing: a shell submission costing more than the remaining budget is refused whole
    with the exact figures; nothing is charged."""
    path = build_db(str(tmp_path / "o.duckdb"), epsilon=0.5, delta=1e-5)
    before = state(path)
    out = via_shell(capsys, path, "SELECT COUNT(*) FROM adult; SELECT COUNT(*) FROM adult "
                    "WHERE sex = 'Male';", "--epsilon", "0.6", "--delta", "1e-6")
    assert out.refused and "budget exceeded" in out.message and "limit 0.5" in out.message
    assert state(path) == before

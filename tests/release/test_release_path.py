"""The one release path (dpsql/release/path.py): every mechanism goes plan → check result
names → check-and-charge → measure → infer → write through it, and a refusal at any step
before the charge charges nothing."""

from __future__ import annotations

import ast
import copy
import os
import signal
from fractions import Fraction

import pytest

import dpsql
from dpsql.engines import duckdb as data_engine
from dpsql.errors import BudgetExceededError, DpsqlError, UnsupportedQueryError
from dpsql.noise.samplers import SeededTestSampler
from dpsql.release import path
from dpsql.store import database, ledger

from ..conftest import ADULT_POLICY, ROOT, make_adult_db, snapshot

METRIC = {"epsilon": 5, "columns": {"age": {"weight": 0.1}, "sex": {"different": 1}}}
SEX = "SELECT sex, COUNT(*) FROM adult GROUP BY sex"
TWO = SEX + "; SELECT COUNT(*) FROM adult WHERE age BETWEEN 20 AND 30"

#: every mechanism: (request, ledger mechanism). ``reuse`` answers from a release made first.
MECHANISMS = {
    "gaussian": (dict(sql=TWO, epsilon=0.5, delta=1e-6, strategy="identity"), "gaussian"),
    "laplace": (dict(sql=TWO, epsilon=0.5, delta=0), "laplace"),
    "reuse": (dict(sql=SEX, epsilon=0.5, delta=0), "reuse"),
    "accuracy": (dict(sql=TWO, target_rmse=40, delta=1e-6, confirm=True), "laplace"),
    "mwem": (dict(sql=TWO, epsilon=0.5, delta=0, strategy="mwem(rounds=2)"), "mwem"),
    "dx_laplace": (dict(sql=TWO, epsilon=1, delta=0, model="metric"), "dx_laplace"),
    "dx_mwem": (dict(sql=TWO, epsilon=1, delta=0, model="metric",
                     strategy="dx_mwem(rounds=2)"), "dx_mwem"),
    "dx_smalldb": (dict(sql=SEX, epsilon=1, delta=0, model="metric",
                        strategy="dx_smalldb(size=4)"), "dx_smalldb"),
}


@pytest.fixture
def db(tmp_path):
    db = make_adult_db(str(tmp_path / "a.duckdb"), sampler=SeededTestSampler(3))
    policy = copy.deepcopy(ADULT_POLICY)
    policy.update(epsilon=4, delta=1e-5, metric=METRIC, rows=48842)
    db.protect("adult", policy, replace=True)
    yield db
    db.close()


def _ask(db, kind, **more):
    request, _ = MECHANISMS[kind]
    request = dict(request, **more)
    if kind == "reuse":          # the past release whose measurements answer it
        db.answer(SEX, epsilon=1, delta=0)
    return request.pop("sql"), request


def _count(monkeypatch, module, name, calls=None):
    """Record each call of ``module.name`` in ``calls`` (returned)."""
    calls = [] if calls is None else calls
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("kind", list(MECHANISMS))
def test_every_mechanism_goes_through_the_one_path(db, monkeypatch, kind):
    """Passing: one answer calls the path's plan step, its charge, its write step and the
    ledger's release mark exactly once each, in that order; the ledger records the
    mechanism."""
    sql, request = _ask(db, kind)
    calls = _count(monkeypatch, path, "mechanism")
    for module, name in ((ledger, "charge"), (path, "write_results"),
                         (ledger, "mark_released")):
        _count(monkeypatch, module, name, calls)
    release = db.answer(sql, **request)
    assert calls == ["mechanism", "charge", "write_results", "mark_released"]
    entry = db.ledger()[-1]
    assert entry["mechanism"] == MECHANISMS[kind][1] and entry["status"] == "released"
    assert release.release_id == entry["release_id"] and release.tables == entry["result_tables"]


@pytest.mark.parametrize("kind", list(MECHANISMS))
def test_explain_is_the_plan_alone(db, monkeypatch, kind):
    sql, request = _ask(db, kind)
    request.pop("confirm", None)
    before = snapshot(db)
    calls = _count(monkeypatch, path, "write_results", _count(monkeypatch, ledger, "charge"))
    monkeypatch.setattr(data_engine, "data_vector", _boom)
    db.explain(sql, **request)
    assert calls == [] and snapshot(db) == before


@pytest.mark.parametrize("kind", list(MECHANISMS))
def test_named_release_of_each_mechanism_is_idempotent(db, kind):
    sql, request = _ask(db, kind, name=f"n-{kind}")
    first = db.answer(sql, **request)
    before = snapshot(db)
    again = db.answer(sql, **request)
    assert again.reused and snapshot(db) == before
    assert [r.rows for r in again.results] == [r.rows for r in first.results]


def _boom(*args, **kwargs):
    raise AssertionError("the data was read before the charge")


REFUSALS = {
    # step: (mechanism, change to the request, error)
    "plan": [("laplace", dict(strategy="no_such_strategy"), DpsqlError),
             ("mwem", dict(delta=1e-6), DpsqlError),
             ("accuracy", dict(confirm=False), DpsqlError),
             ("dx_smalldb", dict(sql="SELECT COUNT(*) FROM adult"), DpsqlError),
             ("dx_laplace", dict(strategy="dx_laplace(x=1)"), DpsqlError)],
    "result names": [(kind, dict(sql_prefix="CREATE TABLE adult2 AS "), UnsupportedQueryError)
                     for kind in ("gaussian", "mwem", "dx_laplace", "reuse")],
    "budget": [("gaussian", dict(epsilon=5), BudgetExceededError),
               ("mwem", dict(epsilon=5), BudgetExceededError),
               ("dx_mwem", dict(epsilon=6), BudgetExceededError),
               ("dx_laplace", dict(epsilon=6), BudgetExceededError)],
}


@pytest.mark.parametrize("step, kind, change, error", [
    (step, *case) for step, cases in REFUSALS.items() for case in cases])
def test_a_refusal_before_the_charge_charges_nothing(db, monkeypatch, step, kind, change,
                                                     error):
    """Passing: refused at the plan, the result names or the budget check, a request of any
    mechanism leaves the ledger and the tables as they were, and never reads the data."""
    sql, request = _ask(db, kind)
    change = dict(change)
    prefix = change.pop("sql_prefix", "")
    sql = change.pop("sql", sql)
    if prefix:
        with db.db.connect() as con:
            con.execute("CREATE TABLE adult2 AS SELECT 1 AS x")   # not dpsql's
        sql = prefix + sql.split(";")[0]
    request.update(change)
    before = snapshot(db)
    monkeypatch.setattr(data_engine, "data_vector", _boom)
    calls = _count(monkeypatch, ledger, "charge")
    with pytest.raises(error):
        db.answer(sql, **request)
    assert calls == [] and snapshot(db) == before


@pytest.mark.parametrize("kind", ["gaussian", "mwem", "dx_laplace", "dx_smalldb"])
def test_a_charge_the_ledger_refuses_charges_nothing(db, monkeypatch, kind):
    """The early budget check skipped: the atomic check-and-charge itself refuses."""
    sql, request = _ask(db, kind, epsilon=6)
    monkeypatch.setattr(path, "_check_budget", lambda con, plan: None)
    monkeypatch.setattr(data_engine, "data_vector", _boom)
    before = snapshot(db)
    with pytest.raises(BudgetExceededError):
        db.answer(sql, **request)
    assert snapshot(db) == before


@pytest.mark.parametrize("kind", list(MECHANISMS))
def test_ctrl_c_after_the_charge_completes_every_mechanism(db, monkeypatch, kind):
    sql, request = _ask(db, kind)
    real = path.write_results

    def write_after_sigint(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)     # Ctrl-C arrives after the charge
        return real(*args, **kwargs)

    monkeypatch.setattr(path, "write_results", write_after_sigint)
    with pytest.raises(dpsql.InterruptedAfterRelease) as info:
        db.answer(sql, **request)
    entry = db.ledger()[-1]
    assert entry["status"] == "released" and info.value.release.tables == entry["result_tables"]


@pytest.mark.parametrize("kind", list(MECHANISMS))
def test_a_failed_write_rolls_back_every_table_and_keeps_the_charge(db, monkeypatch, kind):
    """Every result table is written, then marking the release fails. Passing: the
    transaction is rolled back (no result table remains), the charge stays (`charged`)."""
    sql, request = _ask(db, kind)
    n = len(db.ledger())

    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(ledger, "mark_released", fail)
    with pytest.raises(RuntimeError, match="disk full"):
        db.answer(sql, **request)
    monkeypatch.undo()
    entries = db.ledger()
    assert len(entries) == n + 1 and entries[-1]["status"] == "charged"
    with db.db.connect() as con:
        assert not any(database.table_exists(con, t) for t in entries[-1]["result_tables"])


RELEASE = ROOT / "dpsql" / "release"


@pytest.mark.parametrize("module", ["matrix.py", "adaptive.py", "mechanism.py"])
def test_mechanisms_never_touch_the_ledger_tables_or_kernel(module):
    """Only the path charges, writes and marks releases: the mechanisms' modules import
    neither the ledger, the database helpers nor the kernel."""
    tree = ast.parse((RELEASE / module).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imported.add(node.module)
            imported.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
    assert not imported & {"dpsql.store.ledger", "dpsql.store.database", "dpsql.kernel",
                           "dpsql.engines.duckdb", "dpsql.store.results.build_columns"}
    assert not {m for m in imported if m.startswith("dpsql.kernel.")}   # its modules too


def test_every_metric_epsilon_is_exact(db):
    sql, request = _ask(db, "dx_laplace", epsilon=Fraction(1, 3))
    db.answer(sql, **request)
    assert db.budget("adult")["metric_epsilon_spent"] == Fraction(1, 3)


def _params(eps, delta, strategy, model="dp"):
    return (f'{{"epsilon": "{eps}", "delta": "{delta}", "strategy": "{strategy}", '
            f'"calibration": "analytic", "model": "{model}"}}')


#: the request each mechanism records with its charge, as before the one path (byte for byte)
RECORDED = {
    "gaussian": (_params("1/2", "1/1000000", "identity"), "identity", "analytic"),
    "laplace": (_params("1/2", "0/1", "auto"), None, None),
    "reuse": (_params("1/2", "0/1", "auto"), "reuse", None),
    "mwem": (_params("1/2", "0/1", "mwem(rounds=2)"), "mwem(rounds=2)", None),
    "dx_laplace": (_params("1/1", "0/1", "auto", "metric"), "dx_laplace", None),
    "dx_mwem": (_params("1/1", "0/1", "dx_mwem(rounds=2)", "metric"), "dx_mwem(rounds=2)",
                None),
    "dx_smalldb": (_params("1/1", "0/1", "dx_smalldb(size=4)", "metric"),
                   "dx_smalldb(size=4)", None),
}


@pytest.mark.parametrize("kind", list(RECORDED))
def test_each_mechanism_records_the_request_as_before(db, kind):
    sql, request = _ask(db, kind)
    db.answer(sql, **request)
    entry = db.ledger()[-1]
    params, strategy, calibration = RECORDED[kind]
    assert entry["request"] == params and entry["calibration"] == calibration
    assert strategy is None or entry["strategy"] == strategy
    assert (entry["reused_from"] is not None) == (kind == "reuse")

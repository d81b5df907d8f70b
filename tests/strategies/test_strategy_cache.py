"""The selection cache, the strategy cache's sparse plans and the parse/compile memo.

A repeated request (same workload, same candidates) is rebuilt from
``dpsql.selection_cache``: the same Explanation bit for bit, at any ε/δ/calibration, with no
factorisation and no eigendecomposition; anything stored that does not fit is ignored and
recomputed; a changed workload, strategy option or noise family misses; old databases are
migrated. No wall-clock limits here: ``benchmarks/strategy_cache.py`` measures the speed.
"""

from __future__ import annotations

import json
import math

import duckdb
import numpy as np
import pytest
import scipy.sparse as sp

import dpsql
from dpsql.inference import least_squares as inference
from dpsql.store import ledger
from dpsql.mechanisms import halfwidths, matrix, selection, target
from dpsql.store import selection_cache
from dpsql.store import strategy_cache
from dpsql.errors import StrategyError
from dpsql.inference.least_squares import LeastSquares
from dpsql.inference.intervals import laplace_interval_halfwidth
from dpsql.store.results import Z95
from dpsql.session import Session
from dpsql.sql import memo
from dpsql.strategies import REGISTRY
from dpsql.strategies.synthetic import all_range
from dpsql.workload.matrix import Plan

N = 48
POLICY = {"epsilon": 1e6, "delta": 0.5,
          "columns": {"x": {"type": "integer", "min": 0, "max": N - 1},
                      "g": {"type": "categorical", "values": ["a", "b", "c"]}}}
SQL = ["SELECT x, COUNT(*) FROM t GROUP BY x"] + [
    f"SELECT COUNT(*) FROM t WHERE x BETWEEN {a} AND {b}"
    for a, b in [(0, 9), (3, 30), (10, 47), (20, 25), (5, 40), (31, 33)]] + [
    "SELECT g, COUNT(*) FROM t WHERE x < 24 GROUP BY g"]
OTHER_SQL = SQL[:-1]


def _make(path: str):
    con = duckdb.connect(path)
    con.execute(f"CREATE TABLE t AS SELECT CAST(i % {N} AS INTEGER) AS x, "
                "['a', 'b', 'c'][1 + i % 3] AS g FROM range(2000) r(i)")
    con.close()
    session = dpsql.connect(path)
    session.protect("t", POLICY)
    return session


@pytest.fixture
def db(tmp_path):
    memo.clear()
    session = _make(str(tmp_path / "c.duckdb"))
    yield session
    session.close()


def _filled(path: str, *selects: dict):
    """A fresh database (closed) after ``selects`` (keyword arguments of :func:`_select`) and
    what the first of them returned. Built once per module and copied by the tests that start
    from that state: a cold ``auto`` or ``eigen`` at δ = 0 plans the Laplace eigen strategy,
    about 10 s of CPU each time, and the database a cold selection leaves is the same file
    whichever test made it (the cold/hit comparisons with a never-seen database below show
    that a cold selection is deterministic)."""
    memo.clear()
    session = _make(path)
    try:
        first = [_select(session, **kwargs) for kwargs in selects][0]
    finally:
        session.close()
    return path, first


@pytest.fixture(scope="module")
def cold_auto(tmp_path_factory):
    """A database after one cold ``auto`` selection, and that cold Explanation."""
    return _filled(str(tmp_path_factory.mktemp("cold") / "auto.duckdb"), dict(strategy="auto"))


@pytest.fixture(scope="module")
def cold_eigen(tmp_path_factory):
    """A database after cold ``eigen`` selections at δ = 1e-6 and δ = 0."""
    return _filled(str(tmp_path_factory.mktemp("cold") / "eigen.duckdb"),
                   dict(strategy="eigen", dlt=1e-6), dict(strategy="eigen", dlt=0))


def _copy(template: str, tmp_path):
    """A session on a private copy of a module's database (the tests write to it)."""
    import shutil

    path = str(tmp_path / "copy.duckdb")
    shutil.copyfile(template, path)
    memo.clear()
    return dpsql.connect(path)


@pytest.fixture
def after_auto(cold_auto, tmp_path):
    """A copy of the database a cold ``auto`` selection left, and that selection."""
    session = _copy(cold_auto[0], tmp_path)
    yield session, cold_auto[1]
    session.close()


@pytest.fixture
def after_eigen(cold_eigen, tmp_path):
    """A copy of the database cold ``eigen`` selections at δ = 1e-6 and 0 left."""
    session = _copy(cold_eigen[0], tmp_path)
    yield session
    session.close()


def _select(db, sql=SQL, eps=1.0, dlt=1e-6, strategy="auto", calibration="analytic",
            objective="rmse"):
    with db.db.connect() as con:
        policy, _, workload = Session._compile(sql, ledger.load_policies(con))
        return selection.select(con, policy, workload, eps, dlt, strategy, calibration,
                                objective)


def _same(c1, c2) -> bool:
    def eq(a, b):
        return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))
    return (c1.strategy == c2.strategy and c1.mechanism == c2.mechanism
            and c1.note == c2.note and eq(c1.sigma, c2.sigma)
            and eq(c1.sensitivity, c2.sensitivity) and eq(c1.rmse, c2.rmse)
            and eq(c1.bound_ratio, c2.bound_ratio) and np.array_equal(c1.stderr, c2.stderr)
            and eq(c1.gap, c2.gap))


def _assert_equal(e1, e2):
    assert (e1.strategy, e1.mechanism, e1.sigma, e1.rmse, e1.bound_rmse) == \
        (e2.strategy, e2.mechanism, e2.sigma, e2.rmse, e2.bound_rmse)
    assert np.array_equal(e1.stderr, e2.stderr)
    assert e1.statements == e2.statements and len(e1.candidates) == len(e2.candidates)
    for c1, c2 in zip(e1.candidates, e2.candidates):
        assert _same(c1, c2), (c1, c2)


def _chosen(e):
    return next(c for c in e.candidates if c.strategy == e.strategy
                and c.mechanism == e.mechanism)


def _dense(A):
    return A.toarray() if sp.issparse(A) else np.asarray(A)


def _rows(db, table="selection_cache") -> int:
    with db.db.connect() as con:
        return con.execute(f"SELECT count(*) FROM dpsql.{table}").fetchone()[0]


@pytest.fixture
def no_factorisation(monkeypatch):
    """Fails the test if anything factorises a plan or eigendecomposes the workload."""
    def refuse(*args, **kwargs):
        raise AssertionError("a cache hit recomputed something")
    monkeypatch.setattr(LeastSquares, "_factorise", refuse)
    monkeypatch.setattr(halfwidths, "svdb", refuse)
    for name, obj in list(REGISTRY.items()) + list(matrix.registry("laplace")[0].items()):
        monkeypatch.setattr(obj, "plan", refuse, raising=False)
    return refuse


def test_a_hit_rebuilds_the_identical_explanation_without_factorising(after_auto, monkeypatch):
    db, cold = after_auto                       # a cold _select(db) on this database
    assert not any(c.cached for c in cold.candidates if c.strategy in ("identity", "workload"))
    monkeypatch.setattr(LeastSquares, "_factorise",
                        lambda self: (_ for _ in ()).throw(AssertionError("factorised")))
    monkeypatch.setattr(halfwidths, "svdb", lambda info: 1 / 0)
    hit = _select(db)
    _assert_equal(cold, hit)
    assert all(c.cached for c in hit.candidates)
    best_cold, best_hit = _chosen(cold), _chosen(hit)
    # the chosen candidate carries its real, re-verified plan, identical to the cold one
    assert type(best_hit.plan) is type(best_cold.plan)
    if best_cold.plan.A is None:
        assert best_hit.plan.A is None
    else:
        assert np.array_equal(_dense(best_hit.plan.A), _dense(best_cold.plan.A))
    assert best_hit.plan.sensitivity == best_cold.plan.sensitivity
    # every other candidate: its public numbers only, never releasable
    for c in hit.candidates:
        if c is not best_hit and np.isfinite(c.rmse):
            assert isinstance(c.plan, selection_cache.PlanSummary) and not c.plan.integral
            with pytest.raises(StrategyError, match="not loaded"):
                c.plan.A


@pytest.mark.parametrize("eps, dlt, calibration", [(0.5, 1e-7, "analytic"),
                                                   (0.3, 1e-6, "classic"), (2.0, 0, "analytic")])
def test_one_entry_serves_every_epsilon_delta_and_calibration(after_eigen, tmp_path, eps, dlt,
                                                              calibration):
    db = after_eigen        # its cache filled at other parameters (eigen at δ = 1e-6 and 0)
    rows = _rows(db)
    hit = _select(db, strategy="eigen", eps=eps, dlt=dlt, calibration=calibration)
    assert _rows(db) == rows and all(c.cached for c in hit.candidates)
    # the same request on a database that never saw the workload
    other = _make(str(tmp_path / "other.duckdb"))
    try:
        cold = _select(other, strategy="eigen", eps=eps, dlt=dlt, calibration=calibration)
    finally:
        other.close()
    _assert_equal(cold, hit)


def test_accuracy_first_requests_hit_too(db, no_factorisation, monkeypatch):
    monkeypatch.undo()
    cold = _explain_target(db)
    monkeypatch.setattr(LeastSquares, "_factorise", no_factorisation)
    monkeypatch.setattr(halfwidths, "svdb", no_factorisation)
    _assert_equal(cold[1], _explain_target(db)[1])


def _explain_target(db):
    with db.db.connect() as con:
        policy, _, workload = Session._compile(SQL, ledger.load_policies(con))
        return target.smallest_epsilon(con, policy, workload, 1e-6, "auto", "analytic",
                                          2.0, "rmse")


@pytest.fixture
def store_factors(monkeypatch):
    """Stores every chosen plan's Cholesky factor, however cheap to recompute."""
    monkeypatch.setattr(selection, "FACTOR_STORE_SECONDS_PER_BYTE", 0.0)


def test_the_chosen_solver_is_kept_and_a_hit_reads_its_stored_factor(db, store_factors,
                                                                     monkeypatch):
    cold = _select(db, strategy="optimal")
    solver = _chosen(cold).solver
    assert isinstance(solver, LeastSquares) and solver.cholesky is not None
    assert all(c.solver is None for c in cold.candidates if c is not _chosen(cold))
    assert _rows(db, "solver_cache") == 1
    monkeypatch.setattr(LeastSquares, "_factorise",
                        lambda self: (_ for _ in ()).throw(AssertionError("factorised")))
    with db.db.connect() as con:            # answer() uses the solver inside its connection
        policy, _, workload = Session._compile(SQL, ledger.load_policies(con))
        best = _chosen(selection.select(con, policy, workload, 1.0, 1e-6, "optimal",
                                        "analytic"))
        y = np.linspace(-3.0, 7.0, best.plan.n_measurements)
        got = best.solver.answers(workload.W, y)
    assert np.array_equal(got, solver.answers(workload.W, y))
    # used after its connection closed, a hit's solver factorises instead
    monkeypatch.undo()
    late = _chosen(_select(db, strategy="optimal")).solver
    assert np.array_equal(late.answers(workload.W, y), got)


def test_a_factor_cheaper_to_recompute_than_to_store_is_not_stored(db, monkeypatch):
    cold = _chosen(_select(db, strategy="optimal"))
    assert not selection.factor_worth_storing(cold.plan)          # n = 48
    assert _rows(db, "solver_cache") == 0
    calls = []
    original = LeastSquares._factorise
    monkeypatch.setattr(LeastSquares, "_factorise",
                        lambda self: calls.append(1) or original(self))
    with db.db.connect() as con:            # a hit: its solver factorises once, when used
        policy, _, workload = Session._compile(SQL, ledger.load_policies(con))
        best = _chosen(selection.select(con, policy, workload, 1.0, 1e-6, "optimal",
                                        "analytic"))
        assert best.cached and calls == []
        y = np.linspace(-3.0, 7.0, best.plan.n_measurements)
        got = best.solver.answers(workload.W, y)
    assert calls == [1]
    assert np.array_equal(got, cold.solver.answers(workload.W, y))
    assert np.array_equal(best.solver.cholesky[0], cold.solver.cholesky[0])


def test_which_factors_are_stored():
    def plan(n, sparse=False):
        A = sp.identity(n, format="csr") if sparse else np.zeros((n, n))
        return Plan("x", n, A, 1.0)
    assert [selection.factor_worth_storing(plan(n)) for n in (256, 1024, 2048, 4096)] == \
        [False, False, True, True]
    assert not selection.factor_worth_storing(plan(selection.MAX_STORED_FACTOR + 1))
    assert not selection.factor_worth_storing(plan(4096, sparse=True))   # a cheap Gram


def test_a_corrupted_factor_is_recomputed(db, store_factors):
    cold = _select(db, strategy="optimal")
    plan = _chosen(cold).plan
    good = LeastSquares(plan).cholesky[0]
    bad = np.tril(good) * 1.001
    for stored in [(bad, True), (good[:-1, :-1], True), (np.full_like(good, np.nan), True),
                   (good, False), None]:
        solver = LeastSquares(plan, factor=lambda s=stored: s)
        assert np.allclose(solver.cholesky[0], good) and solver.cholesky[0] is not stored
    solver = LeastSquares(plan, factor=lambda: 1 / 0)       # an unreadable entry
    assert np.allclose(np.tril(solver.cholesky[0]), np.tril(good))
    assert inference.valid_factor(plan, np.tril(good), True)
    assert not inference.valid_factor(plan, bad, True)
    assert _rows(db, "solver_cache") == 1
    with db.db.connect() as con:                              # and through the database
        con.execute("UPDATE dpsql.solver_cache SET factor = ?", [bad.tobytes()])
    best = _chosen(_select(db, strategy="optimal"))
    assert np.allclose(np.tril(best.solver.cholesky[0]), np.tril(good))


CORRUPTIONS = {
    "factors cut short": "UPDATE dpsql.selection_cache SET factors = factors[1:16]",
    "factors not finite": "UPDATE dpsql.selection_cache SET factors = "
                          "'\\x00\\x00\\x00\\x00\\x00\\x00\\xF8\\x7F'::BLOB || factors[9:]",
    "candidates not JSON": "UPDATE dpsql.selection_cache SET candidates = '[{'",
    "candidates not a list": "UPDATE dpsql.selection_cache SET candidates = '{}'",
    "wrong workload hash": "UPDATE dpsql.selection_cache SET workload_hash = 'x'",
    "wrong number of queries": "UPDATE dpsql.selection_cache SET n_queries = n_queries + 1",
    "svdb negative": "UPDATE dpsql.selection_cache SET svdb = -1",
    "plan matrix gone": "DELETE FROM dpsql.strategy_cache",
    "plan matrix changed": "UPDATE dpsql.strategy_cache SET matrix = matrix[5:] || matrix[1:4]",
}


@pytest.mark.parametrize("how", list(CORRUPTIONS))
def test_corrupted_entries_are_ignored_and_recomputed(after_auto, how):
    db, cold = after_auto                       # a cold _select(db, strategy="auto")
    with db.db.connect() as con:
        con.execute(CORRUPTIONS[how])
    again = _select(db, strategy="auto")
    _assert_equal(cold, again)
    best = _chosen(again)
    assert best.plan.A is None or best.plan.sensitivity == _chosen(cold).plan.sensitivity
    _assert_equal(cold, _select(db, strategy="auto"))        # rewritten: a clean hit
    assert all(c.cached for c in _select(db, strategy="auto").candidates)


def test_a_sensitivity_in_the_entry_that_differs_from_the_matrix_forces_a_recompute(db):
    cold = _select(db, strategy="optimal")
    with db.db.connect() as con:
        text = con.execute("SELECT candidates FROM dpsql.selection_cache").fetchone()[0]
        items = json.loads(text)
        items[0]["sensitivity"] *= 0.5               # would shrink sigma: never trusted
        con.execute("UPDATE dpsql.selection_cache SET candidates = ?", [json.dumps(items)])
    again = _select(db, strategy="optimal")
    _assert_equal(cold, again)
    with db.db.connect() as con:                      # recomputed and rewritten
        text = con.execute("SELECT candidates FROM dpsql.selection_cache").fetchone()[0]
    assert json.loads(text)[0]["sensitivity"] == _chosen(cold).plan.sensitivity


def test_changed_workload_options_or_family_miss(db):
    _select(db, strategy="eigen")
    assert _rows(db) == 1
    hit = _select(db, strategy="eigen")
    assert _rows(db) == 1 and all(c.cached for c in hit.candidates)
    for kwargs in [dict(sql=OTHER_SQL), dict(strategy="eigen(principal_vectors=4)"),
                   dict(strategy="eigen", dlt=0), dict(strategy="auto"),
                   dict(strategy="auto", dlt=0)]:
        before = _rows(db)
        e = _select(db, **kwargs)
        assert _rows(db) == before + 1, kwargs
        assert not _chosen(e).cached or _chosen(e).strategy.startswith("eigen")


def test_the_workload_hash_names_exact_bytes():
    W = sp.csr_matrix(np.array([[1.0, 0, 1], [0, 1, 1]]))
    h = strategy_cache.workload_hash(W)
    assert strategy_cache.workload_hash(W.copy()) == h
    assert strategy_cache.workload_hash(W[[1, 0]]) != h                    # row order
    assert strategy_cache.workload_hash(W * (1 + 2 ** -52)) != h           # one ulp
    assert strategy_cache.workload_hash(sp.csr_matrix(W.toarray()[:, [0, 2, 1]])) != h


def test_sparse_plans_round_trip_and_are_reverified(tmp_path):
    plan = REGISTRY["hierarchical"].plan(all_range(32))
    assert sp.issparse(plan.A)
    con = duckdb.connect(str(tmp_path / "s.duckdb"))
    digest = strategy_cache.store(con, "k", plan, 0.0)
    again, stored = strategy_cache.load_entry(con, "k")
    assert sp.issparse(again.A) and np.array_equal(again.A.toarray(), plan.A.toarray())
    assert (again.sensitivity, again.l1_sensitivity) == (plan.sensitivity, plan.l1_sensitivity)
    assert stored == digest == strategy_cache.digest(again)
    for bad in ["UPDATE dpsql.strategy_cache SET indices = indices[9:]",
                "UPDATE dpsql.strategy_cache SET indptr = indptr[9:] || indptr[1:8]",
                "UPDATE dpsql.strategy_cache SET rows = rows + 1"]:
        strategy_cache.store(con, "k", plan, 0.0)
        con.execute(bad)
        assert strategy_cache.load(con, "k") is None, bad


OLD_STRATEGY_CACHE = """CREATE TABLE dpsql.strategy_cache (
    fingerprint VARCHAR PRIMARY KEY, strategy VARCHAR NOT NULL, n BIGINT NOT NULL,
    rows BIGINT NOT NULL, matrix BLOB NOT NULL, notes VARCHAR NOT NULL,
    seconds DOUBLE NOT NULL, created_at TIMESTAMP NOT NULL DEFAULT current_timestamp)"""


def test_an_old_schema_database_is_migrated(db):
    with db.db.connect() as con:     # a database of 5a7e430 or earlier: no schema version
        con.execute("DROP TABLE dpsql.schema_version")
        con.execute("DROP TABLE dpsql.strategy_cache")
        con.execute(OLD_STRATEGY_CACHE)
        for t in ("selection_cache", "solver_cache", "halfwidth_cache"):
            con.execute(f"DROP TABLE IF EXISTS dpsql.{t}")
        plan = REGISTRY["eigen"].plan(all_range(8))
        numerators = np.rint(plan.A * 2 ** 20).astype(np.int32)   # an entry of the old kind
        con.execute("INSERT INTO dpsql.strategy_cache (fingerprint, strategy, n, rows, matrix,"
                    " notes, seconds) VALUES ('old', 'eigen', 8, ?, ?, '[]', 1.0)",
                    [plan.A.shape[0], numerators.tobytes()])
    cold = _select(db, strategy="auto")          # stores a sparse or dense chosen plan
    _assert_equal(cold, _select(db, strategy="auto"))
    with db.db.connect() as con:
        cols = {r[0] for r in con.execute("DESCRIBE dpsql.strategy_cache").fetchall()}
        assert {"indptr", "indices"} <= cols
        old = strategy_cache.load(con, "old")
    assert np.array_equal(old.A, plan.A) and old.sensitivity == plan.sensitivity


def test_laplace_interval_halfwidths_are_cached_per_unit_scale(db):
    e = _select(db, strategy="hierarchical", dlt=0)
    best = _chosen(e)
    with db.db.connect() as con:
        policy, _, workload = Session._compile(SQL, ledger.load_policies(con))
        first = halfwidths.interval_halfwidths(con, e, best.solver, workload)
        assert _rows(db, "halfwidth_cache") == 1
        direct = laplace_interval_halfwidth(best.solver.coefficients(workload.W), e.sigma)
        assert np.allclose(first, direct, rtol=1e-12, atol=0)
        hit = _chosen(_select(db, strategy="hierarchical", dlt=0, eps=0.25))
        again = halfwidths.interval_halfwidths(con, e, hit.solver, workload)
        assert np.array_equal(first, again)
        con.execute("UPDATE dpsql.halfwidth_cache SET units = units[1:8]")   # corrupted
        assert np.array_equal(halfwidths.interval_halfwidths(con, e, hit.solver, workload),
                              first)
    gauss = _select(db, strategy="identity")
    assert np.array_equal(halfwidths.interval_halfwidths(None, gauss, None, None),
                          Z95 * gauss.stderr)


def test_the_memo_returns_immutable_copies(db):
    policies = db.policies()
    p1, q1, w1 = Session._compile(SQL, policies)
    p2, q2, w2 = Session._compile(list(SQL), policies)    # a list and a string differ
    p3, q3, w3 = Session._compile(SQL, policies)
    assert w3 is not w1 and w3.W is w1.W and q3 == q1 and q3 is not q1
    with pytest.raises(ValueError):
        w1.W.data[0] = 5.0
    with pytest.raises(ValueError):
        w1.partitions[0].unit_to_part[0] = 3
    assert isinstance(w1.outputs[0].keys, tuple)
    q1.append("junk")
    assert len(Session._compile(SQL, policies)[1]) == len(SQL)
    object.__setattr__(w1, "_strategy_info", "junk")
    assert getattr(Session._compile(SQL, policies)[2], "_strategy_info", None) is None
    # another policy for the same text is another batch
    changed = {"t": dpsql.policy.policy.load_policy(dict(POLICY, columns=dict(
        POLICY["columns"], x={"type": "integer", "min": 0, "max": 2 * N - 1})), "t")["t"]}
    assert Session._compile(SQL, changed)[2].n_cells != w1.n_cells


def test_the_memo_is_bounded_and_skips_failures(db):
    policies = db.policies()
    for k in range(memo.MAX_ENTRIES + 5):
        Session._compile(f"SELECT COUNT(*) FROM t WHERE x < {k + 1}", policies)
    assert len(memo._entries) == memo.MAX_ENTRIES
    with pytest.raises(dpsql.errors.DpsqlError):
        Session._compile("SELECT COUNT(*) FROM nowhere", policies)
    assert len(memo._entries) == memo.MAX_ENTRIES


def test_session_explain_hits_and_answer_uses_the_cache(db, no_factorisation, monkeypatch):
    monkeypatch.undo()
    cold = db.explain(SQL, epsilon=1, delta=1e-6, strategy="optimal")
    monkeypatch.setattr(LeastSquares, "_factorise", no_factorisation)
    monkeypatch.setattr(halfwidths, "svdb", no_factorisation)
    hit = db.explain(SQL, epsilon=1, delta=1e-6, strategy="optimal")
    _assert_equal(cold, hit)
    monkeypatch.undo()
    release = db.answer(SQL, epsilon=1, delta=1e-6, strategy="optimal")
    assert release.strategy == "optimal" and release.expected_rmse == cold.rmse

"""Free answers from past releases (dpsql.mechanisms.reuse): refinement, GLS, and the release path."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp

from dpsql.mechanisms.reuse.pool import Pool, Refinement
from dpsql.mechanisms.reuse.records import Record
from dpsql.noise.samplers import SeededTestSampler
from dpsql.policy.policy import load_policy
from dpsql.sql.compile import compile_workload
from dpsql.sql.parse import parse_batch

from ..conftest import ADULT_POLICY, make_adult_db

SEX_RACE = ["SELECT sex, COUNT(*) FROM adult GROUP BY sex",
            "SELECT race, COUNT(*) FROM adult GROUP BY race"]
SEX_INCOME = ["SELECT sex, COUNT(*) FROM adult GROUP BY sex",
              "SELECT income, COUNT(*) FROM adult GROUP BY income"]


def _policy():
    return load_policy(dict(ADULT_POLICY), "adult")["adult"]


def _compile(policy, sql):
    return compile_workload(parse_batch(sql, lambda name, node: policy), policy)


def _units_vector(policy, columns, rng):
    """Random counts per unit of the product of ``columns`` (C order)."""
    shape = tuple(policy.column(c).n_units for c in columns)
    return rng.integers(0, 50, size=shape).astype(float)


def _aggregate(units, columns, partitions):
    """Sum a unit-level array into a workload's cells (its partitions' C order)."""
    arr = units
    used = [p.column for p in partitions]
    for axis, c in reversed(list(enumerate(columns))):
        if c not in used:
            arr = arr.sum(axis=axis)
    kept = [c for c in columns if c in used]
    for p in partitions:
        axis = kept.index(p.column)
        moved = np.moveaxis(arr, axis, 0)
        out = np.zeros((p.n_parts,) + moved.shape[1:])
        np.add.at(out, p.unit_to_part, moved)
        arr = np.moveaxis(out, 0, axis)
    order = [kept.index(p.column) for p in partitions]
    return np.transpose(arr, order).reshape(-1)


def test_refinement_aggregates_to_each_partition():
    policy = _policy()
    w1 = _compile(policy, ["SELECT COUNT(*) FROM adult WHERE age BETWEEN 20 AND 30 "
                           "GROUP BY sex"])
    w2 = _compile(policy, ["SELECT COUNT(*) FROM adult WHERE age > 25 AND race = 'White'"])
    parts = [tuple((p.column, p.unit_to_part) for p in w.partitions) for w in (w1, w2)]
    ref = Refinement(policy, parts)
    columns = ref.columns
    units = _units_vector(policy, columns, np.random.default_rng(0))
    # the refined cell vector: units summed into refined parts
    refined_parts = [type("P", (), {"column": c, "unit_to_part": ref.parts[c],
                                    "n_parts": ref.shape[i]})
                     for i, c in enumerate(columns)]
    x_ref = _aggregate(units, columns, refined_parts)
    for w, p in zip((w1, w2), parts):
        P = ref.aggregation(p)
        assert P.shape == (w.n_cells, ref.n)
        np.testing.assert_array_equal(P @ x_ref, _aggregate(units, columns, w.partitions))


def _dense_gls(mats, variances, W):
    """Textbook GLS over the refined cells: (F⁺ diagonal of W F⁺ Wᵀ, estimable)."""
    F = sum(M.T @ M / v for M, v in zip(mats, variances))
    Fp = np.linalg.pinv(F, rcond=1e-10)
    var = np.einsum("ij,jk,ik->i", W, Fp, W)
    ok = np.abs(W - W @ Fp @ F).max(axis=1) < 1e-6
    return var, ok


def test_pool_matches_textbook_gls():
    policy = _policy()
    old = _compile(policy, SEX_RACE)
    new = _compile(policy, SEX_INCOME + ["SELECT COUNT(*) FROM adult WHERE race = 'Black'"])
    rng = np.random.default_rng(1)
    # random weighted sums plus the identity with two cells merged: sex and race queries
    # are estimable, income ones (a column the old release never split) are not
    eye = np.identity(old.n_cells)
    eye[0] += eye[1]
    dense = np.vstack([eye[[0] + list(range(2, old.n_cells))],
                       rng.integers(0, 2, size=(4, old.n_cells))]).astype(float)
    A_old = sp.csr_matrix(dense)
    rec = Record(1, tuple((p.column, p.unit_to_part) for p in old.partitions), A_old,
                 np.zeros(dense.shape[0]), "gaussian", 3.0)
    pool = Pool(policy, new, [rec])
    got = pool.analyse(new.W)
    Wr = pool.refined(new.W).toarray()
    M = (A_old @ pool.refinement.aggregation(rec.partitions)).toarray()
    var, ok = _dense_gls([M], [9.0], Wr)
    np.testing.assert_array_equal(got.estimable, ok)
    np.testing.assert_allclose(got.variance[ok], var[ok], rtol=1e-8)
    assert got.estimable.any() and not got.estimable.all()


def test_pool_estimates_are_unbiased_with_the_reported_variance():
    """Power: 4000 draws; the variance ratio's standard error is sqrt(2/4000) ≈ 2.2%, so
    the ±10% band is ~4.5 sd (false alarm < 1e-5) and a noise scale off by 30% (variance
    ×0.49 or ×1.69) fails it with certainty."""
    policy = _policy()
    old = _compile(policy, SEX_RACE)
    new = _compile(policy, SEX_INCOME)
    rng = np.random.default_rng(2)
    parts = lambda w: tuple((p.column, p.unit_to_part) for p in w.partitions)  # noqa: E731
    ref = Refinement(policy, [parts(old), parts(new)])
    x = rng.integers(0, 200, size=ref.n).astype(float)
    x_old = ref.aggregation(parts(old)) @ x
    x_new = ref.aggregation(parts(new)) @ x
    truth = new.W @ x_new
    n = 4000
    y_old = x_old[None, :] + rng.laplace(0, 2.0, (n, old.n_cells))
    y_new = x_new[None, :] + rng.normal(0, 3.0, (n, new.n_cells))
    pool = Pool(policy, new, [Record(
        1, parts(old), sp.identity(old.n_cells, format="csr"), y_old[0], "laplace", 2.0)])
    k = pool.add(Record(0, parts(new), sp.identity(new.n_cells, format="csr"),
                        np.zeros(new.n_cells), "gaussian", 3.0))
    c_old, c_new = pool.coefficients(new.W)
    draws = y_old @ c_old.T + y_new @ c_new.T - truth[None, :]
    pool.set_y(k, y_new[0])
    assert pool.answers(new.W) == pytest.approx(draws[0] + truth, abs=1e-6)
    predicted = pool.analyse(new.W).variance
    assert np.all(np.abs(draws.mean(axis=0)) < 4 * np.sqrt(predicted / n))
    ratio = draws.var(axis=0) / predicted
    assert np.all((ratio > 0.9) & (ratio < 1.1)), ratio


@pytest.fixture
def db(tmp_path):
    d = make_adult_db(str(tmp_path / "r.duckdb"), epsilon=10, sampler=SeededTestSampler(3))
    yield d
    d.close()


def _values(release):
    return [np.array([row[-4] for row in t.rows], dtype=float) for t in release.results]


def _stderr(release):
    return [np.array([row[-3] for row in t.rows], dtype=float) for t in release.results]


def test_repeated_batch_is_free_and_identical(db):
    first = db.answer(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    spent = db.budget("adult")["epsilon_spent"]
    e = db.explain(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    assert e.mechanism == "reuse" and e.epsilon == 0 and len(e.free) == e.n_queries
    assert "nothing is charged" in str(e)
    again = db.answer(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    assert db.budget("adult")["epsilon_spent"] == spent
    entry = db.ledger()[-1]
    assert entry["mechanism"] == "reuse" and entry["epsilon"] == 0
    assert entry["reused_from"] == str(first.release_id) and entry["status"] == "released"
    for a, b in zip(_values(first), _values(again)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    for a, b in zip(_stderr(first), _stderr(again)):
        np.testing.assert_allclose(a, b, rtol=1e-9)


def test_mixed_batch_pays_only_for_the_new_part(db):
    db.answer(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    batch = ["SELECT race, COUNT(*) FROM adult GROUP BY race",
             "SELECT income, COUNT(*) FROM adult GROUP BY income"]
    e = db.explain(batch, epsilon=0.5, delta=0, strategy="identity")
    n_race = e.statements[0][2] - e.statements[0][1]
    assert e.free == tuple(range(n_race))              # race: free; income: measured
    fresh = db.explain(batch, epsilon=0.5, delta=0, strategy="identity", reuse=False)
    assert np.all(e.stderr <= fresh.stderr + 1e-9)
    before = db.budget("adult")["epsilon_spent"]
    r = db.answer(batch, epsilon=0.5, delta=0, strategy="identity")
    assert db.budget("adult")["epsilon_spent"] - before == Fraction(1, 2)
    np.testing.assert_allclose(np.concatenate(_stderr(r)), e.stderr, rtol=1e-3)
    assert db.ledger()[-1]["reused_from"] == "1"


def test_accuracy_first_charges_only_the_new_part(db):
    db.answer(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    # the free rows (sex: 18 cells, race: 9) are the expensive ones; the new one sums 6
    batch = SEX_RACE + ["SELECT COUNT(*) FROM adult WHERE sex = 'Male' AND income = '>50K'"]
    e = db.explain(batch, max_stderr=8.0, delta=0, strategy="identity")
    cold = db.explain(batch, max_stderr=8.0, delta=0, strategy="identity", reuse=False)
    assert 0 < e.epsilon < cold.epsilon and max(e.stderr) <= 8.0
    with pytest.raises(Exception, match="confirm=True"):
        db.answer(batch, max_stderr=8.0, delta=0, strategy="identity")
    r = db.answer(batch, max_stderr=8.0, delta=0, strategy="identity", confirm=True)
    assert r.epsilon == pytest.approx(e.epsilon)


def test_reuse_false_measures_afresh(db):
    db.answer(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    e = db.explain(SEX_RACE, epsilon=0.5, delta=0, strategy="identity", reuse=False)
    assert e.free == () and e.reused_from == ()
    db.answer(SEX_RACE, epsilon=0.5, delta=0, strategy="identity", reuse=False)
    assert db.budget("adult")["epsilon_spent"] == Fraction(1)
    with pytest.raises(Exception, match="reuse must be true or false"):
        db.answer(SEX_RACE, epsilon=0.5, delta=0, reuse="yes")


def test_a_reuse_scope_limits_the_pool_to_its_releases(db):
    """``Session.reuse_scope`` (the server's per-analyst pool): releases outside it never
    answer a batch, in explain or answer; those inside it do."""
    first = db.answer(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    db.reuse_scope = lambda: frozenset({first.release_id + 100})     # someone else's only
    e = db.explain(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    assert e.free == () and e.reused_from == () and e.epsilon == 0.5
    second = db.answer(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    assert db.budget("adult")["epsilon_spent"] == Fraction(1)
    assert db.ledger()[-1]["reused_from"] is None
    db.reuse_scope = lambda: frozenset({second.release_id})
    e = db.explain(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    assert e.mechanism == "reuse" and e.reused_from == (second.release_id,)
    db.answer(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    assert db.ledger()[-1]["reused_from"] == str(second.release_id)


def test_a_too_costly_analysis_is_skipped_with_a_note_and_changes_nothing_else(db,
                                                                              monkeypatch):
    """Over its share of the planning memory the reuse analysis is not run: the batch is
    planned exactly as without past releases (same strategy and errors, only nothing free)
    and explain says why."""
    from dpsql.mechanisms.reuse import pool

    db.answer(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    assert len(db.explain(SEX_RACE, epsilon=0.5, delta=0, strategy="identity").free) > 0
    monkeypatch.setattr(pool, "MAX_SHARE", 1e-12)
    e = db.explain(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    fresh = db.explain(SEX_RACE, epsilon=0.5, delta=0, strategy="identity", reuse=False)
    assert e.free == () and e.reused_from == () and e.strategy == fresh.strategy
    np.testing.assert_allclose(e.stderr, fresh.stderr)
    assert "reuse" in str(e) and "planned afresh" in str(e)


def test_damaged_or_foreign_measurements_are_not_used(db, tmp_path):
    db.answer(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    with db.db.connect() as con:
        con.execute("UPDATE dpsql.measurements SET y = 'garbage'::BLOB")
    e = db.explain(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    assert e.free == () and e.reused_from == ()


def test_private_sessions_never_reuse_test_noise(db):
    import dpsql

    db.answer(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    path = db.db.path
    db.close()
    private = dpsql.connect(path)
    try:
        e = private.explain(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
        assert e.reused_from == ()
    finally:
        private.close()


def test_a_changed_domain_is_not_reused(db):
    db.answer(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    policy = dict(ADULT_POLICY, epsilon=10)
    policy["columns"] = dict(policy["columns"],
                             race={"type": "categorical", "values": ["White", "Black"]})
    db.protect("adult", policy, replace=True)
    e = db.explain(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    assert e.reused_from == ()


def test_reprotecting_the_table_starts_a_new_data_epoch(db):
    """After the owner reloads the data and protects the table again (same domains), past
    measurements describe the old rows: they are not reused."""
    db.answer(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    assert db.explain(SEX_RACE, epsilon=0.5, delta=0, strategy="identity").reused_from == (1,)
    db.protect("adult", dict(ADULT_POLICY, epsilon=10), replace=True)
    e = db.explain(SEX_RACE, epsilon=0.5, delta=0, strategy="identity")
    assert e.reused_from == () and e.free == ()

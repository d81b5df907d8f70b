"""Answers from past releases for batches compiled to Kronecker blocks (issue 16): the
measurements an implicit release keeps (one piece per clique measurement, over its own
columns), and the free answers they give dense and implicit batches later."""

from __future__ import annotations

import itertools
import math
import tomllib
from importlib import resources

import numpy as np
import pytest

from dpsql.mechanisms.reuse import records
from dpsql.policy.policy import table_policy_from_spec

from ..sql.test_implicit import _NoNoise, _database as _implicit_database

DATA = resources.files("dpsql") / "data"
SPEC = tomllib.loads((DATA / "adult_policy.toml").read_text())["tables"]["adult"]
COLS = ["sex", "race", "income", "marital_status", "workclass", "education", "occupation"]
PAIRS = [f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}"
         for a, b in itertools.combinations(COLS[:5], 2)]


def _database(sampler):
    """A fresh demo database protected at ε = 100 (:func:`tests.sql.test_implicit._database`)."""
    return _implicit_database(sampler)[0]


def _policy():
    return table_policy_from_spec("adult", dict(SPEC))


def _exact(db, sql, table):
    """(released rows, DuckDB's own answer to ``sql`` keyed by group)."""
    with db.db.connect() as con:
        names = [c[0] for c in con.execute(f"DESCRIBE {table}").fetchall()]
        keys = names[:names.index("stderr") - 1]
        got = con.execute(f"SELECT * FROM {table}").fetchall()
        truth = {tuple(r[:-1]): r[-1] for r in con.execute(sql).fetchall()}
    return [(row[len(keys)], truth.get(tuple(row[:len(keys)]), 0)) for row in got]


def test_an_implicit_release_keeps_one_piece_per_clique_measurement():
    """Stored as one row of pieces, each over its own columns; read back piece by piece,
    the same matrices and values as the plan measured (exact here: A m = y)."""
    db = _database(_NoNoise())
    release = db.answer(PAIRS, epsilon=1, delta=1e-6)
    assert release.strategy == "residual"
    with db.db.connect() as con:
        rows = con.execute("SELECT release_id, pieces FROM dpsql.measurements").fetchall()
        assert [r[0] for r in rows] == [release.release_id] and rows[0][1] is not None
        got = records.load(con, _policy(), private=False)
    assert len(got) > 1 and {r.release_id for r in got} == {release.release_id}
    for rec in got:
        columns = [c for c, _ in rec.partitions]
        assert len(columns) <= 2 and set(columns) <= set(COLS[:5])
        n = math.prod(int(u.max()) + 1 for _, u in rec.partitions)
        assert rec.A.shape == (rec.y.size, n) and rec.noise == "gaussian"
    db.close()


def test_a_dense_batch_is_answered_free_and_exactly_from_an_implicit_release():
    """A clique's marginal asked later (dense: 2 columns) at a small ε: the pieces answer it
    more accurately, so it is free, charged nothing, and (exact measurements) equals
    DuckDB's counts."""
    db = _database(_NoNoise())
    first = db.answer(PAIRS, epsilon=1, delta=1e-6)
    spent = db.budget("adult")["epsilon_spent"]
    sql = ["SELECT sex, race, COUNT(*) FROM adult GROUP BY sex, race",
           "SELECT income, COUNT(*) FROM adult GROUP BY income"]
    e = db.explain(sql, epsilon=0.01, delta=1e-6)
    assert e.mechanism == "reuse" and e.reused_from == (first.release_id,)
    again = db.answer(sql, epsilon=0.01, delta=1e-6)
    assert db.budget("adult")["epsilon_spent"] == spent
    assert db.ledger()[-1]["epsilon"] == 0
    for s, table in zip(sql, again.tables):
        for value, want in _exact(db, s, table):
            assert abs(value - want) < 1e-6
    db.close()


NEW_PAIRS = [f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}"
             for a, b in [("sex", "occupation"), ("race", "occupation")]]


def test_oracle_a_repeated_and_a_partly_new_implicit_batch_equal_duckdb():
    """Exact measurements: the repeated batch (all free) and the partly new one (old rows
    from the past release, new rows measured) equal DuckDB's counts; the repeated one is
    charged nothing, the partly new one once, at the requested ε, for its new blocks only."""
    db = _database(_NoNoise())
    first = db.answer(PAIRS, epsilon=1, delta=1e-6)
    spent = db.budget("adult")["epsilon_spent"]
    again = db.answer(PAIRS, epsilon=1, delta=1e-6)
    assert again.strategy == "reuse" and db.budget("adult")["epsilon_spent"] == spent
    entry = db.ledger()[-1]
    assert entry["epsilon"] == 0 and entry["reused_from"] == str(first.release_id)
    batch = PAIRS + NEW_PAIRS
    e = db.explain(batch, epsilon=1, delta=1e-6)
    n_old = e.statements[len(PAIRS)][1]
    assert e.free == tuple(range(n_old)) and e.epsilon == 1
    assert "generalised least squares over that clique" in str(e)
    mixed = db.answer(batch, epsilon=1, delta=1e-6)
    entries = db.ledger()
    assert len(entries) == 3 and entries[-1]["epsilon"] == 1
    assert entries[-1]["reused_from"] == str(first.release_id)
    assert db.budget("adult")["epsilon_spent"] == spent + 1
    for release, sqls in ((again, PAIRS), (mixed, batch)):
        for s, table in zip(sqls, release.tables):
            for value, want in _exact(db, s, table):
                assert abs(value - want) < 1e-6, (s, value, want)
    db.close()


def _compiled(policy, sql):
    from dpsql.sql.compile import compile_workload
    from dpsql.sql.parse import parse_batch

    return compile_workload(parse_batch(sql, lambda name, node: policy), policy)


SMALL = ["SELECT sex, race, COUNT(*) FROM adult GROUP BY sex, race",
         "SELECT race, income, COUNT(*) FROM adult GROUP BY race, income",
         "SELECT income, COUNT(*) FROM adult WHERE sex = 'Male' GROUP BY income",
         "SELECT COUNT(*) FROM adult WHERE race IN ('White', 'Black')"]


def test_reused_standard_errors_are_the_gls_variance_of_a_dense_computation():
    """On a small domain: each row's past variance is textbook GLS (``w F⁺ wᵀ`` over the
    refined cells, dense pseudo-inverse) from the stored measurements over subsets of its
    region's columns; a measurement over columns outside every region is not used."""
    import scipy.sparse as sp

    from dpsql.mechanisms.reuse import blocks
    from dpsql.mechanisms.reuse.pool import Refinement
    from dpsql.mechanisms.reuse.records import Record
    from dpsql.sql.compile import compile_parts, dense_workload
    from dpsql.sql.implicit import implicit_workload
    from dpsql.sql.parse import parse_batch

    policy = _policy()
    queries = parse_batch(SMALL, lambda name, node: policy)
    parts = compile_parts(queries, policy)
    dense = dense_workload(queries, policy, parts)
    workload = implicit_workload(queries, policy, parts)
    rng = np.random.default_rng(5)
    recs = []
    for k, (sql, noise, scale) in enumerate([
            ("SELECT sex, race, COUNT(*) FROM adult GROUP BY sex, race", "gaussian", 2.0),
            ("SELECT income, COUNT(*) FROM adult GROUP BY income", "laplace", 1.5),
            ("SELECT race, COUNT(*) FROM adult WHERE income = '>50K' GROUP BY race",
             "gaussian", 3.0),
            ("SELECT sex, income, COUNT(*) FROM adult GROUP BY sex, income", "gaussian", 1.0),
            ("SELECT sex, race, income, COUNT(*) FROM adult GROUP BY sex, race, income",
             "gaussian", 0.5)]):
        w = _compiled(policy, [sql])
        A = sp.csr_matrix(rng.integers(0, 3, size=(w.n_cells + 1, w.n_cells)).astype(float))
        recs.append(Record(k + 1, tuple((p.column, p.unit_to_part) for p in w.partitions),
                           A, np.zeros(A.shape[0]), noise, scale))
    past, why = blocks.analyse(policy, workload, recs)
    assert why == "" and 5 not in past.release_ids
    names = [p.column for p in workload.partitions]
    base = tuple((p.column, p.unit_to_part) for p in workload.partitions)
    checked = 0
    for region in blocks.regions(workload):
        cols = {names[i] for i in region.columns}
        mine = [r for r in recs if {c for c, _ in r.partitions} <= cols]
        ref = Refinement(policy, [base] + [r.partitions for r in recs])
        F = sum((r.A @ ref.aggregation(r.partitions)).toarray().T
                @ (r.A @ ref.aggregation(r.partitions)).toarray() / r.variance for r in mine)
        Fp = np.linalg.pinv(F, rcond=1e-10)
        W = (dense.W @ ref.aggregation(base)).toarray()
        for r in workload.rows:
            if r.block not in region.blocks:
                continue
            for row in r.target:
                w = W[row]
                ok = np.abs(w - w @ Fp @ F).max() < 1e-6
                assert past.estimable[row] == ok
                if ok:
                    assert past.variance[row] == pytest.approx(w @ Fp @ w, rel=1e-7)
                    checked += 1
    assert checked >= 4 and not past.estimable.all()


def test_a_too_costly_analysis_is_skipped_and_changes_nothing(monkeypatch):
    """Over its share of max_memory the analysis is not run: explain says so, nothing is
    free, and the release equals one asked with reuse off (same seeded noise)."""
    from dpsql.mechanisms.reuse import blocks
    from dpsql.noise.samplers import SeededTestSampler

    got = {}
    for reuse in (True, False):
        db = _database(SeededTestSampler(11))
        db.answer(PAIRS, epsilon=1, delta=1e-6)
        if reuse:
            monkeypatch.setattr(blocks, "MAX_SHARE", 1e-9)
        e = db.explain(PAIRS + NEW_PAIRS, epsilon=1, delta=1e-6, reuse=reuse)
        r = db.answer(PAIRS + NEW_PAIRS, epsilon=1, delta=1e-6, reuse=reuse)
        got[reuse] = (e, [row for t in r.results for row in t.rows], db.ledger()[-1])
        monkeypatch.undo()
        db.close()
    (e1, rows1, l1), (e0, rows0, l0) = got[True], got[False]
    assert "skipped" in str(e1) and "planned afresh" in str(e1) and "skipped" not in \
        "".join(c.note for c in e0.candidates if c.strategy == "reuse")
    assert e1.free == () and e1.reused_from == () and e1.strategy == e0.strategy
    np.testing.assert_array_equal(e1.stderr, e0.stderr)
    assert rows1 == rows0 and l1["epsilon"] == l0["epsilon"] and l1["reused_from"] is None


def test_old_and_new_combine_by_gls_over_each_clique():
    """Nothing free (the new request is more accurate): every block is measured, and a
    clique's answers combine both releases' pieces over its columns. Their released
    standard errors are textbook GLS (dense pseudo-inverse over the marginal) of those
    pieces, below the new measurement's own; the charge is the requested ε, once."""
    from dpsql.mechanisms.reuse.pool import Refinement
    from dpsql.noise.samplers import SeededTestSampler

    db = _database(SeededTestSampler(4))
    first = db.answer(PAIRS, epsilon=1, delta=1e-6)
    alone = db.explain(PAIRS, epsilon=2, delta=1e-6, reuse=False)
    second = db.answer(PAIRS, epsilon=2, delta=1e-6)
    assert db.ledger()[-1]["epsilon"] == 2
    assert db.ledger()[-1]["reused_from"] == str(first.release_id)
    policy = _policy()
    with db.db.connect() as con:
        pieces = records.load(con, policy, private=False)
    assert {r.release_id for r in pieces} == {first.release_id, second.release_id}
    w = _compiled(policy, [PAIRS[0]])          # sex, race: a clique of the batch
    base = tuple((p.column, p.unit_to_part) for p in w.partitions)
    mine = [r for r in pieces if {c for c, _ in r.partitions} <= {"sex", "race"}]
    ref = Refinement(policy, [base] + [r.partitions for r in mine])
    mats = [(r.A @ ref.aggregation(r.partitions)).toarray() for r in mine]
    F = sum(M.T @ M / r.variance for M, r in zip(mats, mine))
    W = (w.W @ ref.aggregation(base)).toarray()
    want = np.sqrt(np.einsum("ij,jk,ik->i", W, np.linalg.pinv(F, rcond=1e-10), W))
    got = np.array([row[-3] for row in second.results[0].rows], dtype=float)
    np.testing.assert_allclose(got, want, rtol=1e-7)
    own = alone.stderr[alone.statements[0][1]:alone.statements[0][2]]
    assert np.all(got < own * 0.95)
    db.close()


def test_stored_measurements_are_read_newest_first_within_their_memory_share(monkeypatch):
    """Only what fits :data:`records.MAX_LOADED_SHARE` of max_memory is read (sizes first,
    newest releases first); what is left out only loses free answers."""
    from dpsql.noise.samplers import SeededTestSampler

    db = _database(SeededTestSampler(2))
    first = db.answer(PAIRS, epsilon=1, delta=1e-6)
    second = db.answer(["SELECT sex, COUNT(*) FROM adult GROUP BY sex"], epsilon=1,
                       delta=1e-6)
    with db.db.connect() as con:
        sizes = dict(con.execute("SELECT release_id, octet_length(strategy) + "
                                 "octet_length(y) FROM dpsql.measurements").fetchall())
    from dpsql.workload import limits as planning

    share = (sizes[second.release_id] + 1) / planning.current().max_memory
    monkeypatch.setattr(records, "MAX_LOADED_SHARE", share)
    with db.db.connect() as con:
        got = records.load(con, _policy(), private=False)
    assert {r.release_id for r in got} == {second.release_id}
    e = db.explain(PAIRS, epsilon=1, delta=1e-6)
    assert first.release_id not in e.reused_from and e.mechanism != "reuse"
    db.close()


def test_the_pool_falls_back_to_divide_and_conquer_when_syevr_fails(monkeypatch):
    """LAPACK's syevr has failed ("Internal Error") on a pool's Gram under the one-thread
    planning BLAS (benchmarks/highdim_sql.py --split 1); the pool then uses syevd and gets
    the same variances."""
    import scipy.linalg as la
    import scipy.sparse as sp

    from dpsql.mechanisms.reuse import pool

    policy = _policy()
    w = _compiled(policy, ["SELECT sex, race, COUNT(*) FROM adult GROUP BY sex, race"])

    rec = records.Record(1, tuple((p.column, p.unit_to_part) for p in w.partitions),
                         sp.identity(w.n_cells, format="csr"), np.zeros(w.n_cells),
                         "gaussian", 2.0)
    want = pool.Pool(policy, w, [rec]).analyse(w.W).variance
    calls = []

    def flaky(G, **kw):
        calls.append(kw.get("driver"))
        if "driver" not in kw:
            raise la.LinAlgError("Internal Error.")
        return original(G, **kw)

    original = la.eigh
    monkeypatch.setattr(pool.la, "eigh", flaky)
    got = pool.Pool(policy, w, [rec]).analyse(w.W).variance
    assert calls == [None, "evd"]
    np.testing.assert_allclose(got, want, rtol=1e-10)

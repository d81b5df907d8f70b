"""User-level privacy (issue 20 item 2): a policy's ``privacy_unit`` and ``max_rows_per_unit``.

Empirically, on a table of visits (1 to 11 rows per person, and rows without a person):
removing one whole unit changes the counts by at most ``k`` and the value sums by at most
``k·M`` (the declared bound), and by exactly that unit's own capped rows (no other unit's
selection moves); every NULL-unit row is a unit of its own. The selection key is drawn at
``protect``, never shown, and changes the rows kept. Every sensitivity scales by ``k``: a
release calibrated for one row is refused by the kernel, before the charge. MWEM and d_X
refuse a table with a privacy unit up front.
"""

from __future__ import annotations

import copy
import os
import shutil

import duckdb
import numpy as np
import pytest

import dpsql
from dpsql.errors import PolicyError, ScaleRefused, StrategyError
from dpsql.kernel.data import _data_vectors
from dpsql.mechanisms import matrix
from dpsql.sql.compile import compile_workload
from dpsql.sql.parse import parse_batch
from dpsql.workload.values import ValueBound

from ..conftest import snapshot

ITEMS = ["book", "food", "game", "tool"]
K = 3
VISITS = {"epsilon": 10, "delta": 1e-5, "privacy_unit": "person_id", "max_rows_per_unit": K,
          "columns": {"item": {"type": "categorical", "values": ITEMS + ["none"]},
                      "amount": {"type": "numeric", "min": 0, "max": 100,
                                 "edges": [0, 50, 100]},
                      "day": {"type": "integer", "min": 1, "max": 365}}}
BATCH = "SELECT item, SUM(amount) FROM visits GROUP BY item"
PEOPLE, NULL_ROWS = 60, 9


_RAW: dict = {}


def _raw_visits() -> tuple:
    """(a DuckDB file holding only the unprotected ``visits`` table, its rows), built once per
    test process: the rows are the same every time (seeded) and the row-by-row insert was
    most of a fresh database's cost; :func:`make_visits` copies the file."""
    if "path" not in _RAW:
        import tempfile

        rng = np.random.default_rng(20)
        rows = [(int(p), str(rng.choice(ITEMS)), float(rng.integers(0, 130)),
                 int(rng.integers(1, 366)))
                for p in range(PEOPLE) for _ in range(int(rng.integers(1, 12)))]
        rows += [(None, str(rng.choice(ITEMS)), float(rng.integers(0, 100)),
                  int(rng.integers(1, 366))) for _ in range(NULL_ROWS)]
        path = os.path.join(tempfile.mkdtemp(prefix="dpsql-visits-"), "raw.duckdb")
        con = duckdb.connect(path)
        con.execute("CREATE TABLE visits (person_id INTEGER, item VARCHAR, amount DOUBLE, "
                    "day INTEGER)")
        con.executemany("INSERT INTO visits VALUES (?, ?, ?, ?)", rows)
        con.close()
        _RAW["path"], _RAW["rows"] = path, rows
    return _RAW["path"], list(_RAW["rows"])


def make_visits(path: str, sampler=None, policy=None):
    """A DuckDB file with ``visits`` (person_id, item, amount, day), protected by ``policy``
    (a fresh selection key each time)."""
    raw, rows = _raw_visits()
    shutil.copyfile(raw, path)
    db = dpsql.connect(path, sampler=sampler)
    db.protect("visits", policy or VISITS)
    return db, rows


@pytest.fixture
def visits(tmp_path):
    db, rows = make_visits(str(tmp_path / "v.duckdb"))
    yield db, rows
    db.close()


def vectors(con, policy, sql=BATCH):
    queries = parse_batch(sql, lambda n, node: policy)
    w = compile_workload(queries, policy)
    x, (s,) = _data_vectors(con, policy, w, [queries[0].value])
    return x, s


def test_each_unit_keeps_at_most_k_rows_and_null_units_are_their_own(visits):
    db, rows = visits
    policy = db.policies()["visits"]
    with db.db.connect() as con:
        x, _ = vectors(con, policy)
    per_person: dict = {}
    for p, *_ in rows:
        if p is not None:
            per_person[p] = per_person.get(p, 0) + 1
    assert max(per_person.values()) > K                 # the cap has work to do
    assert x.sum() == sum(min(n, K) for n in per_person.values()) + NULL_ROWS


def test_removing_a_whole_unit_moves_the_vectors_by_at_most_the_bound(visits):
    db, rows = visits
    policy = db.policies()["visits"]
    bound = ValueBound(0, 100).units_bound
    units = sorted({p for p, *_ in rows if p is not None})
    with db.db.connect() as con:
        x, s = vectors(con, policy)
        worst = 0
        for u in units:
            con.execute("BEGIN TRANSACTION")
            con.execute("DELETE FROM visits WHERE person_id = ?", [u])
            x_without, s_without = vectors(con, policy)
            con.execute("ROLLBACK")
            con.execute("BEGIN TRANSACTION")
            con.execute("DELETE FROM visits WHERE person_id IS DISTINCT FROM ?", [u])
            x_alone, s_alone = vectors(con, policy)
            con.execute("ROLLBACK")
            dx, ds = x - x_without, s - s_without
            assert np.abs(dx).sum() <= K and np.abs(ds).sum() <= K * bound, u
            # exactly the unit's own capped rows: no other unit's selection moved
            assert np.array_equal(dx, x_alone) and np.array_equal(ds, s_alone), u
            worst = max(worst, np.abs(dx).sum())
        assert worst == K                               # the bound is reached, not loose
        con.execute("BEGIN TRANSACTION")                # one NULL-unit row is one unit
        con.execute("DELETE FROM visits WHERE rowid = (SELECT min(rowid) FROM visits "
                    "WHERE person_id IS NULL)")
        x_without, _ = vectors(con, policy)
        con.execute("ROLLBACK")
        assert np.abs(x - x_without).sum() == 1


def _key(db) -> str:
    with db.db.connect() as con:
        return con.execute("SELECT unit_key FROM dpsql.policies").fetchone()[0]


def test_the_key_is_secret_and_drawn_at_each_protect(visits):
    db, _ = visits
    key = _key(db)
    assert len(key) == 64 and int(key, 16) >= 0
    expl = db.explain(BATCH, epsilon=1, delta=1e-6)
    release = db.answer(BATCH, epsilon=1, delta=1e-6)
    with db.db.connect() as con:
        policy_json = con.execute("SELECT policy FROM dpsql.policies").fetchone()[0]
        ledger = str(con.execute("SELECT * FROM dpsql.ledger").fetchall())
        tables = str(con.execute(f"SELECT * FROM {release.tables[0]}").fetchall())
    for shown in (policy_json, ledger, tables, str(expl), str(release), repr(db.policies())):
        assert key not in shown and key[:16] not in shown
    with db.db.connect() as con:
        before, _ = vectors(con, db.policies()["visits"])
    db.protect("visits", VISITS, replace=True)
    assert _key(db) != key
    with db.db.connect() as con:
        after, _ = vectors(con, db.policies()["visits"])
    assert after.sum() == before.sum() and not np.array_equal(after, before)


@pytest.mark.parametrize("change, words", [
    ({"max_groups_per_unit": 2}, "max_groups_per_unit is not supported"),
    ({"max_rows_per_unit": None}, "needs both privacy_unit"),
    ({"max_rows_per_unit": 0}, "max_rows_per_unit must be an integer from 1"),
    ({"max_rows_per_unit": 2.5}, "max_rows_per_unit must be an integer from 1"),
    ({"privacy_unit": "person id"}, "plain SQL identifier"),
    ({"privacy_unit": "nobody"}, "does not have"),
])
def test_bad_unit_policies_are_refused(visits, change, words):
    db, _ = visits
    policy = copy.deepcopy(VISITS)
    policy.update(change)
    policy = {k: v for k, v in policy.items() if v is not None}
    with pytest.raises(PolicyError) as info:
        db.protect("visits", policy, replace=True)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_mwem_is_refused_before_anything_is_spent(visits):
    db, _ = visits
    before = snapshot(db)
    with pytest.raises(StrategyError, match="declares privacy unit 'person_id'"):
        db.answer("SELECT item, COUNT(*) FROM visits GROUP BY item", epsilon=1, delta=0,
                  strategy="mwem(rounds=2)")
    assert snapshot(db) == before


def test_the_kernel_refuses_row_level_noise_on_a_unit_table(visits, monkeypatch):
    """The selection tampered to calibrate for one row (k = 1): the kernel multiplies by k
    itself and refuses, before the charge."""
    db, _ = visits
    real = matrix.noise_scale
    monkeypatch.setattr(matrix, "noise_scale", lambda fam, plan, eps, dlt, cal, k=1:
                        real(fam, plan, eps, dlt, cal, 1))
    import dpsql.release.matrix as release_matrix

    real_rho = release_matrix._rho
    monkeypatch.setattr(release_matrix, "_rho",
                        lambda expl, eps, plan, k=1: real_rho(expl, eps, plan, 1))
    before = snapshot(db)
    for delta in (1e-6, 0):
        with pytest.raises(ScaleRefused, match="nothing was charged"):
            db.answer("SELECT item, COUNT(*) FROM visits GROUP BY item", epsilon=1,
                      delta=delta, strategy="identity")
    assert snapshot(db) == before
    monkeypatch.undo()
    r = db.answer("SELECT item, COUNT(*) FROM visits GROUP BY item", epsilon=1, delta=1e-6,
                  strategy="identity")
    assert db.ledger()[-1]["sensitivity"] == K and r.results


def test_the_joint_release_scales_by_k(visits, monkeypatch):
    import dpsql.release.joint as joint

    db, _ = visits
    real = joint._gaussian
    monkeypatch.setattr(joint, "_gaussian", lambda ask, split, chosen, k: real(
        ask, split, chosen, 1))
    before = snapshot(db)
    with pytest.raises(ScaleRefused, match="joint strategy"):
        db.answer(BATCH, epsilon=1, delta=1e-6)
    assert snapshot(db) == before
    monkeypatch.undo()
    assert db.answer(BATCH, epsilon=1, delta=1e-6).results


def test_explain_names_the_unit(visits):
    db, _ = visits
    text = str(db.explain(BATCH, epsilon=1, delta=1e-6))
    assert f"privacy unit 'person_id', at most {K} rows per unit" in text


def test_the_high_dimensional_path_scales_by_k(visits, monkeypatch):
    """item x day is 2,190 cells: measured through marginals (issue 16), the cap applied to
    the marginals' scan and the kernel's marginal sensitivity times k."""
    import dpsql.mechanisms.implicit as selection
    import dpsql.release.implicit as implicit

    db, _ = visits
    sql = "SELECT item, day, COUNT(*) FROM visits GROUP BY item, day"
    for delta in (1e-6, 0):
        r = db.answer(sql, epsilon=1, delta=delta)
        assert r.strategy in ("residual", "marginals") and len(r.results[0].rows) == 5 * 365
    policy = db.policies()["visits"]
    from dpsql.kernel.data import _clique_marginals
    from dpsql.sql import memo

    queries = parse_batch(sql, lambda n, node: policy)
    workload = memo.compiled(memo.batch_key(sql, db.policies()), queries, policy,
                             implicit=True)
    with db.db.connect() as con:                 # the marginals' scan keeps k rows per unit
        x, _ = vectors(con, policy)
        (T,) = _clique_marginals(con, policy, workload, [(0, 1)]).values()
        rows = con.execute("SELECT count(*) FROM visits").fetchone()[0]
    assert T.sum() == x.sum() < rows
    for module in (selection, implicit):     # the planner calibrated for one row (k = 1)
        monkeypatch.setattr(module, "times_contribution", lambda k, s: s)
    before = snapshot(db)
    for delta in (1e-6, 0):
        with pytest.raises(ScaleRefused, match="nothing was charged"):
            db.answer(sql, epsilon=1, delta=delta)
    assert snapshot(db) == before


@pytest.mark.parametrize("sql, strategy", [
    ("SELECT item, COUNT(*) FROM visits GROUP BY item", "identity"),
    ("SELECT item, day, COUNT(*) FROM visits GROUP BY item, day", "auto"),
    (BATCH, "auto")])
def test_explain_tells_a_script_the_rho_the_charge_records(visits, sql, strategy):
    """A script checks its whole budget before its first release from each workload's
    explained ρ: on a unit table that ρ is k² times a row's, and must be the one charged."""
    db, _ = visits
    expl = db.explain(sql, epsilon=1, delta=1e-6, strategy=strategy)
    db.answer(sql, epsilon=1, delta=1e-6, strategy=strategy)
    with db.db.connect() as con:
        mechanism, rho = con.execute("SELECT mechanism, rho FROM dpsql.ledger ORDER BY "
                                     "release_id DESC LIMIT 1").fetchone()
    if mechanism == "gaussian":
        assert rho == pytest.approx(expl.planned_rho, rel=1e-12)
    else:                                    # pure noise: the script reads eps^2 / 2
        assert mechanism == "laplace" and expl.mechanism == "laplace"


def test_the_kernel_refuses_row_level_mechanisms_on_a_unit_table(visits):
    """MWEM's and d_X's oracles reason about one row: the kernel refuses them on a unit
    table itself (before the charge), whatever the planner let through."""
    from fractions import Fraction

    from dpsql.kernel.boundary import Kernel

    db, _ = visits
    policy = db.policies()["visits"]
    kernel = Kernel()
    before = snapshot(db)
    with db.db.connect() as con:
        for call in (lambda: kernel.release_adaptive(con, policy, [], Fraction(1), None, None),
                     lambda: kernel.release_per_query(con, policy, None, np.ones(1), None),
                     lambda: kernel.release_adaptive_metric(con, policy, [], [], Fraction(1),
                                                            None, None),
                     lambda: kernel.release_adaptive_marginals(con, policy, None, [(0,)],
                                                               Fraction(1), None, None)):
            with pytest.raises(ScaleRefused, match="declares privacy unit 'person_id'"):
                call()
    assert snapshot(db) == before

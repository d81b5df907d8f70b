"""Answers from past releases for batches compiled to Kronecker blocks (issue 16): the
measurements an implicit release keeps (one piece per clique measurement, over its own
columns), and the free answers they give dense and implicit batches later."""

from __future__ import annotations

import itertools
import math
import os
import tempfile
import tomllib
from importlib import resources

import duckdb
import numpy as np

import dpsql
from dpsql.mechanisms.reuse import records
from dpsql.policy.policy import table_policy_from_spec

DATA = resources.files("dpsql") / "data"
SPEC = tomllib.loads((DATA / "adult_policy.toml").read_text())["tables"]["adult"]
COLS = ["sex", "race", "income", "marital_status", "workclass", "education", "occupation"]
PAIRS = [f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}"
         for a, b in itertools.combinations(COLS[:5], 2)]


class _NoNoise:
    """Releases the exact measurements (tests only, non-private)."""

    private = False

    def sample(self, values, sigma, *, sensitivity=None):
        return np.asarray(values, dtype=float), 0.0

    def laplace(self, values, scale, *, sensitivity=None, epsilon=None):
        return np.asarray(values, dtype=float), 0.0


def _database(sampler):
    path = os.path.join(tempfile.mkdtemp(prefix="dpsql-reuse16-"), "adult.duckdb")
    con = duckdb.connect(path)
    con.execute("CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true)",
                [str(DATA / "adult.csv.gz")])
    con.close()
    db = dpsql.connect(path, sampler=sampler)
    db.protect("adult", dict(SPEC, epsilon=100, delta=0.5))
    return db


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

"""The kernel owns the joint release's scales (issue 20 item 1): COUNT and SUM blocks in one
charge, each block's noise checked together against what is charged.

Tampered on the way into the kernel — a block's σ or Laplace scale 30% (or 1%) too small,
Laplace shares summing above ε, the ρ recorded below the exact one, a block whose bounds
say more than the planner calibrated for — the release is refused with one line, before
the charge (ledger and tables unchanged, no noise drawn). Untampered, it releases, and the
kernel's exact products of value sums equal Python's integer arithmetic.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp

import dpsql.release.joint as joint
from dpsql.errors import ScaleRefused
from dpsql.kernel.joint import sum_measure
from dpsql.sql.ir import Value
from dpsql.workload.matrix import make_plan
from dpsql.workload.values import ValueBound

from ..conftest import make_adult_db, snapshot
from .test_kernel_scales import Recording

BATCH = ["SELECT sex, SUM(hours_per_week) FROM adult GROUP BY sex",
         "SELECT race, AVG(age) FROM adult GROUP BY race",
         "SELECT income, COUNT(*) FROM adult GROUP BY income"]


@pytest.fixture
def db(tmp_path):
    rec = Recording()
    d = make_adult_db(str(tmp_path / "j.duckdb"), sampler=rec, epsilon=10, delta=1e-5)
    d.rec = rec
    yield d
    d.close()


def refused(db, match, **kwargs) -> str:
    before = snapshot(db)
    with pytest.raises(ScaleRefused, match=match) as err:
        db.answer(BATCH, **kwargs)
    assert "\n" not in str(err.value) and "nothing was charged" in str(err.value)
    assert db.rec.calls == [] and snapshot(db) == before
    return str(err.value)


def tamper(monkeypatch, name, change):
    real = getattr(joint, name)

    def tampered(*args):
        out = real(*args)
        return change(out)

    monkeypatch.setattr(joint, name, tampered)


def _scaled(blocks, which, factor):
    return [dataclasses.replace(b, scale=b.scale * factor) if i == which else b
            for i, b in enumerate(blocks)]


@pytest.mark.parametrize("which", [0, 1, 2])
@pytest.mark.parametrize("factor", [0.7, 0.99])
def test_a_gaussian_block_below_its_sigma_is_refused(db, monkeypatch, which, factor):
    tamper(monkeypatch, "_gaussian", lambda out: (_scaled(out[0], which, factor), out[1]))
    msg = refused(db, "joint strategy", epsilon=1, delta=1e-6)
    assert "not within the charged delta" in msg or "below the exact" in msg


def test_the_recorded_rho_must_match(db, monkeypatch):
    tamper(monkeypatch, "_gaussian", lambda out: (out[0], out[1] / 2))
    refused(db, "below the exact", epsilon=1, delta=1e-6)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_laplace_block_below_its_scale_is_refused(db, monkeypatch, which):
    tamper(monkeypatch, "_laplace", lambda blocks: _scaled(blocks, which, 0.7))
    assert "spends epsilon" in refused(db, "joint strategy", epsilon=1, delta=0)


def test_laplace_shares_above_epsilon_are_refused(db, monkeypatch):
    tamper(monkeypatch, "_laplace", lambda blocks: [
        dataclasses.replace(b, epsilon=b.epsilon * Fraction(11, 10),
                            scale=b.scale / 1.1 * 1.2) for b in blocks])
    assert "add up to" in refused(db, "joint strategy", epsilon=1, delta=0)


def test_bounds_wider_than_calibrated_are_refused(db, monkeypatch):
    """The planner's σ is for [0, 100]; a block claiming [0, 1000] (which the engine would
    clamp to) is checked by the kernel from its own bounds."""
    def wider(out):
        blocks = [dataclasses.replace(b, value=Value(b.value.column, b.value.lo,
                                                     b.value.hi * 10))
                  if b.value is not None and b.value.column == "hours_per_week" else b
                  for b in out[0]]
        return blocks, out[1]

    tamper(monkeypatch, "_gaussian", wider)
    refused(db, "joint strategy", epsilon=1, delta=1e-6)


@pytest.mark.parametrize("delta", [1e-6, 0])
def test_untampered_releases_once_with_each_blocks_noise(db, delta):
    r = db.answer(BATCH, epsilon=1, delta=delta)
    entry = db.ledger()[-1]
    assert entry["status"] == "released" and entry["strategy"].startswith("joint(")
    assert len(db.ledger()) == 1 and len(r.results) == 3
    kind = "gaussian" if delta else "laplace"
    assert [c[0] for c in db.rec.calls] == [kind] * 3      # one draw per block, one charge


@pytest.mark.parametrize("dense", [True, False])
def test_sum_products_are_exact(dense):
    rng = np.random.default_rng(3)
    value = Value("v", Fraction(-7, 3), Fraction(10 ** 6))
    b = ValueBound(value.lo, value.hi)
    n = 300
    sums = rng.integers(-2 ** 61, 2 ** 61, size=n, dtype=np.int64)   # far past float64
    A = rng.integers(-2 ** 20, 2 ** 20 + 1, size=(40, n)) / 2 ** 20
    A[rng.random(A.shape) < 0.5] = 0
    plan = make_plan("t", A if dense else sp.csr_matrix(A))
    got = sum_measure(plan, sums, value)
    K = np.rint(np.asarray(plan.A.todense() if sp.issparse(plan.A) else plan.A) * 2 ** 20)
    exact = [sum(int(k) * int(s) for k, s in zip(row, sums)) for row in K.astype(np.int64)]
    want = [float(Fraction(e) * b.unit / 2 ** 20) for e in exact]   # one correct rounding
    assert got.tolist() == want
    assert sum_measure(make_plan("i", np.eye(n)), sums, value).tolist() == \
        [float(Fraction(int(s)) * b.unit) for s in sums]

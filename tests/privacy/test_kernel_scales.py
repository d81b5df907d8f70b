"""The kernel owns noise scales (issue 15, item 3).

For every mechanism the scale is tampered with on its way into the kernel (the selection's
noise-scale function, the recorded ρ, the d_X program's scales, the oracles' sensitivity
helpers) and the kernel must refuse with a one-line error before any noise is drawn (a
recording sampler is never called for the refused step) and, where the check precedes the
charge, with the ledger unchanged. The untampered path releases as before.
"""

from __future__ import annotations

import copy
import dataclasses
from fractions import Fraction

import numpy as np
import pytest

import dpsql.release.matrix as release_matrix
from dpsql.errors import ScaleRefused
from dpsql.mechanisms import catalog
from dpsql.mechanisms import matrix
from dpsql.mechanisms.dx.mechanisms import PairDifferences
from dpsql.noise import laplace as laplace_mod
from dpsql.noise.samplers import SeededTestSampler

from ..conftest import ADULT_POLICY, make_adult_db, snapshot

SEX_RACE = ["SELECT sex, COUNT(*) FROM adult GROUP BY sex",
            "SELECT race, COUNT(*) FROM adult GROUP BY race"]
RACE_INCOME = ["SELECT race, COUNT(*) FROM adult GROUP BY race",
               "SELECT income, COUNT(*) FROM adult GROUP BY income"]
MWEM_BATCH = ["SELECT COUNT(*) FROM adult WHERE age < 30",
              "SELECT COUNT(*) FROM adult WHERE age BETWEEN 30 AND 49",
              "SELECT sex, COUNT(*) FROM adult GROUP BY sex"]
METRIC = {"epsilon": 50, "columns": {"age": {"weight": 0.1}, "sex": {"different": 1},
                                     "race": {"different": 1}}}
DX_BATCH = ";\n".join(
    [f"SELECT COUNT(*) FROM adult WHERE age BETWEEN {a} AND {a + 9}" for a in range(20, 80, 10)]
    + ["SELECT sex, COUNT(*) FROM adult WHERE age >= 60 GROUP BY sex"])
TINY = "SELECT sex, COUNT(*) FROM adult GROUP BY sex; SELECT COUNT(*) FROM adult WHERE age < 40"


class Recording:
    """Seeded noise, and a record of every call (kind, scale or ε, sensitivity)."""

    private = False

    def __init__(self, seed: int = 5):
        self.inner = SeededTestSampler(seed)
        self.calls: list = []

    def sample(self, values, sigma, *, sensitivity=None):
        self.calls.append(("gaussian", sigma, sensitivity))
        return self.inner.sample(values, sigma, sensitivity=sensitivity)

    def laplace(self, values, scale, *, sensitivity, epsilon=None):
        self.calls.append(("laplace", scale, sensitivity))
        return self.inner.laplace(values, scale, sensitivity=sensitivity, epsilon=epsilon)

    def exponential(self, scores, epsilon, *, sensitivity):
        self.calls.append(("exponential", epsilon, sensitivity))
        return self.inner.exponential(scores, epsilon, sensitivity=sensitivity)

    def kinds(self) -> set:
        return {c[0] for c in self.calls}


@pytest.fixture
def db(tmp_path):
    rec = Recording()
    d = make_adult_db(str(tmp_path / "k.duckdb"), sampler=rec)
    policy = copy.deepcopy(ADULT_POLICY)
    policy.update(epsilon=10, delta=1e-5, metric=METRIC, rows=32561)
    d.protect("adult", policy, replace=True)
    d.rec = rec
    yield d
    d.close()


def _refused_before_charge(db, match, sql, **kwargs):
    before = snapshot(db)
    with pytest.raises(ScaleRefused, match=match) as err:
        db.answer(sql, **kwargs)
    assert "\n" not in str(err.value) and "nothing was charged" in str(err.value)
    assert db.rec.calls == []                 # no noise drawn, no data read
    assert snapshot(db) == before             # nothing charged, no table written
    return str(err.value)


def _refused_after_charge(db, match, sql, kind, **kwargs):
    """Data-dependent runs: the step's check can only run after the charge (docstrings)."""
    n, tables = len(db.ledger()), _tables(db)
    with pytest.raises(ScaleRefused, match=match) as err:
        db.answer(sql, **kwargs)
    assert "\n" not in str(err.value) and "nothing was sampled" in str(err.value)
    assert kind not in db.rec.kinds()         # the refused kind of step never sampled
    entries = db.ledger()
    assert len(entries) == n + 1 and entries[-1]["status"] == "charged"   # spent, by design
    assert _tables(db) == tables              # nothing published


def _tables(db) -> list:
    with db.db.connect() as con:
        return [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                          "WHERE table_schema = 'main'").fetchall()]


def _tamper_matrix_scale(monkeypatch, family):
    """The selection's noise-scale function halves σ (or b) of ``family``."""
    real = matrix.noise_scale

    def tampered(fam, plan, eps, dlt, calibration, contribution=1):
        scale, variance = real(fam, plan, eps, dlt, calibration, contribution)
        return (scale / 2, variance / 4) if fam == family else (scale, variance)

    monkeypatch.setattr(matrix, "noise_scale", tampered)


# ---------------------------------------------------------------- matrix mechanism

GAUSSIAN = dict(epsilon=Fraction(1, 2), delta=Fraction(1, 10**6), strategy="identity")


@pytest.mark.parametrize("calibration", ["analytic", "classic"])
def test_gaussian_releases_as_before(db, calibration):
    r = db.answer(SEX_RACE, calibration=calibration, **GAUSSIAN)
    entry = db.ledger()[-1]
    assert entry["status"] == "released" and entry["calibration"] == calibration
    (call,) = db.rec.calls
    assert call == ("gaussian", r.sigma, 1.0)  # the kernel's own sensitivity of the identity
    assert entry["sigma"] == r.sigma


@pytest.mark.parametrize("calibration", ["analytic", "classic"])
def test_gaussian_sigma_halved_is_refused(db, monkeypatch, calibration):
    _tamper_matrix_scale(monkeypatch, "gaussian")
    msg = _refused_before_charge(db, "gaussian release", SEX_RACE, calibration=calibration,
                                 **GAUSSIAN)
    assert "not within the charged delta" in msg and "needs sigma >=" in msg


def test_classic_charge_with_an_analytic_sigma_is_refused(db, monkeypatch):
    """σ private under the analytic profile, but the charge records classic: refused."""
    real = matrix.noise_scale
    monkeypatch.setattr(matrix, "noise_scale", lambda fam, plan, eps, dlt, calibration, k=1:
                        real(fam, plan, eps, dlt, "analytic", k))
    _refused_before_charge(db, "below the classic calibration", SEX_RACE,
                           calibration="classic", **GAUSSIAN)


@pytest.mark.parametrize("factor, match", [(Fraction(1, 2), "below the exact"),
                                           (2, "not the")])
def test_recorded_rho_must_match_the_sigma_used(db, monkeypatch, factor, match):
    real = release_matrix._rho
    monkeypatch.setattr(release_matrix, "_rho",
                        lambda expl, eps, plan, k=1: real(expl, eps, plan, k) * float(factor))
    _refused_before_charge(db, match, SEX_RACE, **GAUSSIAN)


LAPLACE = dict(epsilon=Fraction(1, 2), delta=0, strategy="identity")


def test_laplace_matrix_releases_as_before(db):
    r = db.answer(SEX_RACE, **LAPLACE)
    assert db.ledger()[-1]["status"] == "released"
    assert db.rec.calls == [("laplace", r.sigma, 1.0)]


def test_laplace_matrix_scale_halved_is_refused(db, monkeypatch):
    _tamper_matrix_scale(monkeypatch, "laplace")
    msg = _refused_before_charge(db, "laplace release", SEX_RACE, **LAPLACE)
    assert "spends epsilon" in msg and "needs b >=" in msg


def test_reuse_new_measurements_are_checked(db, monkeypatch):
    db.answer(SEX_RACE, **LAPLACE)
    db.rec.calls.clear()
    e = db.explain(RACE_INCOME, **LAPLACE)
    assert e.free and e.reused_from == (1,)   # race is free, income is measured
    with monkeypatch.context() as m:
        _tamper_matrix_scale(m, "laplace")
        _refused_before_charge(db, "laplace release", RACE_INCOME, **LAPLACE)
    db.answer(RACE_INCOME, **LAPLACE)          # untampered: combined as before
    entry = db.ledger()[-1]
    assert entry["reused_from"] == "1" and entry["status"] == "released"
    assert [c[0] for c in db.rec.calls] == ["laplace"]


def test_kernel_scale_check_is_exact_at_the_boundary():
    """The Laplace check is exact: the calibrated b passes, the next double down fails."""
    for eps, sens, p in [(Fraction(1, 10), 1.0, 1), (Fraction(3), 2.5, 40)]:
        b = laplace_mod.laplace_scale(eps, sens, p)
        assert laplace_mod.laplace_shortfall(b, eps, sens, p) is None
        assert laplace_mod.laplace_shortfall(np.nextafter(b, 0), eps, sens, p) is not None


@pytest.mark.parametrize("eps", ["0.01", "0.5", "0.999", "3", "50"])
@pytest.mark.parametrize("dlt", ["1e-12", "1e-6", "0.1"])
def test_gaussian_check_passes_the_calibrated_sigma_and_nothing_below(eps, dlt):
    from dpsql.noise.gaussian import calibrate_with_rounding, gaussian_shortfall

    eps, dlt = Fraction(eps), Fraction(dlt)
    for sens, p in [(1.0, 1), (2.5, 1000), (0.001, 40)]:
        cals = ["analytic", "classic"] if eps < 1 else ["analytic"]
        for cal in cals:
            sigma = calibrate_with_rounding(eps, dlt, sens, p, cal)
            assert gaussian_shortfall(sigma, eps, dlt, sens, p, cal) is None
            assert gaussian_shortfall(sigma * (1 - 1e-6), eps, dlt, sens, p, cal) is not None


def test_kernel_recomputes_the_plans_recorded_l2_sensitivity_exactly():
    import scipy.sparse as sp

    from dpsql.noise.verify import exact_l2_norm
    from dpsql.workload.matrix import exact_l2_sensitivity, make_plan

    rng = np.random.default_rng(4)
    for _ in range(50):
        m, n = (int(k) for k in rng.integers(1, 40, 2))
        A = sp.random(m, n, density=0.3, random_state=rng) - sp.random(m, n, density=0.2,
                                                                       random_state=rng)
        if A.nnz:
            plan = make_plan("random", A)
            assert exact_l2_norm(plan.A) == plan.sensitivity == exact_l2_sensitivity(plan.A)
            assert exact_l2_norm(plan.A.toarray()) == plan.sensitivity


# --------------------------------------------------------------------------- MWEM

MWEM = dict(epsilon=Fraction(1), delta=0, strategy="mwem(rounds=3)")


def test_mwem_releases_as_before(db):
    db.answer(MWEM_BATCH, **MWEM)
    assert db.ledger()[-1]["status"] == "released"
    assert {"laplace", "exponential"} <= db.rec.kinds()


def test_mwem_laplace_step_with_halved_scale_is_refused(db, monkeypatch):
    real = laplace_mod.laplace_scale
    monkeypatch.setattr(laplace_mod, "laplace_scale", lambda *a: real(*a) / 2)
    _refused_after_charge(db, "MWEM measurement", MWEM_BATCH, "laplace", **MWEM)


def test_mwem_selection_with_halved_sensitivity_is_refused(db, monkeypatch):
    import dpsql.kernel.oracles as oracles

    real = oracles.group_sensitivities
    monkeypatch.setattr(oracles, "group_sensitivities", lambda *a: real(*a) / 2)
    _refused_after_charge(db, "MWEM selection", MWEM_BATCH, "exponential", **MWEM)


# ---------------------------------------------------------------------------- d_X

DX = dict(epsilon=Fraction(1, 2), delta=0, model="metric")


def test_dx_laplace_releases_as_before(db):
    db.answer(DX_BATCH, **DX)
    assert db.ledger()[-1]["status"] == "released"
    assert db.rec.kinds() == {"laplace"}


def test_dx_laplace_with_one_scale_halved_is_refused(db, monkeypatch):
    real = catalog.explain_dx

    def tampered(policy, workload, eps):
        expl, plan = real(policy, workload, eps)
        scales = plan.scales.copy()
        k = int(np.argmax(scales))
        scales[k] /= 2
        return expl, dataclasses.replace(plan, scales=scales)

    monkeypatch.setattr(catalog, "explain_dx", tampered)
    msg = _refused_before_charge(db, "d_X Laplace release", DX_BATCH, **DX)
    assert "metric constraint on cell edge" in msg


def test_dx_scale_check_errs_only_against_the_caller():
    """A 3-cell chain (d = 1/10 per edge), ε = 2: the constraint is b ≥ 5 for a query that
    separates one edge; 1e-12 above passes, 1e-12 below fails, b = 0 needs a constant."""
    from dpsql.noise.verify import dx_scales_shortfall

    W = np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    I, J, d = np.array([0, 1]), np.array([1, 2]), np.array([0.1, 0.1])
    ok = dx_scales_shortfall(W, [5 * (1 + 1e-12), 0.0], I, J, d, 3, Fraction(2))
    assert ok is None
    assert "edge (0, 1)" in dx_scales_shortfall(W, [5 * (1 - 1e-12), 0.0], I, J, d, 3, 2)
    assert "exactly" in dx_scales_shortfall(W, [0.0, 0.0], I, J, d, 3, 2)
    assert "not connected" in dx_scales_shortfall(W, [6.0, 0.0], I[:1], J[:1], d[:1], 3, 2)


def test_dx_laplace_exact_query_must_be_constant(db, monkeypatch):
    real = catalog.explain_dx

    def tampered(policy, workload, eps):
        expl, plan = real(policy, workload, eps)
        return expl, dataclasses.replace(plan, scales=np.where(np.arange(plan.scales.size)
                                                               == 0, 0.0, plan.scales))

    monkeypatch.setattr(catalog, "explain_dx", tampered)
    _refused_before_charge(db, "released exactly", DX_BATCH, **DX)


@pytest.mark.parametrize("spec", ["dx_mwem(rounds=3)", "dx_smalldb(size=4)"])
def test_dx_data_dependent_releases_as_before(db, spec):
    db.answer(TINY if "smalldb" in spec else DX_BATCH, strategy=spec, **DX)
    assert db.ledger()[-1]["status"] == "released"
    assert "exponential" in db.rec.kinds()


@pytest.mark.parametrize("method, match, kind", [
    ("groups", "d_X MWEM selection", "exponential"),
    ("total", "d_X MWEM measurement", "laplace")])
def test_dx_mwem_with_halved_lipschitz_constant_is_refused(db, monkeypatch, method, match,
                                                           kind):
    real = getattr(PairDifferences, method)
    monkeypatch.setattr(PairDifferences, method, lambda self, *a: real(self, *a) / 2)
    _refused_after_charge(db, match, DX_BATCH, kind, strategy="dx_mwem(rounds=3)", **DX)


def test_dx_exponential_smalldb_with_halved_lipschitz_constant_is_refused(db, monkeypatch):
    real = PairDifferences.rows
    monkeypatch.setattr(PairDifferences, "rows", lambda self: real(self) / 2)
    _refused_after_charge(db, "d_X SmallDB selection", TINY, "exponential",
                          strategy="dx_smalldb(size=4)", **DX)


def test_dx_run_with_a_foreign_cell_metric_is_refused_before_the_charge(db, monkeypatch):
    real = catalog.dx_mwem_plan

    def stretched(*args):
        *rest, graphs = real(*args)
        return (*rest, [dataclasses.replace(g, d=g.d * 2) for g in graphs])

    monkeypatch.setattr(catalog, "dx_mwem_plan", stretched)
    _refused_before_charge(db, "cell metric given differs", DX_BATCH,
                           strategy="dx_mwem(rounds=3)", **DX)

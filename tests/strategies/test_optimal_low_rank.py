"""``optimal`` on rank-deficient workloads (dpsql/strategies/gaussian/optimal.py, dual.py).

Their optimum ``X`` is singular, so the strategy mixes in ``t`` of the identity and its
certified gap carries ``1/(1 − t)``: with ``t`` fixed at 2e-6 above the 1e-6 tolerance these
workloads could never certify (the solver iterated to a stall and reported ~2.2e-6).
Oracles: the certificate itself (upper / lower bound, both recomputed here from the plan)
and L-BFGS-B run to its own tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dpsql.strategies.gaussian import coa, optimal, projected
from dpsql.strategies.gaussian.dual import FactoredForm
from dpsql.workload.matrix import WorkloadInfo
from tests.strategies.test_newton import points_and_ranges


def ranges(n: int, k: int, seed: int) -> WorkloadInfo:
    """``k`` random ranges over ``n`` cells, no point queries."""
    return points_and_ranges(n, k, seed, points=False)


@pytest.mark.parametrize("n,k,seed", [(64, 40, 0), (64, 40, 1), (96, 150, 0), (96, 200, 3)])
def test_rank_deficient_workloads_certify_the_tolerance_mix_included(n, k, seed):
    info = ranges(n, k, seed)
    assert np.linalg.matrix_rank(info.V) < n              # singular: the mix is needed
    sol = optimal.solve(info)
    assert 0 < sol.mix == optimal.mix_weight(optimal.TOL) <= optimal.TOL / 4
    assert sol.gap <= optimal.TOL
    # the certificate, recomputed from the strategy itself: tr(V (AᵀA)⁻¹) / lower − 1
    A = sol.A.toarray() if sp.issparse(sol.A) else np.asarray(sol.A)
    assert np.linalg.norm(A, axis=0).max() <= 1 + 1e-12
    V = np.asarray(info.V, dtype=float) / sol.scale
    value = float(np.trace(np.linalg.solve(A.T @ A, V)))
    assert value / sol.lower - 1 <= optimal.TOL * (1 + 1e-3)
    assert sol.iterations < 100                           # no stall


def test_coa_returns_the_certified_warm_start_without_newton_steps():
    plan = coa.COA().plan(ranges(64, 40, 0))
    notes = dict(plan.notes)
    assert notes["iterations"] == 0 and notes["gap"] <= 1e-6 and notes["mix"] > 0


def test_lbfgs_stops_at_its_own_certificate_and_it_holds():
    info = ranges(96, 60, 2)
    sol = optimal.solve(info)                             # the factored form's F, from V
    V = np.asarray(info.V, dtype=float) / sol.scale
    lam, Q = np.linalg.eigh(V)
    keep = lam > 1e-11 * lam.max()
    form = FactoredForm(Q[:, keep] * np.sqrt(lam[keep]))
    w0 = np.full(96, 1 / 96)
    w_full, used_full = form.ascend(w0, 1000)
    w_stop, used_stop = form.ascend(w0, 1000, gap=1e-6)
    assert used_stop < used_full
    p = form.evaluate(w_stop)
    assert p.h ** 2 * p.x.max() / p.low ** 2 - 1 <= 1e-6 * 1.01


def _factored(info):
    V = np.asarray(info.V, dtype=float)
    V /= np.diag(V).max()
    lam, Q = np.linalg.eigh(V)
    keep = lam > 1e-11 * lam.max()
    return FactoredForm(Q[:, keep] * np.sqrt(lam[keep]))


def test_the_projected_hessian_matches_finite_differences():
    form = _factored(ranges(80, 50, 4))
    rng = np.random.default_rng(4)  # test data only
    v = rng.uniform(0.2, 1.5, form.n)
    rho, _, G, a = form._parts(v)
    M = projected.negative_hessian(G, rho).astype(float)
    M = np.triu(M) + np.triu(M, 1).T                      # ssyrk fills the upper triangle
    dv = 1e-6 * v * rng.standard_normal(form.n)
    da = form._parts(v + dv)[3] - a                       # ∂a/∂v dv = −M dv
    assert np.linalg.norm(da + M @ dv) <= 0.1 * np.linalg.norm(da)


@pytest.mark.parametrize("n,k,seed", [(96, 60, 0), (96, 150, 1), (128, 40, 2)])
def test_projected_newton_certifies_in_few_evaluations(n, k, seed):
    """At the gap ``optimal`` asks of it (0.9 of what the 1e-6 tolerance leaves beside the
    mix); where it stalls short of a gap (its Hessian is a few percent off), L-BFGS-B and the
    fixed point finish, as test_rank_deficient_workloads... checks."""
    form = _factored(ranges(n, k, seed))
    gap = 0.9 * ((1 + optimal.TOL) * (1 - optimal.mix_weight(optimal.TOL)) - 1)
    w, used, done = projected.ascend(form, np.full(n, 1 / n), gap, 200)
    assert done and used <= 40
    p = form.evaluate(w)                                  # the caller's evaluation agrees
    assert p.h ** 2 * p.x.max() / p.low ** 2 - 1 <= 1.01 * gap


def test_the_search_takes_a_certified_step_whatever_armijo_says():
    """Near the optimum ``Φ`` is flat to its rounding: a full step that certified the gap
    failed Armijo's test on rounding alone, the halved steps moved away from it, and
    L-BFGS-B then stalled (77 evaluations, 5.9 s, on 600 ranges over 1,024 cells)."""
    v, d, g = np.ones(4), np.full(4, 1e-9), np.full(4, 1e-6)
    calls = []

    def evaluate(moved):
        calls.append(moved)
        return 1.0 - 1e-15, None, None, None, True       # a hair lower, and certified
    moved, found = projected._search(evaluate, v, 1.0, g, d, 8)
    assert len(calls) == 1 and np.array_equal(moved, v + d) and found[4]


def test_a_batch_whose_flat_optimum_failed_armijo_certifies_in_few_steps():
    """The batch of the test above's kind that is small: 23 evaluations before, 12 now."""
    sol = optimal.solve(ranges(128, 256, 2))
    assert sol.gap <= optimal.TOL and sol.iterations <= 15


def test_the_solver_takes_fewer_steps_with_the_projected_newton(monkeypatch):
    info = ranges(128, 100, 5)
    fast = optimal.solve(info)
    monkeypatch.setattr(projected, "ascend", lambda form, w, gap, most: (w, 0, False))
    slow = optimal.solve(info)
    assert fast.gap <= optimal.TOL and slow.gap <= optimal.TOL
    assert fast.iterations < slow.iterations


def test_many_cells_and_a_low_rank_skip_the_hessian_and_still_certify(monkeypatch):
    """Few queries over many cells: no n x n Hessian past projected.HESSIAN_CELLS when the
    rank is under projected.RANK_SHARE of the cells (L-BFGS-B's O(n r) memory instead),
    nor ever past projected.MAX_CELLS; the same certificate."""
    monkeypatch.setattr(projected, "HESSIAN_CELLS", 50)
    monkeypatch.setattr(projected, "negative_hessian", lambda *a: pytest.fail("formed"))
    sol = optimal.solve(ranges(64, 10, 0))                # rank <= 10 < 64 / 4
    assert sol.gap <= optimal.TOL
    monkeypatch.setattr(projected, "MAX_CELLS", 50)
    assert optimal.solve(ranges(64, 40, 0)).gap <= optimal.TOL


def test_a_rank_that_is_a_large_share_of_many_cells_gets_newton_steps(monkeypatch):
    """Past HESSIAN_CELLS the Hessian is still formed where the rank is a large share of the
    cells, and past LBFGS_MAX_RANK (L-BFGS-B not tried) the Newton steps still run: at 2,048
    cells and rank 1,441 the fixed point alone had stalled at a gap of 4.6e-6 after 70
    evaluations (49 s); these steps certified in 11 (13 s)."""
    monkeypatch.setattr(projected, "HESSIAN_CELLS", 50)
    monkeypatch.setattr(optimal, "LBFGS_MAX_RANK", 10)
    formed = []
    real = projected.negative_hessian
    monkeypatch.setattr(projected, "negative_hessian",
                        lambda *a: formed.append(1) or real(*a))
    sol = optimal.solve(ranges(64, 40, 0))                # rank 40 >= 64 / 4, > 10
    assert formed and sol.gap <= optimal.TOL and sol.iterations <= 20


def test_lbfgs_ascends_at_any_rank_where_the_newton_steps_do_not_run(monkeypatch):
    """No Hessian (many cells, a rank under RANK_SHARE of them) and a rank over
    LBFGS_MAX_RANK: L-BFGS-B still ascends, rather than the fixed point alone (which crawls
    where many optimal weights are 0)."""
    monkeypatch.setattr(projected, "HESSIAN_CELLS", 50)
    monkeypatch.setattr(projected, "RANK_SHARE", 0.9)
    monkeypatch.setattr(optimal, "LBFGS_MAX_RANK", 10)
    calls = []
    real = FactoredForm.ascend
    monkeypatch.setattr(FactoredForm, "ascend",
                        lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    sol = optimal.solve(ranges(64, 40, 0))                # rank 40 < 0.9 * 64, > 10
    assert calls and sol.gap <= optimal.TOL


@pytest.mark.parametrize("short", [False, True])
@pytest.mark.parametrize("duplicate", [False, True])
def test_the_row_space_factor_reproduces_the_gram_matrix(duplicate, short):
    """``F Fᵀ = Wᵀ W`` with ``F`` of full column rank: ``Wᵀ`` itself for independent rows,
    the eigenvectors' route when a row repeats (rank one less than the rows); the Gram
    product dense (long ranges) or sparse (points and pairs of cells)."""
    if short:
        W = sp.vstack([sp.identity(96, format="csr")[:50],
                       sp.csr_matrix(np.eye(96, k=1)[50:60] + np.eye(96)[50:60])]).tocsr()
    else:
        W = ranges(96, 60, 4).W
    if duplicate:
        W = sp.vstack([W, W[3]]).tocsr()
    F = optimal._row_space(W)
    assert np.allclose(F @ F.T, (W.T @ W).toarray(), atol=1e-10)
    assert F.shape[1] == np.linalg.matrix_rank(W.toarray()) == 60
    if not duplicate:
        assert np.array_equal(F, W.T.toarray())


def test_kronecker_factors_keep_the_larger_mix_and_certify_their_tolerance():
    """A singular 1-D factor of a Kronecker plan: the identity's weight stays 2e-6 (its
    products multiply condition numbers) and the factor's tolerance leaves room for it."""
    from dpsql.strategies import kronecker
    info = ranges(64, 40, 1)
    sol = optimal.solve(WorkloadInfo(64, V=info.V, m=64), tol=kronecker.FACTOR_TOL)
    assert sol.mix == optimal.MIX and sol.gap <= kronecker.FACTOR_TOL
    assert sol.iterations < 100


def test_auto_skips_a_low_rank_solve_it_prices_over_its_limit(monkeypatch):
    """2,000 ranges over 3,000 cells: priced as full rank (``0.45 (n/1024)³``, 11 s) ``auto``
    planned it, for 69 s of CPU; priced by its rank (at most the 2,000 queries) it is over
    ``auto``'s limit, so ``auto`` skips it, saying why, and never starts the solve. With as
    many queries as cells the price stays the full-rank one."""
    from types import SimpleNamespace

    from dpsql.mechanisms import selection
    monkeypatch.setattr(optimal, "solve", lambda *a, **k: pytest.fail("solved"))
    batch = SimpleNamespace(W=ranges(3000, 2000, 1).W, shape=(3000,))
    found = selection.evaluate(None, "gaussian", "optimal", optimal.Optimal(), batch, auto=True)
    assert found.status == "skipped" and "estimated" in found.note
    price = optimal.Optimal().estimated_seconds
    assert price(SimpleNamespace(n=3000, m=2000)) > selection.AUTO_TIME_LIMIT
    assert price(SimpleNamespace(n=1024, m=2524)) == price(SimpleNamespace(n=1024, m=1024))
    assert price(SimpleNamespace(n=1024, m=300)) < price(SimpleNamespace(n=1024, m=600))

"""Newton and chord steps of the ``optimal`` dual (dpsql/strategies/gaussian/newton.py).

Oracles: the integral 1/s (the quadrature), finite differences of the exact float64 dual
(the Jacobian), and the solver's own certificate with the Newton steps switched off.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dpsql.strategies.gaussian import newton, optimal
from dpsql.strategies.gaussian.dual import FullForm
from dpsql.workload.matrix import WorkloadInfo


def points_and_ranges(n: int, k: int, seed: int, points: bool = True) -> WorkloadInfo:
    """``k`` random ranges over ``n`` cells, after the ``n`` point queries (``points``)."""
    rng = np.random.default_rng(seed)  # test data only
    ends = np.sort(rng.integers(0, n, (k, 2)), axis=1)
    W = np.zeros((k, n))
    for row, (a, b) in enumerate(ends):
        W[row, a:b + 1] = 1
    return WorkloadInfo.from_matrix(sp.csr_matrix(np.vstack([np.eye(n), W]) if points else W),
                                    (n,))


@pytest.mark.parametrize("ratio", [1.0, 3.0, 100.0, 563.0, 1e4])
def test_nodes_approximate_the_reciprocal(ratio):
    t, weights = newton.nodes(2e-3, 2e-3 * ratio)
    s = np.geomspace(2e-3, 2e-3 * ratio, 2000)
    approx = np.exp(-np.outer(s, t)) @ weights
    assert np.all(weights >= 0) and np.all(t > 0)
    assert np.abs(approx * s - 1).max() < 0.25          # 5-18%: a direction only
    assert t.size <= 5


def _point(V, w):
    return FullForm(V, symmetry=False).evaluate(w)


def test_jacobian_matches_finite_differences():
    info = points_and_ranges(48, 60, 1)
    V = np.asarray(info.V, dtype=float)
    V /= np.diag(V).max()
    rng = np.random.default_rng(2)  # test data only
    w = rng.uniform(0.3, 1.5, V.shape[0])
    w /= w.sum()
    p = _point(V, w)
    Q, r = p.eigen()
    jac = newton.Jacobian(Q, r, w * p.h * p.x, p.h)
    assert jac.ok
    du = 1e-5 * rng.standard_normal(w.size)
    q = _point(V, w * np.exp(du))                     # x of the unnormalised w: J du exactly
    # d log x = −D_N⁻¹ A du, so the step for the residual log(x / x') recovers du
    back = jac.step(p.x / q.x)
    assert np.linalg.norm(back - du) <= 0.1 * np.linalg.norm(du)


def test_newton_step_from_uniform_beats_the_fixed_point():
    info = points_and_ranges(64, 90, 3)
    V = np.asarray(info.V, dtype=float)
    V /= np.diag(V).max()
    n = V.shape[0]
    w = np.full(n, 1.0 / n)
    p = _point(V, w)
    Q, r = p.eigen()
    step = newton.Jacobian(Q, r, w * p.h * p.x, p.h).step(p.x)
    plain = w * p.x ** 2                              # the fixed point's γ = 2 step
    moved = w * np.exp(step)
    errors = [np.abs(_point(V, v / v.sum()).x - 1).max() for v in (plain, moved)]
    assert errors[1] < 0.5 * errors[0]


def test_chord_steps_save_evaluations_and_keep_the_certificate(monkeypatch):
    info = points_and_ranges(96, 150, 4)
    with_newton = optimal.solve(info)

    class Off:
        def step(self, *args):
            return None

    monkeypatch.setattr(optimal, "Chord", Off)
    without = optimal.solve(info)
    assert with_newton.gap <= 1e-6 and without.gap <= 1e-6
    assert with_newton.iterations < without.iterations
    assert with_newton.upper == pytest.approx(without.upper, rel=2e-6)
    assert with_newton.lower <= without.upper * (1 + 1e-9)
    assert without.lower <= with_newton.upper * (1 + 1e-9)
    columns = np.sqrt(np.square(with_newton.A).sum(axis=0))
    assert columns.max() <= 1 + 1e-12


def test_a_failing_newton_phase_hands_over_to_the_fixed_point():
    chord = newton.Chord()

    class Bad:                                        # an exact point whose x got worse
        exact = True
        h = 1.0

        def eigen(self):
            return np.eye(3), np.ones(3)

    w = np.full(3, 1 / 3)
    assert chord.step(Bad(), w, np.array([1.1, 0.9, 1.0])) is not None
    assert chord.step(Bad(), w, np.array([1.5, 0.5, 1.0])) is None   # Newton's own: off
    assert chord.off and chord.step(Bad(), w, np.array([1.01, 0.99, 1.0])) is None


def _near_optimum(n: int, k: int, seed: int, spread: float):
    """(V scaled, the dual optimum w perturbed by ``spread`` in log, its point with the
    rescaled value always computed)."""
    info = points_and_ranges(n, k, seed)
    V = np.asarray(info.V, dtype=float)
    V /= np.diag(V).max()
    w_opt = optimal.solve(info, tol=1e-10).weights
    rng = np.random.default_rng(seed)  # test data only
    w = w_opt * np.exp(spread * rng.standard_normal(n))
    w /= w.sum()
    return V, w, FullForm(V, symmetry=False).evaluate(w)


@pytest.mark.parametrize("spread", [1e-2, 3e-3, 1e-3])
def test_rescaled_excess_is_at_least_the_leading_order_term(spread):
    """The skip rule's premise (dual.rescaled_hopeless): tr(V X'⁻¹)/h² − 1 >= ¾ Σ w (x − 1)²
    to leading order (here with 10% room for the cubic terms)."""
    for seed in (4, 5, 6):
        V, w, p = _near_optimum(40, 70, seed, spread)
        assert np.isfinite(p.rescaled)
        excess = p.rescaled / p.h ** 2 - 1
        lead = 0.75 * float(np.dot(w, np.square(p.x - 1)))
        assert excess >= 0.9 * lead > 0


def test_hopeless_rescaled_values_are_skipped_and_the_certificate_kept(monkeypatch):
    V, w, p = _near_optimum(40, 70, 7, 1e-2)
    est = 0.75 * float(np.dot(w, np.square(p.x - 1)))
    form = FullForm(V, symmetry=False)
    assert np.isfinite(form.evaluate(w, tol=1.01 * est).rescaled)
    skipped = form.evaluate(w, tol=0.99 * est)
    assert skipped.rescaled == np.inf and skipped.low == p.low and np.all(skipped.x == p.x)
    # the solver certifies the same gap in no more steps than with every value computed
    info = points_and_ranges(64, 90, 3)
    fast = optimal.solve(info)
    monkeypatch.setattr("dpsql.strategies.gaussian.dual.rescaled_hopeless",
                        lambda w, x, tol: False)
    full = optimal.solve(info)
    assert fast.gap <= optimal.TOL and fast.iterations <= full.iterations
    assert fast.upper == pytest.approx(full.upper, rel=1e-12)

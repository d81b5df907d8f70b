"""The local-polytope estimate behind non-negative answers on wide batches
(:mod:`dpsql.inference.pgm`), against dense references on small domains."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.optimize as so

from dpsql.inference import consistent, pgm
from dpsql.workload.blocks import apply_along, marginal, marginal_workload
from dpsql.workload.limits import Limits
from dpsql.workload.marginals import MarginalMeasurement

SIZES = (3, 4, 2, 3)
CYCLE = ((0, 1), (1, 2), (2, 3), (0, 3))


def _rng(seed: int):
    return np.random.default_rng(seed)                   # test data only


def _tables(rng, regions, sizes=SIZES) -> dict:
    return {R: rng.standard_normal(tuple(sizes[i] for i in R)) for R in regions}


def _inner(a: dict, b: dict, weights=None) -> float:
    return sum((1.0 if weights is None else weights[R]) * float(np.sum(a[R] * b[R]))
               for R in a)


@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_fast_transforms_equal_the_orthogonal_basis(n):
    rng = _rng(n)
    Q = consistent._basis(n)
    assert np.allclose(Q @ Q.T, np.eye(n))
    for shape in [(n,), (3, n), (n, 2, 4), (2, n, 3)]:
        T = rng.standard_normal(shape)
        axis = shape.index(n)
        assert np.allclose(consistent._forward(T, axis), apply_along(T, Q, axis))
        assert np.allclose(consistent._inverse(T, axis), apply_along(T, Q.T, axis))


@pytest.mark.parametrize("weighted", [False, True])
def test_projection_is_the_orthogonal_projection_onto_consistent_tables(weighted):
    """Idempotent, consistent on every intersection, fixes the marginals of any (signed)
    full table, and the residual is orthogonal to them in the projection's metric."""
    rng = _rng(1)
    weights = {R: w for R, w in zip(CYCLE, (0.5, 2.0, 7.0, 1.0))} if weighted else None
    x = _tables(rng, CYCLE)
    p = consistent.project(x, SIZES, weights)
    again = consistent.project(p, SIZES, weights)
    assert max(np.abs(p[R] - again[R]).max() for R in CYCLE) < 1e-12
    for R, Q in itertools.combinations(CYCLE, 2):
        S = tuple(sorted(set(R) & set(Q)))
        down = [T.sum(axis=tuple(a for a, i in enumerate(C) if i not in S))
                for C, T in ((R, p[R]), (Q, p[Q]))]
        assert np.allclose(*down)
    full = rng.standard_normal(math.prod(SIZES))
    w = {R: marginal(full, R, SIZES) for R in CYCLE}
    fixed = consistent.project(w, SIZES, weights)
    assert max(np.abs(fixed[R] - w[R]).max() for R in CYCLE) < 1e-12
    residual = {R: x[R] - p[R] for R in CYCLE}
    assert abs(_inner(residual, w, weights)) < 1e-9 * math.sqrt(_inner(x, x))
    # and a table off V is moved (the test can fail)
    assert max(np.abs(p[R] - x[R]).max() for R in CYCLE) > 0.1


def _measure(measurements, x) -> np.ndarray:
    out = []
    for m in measurements:
        T = marginal(x, m.columns, SIZES)
        for axis, F in enumerate(m.factors):
            T = apply_along(T, F, axis)
        out.append(m.scale * T.reshape(-1))
    return np.concatenate(out)


def _dense(measurements) -> np.ndarray:
    rows = []
    for m in measurements:
        G = [np.ones((1, n)) for n in SIZES]
        for c, F in zip(m.columns, m.factors):
            G[c] = F
        M = np.ones((1, 1))
        for g in G:
            M = np.kron(M, g)
        rows.append(m.scale * M)
    return np.vstack(rows)


def _answers(tables, blocks) -> np.ndarray:
    return np.concatenate([pgm.block_answers(tables, b, SIZES) for b in blocks])


def test_on_a_junction_tree_the_estimate_is_dense_non_negative_least_squares():
    """A chain of cliques is decomposable, so the local polytope is the marginal polytope:
    the estimate's answers equal those of non-negative least squares on the full table."""
    rng = _rng(2)
    W = marginal_workload(tuple("abcd"), SIZES, [(0, 1), (1, 2), (2, 3)])
    meas = pgm.block_measurements(W.blocks)
    x = np.zeros(math.prod(SIZES))
    x[rng.integers(0, x.size, 15)] = rng.integers(1, 5, 15)
    y = _measure(meas, x) + 3.0 * rng.standard_normal(sum(m.size for m in meas))
    assert y.min() < 0
    tables, rounds = pgm.estimate(SIZES, meas, y, tolerance=1e-10, max_rounds=20000)
    A = _dense(meas)
    nnls = so.lsq_linear(A, y, bounds=(0, np.inf), tol=1e-12, max_iter=10000).x
    assert rounds < 20000
    mine = _answers(tables, W.blocks)
    # the same optimum (scipy's own stops ~1e-8 of the loss short of it)
    assert np.sum((mine - y) ** 2) <= np.sum((A @ nnls - y) ** 2) + 1e-6
    assert np.abs(mine - A @ nnls).max() < 2e-3
    assert min(T.min() for T in tables.values()) >= 0


def test_a_feasible_unconstrained_optimum_is_returned_as_it_is():
    """Positive data, tiny noise: the least-squares answers are non-negative and consistent,
    so the estimate returns them (the loss and its gradient are right)."""
    rng = _rng(3)
    W = marginal_workload(tuple("abcd"), SIZES, list(CYCLE))
    meas = pgm.block_measurements(W.blocks)
    x = rng.integers(5, 40, math.prod(SIZES)).astype(float)
    y = _measure(meas, x) + 0.01 * rng.standard_normal(sum(m.size for m in meas))
    tables, _ = pgm.estimate(SIZES, meas, y, tolerance=1e-10, max_rounds=20000)
    assert np.abs(_answers(tables, W.blocks) - _measure(meas, x)).max() < 0.1
    assert np.abs(_answers(tables, W.blocks) - y).max() > 1e-4      # not a copy of y


@pytest.mark.parametrize("seed", range(4))
def test_projecting_least_squares_answers_never_increases_the_total_squared_error(seed):
    """The guarantee of the module docstring on a cyclic set of cliques (where the local
    polytope is larger than the marginal polytope), with a range factor inside: for sparse
    data and heavy noise the estimate's total squared error is at most the least-squares
    answers', and strictly smaller here."""
    rng = _rng(10 + seed)
    ranges = np.array([[1, 1, 0, 0], [0, 1, 1, 1], [1, 1, 1, 1]], dtype=float)
    meas = [MarginalMeasurement(C, tuple(np.eye(SIZES[i]) if (i, C) != (1, (1, 2)) else
                                         ranges for i in C), 1.0) for C in CYCLE]
    x = np.zeros(math.prod(SIZES))
    x[rng.integers(0, x.size, 12)] = rng.integers(1, 4, 12)
    truth = _measure(meas, x)
    y = truth + 4.0 * rng.standard_normal(truth.size)
    tables, _ = pgm.estimate(SIZES, meas, y, tolerance=1e-9, max_rounds=50000)
    est = np.concatenate([
        m.scale * _apply(tables[pgm.home(tuple(tables), m.columns, SIZES)], m)
        for m in meas])
    assert est.min() >= 0
    assert np.sum((est - truth) ** 2) < np.sum((y - truth) ** 2)


def _apply(T, m):
    for axis, F in enumerate(m.factors):
        T = apply_along(T, F, axis)
    return T.reshape(-1)


def test_the_rounds_a_request_affords_come_from_its_limits():
    W = marginal_workload(tuple("abcd"), SIZES, list(CYCLE))
    meas = pgm.block_measurements(W.blocks)
    rounds, why = pgm.planned_rounds(SIZES, meas, Limits(2 ** 30, 60.0))
    assert why is None and rounds == pgm.MAX_ROUNDS
    rounds, why = pgm.planned_rounds(SIZES, meas, Limits(2 ** 30, 1e-4))
    assert rounds == 0 and "over time_limit" in why
    rounds, why = pgm.planned_rounds(SIZES, meas, Limits(1000, 60.0))
    assert rounds == 0 and "over max_memory" in why

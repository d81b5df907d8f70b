"""ResidualPlanner (dpsql.strategies.residual, dpsql.inference.implicit) against dense forms."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import optimize

from dpsql.errors import StrategyError
from dpsql.inference.implicit import residual_block_answers, residual_cell_variance
from dpsql.strategies.bounds import svdb
from dpsql.strategies.gaussian.optimal import solve
from dpsql.strategies.residual import (closure, eigenvalues, from_union, residual_plan,
                                       svdb_marginals)
from dpsql.workload.blocks import (KronBlock, UnionWorkload, grouped_factor, marginal,
                                   marginal_workload, ones_factor)
from dpsql.workload.matrix import WorkloadInfo

SIZES = (3, 4, 2, 5)
COLUMNS = ("a", "b", "c", "d")
#: a weighted mix of 1-, 2- and 3-way marginals (closure: 11 of the 16 subsets)
WEIGHTS = {(0, 1): 1.0, (1, 2, 3): 0.5, (0, 3): 2.0, (2,): 3.0}


def _dense_workload(weights, sizes=SIZES):
    return marginal_workload([f"c{i}" for i in range(len(sizes))], sizes, list(weights),
                             list(weights.values())).dense()


def _cov(plan):
    A = plan.dense_rows()
    return np.linalg.pinv(A.T @ A)


def test_closure_and_eigenvalues_match_the_dense_spectrum():
    assert len(closure(WEIGHTS)) == 11
    W = _dense_workload(WEIGHTS)
    lam = np.sort(np.linalg.eigvalsh(W.T @ W))
    v = eigenvalues(SIZES, WEIGHTS)
    mine = np.sort(np.concatenate(
        [np.full(math.prod(SIZES[i] - 1 for i in A), v[A]) for A in v]
        + [np.zeros(math.prod(SIZES) - sum(math.prod(SIZES[i] - 1 for i in A) for A in v))]))
    np.testing.assert_allclose(mine, lam, atol=1e-9)


def test_svdb_equals_the_dense_bound_and_the_sum_optimum_attains_it():
    W = _dense_workload(WEIGHTS)
    dense_bound = svdb(W.T @ W)
    plan = residual_plan(SIZES, WEIGHTS)
    # the dense bound adds √ of rounding-level eigenvalues (~1e-13 each) for the null space
    assert svdb_marginals(SIZES, WEIGHTS) == pytest.approx(dense_bound, rel=1e-6)
    assert plan.svdb == pytest.approx(svdb_marginals(SIZES, WEIGHTS), rel=1e-13)
    assert plan.total_error == pytest.approx(plan.svdb, rel=1e-12)        # certified optimum
    assert np.trace(W.T @ W @ _cov(plan)) == pytest.approx(plan.svdb, rel=1e-9)


def test_l2_sensitivity_is_exactly_one_on_the_dense_rows():
    for objective in ("sum", "max"):
        plan = residual_plan(SIZES, WEIGHTS, objective=objective)
        norms = np.sqrt((plan.dense_rows() ** 2).sum(axis=0))
        np.testing.assert_allclose(norms, 1.0, rtol=1e-12)
        assert plan.sensitivity == pytest.approx(1.0, rel=1e-14)
        assert plan.dense_rows().shape[0] == plan.n_measurements


def test_reconstruction_from_noise_free_measurements_is_exact():
    rng = np.random.default_rng(5)
    x = rng.poisson(4.0, math.prod(SIZES)).astype(float)
    plan = residual_plan(SIZES, WEIGHTS)
    y = plan.measure_all(x)
    flat = np.concatenate([y[A].reshape(-1) for A in plan.a])
    np.testing.assert_allclose(flat, plan.dense_rows() @ x, rtol=1e-10, atol=1e-9)
    stored = {B: marginal(x, B, SIZES) for B in WEIGHTS}          # what the engine would give
    y_from_marginals = plan.measure_all(stored)
    for B in list(WEIGHTS) + [(0,), (), (1, 3)]:
        truth = marginal(x, B, SIZES)
        np.testing.assert_allclose(plan.answer(y, B), truth, rtol=1e-10, atol=1e-9)
        np.testing.assert_allclose(plan.answer(y_from_marginals, B), truth, rtol=1e-10,
                                   atol=1e-9)
    with pytest.raises(ValueError, match="subset"):
        plan.answer(y, (0, 1, 2))                                  # {0, 2} is not measured


def test_per_cell_variances_match_the_dense_covariance():
    for objective in ("sum", "max"):
        plan = residual_plan(SIZES, WEIGHTS, objective=objective)
        cov = _cov(plan)
        for B in WEIGHTS:
            Q = _dense_workload({B: 1.0})
            diag = np.einsum("ij,jk,ik->i", Q, cov, Q)
            np.testing.assert_allclose(diag, plan.variance(B), rtol=1e-9)


def test_max_variance_optimum():
    sum_plan = residual_plan(SIZES, WEIGHTS)
    plan = residual_plan(SIZES, WEIGHTS, objective="max")
    assert plan.max_variance < sum_plan.max_variance * (1 - 1e-3)
    keys = list(plan.a)
    m = np.array([math.prod(SIZES[i] - 1 for i in A) for A in keys], dtype=float)
    N = math.prod(SIZES)

    def variances(b):                     # w_B var_B at b_A = a_A m_A / N
        a = dict(zip(keys, N * np.maximum(b, 1e-12) / m))
        return np.array([w * residual_cell_variance(SIZES, a, B) for B, w in WEIGHTS.items()])

    # an independent solver on the epigraph form: min t s.t. w_B var_B(b) <= t, Σ b = 1
    uniform = np.full(len(keys), 1 / len(keys))
    z0 = np.append(uniform, variances(uniform).max())
    res = optimize.minimize(lambda z: z[-1], z0, method="SLSQP",
                            bounds=[(1e-9, 1)] * len(keys) + [(0, None)],
                            constraints=[
                                dict(type="ineq", fun=lambda z: z[-1] - variances(z[:-1])),
                                dict(type="eq", fun=lambda z: z[:-1].sum() - 1)],
                            options=dict(maxiter=1000, ftol=1e-14))
    other = variances(res.x[:-1]).max()
    assert plan.max_variance <= other * (1 + 1e-6)
    assert plan.max_variance == pytest.approx(other, rel=1e-4)


def test_restricted_group_bys_reproduce_the_worked_example():
    """NOTES: 2, 2, 2, 3 declared values plus one `other` each; all six 2-way GROUP BYs."""
    sizes = (3, 3, 3, 4)
    pairs = list(itertools.combinations(range(4), 2))
    union = UnionWorkload(COLUMNS, sizes, tuple(
        KronBlock(tuple(grouped_factor(n - 1, 1) if i in B else ones_factor(n)
                        for i, n in enumerate(sizes))) for B in pairs))
    W = union.dense()
    V = W.T @ W
    assert svdb(V) == pytest.approx(69.33, abs=5e-3)
    full = residual_plan(sizes, {B: 1.0 for B in pairs})           # optimised for full marginals
    assert np.trace(V @ _cov(full)) == pytest.approx(103.55, abs=5e-3)
    restricted = from_union(union)                                 # optimised for returned cells
    assert restricted.svdb is None
    assert restricted.total_error == pytest.approx(np.trace(V @ _cov(restricted)), rel=1e-9)
    assert restricted.total_error == pytest.approx(103.48, abs=5e-3)
    optimum = solve(WorkloadInfo.from_matrix(W))
    assert optimum.upper * optimum.scale == pytest.approx(97.09, abs=5e-3)


def test_columns_of_one_part_and_invalid_workloads():
    plan = residual_plan((1, 3, 2), {(0, 1): 1.0, (1, 2): 1.0})
    x = np.arange(6, dtype=float)
    y = plan.measure_all(x)
    np.testing.assert_allclose(plan.answer(y, (0, 1)), x.reshape(1, 3, 2).sum(axis=2))
    assert plan.total_error == pytest.approx(plan.svdb, rel=1e-12)
    with pytest.raises(StrategyError, match="distinct"):
        residual_plan(SIZES, {(0, 0): 1.0})
    with pytest.raises(StrategyError, match="weights"):
        residual_plan(SIZES, {(0,): -1.0})
    ranges = np.tril(np.ones((3, 3)))
    union = UnionWorkload(COLUMNS, SIZES, (KronBlock((ranges, ones_factor(4), ones_factor(2),
                                                      ones_factor(5))),))
    with pytest.raises(StrategyError, match="not a marginal"):
        from_union(union)


def test_large_domain_plans_work_on_marginals():
    sizes = (10,) * 8
    pairs = {B: 1.0 for B in itertools.combinations(range(8), 2)}
    plan = residual_plan(sizes, pairs)
    assert plan.total_error == pytest.approx(plan.svdb, rel=1e-12)
    assert plan.sensitivity == pytest.approx(1.0, rel=1e-14)
    rng = np.random.default_rng(6)
    stored = {B: rng.poisson(5.0, (10, 10)).astype(float) for B in pairs}
    # consistent marginals of one data set are not needed for the algebra: the answer of a
    # measured set B is the projection of what was measured, exact when stored is consistent
    one = {(0, 1): stored[(0, 1)]}
    y = {A: plan.measure(A, marginal(one, A, sizes)) for A in closure([(0, 1)])}
    # rtol alone cannot hold at an exact zero cell (a Poisson draw of 0): the reconstruction
    # sums float64 terms of size ~10, so its rounding is ~1e-15 in absolute terms
    np.testing.assert_allclose(plan.answer(y, (0, 1)), stored[(0, 1)], rtol=1e-10, atol=1e-12)


def test_answers_are_the_least_squares_estimate():
    """The reconstruction's linear map from y has row norms² equal to the per-cell variance
    (so it is the minimum-variance unbiased estimator, which least squares is)."""
    plan = residual_plan(SIZES, WEIGHTS, objective="max")
    keys = list(plan.a)
    shapes = [tuple(SIZES[i] - 1 for i in A) for A in keys]
    total = sum(math.prod(s) for s in shapes)
    for B in WEIGHTS:
        columns = []
        for j in range(total):
            flat = np.zeros(total)
            flat[j] = 1.0
            parts = np.split(flat, np.cumsum([math.prod(s) for s in shapes])[:-1])
            y = {A: p.reshape(s) for A, p, s in zip(keys, parts, shapes)}
            columns.append(plan.answer(y, B).reshape(-1))
        L = np.array(columns).T
        np.testing.assert_allclose((L ** 2).sum(axis=1), plan.variance(B), rtol=1e-10)
        A = plan.dense_rows()
        Q = _dense_workload({B: 1.0})
        np.testing.assert_allclose(L @ A, Q, atol=1e-10)            # unbiased: L A = Q_B
    assert plan.sensitivity >= math.sqrt(
        sum(plan.a[A] * math.prod(SIZES[i] - 1 for i in A) for A in keys) / math.prod(SIZES))


def test_any_kronecker_block_on_a_measured_clique_with_exact_standard_errors():
    rng = np.random.default_rng(9)
    plan = residual_plan(SIZES, WEIGHTS, objective="max")
    x = rng.poisson(4.0, math.prod(SIZES)).astype(float)
    y = plan.measure_all(x)
    cov = _cov(plan)
    ranges = np.array([[1.0 if i <= j <= k else 0.0 for j in range(5)]
                       for i in range(5) for k in range(i, 5)])
    blocks = [
        KronBlock((ones_factor(3), np.eye(4), ones_factor(2), ranges), 2.0),      # on (1, 3)
        KronBlock((np.array([[1.0, 0, 1]]), ones_factor(4), ones_factor(2), ranges[:4])),
        KronBlock((ones_factor(3), grouped_factor(3, 1), np.eye(2), ones_factor(5)), 0.5),
    ]
    for block in blocks:
        answers, se = residual_block_answers(SIZES, plan.a, y, block, sigma=3.0)
        W = block.dense()
        np.testing.assert_allclose(answers, W @ x, rtol=1e-10, atol=1e-8)
        np.testing.assert_allclose(se ** 2, 9.0 * np.einsum("ij,jk,ik->i", W, cov, W),
                                   rtol=1e-9)

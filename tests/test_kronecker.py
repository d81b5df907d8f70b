"""Kronecker strategies (dpsql.strategies.kronecker) and their implicit inference, vs dense."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsql.errors import StrategyError
from dpsql.inference.implicit import kron_answers, kron_variances
from dpsql.strategies.gaussian.optimal import solve
from dpsql.strategies.kronecker import (factor_error, one_dimensional, opt_kron, separate_kron,
                                        union_kron)
from dpsql.workload.blocks import (KronBlock, UnionWorkload, grouped_factor, identity_factor,
                                   ones_factor)
from dpsql.workload.matrix import WorkloadInfo

SIZES = (3, 4, 5)


def _ranges(n):
    return np.array([[1.0 if i <= j <= k else 0.0 for j in range(n)]
                     for i in range(n) for k in range(i, n)])


def _prefixes(n):
    return np.tril(np.ones((n, n)))


def _dense_error(W, A):
    """Total squared error at σ = 1 per unit of L2 sensitivity: ‖A‖² tr(WᵀW (AᵀA)⁺)."""
    sens2 = float((A ** 2).sum(axis=0).max())
    return sens2 * float(np.trace(W.T @ W @ np.linalg.pinv(A.T @ A)))


def _union():
    return UnionWorkload(("a", "b", "c"), SIZES, (
        KronBlock((_ranges(3), identity_factor(4), _prefixes(5)), 2.0),
        KronBlock((identity_factor(3), ones_factor(4), _ranges(5))),
        KronBlock((ones_factor(3), grouped_factor(3, 1), identity_factor(5)), 0.5),
    ))


def test_one_dimensional_closed_forms_and_optimum():
    np.testing.assert_array_equal(one_dimensional(np.ones((4, 4)) * 3), np.ones((1, 4)))
    np.testing.assert_array_equal(one_dimensional(np.eye(4) * 2), np.eye(4))
    V = _ranges(6).T @ _ranges(6)
    A = one_dimensional(V)
    assert np.sqrt((A ** 2).sum(axis=0)).max() == pytest.approx(1.0, rel=1e-15)
    best = solve(WorkloadInfo(6, V=V, m=21))
    assert factor_error(V, A) == pytest.approx(best.upper * best.scale, rel=1e-5)
    assert factor_error(V, np.ones((1, 6))) == math.inf          # ranges need more than a total


def test_opt_kron_equals_the_dense_optimum_for_one_block():
    block = KronBlock((_ranges(3), identity_factor(4), _prefixes(5)), 2.0)
    strategy = opt_kron(block)
    W, A = block.dense(), strategy.dense()
    assert strategy.sensitivity == pytest.approx(1.0, rel=1e-12)
    assert float(np.sqrt((A ** 2).sum(axis=0)).max()) == pytest.approx(1.0, rel=1e-12)
    assert strategy.error == pytest.approx(_dense_error(W, A), rel=1e-9)
    optimum = solve(WorkloadInfo.from_matrix(W))                   # dense, 60 cells
    assert optimum.gap < 1e-5
    assert strategy.error == pytest.approx(optimum.upper * optimum.scale, rel=2e-5)
    assert strategy.error >= optimum.lower * optimum.scale * (1 - 1e-9)
    assert strategy.l1_sensitivity == pytest.approx(
        float(np.abs(A).sum(axis=0).max()), rel=1e-12)


def test_union_kron_error_matches_dense_and_is_near_the_optimum():
    union = _union()
    W = union.dense()
    strategy = union_kron(union)
    A = strategy.dense()
    assert strategy.sensitivity == pytest.approx(1.0, rel=1e-12)
    assert strategy.error == pytest.approx(_dense_error(W, A), rel=1e-9)
    optimum = solve(WorkloadInfo.from_matrix(W))
    lower = optimum.lower * optimum.scale
    assert strategy.error >= lower * (1 - 1e-9)
    assert strategy.error <= 1.05 * lower                          # 1.005x here
    one_round = union_kron(union, max_rounds=1)
    assert strategy.error <= one_round.error


def test_separate_kron_splits_the_budget_by_square_roots():
    union = _union()
    strategies, shares, total = separate_kron(union)
    errors = np.array([s.error for s in strategies])
    assert shares.sum() == pytest.approx(1.0)
    assert total == pytest.approx(float((errors / shares).sum()), rel=1e-12)
    A = np.vstack([math.sqrt(c) * s.dense() for c, s in zip(shares, strategies)])
    assert float((A ** 2).sum(axis=0).max()) == pytest.approx(1.0, rel=1e-9)
    # answering every block from all measurements jointly can only do better
    assert _dense_error(union.dense(), A) <= total * (1 + 1e-9)


def test_implicit_answers_and_variances_of_a_kronecker_strategy():
    union = _union()
    strategy = union_kron(union)
    A = strategy.dense()
    rng = np.random.default_rng(8)
    x = rng.poisson(3.0, math.prod(SIZES)).astype(float)
    y = A @ x
    cov = np.linalg.pinv(A.T @ A)
    for block in union.blocks:
        W = block.dense()
        scaled = [math.sqrt(block.weight) * block.factors[0]] + list(block.factors[1:])
        np.testing.assert_allclose(kron_answers(scaled, strategy.factors, y), W @ x,
                                   rtol=1e-8, atol=1e-7)
        np.testing.assert_allclose(kron_variances(scaled, strategy.factors),
                                   np.einsum("ij,jk,ik->i", W, cov, W), rtol=1e-8)


def test_rows_outside_the_strategy_are_refused():
    with pytest.raises(ValueError, match="row space"):
        kron_variances([_ranges(3)], [np.ones((1, 3))])


def _dense_l1_error(W, A):
    """Δ₁² tr(WᵀW (AᵀA)⁺): the Laplace total squared error divided by 2/ε²."""
    sens = float(np.abs(A).sum(axis=0).max())
    return sens ** 2 * float(np.trace(W.T @ W @ np.linalg.pinv(A.T @ A)))


def test_laplace_variants_match_dense_and_beat_identity():
    union = _union()
    W = union.dense()
    identity = float(np.trace(W.T @ W))                 # Δ₁ = 1, (AᵀA)⁺ = I
    block = union.blocks[0]
    single = opt_kron(block, norm="l1")
    A = single.dense()
    assert single.norm == "l1" and single.l1_sensitivity == pytest.approx(1.0, rel=1e-12)
    assert single.error == pytest.approx(_dense_l1_error(block.dense(), A), rel=1e-9)
    assert single.error < float(np.trace(block.dense().T @ block.dense()))
    shared = union_kron(union, norm="l1")
    assert shared.error == pytest.approx(_dense_l1_error(W, shared.dense()), rel=1e-9)
    assert shared.error <= identity * (1 + 1e-12)     # small columns: identity wins here
    strategies, shares, total = separate_kron(union, norm="l1")
    errors = np.array([s.error for s in strategies])
    assert total == pytest.approx(float((errors / shares ** 2).sum()), rel=1e-12)
    stacked = np.vstack([c * s.dense() for c, s in zip(shares, strategies)])
    assert float(np.abs(stacked).sum(axis=0).max()) == pytest.approx(1.0, rel=1e-9)
    with pytest.raises(StrategyError, match="norm"):
        opt_kron(block, norm="linf")

"""Implicit workload operators (dpsql.workload.blocks) against their dense forms."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dpsql.workload.blocks import (DomainTooLarge, KronBlock, UnionWorkload, grouped_factor,
                                   helmert, identity_factor, marginal, marginal_workload,
                                   ones_factor)

SIZES = (3, 4, 2, 5)
COLUMNS = ("a", "b", "c", "d")


def _ranges(n):
    return np.array([[1.0 if i <= j <= k else 0.0 for j in range(n)]
                     for i in range(n) for k in range(i, n)])


def _blocks():
    rng = np.random.default_rng(7)
    return (
        KronBlock((identity_factor(3), ones_factor(4), _ranges(2), ones_factor(5)), 2.0),
        KronBlock((ones_factor(3), grouped_factor(3, 1), ones_factor(2), identity_factor(5))),
        KronBlock((rng.integers(0, 2, (2, 3)), _ranges(4), identity_factor(2),
                   rng.normal(size=(3, 5))), 0.25),
        KronBlock(tuple(ones_factor(n) for n in SIZES), 3.0),
    )


def _dense_kron(factors):
    out = np.ones((1, 1))
    for F in factors:
        out = np.kron(out, F)
    return out


def test_helmert_is_an_orthonormal_basis_orthogonal_to_ones():
    for n in (1, 2, 3, 7):
        H = helmert(n)
        assert H.shape == (n - 1, n)
        np.testing.assert_allclose(H @ H.T, np.eye(n - 1), atol=1e-14)
        np.testing.assert_allclose(H.T @ H, np.eye(n) - 1.0 / n, atol=1e-14)


def test_block_operators_equal_their_dense_form():
    rng = np.random.default_rng(1)
    x = rng.poisson(3.0, math.prod(SIZES)).astype(float)
    for block in _blocks():
        D = math.sqrt(block.weight) * _dense_kron(block.factors)
        np.testing.assert_allclose(block.dense(), D)
        assert block.shape == D.shape
        np.testing.assert_allclose(block.matvec(x), D @ x, rtol=1e-12, atol=1e-10)
        y = rng.normal(size=D.shape[0])
        np.testing.assert_allclose(block.rmatvec(y), D.T @ y, rtol=1e-12, atol=1e-10)
        gram = block.weight * _dense_kron(block.gram_factors())
        np.testing.assert_allclose(gram, D.T @ D, rtol=1e-12, atol=1e-10)
        np.testing.assert_allclose(block.answer(marginal(x, block.used, SIZES)), D @ x,
                                   rtol=1e-12, atol=1e-10)


def test_used_columns_and_marginal_sets():
    b = _blocks()
    assert b[0].used == (0, 2) and b[0].marginal_set() is None
    assert b[1].used == (1, 3) and b[1].marginal_set() is None       # [I | 0] is not Q_B
    assert b[3].used == () and b[3].marginal_set() == ()
    q = marginal_workload(COLUMNS, SIZES, [(3, 1)]).blocks[0]
    assert q.used == (1, 3) and q.marginal_set() == (1, 3)


def test_union_operators_equal_their_dense_form():
    rng = np.random.default_rng(2)
    union = UnionWorkload(COLUMNS, SIZES, _blocks())
    D = np.vstack([math.sqrt(b.weight) * _dense_kron(b.factors) for b in union.blocks])
    np.testing.assert_allclose(union.dense(), D)
    assert union.shape == D.shape and union.N == 120
    x = rng.poisson(2.0, union.N).astype(float)
    y = rng.normal(size=D.shape[0])
    np.testing.assert_allclose(union.matvec(x), D @ x, rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(union.rmatvec(y), D.T @ y, rtol=1e-12, atol=1e-10)
    V = sum(w * _dense_kron(Vs) for w, Vs in union.gram_factors())
    np.testing.assert_allclose(V, D.T @ D, rtol=1e-12, atol=1e-9)
    assert union.cliques() == ((0, 1, 2, 3), (0, 2), (1, 3), ())


def test_answers_from_marginals_only():
    rng = np.random.default_rng(3)
    union = UnionWorkload(COLUMNS, SIZES, _blocks())
    x = rng.poisson(2.0, union.N).astype(float)
    stored = {(0, 1, 2, 3): x.reshape(SIZES)}
    np.testing.assert_allclose(union.answers(stored), union.matvec(x), rtol=1e-12, atol=1e-9)
    small = marginal_workload(COLUMNS, SIZES, [(0, 1), (1, 3), (3,)])
    stored = {(0, 1): marginal(x, (0, 1), SIZES), (1, 3): marginal(x, (3, 1), SIZES)}
    np.testing.assert_allclose(small.answers(stored), small.matvec(x), rtol=1e-12)


def test_marginal_sums_down_the_smallest_superset():
    x = np.arange(math.prod(SIZES), dtype=float)
    T = x.reshape(SIZES)
    for cols in itertools.chain.from_iterable(itertools.combinations(range(4), r)
                                              for r in range(5)):
        expect = T.sum(axis=tuple(i for i in range(4) if i not in cols))
        np.testing.assert_allclose(marginal(x, cols, SIZES), expect)
        np.testing.assert_allclose(marginal({(0, 1, 2, 3): T}, cols, SIZES), expect)
    with pytest.raises(ValueError, match="covers"):
        marginal({(0, 1): T.sum(axis=(2, 3))}, (2,), SIZES)


def test_full_product_is_never_built_for_large_domains():
    sizes = (10,) * 8                                   # 10^8 cells
    union = marginal_workload([f"c{i}" for i in range(8)], sizes,
                              itertools.combinations(range(8), 2))
    assert union.shape == (2800, 10 ** 8)
    with pytest.raises(DomainTooLarge, match="10000000"):
        union.dense()
    with pytest.raises(DomainTooLarge, match="marginals"):
        union.blocks[0].matvec(np.zeros(3))
    rng = np.random.default_rng(4)
    stored = {B: rng.poisson(5.0, (10, 10)).astype(float)
              for B in itertools.combinations(range(8), 2)}
    answers = union.answers(stored)
    np.testing.assert_allclose(answers[:100], stored[(0, 1)].reshape(-1))


def test_invalid_inputs_are_refused():
    with pytest.raises(ValueError, match="weight"):
        KronBlock((np.eye(2),), 0.0)
    with pytest.raises(ValueError, match="finite"):
        KronBlock((np.array([[np.nan]]),))
    with pytest.raises(ValueError, match="sizes"):
        UnionWorkload(("a",), (3,), (KronBlock((np.eye(2),)),))
    with pytest.raises(ValueError, match="distinct"):
        UnionWorkload(("a", "a"), (2, 2), (KronBlock((np.eye(2), np.eye(2))),))

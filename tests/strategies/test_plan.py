"""Plans on the exact grid: A x exact in float64, sensitivity exact and rounded up."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp

from dpsql.errors import StrategyError
from dpsql.kernel.boundary import Kernel
from dpsql.kernel.scales import _on_grid
from dpsql.workload.matrix import (Plan, exact_l2_sensitivity, gram, gram_route, l2_sensitivity,
                                   make_plan)


@pytest.mark.parametrize("sparse", [False, True])
def test_products_are_exact_and_sensitivity_is_an_upper_bound(sparse):
    rng = np.random.default_rng(3)  # test data only
    for _ in range(20):
        A = rng.normal(size=(25, 12)) * rng.uniform(0.01, 100)
        plan = make_plan("t", sp.csr_matrix(A) if sparse else A)
        M = plan.A.toarray() if sparse else plan.A
        assert _on_grid(plan.A) and np.abs(M).max() == 1.0
        x = rng.integers(0, 2 ** 31, 12).astype(float)   # large counts still exact
        exact = [sum(Fraction(a) * int(v) for a, v in zip(row, x)) for row in M]
        assert [Fraction(v) for v in plan.measure(x)] == exact
        true = max(sum(Fraction(a) ** 2 for a in M[:, j]) for j in range(M.shape[1]))
        assert Fraction(plan.sensitivity) ** 2 >= true
        assert plan.sensitivity == pytest.approx(l2_sensitivity(M), rel=1e-12)


def test_kernel_refuses_plans_off_the_grid():
    A = np.array([[0.1, 1.0], [1.0, 0.3]])  # 0.1 is not a multiple of 2**-20
    plan = Plan("bad", 2, A, exact_l2_sensitivity(np.round(A * 2**20) / 2**20))
    with pytest.raises(StrategyError, match="grid"):
        Kernel().release(None, None, None, plan, 1.0, None)


@pytest.mark.parametrize("rank_deficient", [False, True])
def test_least_squares_paths_agree_with_dense_pinv(rank_deficient):
    from dpsql.inference.least_squares import LeastSquares

    rng = np.random.default_rng(5)  # test data only
    n = 12
    A = rng.normal(size=(20, n))
    if rank_deficient:
        A[:, -1] = A[:, 0]          # two identical columns: rank n - 1
    plan = make_plan("t", A)
    M = plan.A
    W = rng.integers(0, 2, size=(7, n)).astype(float)
    if rank_deficient:
        W[:, -1] = W[:, 0]          # keep W in the row space of A
    ls = LeastSquares(plan)
    assert (ls._chol is None) == rank_deficient
    pinv_gram = np.linalg.pinv(M.T @ M)
    assert np.allclose(ls.error_factors(sp.csr_matrix(W)), np.diag(W @ pinv_gram @ W.T))
    V = W.T @ W
    assert ls.total_error_factor(V) == pytest.approx(np.trace(V @ pinv_gram), rel=1e-8)
    y = rng.normal(size=M.shape[0])
    assert np.allclose(ls.answers(sp.csr_matrix(W), y), W @ np.linalg.pinv(M) @ y)


def test_strategy_cache_returns_the_identical_plan_and_reverifies_it(tmp_path):
    import duckdb

    from dpsql.store import strategy_cache
    from dpsql.strategies import REGISTRY, WorkloadInfo

    from dpsql.strategies.synthetic import all_range

    n = 48
    info = all_range(n)
    V = info.V
    strategy = REGISTRY["eigen"]
    plan = strategy.plan(info)
    con = duckdb.connect(str(tmp_path / "c.duckdb"))
    key = strategy_cache.fingerprint("eigen", strategy, info)
    assert strategy_cache.load(con, key) is None
    strategy_cache.store(con, key, plan, 1.0)
    again = strategy_cache.load(con, key)
    assert np.array_equal(again.A, plan.A) and again.sensitivity == plan.sensitivity
    assert again.notes == plan.notes
    other = WorkloadInfo(n, (n,), V=V + np.eye(n), m=info.m)
    assert strategy_cache.fingerprint("eigen", strategy, other) != key
    # a tampered entry cannot lower the sensitivity: it is recomputed on load
    con.execute("UPDATE dpsql.strategy_cache SET matrix = ?", [(np.rint(
        plan.A * 2 * 2 ** 20).clip(-2 ** 20, 2 ** 20)).astype(np.int32).tobytes()])
    tampered = strategy_cache.load(con, key)
    assert tampered.sensitivity > plan.sensitivity


def test_gram_by_differences_is_the_exact_gram():
    """Long ranges take the route through differences; integers give the same numbers bit
    for bit, other values (and short rows) the direct product."""
    rng = np.random.default_rng(5)  # test data only
    n, k = 300, 400
    ends = np.sort(rng.integers(0, n, (k, 2)), axis=1)
    R = np.zeros((k, n))
    for r, (a, b) in enumerate(ends):
        R[r, a:b + 1] = rng.integers(1, 4)            # weighted ranges
    W = sp.csr_matrix(np.vstack([np.eye(n), R, -R[:50]]))
    assert np.array_equal(gram(W), (W.T @ W).toarray())
    F = sp.csr_matrix(R * 0.3)                        # not integers: the direct product
    assert np.array_equal(gram(F), (F.T @ F).toarray())
    S = sp.csr_matrix(np.eye(n))                      # short rows: direct
    assert np.array_equal(gram(S), np.eye(n))


def test_gram_route_counts_the_differences_without_forming_them():
    """The planning model prices the route gram takes: the difference rows counted from W's
    entries (runs, gaps, sign changes, explicit zeros, the last column) match B formed."""
    from dpsql.workload import limits

    rng = np.random.default_rng(11)  # test data only
    n = 40
    shift = sp.eye(n, format="csr") - sp.eye(n, k=1, format="csr")
    for trial in range(60):
        D = rng.integers(-2, 3, (30, n)) * (rng.random((30, n)) < rng.random())
        for r in range(0, 30, 2):                     # half the rows: runs of one value
            a, b = sorted(rng.integers(0, n, 2))
            D[r] = 0
            D[r, a:b + 1] = rng.integers(1, 3) if r % 4 else 0
        W = sp.csr_matrix(D.astype(float))
        W.data[::7] = 0.0                             # explicit zeros are not entries
        B = (W @ shift).tocsr()
        B.eliminate_zeros()
        rows = np.diff(B.indptr).astype(float)
        direct = float(np.square(np.diff(W.indptr), dtype=float).sum())
        ops = float(np.square(rows).sum()) + 4.0 * n * n
        route = gram_route(W)
        assert route == (("differences", ops) if ops < direct and direct > 4.0 * n * n
                         else ("direct", direct))
        assert limits.row_gram_ops(W) == route[1]
        assert np.array_equal(gram(W), (W.T @ W).toarray())
    ends = np.array([(a, b) for a in range(0, 512, 8) for b in range(a, 512, 8)])
    lengths = ends[:, 1] - ends[:, 0] + 1             # long ranges: two differences a row
    cols = np.concatenate([np.arange(a, b + 1) for a, b in ends])
    R = sp.csr_matrix((np.ones(cols.size), cols, np.concatenate([[0], np.cumsum(lengths)])),
                      shape=(len(ends), 512))
    assert ends[:, 1].max() < 511                     # none ends in the last column
    assert gram_route(R) == ("differences", 4.0 * len(ends) + 4.0 * 512 * 512)
    assert limits.gram_ops(R) == gram_route(R)[1]     # the bound prices it too (m >= n)

"""Error factors by runs of cells (dpsql.inference.runs) equal the triangular solve's."""

import numpy as np
import pytest
import scipy.linalg as la
import scipy.sparse as sp

from dpsql.inference import runs
from dpsql.inference.least_squares import LeastSquares
from dpsql.workload.matrix import make_plan


def _factor(n, seed=0, lower=True):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((n + 5, n)) + 2.0 * np.eye(n + 5, n)
    return la.cho_factor(A.T @ A, lower=lower, check_finite=False)


def _varied(n, seed=1):
    """Points, ranges, multi-run rows (a product's range), weights, empty and dense rows."""
    rng = np.random.default_rng(seed)
    rows = [np.eye(n)[j] for j in range(n)]
    for _ in range(n):
        a, b = np.sort(rng.integers(0, n, 2))
        r = np.zeros(n)
        r[a:b + 1] = 1.0
        rows.append(r)
    for _ in range(n // 2):
        r = np.zeros(n)
        for _ in range(rng.integers(2, 5)):
            a = rng.integers(0, n - 3)
            r[a:a + rng.integers(1, 4)] = rng.choice([1.0, 2.0, -1.0, 0.5])
        rows.append(r)
    rows.append(np.zeros(n))                          # an empty row
    rows.append(np.where(np.arange(n) % 2, 1.0, 0.0))  # n/2 runs: solved directly
    rows.append(rng.standard_normal(n))                # dense, all different
    return np.array(rows)


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("n", [8, 64, 200])
def test_runs_equal_the_solve(n, lower):
    c, low = _factor(n, seed=n, lower=lower)
    W = _varied(n)
    want = runs.solved(c, low, sp.csr_matrix(W))
    for given in (sp.csr_matrix(W), W, sp.coo_matrix(W)):
        got = runs.error_factors(c, low, given)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


def test_runs_of_a_row():
    W = sp.csr_matrix(np.array([[0, 1, 1, 0, 2, 2, 1, 0, 1],
                                [0, 0, 0, 0, 0, 0, 0, 0, 0],
                                [1, 0, 0, 0, 0, 0, 0, 0, 1]], dtype=float))
    row, start, stop, value = runs.runs(W)
    assert row.tolist() == [0, 0, 0, 0, 2, 2]
    assert start.tolist() == [1, 4, 6, 8, 0, 8]
    assert stop.tolist() == [2, 5, 6, 8, 0, 8]
    assert value.tolist() == [1, 2, 1, 1, 1, 1]


@pytest.mark.parametrize("m", [1, 3])
def test_a_workload_with_no_cell_has_no_runs_and_zero_factors(m):
    """Every row empty (a WHERE no cell satisfies, e.g. ``age > 1e400``): no runs at all,
    and each error factor is 0 (the answer is 0 whatever the data)."""
    W = sp.csr_matrix((m, 6))
    row, start, stop, value = runs.runs(W)
    assert row.size == start.size == stop.size == value.size == 0
    c, low = _factor(6)
    np.testing.assert_array_equal(runs.error_factors(c, low, W), np.zeros(m))


def test_a_run_across_rows_is_two_runs():
    W = sp.csr_matrix(np.array([[0, 0, 1], [1, 0, 0]], dtype=float))
    row, start, stop, _ = runs.runs(W)
    assert row.tolist() == [0, 1] and start.tolist() == [2, 0] and stop.tolist() == [2, 0]


def test_rows_whose_bound_is_loose_are_solved(monkeypatch):
    """A row whose prefix sums could cancel beyond the tolerance is solved directly."""
    c, low = _factor(64, seed=3)
    W = _varied(64)
    want = runs.solved(c, low, sp.csr_matrix(W))
    solved_rows = []
    original = runs.solved

    def spy(c_, low_, W_):
        solved_rows.append(W_.shape[0])
        return original(c_, low_, W_)
    monkeypatch.setattr(runs, "solved", spy)
    monkeypatch.setattr(runs, "TOLERANCE", 0.0)       # every summed row is unsure
    got = runs.error_factors(c, low, W)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    summed = int(np.count_nonzero((W != 0).sum(axis=1) > 1))   # not a point nor empty
    assert solved_rows == [summed]


def test_few_rows_are_solved_whole(monkeypatch):
    c, low = _factor(64, seed=4)
    W = sp.csr_matrix(np.eye(64)[:10])
    calls = []
    monkeypatch.setattr(runs, "_inverse_columns", lambda *a: calls.append(a))
    got = runs.error_factors(c, low, W)
    assert not calls
    np.testing.assert_allclose(got, runs.solved(c, low, W), rtol=1e-15)


def test_least_squares_error_factors_match_the_dense_formula():
    rng = np.random.default_rng(5)
    n = 48
    plan = make_plan("test", rng.standard_normal((60, n)))
    W = _varied(n, seed=6)
    got = LeastSquares(plan).error_factors(sp.csr_matrix(W))
    A = plan.A
    want = np.einsum("ij,ji->i", W, np.linalg.solve(A.T @ A, W.T))
    np.testing.assert_allclose(got, want, rtol=1e-9)

"""The optimal (ε, δ) strategy: COA (Yuan et al.) and the certified dual solver ``optimal``.

Oracles: an SDP solved by cvxpy (the Schur-complement form of min tr(V X⁻¹) s.t.
diag(X) = 1), the singular value bound, the published all-range reference, brute-force
sensitivity, and a simulation of the mechanism (numpy noise: tests only).
"""

from __future__ import annotations

import math

import cvxpy as cp
import numpy as np
import pytest
import scipy.sparse as sp

from dpsql.errors import StrategyError
from dpsql.inference.least_squares import LeastSquares
from dpsql.workload.matrix import QUANTUM_BITS, WorkloadInfo
from dpsql.strategies.bounds import svdb
from dpsql.strategies.gaussian.coa import COA
from dpsql.strategies.identity import IdentityStrategy
from dpsql.strategies.gaussian.optimal import Optimal, solve
from dpsql.strategies.workload import WorkloadStrategy
from dpsql.strategies.synthetic import all_range_gram


all_ranges = all_range_gram


def range_rows(n: int, m: int, rng) -> np.ndarray:
    W = np.zeros((m, n))
    for r in range(m):
        a, b = sorted(rng.integers(0, n, 2))
        W[r, a:b + 1] = 1
    return W


def plan_error(plan, V) -> float:
    """Total squared error per unit σ² of the quantised plan: Δ² tr(V (AᵀA)⁺)."""
    return LeastSquares(plan).total_error_factor(V) * plan.sensitivity ** 2


def sdp_optimum(V: np.ndarray) -> float:
    """min tr(Y) s.t. [[Y, Lᵀ], [L, X]] ⪰ 0, diag(X) = 1, with V = L Lᵀ (L of full rank)."""
    scale = float(np.diag(V).max())
    lam, Q = np.linalg.eigh(V / scale)
    keep = lam > 1e-10 * lam.max()
    L = Q[:, keep] * np.sqrt(lam[keep])
    n, r = L.shape
    X = cp.Variable((n, n), symmetric=True)
    Y = cp.Variable((r, r), symmetric=True)
    problem = cp.Problem(cp.Minimize(cp.trace(Y)),
                         [cp.bmat([[Y, L.T], [L, X]]) >> 0, cp.diag(X) == 1])
    problem.solve(solver=cp.CLARABEL)
    assert problem.status == cp.OPTIMAL
    return problem.value * scale


def random_workloads():
    rng = np.random.default_rng(20240611)  # test data only
    out = []
    W = (rng.random((40, 16)) < 0.3).astype(float)
    out.append(("binary 40x16", WorkloadInfo.from_matrix(sp.csr_matrix(W))))
    W = range_rows(24, 10, rng)
    out.append(("10 ranges over 24 cells", WorkloadInfo.from_matrix(sp.csr_matrix(W))))
    W = rng.normal(size=(20, 12))
    out.append(("gaussian 20x12", WorkloadInfo.from_matrix(W)))
    W = (rng.random((9, 30)) < 0.4).astype(float)
    out.append(("gram only, rank 9 of 30", WorkloadInfo(30, V=W.T @ W, m=9)))
    W = np.tril(np.ones((20, 20)))
    out.append(("prefixes 20", WorkloadInfo.from_matrix(W)))
    W = np.vstack([range_rows(32, 50, rng), np.ones((1, 32))])
    W[:, 5] = 0                                     # a cell no query uses
    out.append(("ranges with an unused cell", WorkloadInfo.from_matrix(sp.csr_matrix(W))))
    return out


WORKLOADS = random_workloads()


@pytest.mark.parametrize("name,workload", WORKLOADS, ids=[w[0] for w in WORKLOADS])
def test_optimal_and_coa_reach_the_sdp_optimum(name, workload):
    V = workload.V
    best = sdp_optimum(V)
    sol = solve(workload)
    assert sol.lower * sol.scale <= best * (1 + 1e-6)        # the dual bound is a bound
    assert best <= sol.upper * sol.scale * (1 + 1e-6)        # ... and X(w) is feasible
    assert sol.gap <= 1e-5
    for strategy in (Optimal(), COA()):
        plan = strategy.plan(workload)
        err = plan_error(plan, V)
        assert err == pytest.approx(best, rel=1e-3), strategy.name
        assert err >= best * (1 - 1e-6)
        notes = dict(plan.notes)
        assert notes["lower_bound"] <= best * (1 + 1e-6)
        assert notes["gap"] < 1e-3


@pytest.mark.parametrize("seed", range(4))
def test_never_worse_than_identity_or_workload(seed):
    rng = np.random.default_rng(seed)  # test data only
    n, m = int(rng.integers(6, 30)), int(rng.integers(3, 60))
    W = range_rows(n, m, rng) if seed % 2 else (rng.random((m, n)) < 0.35).astype(float)
    W[0, :] = 1                                    # every cell is used
    workload = WorkloadInfo.from_matrix(sp.csr_matrix(W))
    V = workload.V
    baseline = min(plan_error(s.plan(workload), V)
                   for s in (IdentityStrategy(), WorkloadStrategy()))
    for strategy in (Optimal(), COA()):
        assert plan_error(strategy.plan(workload), V) <= baseline * (1 + 1e-6)


def rmse(total: float, m: int, epsilon: float, delta: float, constant: float) -> float:
    """σ √(total / m) with σ = √(2 ln(constant / δ)) / ε per unit sensitivity."""
    return math.sqrt(2 * math.log(constant / delta)) / epsilon * math.sqrt(total / m)


def test_all_ranges_reference_n1024():
    n = 1024
    V, m = all_ranges(n), n * (n + 1) // 2
    workload = WorkloadInfo(n, V=V, m=m)
    plan = Optimal().plan(workload)
    notes = dict(plan.notes)
    assert notes["gap"] <= 1e-6
    err, bound = plan_error(plan, V), svdb(V, n)
    # Li & Miklau's calibration √(2 ln(2/δ))/ε gives the published figures (svdb 31.09,
    # optimum 31.288); the classic √(2 ln(1.25/δ))/ε gives 30.339 and 30.536.
    assert rmse(bound, m, 0.5, 1e-4, 2.0) == pytest.approx(31.09, abs=0.005)
    assert rmse(err, m, 0.5, 1e-4, 2.0) == pytest.approx(31.288, rel=1e-3)
    assert rmse(err, m, 0.5, 1e-4, 1.25) == pytest.approx(30.536, rel=1e-3)
    assert err >= bound
    assert err == pytest.approx(notes["objective"], rel=1e-5)    # rounding to the grid
    assert notes["lower_bound"] <= err


def test_uniform_weights_give_svdb_and_warm_start_certifies_at_once():
    n = 96
    workload = WorkloadInfo(n, V=all_ranges(n), m=n * (n + 1) // 2)
    first = solve(workload, max_iterations=1)
    assert first.lower * first.scale == pytest.approx(svdb(workload.V, n), rel=1e-10)
    sol = solve(workload)
    again = solve(workload, weights=sol.weights)
    assert again.iterations == 1 and again.gap <= 1e-6


@pytest.mark.parametrize("n", [31, 64])
def test_reversal_split_matches_the_plain_eigenproblem(n):
    workload = WorkloadInfo(n, V=all_ranges(n), m=n * (n + 1) // 2)
    a, b = solve(workload), solve(workload, symmetry=False)
    assert a.upper == pytest.approx(b.upper, rel=1e-6)
    assert a.lower == pytest.approx(b.lower, rel=1e-6)
    V = workload.V / a.scale
    for sol in (a, b):
        A = sol.A
        assert np.sqrt((A ** 2).sum(axis=0)).max() <= 1 + 1e-12
        assert np.trace(np.linalg.solve(A.T @ A, V)) == pytest.approx(sol.upper, rel=1e-8)


def test_representation_independence():
    rng = np.random.default_rng(7)  # test data only
    n = 48
    W = range_rows(n, 80, rng)
    perm = rng.permutation(n)
    for strategy in (Optimal(), COA()):
        errors = []
        for cols in (np.arange(n), perm):
            workload = WorkloadInfo.from_matrix(sp.csr_matrix(W[:, cols]))
            errors.append(plan_error(strategy.plan(workload), workload.V))
        assert errors[0] == pytest.approx(errors[1], rel=1e-5), strategy.name
    V = all_ranges(40)                                   # the symmetric path vs a permuted one
    perm = rng.permutation(40)
    e1 = plan_error(Optimal().plan(WorkloadInfo(40, V=V, m=820)), V)
    Vp = V[np.ix_(perm, perm)]
    e2 = plan_error(Optimal().plan(WorkloadInfo(40, V=Vp, m=820)), Vp)
    assert e1 == pytest.approx(e2, rel=1e-5)


@pytest.mark.parametrize("name,workload", WORKLOADS[:4], ids=[w[0] for w in WORKLOADS[:4]])
def test_sensitivity_is_the_largest_column_norm_of_the_quantised_plan(name, workload):
    q = 2 ** QUANTUM_BITS
    for strategy in (Optimal(), COA()):
        plan = strategy.plan(workload)
        A = plan.A.toarray() if sp.issparse(plan.A) else plan.A
        ints = np.rint(A * q).astype(np.int64)
        assert np.array_equal(ints, A * q)                   # on the grid
        exact = max(sum(int(v) ** 2 for v in ints[:, j]) for j in range(A.shape[1]))
        assert plan.sensitivity ** 2 * q * q >= exact        # rounded up, never down
        assert plan.sensitivity == pytest.approx(math.sqrt(exact) / q, rel=1e-12)
        norms = np.sqrt((A ** 2).sum(axis=0))
        assert norms.min() >= (1 - 1e-4) * norms.max()       # every column used to the full


def test_empirical_error_matches_the_expected_error():
    rng = np.random.default_rng(11)  # test data only: the mechanism's noise is simulated
    n, m = 20, 30
    W = range_rows(n, m, rng)
    W[0] = 1
    workload = WorkloadInfo.from_matrix(sp.csr_matrix(W))
    plan = Optimal().plan(workload)
    solver = LeastSquares(plan)
    sigma = plan.sensitivity * math.sqrt(2 * math.log(1.25 / 1e-5)) / 1.0
    x = rng.integers(0, 1000, n).astype(float)
    truth = W @ x
    errors = []
    for _ in range(300):
        y = plan.measure(x) + rng.normal(0.0, sigma, plan.n_measurements)
        errors.append(solver.answers(W, y) - truth)
    empirical = math.sqrt(np.mean(np.square(errors)))
    expected = sigma * math.sqrt(solver.total_error_factor(workload.V) / m)
    assert empirical == pytest.approx(expected, rel=0.10)


def test_coa_warm_start_and_homotopy():
    n = 64
    workload = WorkloadInfo(n, V=all_ranges(n), m=n * (n + 1) // 2)
    cold = COA().solve(workload)
    assert cold.gap <= 1e-6 and cold.iterations > 5
    A = Optimal().solve(workload).A
    warm = COA().solve(workload, X0=A.T @ A)
    assert warm.gap <= 1e-6 and warm.iterations < cold.iterations
    assert warm.value == pytest.approx(cold.value, rel=1e-6)
    assert np.allclose(np.diag(cold.X), 1.0)


def test_refuses_workloads_that_select_no_cell():
    W = sp.csr_matrix((3, 5))
    for strategy in (Optimal(), COA()):
        with pytest.raises(StrategyError, match="select"):
            strategy.plan(WorkloadInfo.from_matrix(W))


def test_coa_warm_starts_from_optimal_and_takes_no_step_once_certified():
    n = 128
    workload = WorkloadInfo(n, V=all_ranges(n), m=n * (n + 1) // 2)
    notes = dict(COA().plan(workload).notes)
    assert notes["iterations"] == 0 and notes["gap"] <= 1e-6
    assert notes["warm_iterations"] >= 1
    reference = dict(Optimal().plan(workload).notes)
    assert notes["objective"] == pytest.approx(reference["objective"], rel=1e-12)
    cold = dict(COA(warm="identity").plan(workload).notes)      # the paper's path
    assert cold["iterations"] > 0 and cold["gap"] <= 1e-6
    with pytest.raises(StrategyError, match="warm"):
        COA(warm="eigen-ish")


def test_coa_stops_at_the_first_certified_newton_iterate():
    n = 64
    workload = WorkloadInfo(n, V=all_ranges(n), m=n * (n + 1) // 2)
    A = solve(workload, tol=1e-2, max_iterations=1).A    # a warm start, not yet certified
    X0 = A.T @ A
    sol = COA().solve(workload, X0=X0)
    assert sol.gap <= 1e-6 and sol.iterations >= 2
    # one Newton step fewer is not yet certified: the stop came at the first certified step
    short = COA(max_newton=sol.iterations - 1).solve(workload, X0=X0)
    assert short.gap > 1e-6
    assert short.iterations == sol.iterations - 1


def test_the_float32_first_step_is_never_a_bound(monkeypatch):
    """A cold start's first step is float32 and only sets the next weights: even a wrong
    first step (eigenvalues 4x too large, which would be a false lower bound, and a random
    basis for eigenvectors) costs steps, never the certificate; the float64 steps that
    follow give every bound."""
    from dpsql.strategies.gaussian import dual

    rng = np.random.default_rng(3)  # test data only
    W = np.vstack([np.eye(24), range_rows(24, 30, rng)])
    workload = WorkloadInfo.from_matrix(sp.csr_matrix(W))
    best = sdp_optimum(workload.V)
    honest = solve(workload)
    exact = dual.eigh
    singles = []

    def wrong_single(M, single=False):
        if not single:
            return exact(M)
        singles.append(M.shape)
        lam, _ = exact(M)
        return 4 * lam, np.linalg.qr(rng.normal(size=M.shape))[0]

    monkeypatch.setattr(dual, "eigh", wrong_single)
    for sol in (solve(workload), honest):
        assert sol.lower * sol.scale <= best * (1 + 1e-7)
        assert best <= sol.upper * sol.scale * (1 + 1e-7)
        assert sol.gap <= 1e-6
    assert singles == [(24, 24)]                      # one float32 step, the first
    assert solve(workload, weights=honest.weights).iterations == 1   # warm: float64 only
    assert len(singles) == 1

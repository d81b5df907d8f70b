"""Eigen-Design (Li & Miklau, VLDB 2012): Program 1 solvers, Program 2 plans, paper numbers.

Errors are always computed on ``plan.A`` (the rounded matrix the kernel would use) with the
plan's exact sensitivity: total squared error factor ``sens² · tr(V (AᵀA)⁻¹)``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.sparse as sp

from dpsql.errors import StrategyError
from dpsql.inference.least_squares import LeastSquares
from dpsql.workload.matrix import WorkloadInfo
from dpsql.strategies.gaussian.eigen import EigenDesign, complete_columns, eigen_queries
from dpsql.strategies.gaussian.program1 import solve_program1, solve_program1_cvxpy
from dpsql.strategies.synthetic import all_range, range_rows

SIGMA_1 = math.sqrt(2 * math.log(2 / 1e-4)) / 0.5     # the paper's σ at ε = 0.5, δ = 1e-4


all_range_info = all_range

def marginals_2way(k: int, size: int) -> WorkloadInfo:
    shape = (size,) * k
    rows = []
    for a, b in itertools.combinations(range(k), 2):
        for va, vb in itertools.product(range(size), repeat=2):
            sel = np.zeros(shape)
            idx = [slice(None)] * k
            idx[a], idx[b] = va, vb
            sel[tuple(idx)] = 1.0
            rows.append(sel.reshape(-1))
    return WorkloadInfo.from_matrix(sp.csr_matrix(np.array(rows)), shape)


def total_error(plan, V) -> float:
    """``sens² tr(V (AᵀA)⁻¹)`` of the plan as the kernel would run it."""
    return plan.sensitivity ** 2 * LeastSquares(plan).total_error_factor(V)


def svdb(V) -> float:
    lam = np.clip(np.linalg.eigvalsh(V), 0, None)
    return float(np.sqrt(lam).sum() ** 2 / V.shape[0])


def program1_inputs(W):
    lam, Q = eigen_queries(WorkloadInfo.from_matrix(sp.csr_matrix(W)))
    return lam, Q * Q


# --- Program 1: the fast dual solver against cvxpy ------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_fast_program1_agrees_with_cvxpy(seed):
    rng = np.random.default_rng(seed)  # test data only
    n = int(rng.integers(4, 65))
    kind = seed % 3
    if kind == 0:
        W = (rng.random((int(rng.integers(2, 80)), n)) < 0.3).astype(float)
    elif kind == 1:
        W = range_rows(n)[rng.permutation(n * (n + 1) // 2)[: 2 * n]]
    else:
        W = rng.normal(size=(int(rng.integers(2, n)), n))          # low rank
    lam, B = program1_inputs(W)
    fast, ref = solve_program1(lam, B), solve_program1_cvxpy(lam, B)
    assert fast.gap <= 1e-6
    assert fast.lower_bound <= ref.objective * (1 + 1e-7)
    assert fast.objective == pytest.approx(ref.objective, rel=1e-4)
    assert (B.T @ fast.u).max() <= 1 + 1e-12 and (fast.u > 0).all()
    # grouped rows (the principal-vector form) are the same kind of program
    groups = [[0], list(range(1, lam.size))] if lam.size > 1 else [[0]]
    lam_g = np.array([lam[g].sum() for g in groups])
    B_g = np.vstack([B[g].sum(axis=0) for g in groups])
    assert solve_program1(lam_g, B_g).objective == pytest.approx(
        solve_program1_cvxpy(lam_g, B_g).objective, rel=1e-4)


def test_restarts_converge_and_a_cut_short_solve_stays_feasible_and_honest():
    info = all_range_info(48)
    lam, Q = eigen_queries(info)
    B = Q * Q
    restarted = solve_program1(lam, B, round_iterations=3, max_rounds=200)
    assert restarted.gap <= 1e-6                      # via the multiplicative fallback
    short = solve_program1(lam, B, round_iterations=3, max_rounds=1)
    assert (B.T @ short.u).max() <= 1 + 1e-12
    assert short.lower_bound <= restarted.objective <= short.objective
    assert short.gap > 1e-6


def test_cvxpy_solver_option_gives_the_same_plan_error():
    info = all_range_info(24)
    fast = total_error(EigenDesign().plan(info), info.V)
    ref = total_error(EigenDesign(solver="cvxpy").plan(info), info.V)
    assert fast == pytest.approx(ref, rel=1e-4)


# --- Program 2: privacy and the paper's numbers ----------------------------------------------

def test_completion_makes_every_column_norm_exactly_one():
    rng = np.random.default_rng(7)  # test data only
    A1 = rng.normal(size=(5, 9)) * rng.uniform(0.1, 3, size=9)
    A = complete_columns(A1)
    assert np.allclose((A ** 2).sum(axis=0), 1.0, atol=1e-12)
    info = all_range_info(32)
    plan = EigenDesign().plan(info)
    norms = np.sqrt((np.asarray(plan.A) ** 2).sum(axis=0))
    # make_plan scales the largest entry to 1: all columns still share one norm, the sensitivity
    assert np.allclose(norms, plan.sensitivity, rtol=1e-5)
    assert plan.sensitivity >= norms.max()


def test_all_range_256_within_1_3_of_svdb():
    info = all_range_info(256)
    plan = EigenDesign().plan(info)
    ratio = math.sqrt(total_error(plan, info.V) / svdb(info.V))
    assert 1.0 <= ratio <= 1.3
    assert ratio < 1.02                                  # measured 1.0175 (RMSE ratio)


def test_two_way_marginals_reach_the_bound():
    info = marginals_2way(4, 4)                          # n = 256, 96 queries
    plan = EigenDesign().plan(info)
    assert math.sqrt(total_error(plan, info.V) / svdb(info.V)) <= 1.01


def test_permuting_cells_leaves_the_error_unchanged():
    info = all_range_info(48)
    perm = np.random.default_rng(1).permutation(48)  # test data only
    V = info.V[np.ix_(perm, perm)]
    permuted = WorkloadInfo(48, (48,), V=V, m=info.m)
    base = total_error(EigenDesign().plan(info), info.V)
    assert total_error(EigenDesign().plan(permuted), V) == pytest.approx(base, rel=1e-5)


def test_simulated_rmse_matches_the_expected_rmse():
    W = range_rows(12)
    info = WorkloadInfo.from_matrix(sp.csr_matrix(W))
    plan = EigenDesign().plan(info)
    ls = LeastSquares(plan)
    sigma = plan.sensitivity * SIGMA_1
    expected = sigma * math.sqrt(ls.total_error_factor(info.V) / info.m)
    rng = np.random.default_rng(11)  # test noise only: never a release
    x = rng.integers(0, 1000, 12).astype(float)
    errors = [ls.answers(W, plan.measure(x) + rng.normal(0, sigma, plan.n_measurements))
              - W @ x for _ in range(300)]
    empirical = math.sqrt(np.mean(np.square(errors)))
    assert empirical == pytest.approx(expected, rel=0.10)


def test_figure_1_example_ratios():
    """Figure 1 (8 cells: gender x 4 gpa ranges, 8 queries, sensitivity √5).

    Fig. 1(b) is lost in the text extraction. This workload satisfies the text (q1 total,
    q2/q3 by gender with q3 = q1 − q2, q4/q5 gpa ranges, q6/q7 ranges, q8 a non-range
    predicate, sensitivity √5) and was picked, by a search over all such workloads, as the
    closest to the paper's eigen and bound ratios: a consistency check, not an independent
    reproduction. The paper's absolute values do not follow from its stated calibration
    (identity 45.36 would need tr(V) / m ≈ 26, but tr(V) <= 5 · 8 here), so compare
    calibration-free ratios: eigen / identity = 29.79 / 45.36, svdb / identity = 29.18 / 45.36
    and, for the workload answered directly by the Gaussian mechanism (noise √5 σ per
    query), 47.78 / 45.36.
    """
    W = np.array([[1, 1, 1, 1, 1, 1, 1, 1],
                  [1, 1, 1, 1, 0, 0, 0, 0],
                  [0, 0, 0, 0, 1, 1, 1, 1],
                  [1, 0, 0, 0, 1, 0, 0, 0],
                  [0, 1, 1, 1, 0, 1, 1, 1],
                  [0, 1, 1, 1, 0, 0, 0, 0],
                  [0, 0, 0, 0, 0, 1, 1, 1],
                  [0, 1, 1, 1, 1, 1, 1, 0]], dtype=float)
    info = WorkloadInfo.from_matrix(sp.csr_matrix(W), (2, 4))
    assert (W ** 2).sum(axis=0).max() == 5
    identity = math.sqrt(np.trace(info.V))
    eigen = math.sqrt(total_error(EigenDesign().plan(info), info.V))
    assert eigen / identity == pytest.approx(29.79 / 45.36, rel=0.01)
    assert math.sqrt(svdb(info.V)) / identity == pytest.approx(29.18 / 45.36, rel=0.01)
    assert eigen >= math.sqrt(svdb(info.V))
    assert math.sqrt(5 * info.m) / identity == pytest.approx(47.78 / 45.36, rel=0.01)


# --- the §4.2 options and the relative-error heuristic ---------------------------------------

def test_principal_vectors_and_separation_stay_near_the_bound():
    info = all_range_info(128)
    full = total_error(EigenDesign().plan(info), info.V)
    bound = svdb(info.V)
    for strategy in (EigenDesign(principal_vectors=13), EigenDesign(separation=True),
                     EigenDesign(separation=True, group_size=32)):
        err = total_error(strategy.plan(info), info.V)
        assert bound <= err and math.sqrt(err / bound) <= 1.15
    everything = EigenDesign(principal_vectors=500).plan(info)   # k >= rank: plain Program 2
    assert total_error(everything, info.V) == pytest.approx(full, rel=1e-5)


def test_relative_design_favours_unit_norm_queries():
    n = 32
    W = np.vstack([range_rows(n)[:20], np.eye(n)])       # wide ranges and single cells
    info = WorkloadInfo.from_matrix(sp.csr_matrix(W))
    norms = np.sqrt((W ** 2).sum(axis=1))
    V_unit = (W / norms[:, None]).T @ (W / norms[:, None])
    absolute = total_error(EigenDesign().plan(info), V_unit)
    relative = total_error(EigenDesign(relative=True).plan(info), V_unit)
    assert relative < absolute
    with pytest.raises(StrategyError, match="rows"):
        EigenDesign(relative=True).plan(all_range_info(8))


def test_refusals_and_bad_options():
    with pytest.raises(StrategyError, match="no cell"):
        EigenDesign().plan(WorkloadInfo.from_matrix(sp.csr_matrix((3, 4))))
    with pytest.raises(StrategyError, match="at most"):
        EigenDesign(max_cells=16).plan(all_range_info(32))
    for kwargs in ({"principal_vectors": 0}, {"principal_vectors": 3, "separation": True},
                   {"solver": "sdp"}, {"tol": 0}, {"group_size": 0}):
        with pytest.raises(ValueError):
            EigenDesign(**kwargs)

"""Pure ε-DP (Laplace) strategies: L1 sensitivity, exact error, the L1 program, paper numbers.

Brute force throughout: dense matrices, ``np.linalg.pinv``, cvxpy. Expected total squared
error under Laplace noise of scale ``b = Δ₁/ε``: ``2b² tr(W (AᵀA)⁺ Wᵀ)``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.sparse as sp

from dpsql.errors import StrategyError
from dpsql.inference.least_squares import LeastSquares
from dpsql.strategies import REGISTRY
from dpsql.workload.matrix import WorkloadInfo, make_plan
from dpsql.strategies.hierarchical import candidates, level_sizes, tree_matrix
from dpsql.strategies.laplace.candidates import (BASES, L1_AUTO_CANDIDATES, L1_REGISTRY, L1EigenDesign,
                                 basis_rows, design_basis, l1_error_factor, l1_expected_rmse)
from dpsql.strategies.laplace.hierarchical import choose_branching_l1
from dpsql.strategies.laplace.program import (complete_columns_l1, solve_l1_program,
                                         solve_l1_program_cvxpy)
from dpsql.strategies.laplace.trees import (CoarseColumn, best_chain, chain_matrix, choose_chains,
                                       weighted_tree_error)
from dpsql.strategies.wavelet import haar_matrix
from dpsql.strategies.synthetic import all_range, prefix, range_rows

EPSILON = 0.5


# --- workloads (explicit rows, small) -------------------------------------------------------

def ranges_2d(shape: tuple) -> np.ndarray:
    """All axis-aligned rectangles over a 2-D grid (C order cells)."""
    a, b = shape
    rows = []
    for r0, r1 in itertools.combinations_with_replacement(range(a), 2):
        for c0, c1 in itertools.combinations_with_replacement(range(b), 2):
            sel = np.zeros(shape)
            sel[r0:r1 + 1, c0:c1 + 1] = 1.0
            rows.append(sel.reshape(-1))
    return np.array(rows)


def marginals(shape: tuple, order: int) -> np.ndarray:
    rows = []
    for cols in itertools.combinations(range(len(shape)), order):
        for values in itertools.product(*[range(shape[c]) for c in cols]):
            sel = np.zeros(shape)
            idx = [slice(None)] * len(shape)
            for c, v in zip(cols, values):
                idx[c] = v
            sel[tuple(idx)] = 1.0
            rows.append(sel.reshape(-1))
    return np.array(rows)


def _random_rows(m, n, seed):
    rng = np.random.default_rng(seed)  # test data only
    W = (rng.random((m, n)) < 0.35).astype(float)
    W[W.sum(axis=1) == 0, 0] = 1.0
    return W


WORKLOADS = {
    "range-7": lambda: (range_rows(7), (7,)),
    "range-16": lambda: (range_rows(16), (16,)),
    "prefix-10": lambda: (np.tril(np.ones((10, 10))), (10,)),
    "random-12": lambda: (_random_rows(20, 12, 3), (12,)),
    "lowrank-9": lambda: (_random_rows(4, 9, 5), (9,)),
    "ranges-4x4": lambda: (ranges_2d((4, 4)), (4, 4)),
    "ranges-3x5": lambda: (ranges_2d((3, 5)), (3, 5)),
    "marg1-2x3x2": lambda: (marginals((2, 3, 2), 1), (2, 3, 2)),
    "marg2-2x2x4": lambda: (marginals((2, 2, 4), 2), (2, 2, 4)),
}


def info_of(name) -> tuple:
    W, shape = WORKLOADS[name]()
    return W, WorkloadInfo.from_matrix(sp.csr_matrix(W), shape)


def dense(plan) -> np.ndarray:
    if plan.A is None:
        return np.eye(plan.n)
    return plan.A.toarray() if sp.issparse(plan.A) else np.asarray(plan.A, dtype=float)


def brute_rmse(A: np.ndarray, W: np.ndarray, epsilon: float) -> float:
    """``√(2 b² tr(W (AᵀA)⁺ Wᵀ) / m)`` with ``b`` from the dense max column L1 norm."""
    b = np.abs(A).sum(axis=0).max() / epsilon
    total = 2 * b * b * np.trace(W @ np.linalg.pinv(A.T @ A) @ W.T)
    return math.sqrt(total / W.shape[0])


def l1_plan(name, info):
    try:
        return L1_REGISTRY[name].plan(info)
    except StrategyError as exc:                      # only Fourier may refuse, and says why
        assert name == "fourier", exc
        pytest.skip(f"fourier refuses: {exc}")


# --- registry ---------------------------------------------------------------------------

def test_registry_entries():
    assert set(L1_REGISTRY) == {"identity", "workload", "hierarchical", "wavelet", "fourier",
                                "eigen"}
    assert set(L1_AUTO_CANDIDATES) <= set(L1_REGISTRY)
    for key, strategy in L1_REGISTRY.items():
        assert strategy.name == key
    for key in ("identity", "workload", "wavelet", "fourier"):   # same plans as Gaussian
        assert L1_REGISTRY[key] is REGISTRY[key]


# --- sensitivity and expected error against dense brute force ------------------------------

@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("name", sorted(L1_REGISTRY))
def test_l1_sensitivity_and_error_are_exact(name, workload):
    W, info = info_of(workload)
    plan = l1_plan(name, info)
    A = dense(plan)
    assert plan.l1_sensitivity == np.abs(A).sum(axis=0).max()   # exact: entries on 2**-20
    assert plan.integral
    # every query is estimable (unbiased least squares)
    assert np.allclose(W @ np.linalg.pinv(A) @ A, W, atol=1e-8)
    expected = brute_rmse(A, W, EPSILON)
    assert l1_expected_rmse(plan, W, EPSILON) == pytest.approx(expected, rel=1e-8)
    assert l1_expected_rmse(plan, sp.csr_matrix(W), EPSILON) == pytest.approx(expected, rel=1e-8)
    assert l1_expected_rmse(plan, info, EPSILON) == pytest.approx(expected, rel=1e-8)
    gram_only = WorkloadInfo(info.n, info.shape, V=W.T @ W, m=W.shape[0])
    assert l1_expected_rmse(plan, gram_only, EPSILON) == pytest.approx(expected, rel=1e-8)
    assert l1_error_factor(plan, info.V) == pytest.approx(
        expected ** 2 * W.shape[0] * EPSILON ** 2 / 2, rel=1e-8)


def test_kronecker_l1_sensitivity_is_the_product():
    W, info = info_of("ranges-3x5")
    branching, _ = choose_branching_l1(info.V, info.shape)
    levels = [len(level_sizes(k, b)) for k, b in zip(info.shape, branching)]
    assert L1_REGISTRY["hierarchical"].plan(info).l1_sensitivity == math.prod(levels)
    heights = [(k - 1).bit_length() + 1 for k in info.shape]
    assert L1_REGISTRY["wavelet"].plan(info).l1_sensitivity == math.prod(heights)


# --- empirical error: Laplace releases, least squares ------------------------------------

@pytest.mark.parametrize("name,workload", [
    ("identity", "range-16"), ("hierarchical", "range-16"), ("wavelet", "range-16"),
    ("eigen", "range-16"), ("hierarchical", "ranges-4x4"), ("eigen", "ranges-4x4"),
    ("wavelet", "marg2-2x2x4"), ("eigen", "marg2-2x2x4"), ("eigen", "prefix-10")])
def test_empirical_rmse_matches_expected(name, workload):
    W, info = info_of(workload)
    plan = L1_REGISTRY[name].plan(info)
    A = dense(plan)
    rng = np.random.default_rng(7)  # test data and test noise only
    x = rng.integers(0, 50, size=info.n).astype(float)
    truth = W @ x
    b = plan.l1_sensitivity / EPSILON
    ls = LeastSquares(plan)
    # least squares is linear in y: its matrix, one column per measurement, from the solver
    L = np.column_stack([ls.answers(W, e) for e in np.eye(A.shape[0])])
    releases = 3000
    Y = (A @ x)[:, None] + rng.laplace(0.0, b, size=(A.shape[0], releases))
    empirical = math.sqrt(float(((L @ Y - truth[:, None]) ** 2).mean()))
    expected = l1_expected_rmse(plan, W, EPSILON)
    assert empirical == pytest.approx(expected, rel=0.10)
    # the check has power: variance b² instead of 2b² (−29 %) or a 30 % scale error fails
    for wrong in (expected / math.sqrt(2), 0.7 * expected, 1.3 * expected):
        assert empirical != pytest.approx(wrong, rel=0.10)


# --- the L1 program: derivation, fast solver, certificate -------------------------------

def test_cost_formula_for_an_unnormalised_orthogonal_basis():
    """tr(V (AᵀA)⁻¹) = Σ b_iᵀVb_i / (ũ_i² ‖b_i‖⁴) for A = diag(ũ) B, rows b_i orthogonal."""
    B = haar_matrix(16).toarray()                         # 0/±1 rows, orthogonal, unnormalised
    assert np.allclose(B @ B.T, np.diag((B * B).sum(axis=1)))
    V = all_range(16).V
    rng = np.random.default_rng(0)  # test data only
    ut = rng.random(16) + 0.2
    A = ut[:, None] * B
    norms2 = (B * B).sum(axis=1)
    formula = float((np.einsum("ij,jk,ik->i", B, V, B) / (ut ** 2 * norms2 ** 2)).sum())
    assert np.trace(V @ np.linalg.inv(A.T @ A)) == pytest.approx(formula, rel=1e-10)
    # and the normalised form used by the program: c_i = q_iᵀVq_i, u_i = ũ_i ‖b_i‖
    Q = B / np.sqrt(norms2)[:, None]
    c = np.einsum("ij,jk,ik->i", Q, V, Q)
    assert float((c / (ut * np.sqrt(norms2)) ** 2).sum()) == pytest.approx(formula, rel=1e-10)


@pytest.mark.parametrize("basis", ["eigen", "haar", "fourier"])
@pytest.mark.parametrize("workload", ["range-16", "ranges-4x4", "marg2-2x2x4", "random-12"])
def test_designed_error_is_the_dense_error(basis, workload):
    W, info = info_of(workload)
    try:
        d = design_basis(basis, info)
    except StrategyError:
        assert basis == "haar" and workload == "random-12"   # 12 is not a power of two
        return
    A = d.A.toarray() if sp.issparse(d.A) else d.A
    l1 = np.abs(A).sum(axis=0).max()
    assert l1 == pytest.approx(1.0, rel=1e-9)
    assert d.error == pytest.approx(l1 ** 2 * np.trace(info.V @ np.linalg.pinv(A.T @ A)),
                                    rel=1e-8)


def _program_cases():
    rng = np.random.default_rng(11)  # test data only
    cases = []
    for _ in range(3):                                   # random positive costs, matrices
        k, n = int(rng.integers(3, 25)), int(rng.integers(3, 30))
        M = rng.random((k, n)) * (rng.random((k, n)) < 0.6)
        M[np.arange(k), rng.integers(0, n, size=k)] += 0.1
        cases.append((np.exp(rng.normal(size=k) * 2), M))
    for name in ("random-12", "range-16", "lowrank-9"):   # eigen-queries of workloads
        _, info = info_of(name)
        Q, c = basis_rows("eigen", info)
        cases.append((c, np.abs(Q)))
    Q, c = basis_rows("haar", all_range(16))              # sparse Haar rows
    cases.append((c, abs(Q)))
    return cases


@pytest.mark.parametrize("case", range(7))
def test_fast_l1_program_agrees_with_cvxpy(case):
    c, M = _program_cases()[case]
    fast, ref = solve_l1_program(c, M), solve_l1_program_cvxpy(c, M)
    Md = M.toarray() if sp.issparse(M) else M
    assert fast.gap <= 1e-6
    assert (Md.T @ fast.u).max() <= 1 + 1e-12 and (fast.u > 0).all()
    assert fast.objective == pytest.approx(ref.objective, rel=1e-4)
    assert fast.lower_bound <= ref.objective * (1 + 1e-7)   # a true lower bound
    # the bound holds against any feasible point
    rng = np.random.default_rng(case)  # test data only
    for _ in range(20):
        u = rng.random(c.size) + 1e-3
        u = u / (Md.T @ u).max()
        assert fast.lower_bound <= float((c / u ** 2).sum()) * (1 + 1e-12)


def test_program_refuses_bad_input():
    with pytest.raises(StrategyError):
        solve_l1_program([1.0, 0.0], np.ones((2, 3)))
    with pytest.raises(StrategyError):
        solve_l1_program([1.0, 1.0], np.array([[1.0, 1.0], [0.0, 0.0]]))
    with pytest.raises(StrategyError):
        solve_l1_program([1.0], -np.ones((1, 3)))


def test_eigen_l1_with_the_cvxpy_solver_matches():
    _, info = info_of("random-12")
    fast = L1EigenDesign(bases=("eigen",)).plan(info)
    ref = L1EigenDesign(bases=("eigen",), solver="cvxpy").plan(info)
    assert l1_error_factor(fast, info.V) == pytest.approx(l1_error_factor(ref, info.V),
                                                          rel=1e-4)


# --- completion -------------------------------------------------------------------------

def test_completion_keeps_the_sensitivity_and_can_only_help():
    for workload in ("prefix-10", "random-12", "range-16", "marg2-2x2x4"):
        _, info = info_of(workload)
        d = design_basis("eigen", info)
        C = complete_columns_l1(d.A)
        assert np.abs(C).sum(axis=0) == pytest.approx(np.ones(info.n), abs=1e-12)
        plain = l1_error_factor(make_plan("x", d.A), info.V)
        done = l1_error_factor(make_plan("x", C), info.V)
        assert done <= plain * (1 + 1e-6)
    # it helps the eigen basis a lot on prefixes (49 % at n = 128)
    info = prefix(64)
    d = design_basis("eigen", info)
    plain = l1_error_factor(make_plan("x", d.A), info.V)
    done = l1_error_factor(make_plan("x", complete_columns_l1(d.A)), info.V)
    assert done < 0.8 * plain
    with_completion = l1_error_factor(L1EigenDesign(bases=("eigen",)).plan(info), info.V)
    without = l1_error_factor(L1EigenDesign(bases=("eigen",), complete=False).plan(info),
                              info.V)
    assert with_completion < 0.8 * without


# --- representation independence ----------------------------------------------------------

@pytest.mark.parametrize("workload", ["random-12", "range-16", "prefix-10"])
def test_eigen_basis_is_permutation_invariant(workload):
    W, info = info_of(workload)
    perm = np.random.default_rng(1).permutation(info.n)  # test data only
    permuted = WorkloadInfo.from_matrix(sp.csr_matrix(W[:, perm]))
    for complete in (False, True):
        strategy = L1EigenDesign(bases=("eigen",), complete=complete)
        a = l1_error_factor(strategy.plan(info), info.V)
        b = l1_error_factor(strategy.plan(permuted), permuted.V)
        assert a == pytest.approx(b, rel=1e-5)


def test_tree_and_haar_bases_are_not_permutation_invariant():
    """The check above has power: the order-dependent bases change under permutation."""
    info = all_range(64)
    perm = np.random.default_rng(1).permutation(info.n)  # test data only
    permuted = WorkloadInfo(info.n, V=info.V[np.ix_(perm, perm)], m=info.m)
    for basis in ("tree", "haar"):
        assert design_basis(basis, permuted).error > 1.1 * design_basis(basis, info).error
    a = l1_error_factor(L1EigenDesign(bases=("eigen",)).plan(info), info.V)
    b = l1_error_factor(L1EigenDesign(bases=("eigen",)).plan(permuted), permuted.V)
    assert a == pytest.approx(b, rel=1e-5)


# --- hierarchical under L1 ----------------------------------------------------------------

@pytest.mark.parametrize("n", [7, 37, 64])
def test_hierarchical_branching_minimises_the_l1_error(n):
    info = WorkloadInfo.from_matrix(sp.csr_matrix(range_rows(n)))
    (b,), error = choose_branching_l1(info.V, (n,))
    brute = {}
    for cand in candidates(n):
        A = tree_matrix(n, cand).toarray()
        brute[cand] = np.abs(A).sum(axis=0).max() ** 2 * np.trace(
            info.V @ np.linalg.pinv(A.T @ A))
    assert error == pytest.approx(brute[b], rel=1e-9)
    assert error <= min(brute.values()) * (1 + 1e-12)
    plan = L1_REGISTRY["hierarchical"].plan(info)
    assert plan.l1_sensitivity == len(level_sizes(n, b))
    # never worse under L1 than the Gaussian choice (which weighs levels by L, not L²)
    gaussian = REGISTRY["hierarchical"].plan(info)
    assert l1_error_factor(plan, info.V) <= l1_error_factor(gaussian, info.V) * (1 + 1e-9)


def test_hierarchical_l1_prefers_fewer_levels_than_gaussian():
    info = all_range(256)
    l1 = L1_REGISTRY["hierarchical"].plan(info)
    gaussian = REGISTRY["hierarchical"].plan(info)
    assert l1.l1_sensitivity < gaussian.l1_sensitivity
    assert l1_error_factor(l1, info.V) < 0.8 * l1_error_factor(gaussian, info.V)


def test_hierarchical_multi_column_error_is_the_dense_error():
    W, info = info_of("ranges-4x4")
    branching, error = choose_branching_l1(info.V, info.shape)
    plan = L1_REGISTRY["hierarchical"].plan(info)
    A = dense(plan)
    assert error == pytest.approx(np.abs(A).sum(axis=0).max() ** 2 * np.trace(
        info.V @ np.linalg.pinv(A.T @ A)), rel=1e-9)


# --- weighted trees -------------------------------------------------------------------------

def _dense_chain_error(M, sizes, v):
    k = len(M)
    X = np.zeros((k, k))
    for size, w in zip(sizes, v):
        T = np.zeros((-(-k // size), k))
        T[np.arange(k) // size, np.arange(k)] = 1.0
        X += w * T.T @ T
    return float(np.trace(np.linalg.solve(X, M)))


@pytest.mark.parametrize("k,sizes", [(37, (1, 3, 9, 27, 37)), (50, (1, 4, 12, 48, 50)),
                                     (64, (1, 16)), (10, (1,)), (45, (1, 6, 12)),
                                     (37, (1, 2, 4, 8, 16, 32, 37)), (20, (1, 20))])
def test_weighted_tree_error_is_exact(k, sizes):
    rng = np.random.default_rng(k + len(sizes))  # test data only
    R = rng.normal(size=(k, k))
    M = R @ R.T
    v = rng.random(len(sizes)) + 0.1
    if len(v) > 2:
        v[2] = 0.0                                   # a level switched off
    expected = _dense_chain_error(M, sizes, v)
    assert weighted_tree_error(M, sizes, v) == pytest.approx(expected, rel=1e-10)
    if len(sizes) > 1:
        col = CoarseColumn(M, sizes[1])
        assert weighted_tree_error(col, sizes, v) == pytest.approx(expected, rel=1e-10)
    A = chain_matrix(k, sizes, np.sqrt(v)).toarray()
    assert np.abs(A).sum(axis=0) == pytest.approx(np.full(k, np.sqrt(v).sum()))
    with pytest.raises(ValueError):
        weighted_tree_error(M, (1, 3, 4), [1.0, 1.0, 1.0])        # not nested


def test_chain_cost_of_many_log_weights_is_each_ones_cost():
    """The search scores a batch of starts in one call: each row's cost is the single
    call's, which is the dense ``(Σu)² tr(M X⁻¹)`` (padded groups included: 37 = 3·12 + 1)."""
    from dpsql.strategies.laplace.chains import _chain_cost
    rng = np.random.default_rng(7)  # test data only
    R = rng.normal(size=(37, 37))
    M = R @ R.T
    cost = _chain_cost(M, -12.0, 6.0)
    for sizes in [(1, 3), (1, 3, 9, 37), (1, 2, 4, 8, 16, 32, 37)]:
        Z = rng.uniform(-4.0, 2.0, size=(5, len(sizes) - 1))
        Z[0, -1] = -20.0                                    # clipped to the range
        many = cost(sizes, Z)
        for z, value in zip(Z, many):
            assert value == pytest.approx(cost(sizes, z), rel=1e-12)
            u = np.exp(np.concatenate([[0.0], np.clip(z, -12.0, 6.0)]))
            assert value == pytest.approx(u.sum() ** 2 * _dense_chain_error(M, sizes, u * u),
                                          rel=1e-9)


def test_chain_search_beats_uniform_trees_and_is_exact():
    info = all_range(64)
    error, sizes, u = best_chain(info.V, 64)
    A = chain_matrix(64, sizes, u).toarray()
    assert error == pytest.approx(np.abs(A).sum(axis=0).max() ** 2 * np.trace(
        info.V @ np.linalg.inv(A.T @ A)), rel=1e-9)
    _, uniform = choose_branching_l1(info.V, (64,))
    assert error < 0.9 * uniform


def test_multi_column_chains_error_is_the_dense_error():
    W, info = info_of("ranges-4x4")
    chains, error = choose_chains(info.V, info.shape)
    A = np.kron(*[chain_matrix(k, s, u).toarray() for k, (s, u) in zip(info.shape, chains)])
    assert error == pytest.approx(np.abs(A).sum(axis=0).max() ** 2 * np.trace(
        info.V @ np.linalg.inv(A.T @ A)), rel=1e-9)


# --- the eigen strategy's choice and the literature figure --------------------------------

def test_eigen_picks_the_best_basis_and_never_loses_to_identity():
    for workload in ("range-16", "prefix-10", "marg2-2x2x4"):
        W, info = info_of(workload)
        plan = L1_REGISTRY["eigen"].plan(info)
        best = l1_error_factor(plan, info.V)
        for basis in BASES:
            try:
                single = L1EigenDesign(bases=(basis,)).plan(info)
            except StrategyError:
                continue
            assert best <= l1_error_factor(single, info.V) * (1 + 1e-6), (workload, basis)


def test_all_range_256_figures():
    """All ranges over 256 cells at ε = 0.5 (the issue's L1-optimised figure: 16.2)."""
    info = all_range(256)
    rmse = {name: l1_expected_rmse(L1_REGISTRY[name].plan(info), info, EPSILON)
            for name in ("identity", "hierarchical", "wavelet", "eigen")}
    assert rmse["identity"] == pytest.approx(26.23, abs=0.01)
    assert rmse["wavelet"] == pytest.approx(29.74, abs=0.01)
    assert rmse["hierarchical"] == pytest.approx(23.27, abs=0.01)
    assert rmse["eigen"] <= 16.25                 # the figure: 16.2
    unrefined = L1EigenDesign(refine=0).plan(info)   # the weighted tree: leaves + blocks of 16
    assert l1_expected_rmse(unrefined, info, EPSILON) == pytest.approx(17.77, abs=0.01)


@pytest.mark.slow
def test_all_range_1024_error():
    """The expected RMSE on all ranges over 1,024 cells; its speed target (3 s) is printed
    by benchmarks/l1_eigen_speed.py, never asserted here (shared, noisy machines)."""
    info = all_range(1024)
    plan = L1_REGISTRY["eigen"].plan(info)
    assert l1_expected_rmse(plan, info, EPSILON) <= 22.35


# --- p-Identity refinement -------------------------------------------------------------

def test_p_identity_error_and_gradient_are_exact():
    from dpsql.strategies.laplace.trees import p_identity_error

    rng = np.random.default_rng(0)  # test data only
    n, p = 12, 4
    R = rng.normal(size=(n, n))
    V = R @ R.T
    theta = rng.random((p, n)) * (rng.random((p, n)) < 0.7)
    value, grad = p_identity_error(V, theta)
    A = np.vstack([np.eye(n), theta]) / (1.0 + theta.sum(axis=0))
    assert np.abs(A).sum(axis=0) == pytest.approx(np.ones(n))
    assert value == pytest.approx(np.trace(V @ np.linalg.inv(A.T @ A)), rel=1e-10)
    h = 1e-6
    numeric = np.zeros_like(theta)
    for i in range(p):
        for j in range(n):
            E = np.zeros_like(theta)
            E[i, j] = h
            numeric[i, j] = (p_identity_error(V, theta + E)[0]
                             - p_identity_error(V, theta - E)[0]) / (2 * h)
    assert np.abs(numeric - grad).max() <= 1e-6 * np.abs(grad).max()


def test_refinement_starts_from_the_tree_and_never_loses():
    from dpsql.strategies.laplace.trees import _identity_rows, refine_tree

    info = all_range(64)
    tree = design_basis("tree", info)
    refined, error, p = refine_tree(info, tree.A, tree.chains, 30)
    assert error < tree.error
    assert np.abs(refined).sum(axis=0) == pytest.approx(np.ones(64))
    assert error == pytest.approx(np.trace(info.V @ np.linalg.inv(refined.T @ refined)),
                                  rel=1e-9)
    assert refine_tree(info, tree.A, tree.chains, 0)[1] == pytest.approx(tree.error, rel=1e-9)
    # several columns: the leaves rows of a Kronecker product of chains are a scaled I
    chains = [((1, 2), np.array([1.0, 0.5])), ((1, 3), np.array([0.8, 0.4]))]
    A = np.kron(chain_matrix(4, *chains[0]).toarray(), chain_matrix(6, *chains[1]).toarray())
    mask = _identity_rows((4, 6), chains)
    assert np.array_equal(A[mask], 0.8 * np.eye(24))
    plain = L1EigenDesign(refine=0).plan(info)
    assert l1_error_factor(L1EigenDesign().plan(info), info.V) < l1_error_factor(plain, info.V)

"""MWEM (dpsql.mechanisms.mwem.core) against test oracles that wrap a known data vector.

The oracles here use seeded numpy noise: they are test doubles, not private mechanisms.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp

from dpsql.errors import DpsqlError, PrivacyParameterError, StrategyError
from dpsql.mechanisms.mwem import defaults
from dpsql.mechanisms.mwem.core import (
    Block,
    CandidateGroups,
    GroupValues,
    MWEMOptions,
    group_sensitivities,
    mwem_error_bound,
    run_mwem,
)
from tests.architecture.test_architecture import FORBIDDEN, _closure


def col_l1(M) -> float:
    M = np.abs(M.toarray() if sp.issparse(M) else np.asarray(M))
    return float(M.sum(axis=0).max()) if M.size else 0.0


def dense(M) -> np.ndarray:
    return M.toarray() if sp.issparse(M) else np.asarray(M)


class SeededOracle:
    """A test oracle over known per-block data: exact scores, seeded EM and Laplace noise.

    ``em="sample"`` draws from the exponential mechanism (Gumbel-max, exact); ``"argmax"``
    picks the best score. ``fast`` uses the vectorised helpers of CandidateGroups (big
    problems); otherwise only the plain Sequence protocol is used. ``record`` keeps every
    argument and every noise draw.
    """

    def __init__(self, xs, seed=0, em="sample", fast=False, record=True):
        self.xs = [np.asarray(x, dtype=float) for x in xs]
        self.rng = np.random.default_rng(seed)
        self.em, self.fast, self.record = em, fast, record
        self.spends, self.selects, self.measures = [], [], []
        self._answers = {}

    def _spend(self, kind, block, epsilon):
        assert isinstance(epsilon, Fraction) and epsilon > 0
        self.spends.append((kind, block, epsilon))

    def select(self, block, groups, estimates, penalties, epsilon):
        self._spend("select", block, epsilon)
        x = self.xs[block]
        penalties = np.asarray(penalties, dtype=float)
        if self.fast:
            if block not in self._answers:
                self._answers[block] = groups.W @ x
            true = self._answers[block][groups.row_index]
            scores = groups.scores(estimates, true, penalties)
            sens = groups.sensitivity()
        else:
            mats = [dense(g) for g in groups]
            ests = [np.asarray(e, dtype=float) for e in estimates]
            assert len(mats) == len(ests) == penalties.size
            scores = np.array([np.abs(e - M @ x).sum() - p
                               for M, e, p in zip(mats, ests, penalties)])
            sens = max(col_l1(M) for M in mats)
        if self.em == "argmax":
            k = int(np.argmax(scores))
        else:
            k = int(np.argmax(float(epsilon) * scores / (2 * sens)
                              + self.rng.gumbel(size=scores.size)))
        if self.record:
            self.selects.append(dict(block=block, groups=mats, estimates=ests,
                                     penalties=penalties, epsilon=epsilon, scores=scores,
                                     choice=k))
        return k

    def measure(self, block, rows, epsilon):
        self._spend("measure", block, epsilon)
        b = col_l1(rows) / float(epsilon)
        noise = self.rng.laplace(0.0, b, rows.shape[0])
        if self.record:
            self.measures.append(dict(block=block, rows=dense(rows), epsilon=epsilon,
                                      noise=noise, b=b))
        return rows @ self.xs[block] + noise, b


def range_matrix(n, m, rng) -> sp.csr_matrix:
    a, b = rng.integers(0, n, m), rng.integers(0, n, m)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    lengths = hi - lo + 1
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    cols = np.arange(lengths.sum()) - np.repeat(starts - lo, lengths)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    return sp.csr_matrix((np.ones(cols.size), cols, indptr), shape=(m, n))


def two_blocks(rng):
    """Block 0: 3×4 cells with both marginals and random 0/1 rows; block 1: 5 cells."""
    W0 = np.vstack([np.kron(np.eye(3), np.ones(4)), np.kron(np.ones(3), np.eye(4)),
                    (rng.random((5, 12)) < 0.4).astype(float)])
    W1 = np.vstack([np.eye(5), np.tril(np.ones((5, 5)))])
    b0 = Block(sp.csr_matrix(W0), [(0, 3), (3, 7)], 12, shape=(3, 4))
    b1 = Block(sp.csr_matrix(W1), [(0, 5)], 5, shape=(5,))
    return b0, b1


# ---------------------------------------------------------------------------------------
# The budget: exactly epsilon, every time


@pytest.mark.parametrize("rounds", [1, 3, 7, "auto"])
@pytest.mark.parametrize("init_share,total,cuboids", [
    (0, None, False), (Fraction(1, 10), None, True), (Fraction(1, 3), 1000, False),
    (0, 1000, True)])
def test_total_spend_is_exactly_epsilon(rounds, init_share, total, cuboids):
    rng = np.random.default_rng(1)
    blocks = two_blocks(rng)
    x = rng.poisson(20, (12, 5)).astype(float)
    xs = [x.sum(1), x.sum(0)]
    for epsilon in (Fraction(7, 13), Fraction(1, 10), 1):
        oracle = SeededOracle(xs, seed=2, record=False)
        opts = MWEMOptions(rounds=rounds, init_share=init_share, total=total,
                           cuboids=cuboids, replay=2, max_stages=3)
        result = run_mwem(blocks, epsilon, oracle, opts)
        assert sum(e for _, _, e in oracle.spends) == epsilon
        assert result.epsilon == epsilon
        assert all(isinstance(e, Fraction) and e > 0 for _, _, e in result.spends)
        assert [e for _, _, e in result.spends] == [e for _, _, e in oracle.spends]
        kinds = [k for k, _, _ in result.spends]
        assert kinds.count("select") == kinds.count("measure") == result.rounds
        assert kinds.count("total") == (total is None)
        assert kinds.count("init") == (2 if init_share else 0)
        if rounds == "auto":
            T0 = 2                                  # both blocks get rounds
            assert 3 * T0 <= result.rounds <= 7 * T0
        else:
            assert result.rounds == rounds
        assert sum(result.rounds_per_block) == result.rounds
        for A, block, ans in zip(result.distributions, blocks, result.answers):
            assert np.all(A >= 0) and A.sum() == pytest.approx(result.total)
            np.testing.assert_allclose(ans, block.W @ A)


def test_float_epsilon_is_read_exactly_and_shares_compose():
    rng = np.random.default_rng(0)
    W = range_matrix(32, 40, rng)
    oracle = SeededOracle([rng.poisson(5, 32)], record=False)
    opts = MWEMOptions(rounds=6, init_share=Fraction(1, 4), total_share=Fraction(1, 8))
    result = run_mwem([Block(W, [], 32)], 0.3, oracle, opts)
    eps = Fraction(3, 10)
    assert result.epsilon == eps
    by_kind = {}
    for kind, _, e in result.spends:
        by_kind[kind] = by_kind.get(kind, 0) + e
    assert by_kind["total"] == eps / 8 and by_kind["init"] == eps / 4
    assert by_kind["select"] == by_kind["measure"] == (eps - eps / 8 - eps / 4) / 2
    assert {e for k, _, e in result.spends if k == "select"} == {(eps * 5 / 8) / 12}


def test_the_algorithm_refuses_bad_oracle_answers():
    W = sp.csr_matrix(np.eye(4))

    class BadSelect(SeededOracle):
        def select(self, *args):
            super().select(*args)
            return 99

    class BadMeasure(SeededOracle):
        def measure(self, block, rows, epsilon):
            y, b = super().measure(block, rows, epsilon)
            return np.append(y, 1.0), b

    for cls in (BadSelect, BadMeasure):
        with pytest.raises(StrategyError, match="oracle"):
            run_mwem([Block(W, [], 4)], 1, cls([np.ones(4)]), MWEMOptions(rounds=2, total=4))


# ---------------------------------------------------------------------------------------
# What the algorithm hands to the oracle: candidates, estimates, penalties


def reference_mw(n, N, measured, replay, A0=None):
    """Figure 1 of the paper, dense and in plain (not log) space: the A before each round."""
    A = np.full(n, N / n) if A0 is None else np.array(A0, dtype=float)
    before, history = [], []
    for rows, y in measured:
        before.append(A.copy())
        history.append((rows, y))
        for k, (R, m) in enumerate([history[-1]] + history * replay):
            A = A * np.exp(R.T @ (m - R @ A) / (2 * N))
            A *= N / A.sum()
    return before, A


@pytest.mark.parametrize("replay", [0, 3])
def test_selection_gets_the_current_estimates_of_unmeasured_queries(replay):
    rng = np.random.default_rng(5)
    n, N = 16, 500.0
    W = (rng.random((12, n)) < 0.5).astype(float)
    x = rng.multinomial(int(N), rng.dirichlet(np.full(n, 0.3))).astype(float)
    oracle = SeededOracle([x], seed=3)
    result = run_mwem([Block(sp.csr_matrix(W), [], n)], 2, oracle,
                      MWEMOptions(rounds=8, replay=replay, total=N))
    measured = [(m["rows"], m["rows"] @ x + m["noise"]) for m in oracle.measures]
    before, final = reference_mw(n, N, measured, replay)
    chosen = set()
    for t, call in enumerate(oracle.selects):
        offered = [int(np.flatnonzero((W == g).all(axis=1))[0]) for g in call["groups"]]
        assert offered == [i for i in range(12) if i not in chosen]     # unmeasured, in order
        assert all(g.shape == (1, n) for g in call["groups"])
        np.testing.assert_array_equal(call["penalties"], 0.0)
        for g, est in zip(call["groups"], call["estimates"]):
            np.testing.assert_allclose(est, g @ before[t], rtol=1e-10)
        # the score the oracle used is exactly |q·A − q·x| for the offered rows
        np.testing.assert_allclose(
            call["scores"], [abs((g @ before[t] - g @ x).item()) for g in call["groups"]],
            rtol=1e-10, atol=1e-9)
        picked = offered[call["choice"]]
        np.testing.assert_array_equal(oracle.measures[t]["rows"], W[[picked]])
        chosen.add(picked)
    np.testing.assert_allclose(result.distributions[0], final, rtol=1e-9)
    np.testing.assert_allclose(result.answers[0], W @ final, rtol=1e-9)


def test_cuboid_candidates_are_output_groups_with_row_count_penalties():
    rng = np.random.default_rng(8)
    # 3×3 cells: a-marginal rows 0-2, b-marginal rows 3-5, two loose rows 6-7
    W = np.vstack([np.kron(np.eye(3), np.ones(3)), np.kron(np.ones(3), np.eye(3)),
                   (rng.random((2, 9)) < 0.5).astype(float)])
    x = rng.poisson(30, 9).astype(float)
    N = float(x.sum())
    oracle = SeededOracle([x], seed=1, em="argmax")
    run_mwem([Block(sp.csr_matrix(W), [(0, 3), (3, 6)], 9)], 1, oracle,
             MWEMOptions(rounds=3, cuboids=True, replay=0, total=N))
    first = oracle.selects[0]
    assert [g.shape[0] for g in first["groups"]] == [3, 3, 1, 1]
    np.testing.assert_array_equal(first["groups"][0], W[0:3])
    np.testing.assert_array_equal(first["groups"][2], W[[6]])
    np.testing.assert_array_equal(first["penalties"], [3, 3, 1, 1])
    for g, est in zip(first["groups"], first["estimates"]):
        np.testing.assert_allclose(est, g @ np.full(9, N / 9))
    # argmax EM: the measured group is the one with the best penalised score, all its rows
    for call, meas in zip(oracle.selects, oracle.measures):
        best = call["groups"][int(np.argmax(call["scores"]))]
        np.testing.assert_array_equal(meas["rows"], best)
    # a marginal has sensitivity 1: the measurement used b = 1/ε
    assert oracle.measures[0]["b"] == pytest.approx(1 / float(oracle.measures[0]["epsilon"]))
    assert len(oracle.selects[1]["groups"]) == 3         # the measured group is not re-offered


def test_noisy_histogram_initialisation():
    rng = np.random.default_rng(4)
    n = 10
    x = np.array([0, 0, 50, 3, 0, 0, 100, 0, 7, 0], dtype=float)
    oracle = SeededOracle([x], seed=6)
    W = range_matrix(n, 15, rng)
    run_mwem([Block(W, [], n)], 1, oracle,
             MWEMOptions(rounds=2, init_share=Fraction(1, 2), total=160))
    init = oracle.measures[0]
    np.testing.assert_array_equal(init["rows"], np.eye(n))
    assert init["epsilon"] == Fraction(1, 2)
    h = x + init["noise"]
    a0 = np.maximum(h, 0) + init["b"]
    A0 = 160 * a0 / a0.sum()
    for g, est in zip(oracle.selects[0]["groups"], oracle.selects[0]["estimates"]):
        np.testing.assert_allclose(est, g @ A0, rtol=1e-12, atol=1e-10)


def test_candidate_sequences_and_fast_helpers_agree_with_the_plain_definition():
    rng = np.random.default_rng(2)
    W = sp.csr_matrix((rng.random((9, 7)) < 0.5) * rng.integers(1, 3, (9, 7)) / 2.0)
    starts, stops = np.array([0, 2, 3, 7]), np.array([2, 3, 7, 9])
    cands = CandidateGroups(W, starts, stops)
    assert len(cands) == 4 and len(list(cands)) == 4
    np.testing.assert_array_equal(dense(cands[2]), dense(W[3:7]))
    np.testing.assert_array_equal(dense(cands[-1]), dense(W[7:9]))
    np.testing.assert_array_equal(dense(cands.stacked()), dense(W))
    assert cands.sensitivity() == max(col_l1(W[s:e]) for s, e in zip(starts, stops))
    np.testing.assert_array_equal(group_sensitivities(W, starts, stops),
                                  [col_l1(W[s:e]) for s, e in zip(starts, stops)])
    singles = CandidateGroups(W, np.arange(9), np.arange(1, 10))
    assert singles.sensitivity() == col_l1(W.max(axis=0).toarray()) or \
        singles.sensitivity() == float(W.max())
    est = rng.random(9) * 10
    values = GroupValues(est, cands.offsets)
    assert [v.size for v in values] == [2, 1, 4, 2]
    x = rng.poisson(4, 7).astype(float)
    pens = np.array([2.0, 1.0, 4.0, 2.0])
    plain = [np.abs(values[g] - cands[g] @ x).sum() - pens[g] for g in range(4)]
    np.testing.assert_allclose(cands.scores(values, (W @ x)[cands.row_index], pens), plain)


def test_range_rows_use_prefix_sums_with_the_same_estimates():
    from dpsql.mechanisms.mwem.core import _BlockState, _interval_rows

    rng = np.random.default_rng(4)
    W = range_matrix(50, 200, rng)
    W_empty_row = sp.vstack([W, sp.csr_matrix((1, 50))]).tocsr()
    assert _interval_rows(W) is not None and _interval_rows(W_empty_row) is not None
    assert _interval_rows(sp.csr_matrix(np.array([[1.0, 0, 1]]))) is None      # a gap
    assert _interval_rows(sp.csr_matrix(np.array([[0.5, 0.5, 0]]))) is None    # not 0/1
    state = _BlockState(Block(W_empty_row, [], 50), cuboids=False)
    state.set_log_weights(rng.normal(0, 3, 50))
    np.testing.assert_allclose(state.estimates(1e6), W_empty_row @ (1e6 * state.p),
                               rtol=1e-9, atol=1e-6)


# ---------------------------------------------------------------------------------------
# The factored form equals the flat form on the product domain


class ReplayOracle:
    """Answers a flat run with the factored run's choices and noise, lifted to the flat cells.

    ``offsets[g]`` is where block ``g``'s rows start in the flat workload.
    """

    def __init__(self, x_flat, factored: SeededOracle, result, lift, offsets):
        self.x = x_flat
        self.choices = [(m.block, m.rows) for m in result.measurements if m.kind == "round"]
        self.measures = list(factored.measures)
        self.lift, self.offsets = lift, offsets
        self.spends = []

    def select(self, block, groups, estimates, penalties, epsilon):
        self.spends.append(epsilon)
        g, (start, stop) = self.choices.pop(0)
        start, stop = start + self.offsets[g], stop + self.offsets[g]
        matches = np.flatnonzero((groups.starts == start) & (groups.stops == stop))
        assert len(matches) == 1
        return int(matches[0])

    def measure(self, block, rows, epsilon):
        self.spends.append(epsilon)
        call = self.measures.pop(0)
        np.testing.assert_array_equal(dense(rows), self.lift(call["block"], call["rows"]))
        assert epsilon == call["epsilon"]
        return rows @ self.x + call["noise"], call["b"]


@pytest.mark.parametrize("opts", [
    MWEMOptions(rounds=6, replay=3),
    MWEMOptions(rounds=5, replay=0, iterate="average", total=1000),
    MWEMOptions(rounds=6, replay=2, cuboids=True, total_share=Fraction(1, 5)),
    MWEMOptions(rounds=4, replay=1, cuboids=True, iterate="average", total=1000),
    MWEMOptions(rounds=6, replay=2, measure="partition", total=1000),
])
def test_factored_blocks_match_the_flat_product_domain(opts):
    rng = np.random.default_rng(11)
    b0, b1 = two_blocks(rng)
    x_flat = rng.poisson(rng.gamma(0.5, 30, 60)).astype(float)     # cells (a, b, c), C order
    cube = x_flat.reshape(12, 5)
    xs = [cube.sum(1), cube.sum(0)]
    if opts.total is not None:
        opts = MWEMOptions(**{**opts.__dict__, "total": float(x_flat.sum()),
                              "total_share": None})

    def lift(block, rows):
        rows = dense(rows)
        return np.kron(rows, np.ones((1, 5))) if block == 0 else np.kron(np.ones((1, 12)), rows)

    factored_oracle = SeededOracle(xs, seed=7)
    factored = run_mwem([b0, b1], Fraction(3, 2), factored_oracle, opts)
    assert all(r > 0 for r in factored.rounds_per_block)

    m0 = b0.n_queries
    W_flat = sp.csr_matrix(np.vstack([lift(0, b0.W), lift(1, b1.W)]))
    groups = list(b0.groups) + [(m0 + s, m0 + e) for s, e in b1.groups]
    flat_oracle = ReplayOracle(x_flat, factored_oracle, factored, lift, [0, m0])
    flat = run_mwem([Block(W_flat, groups, 60, shape=(3, 4, 5))], Fraction(3, 2), flat_oracle,
                    opts)

    assert not flat_oracle.choices and not flat_oracle.measures      # every draw replayed
    assert flat.rounds == factored.rounds
    assert flat_oracle.spends == [e for _, _, e in factored.spends]
    np.testing.assert_allclose(flat.answers[0][:m0], factored.answers[0], rtol=1e-9)
    np.testing.assert_allclose(flat.answers[0][m0:], factored.answers[1], rtol=1e-9)
    A = flat.distributions[0].reshape(12, 5)
    np.testing.assert_allclose(A.sum(1), factored.distributions[0], rtol=1e-9)
    np.testing.assert_allclose(A.sum(0), factored.distributions[1], rtol=1e-9)
    if opts.iterate == "last":          # the last iterate is the product distribution itself
        np.testing.assert_allclose(
            A, np.outer(factored.distributions[0], factored.distributions[1]) / flat.total,
            rtol=1e-9)


def test_rounds_are_dealt_to_blocks_by_log_domain_size():
    rng = np.random.default_rng(3)
    blocks = [Block(range_matrix(n, 30, rng), [], n) for n in (4, 16, 64)]
    blocks.append(Block(sp.csr_matrix(np.ones((2, 1))), [], 1))     # one cell: nothing to learn
    oracle = SeededOracle([rng.poisson(3, b.n_cells) for b in blocks], record=False)
    result = run_mwem(blocks, 1, oracle, MWEMOptions(rounds=12, replay=0, total=100))
    assert result.rounds_per_block == (2, 4, 6, 0)                   # ∝ ln 4 : ln 16 : ln 64
    np.testing.assert_allclose(result.answers[3], [100.0, 100.0])


# ---------------------------------------------------------------------------------------
# Automatic T: the documented doubling rule, driven by released values only


class EchoOracle:
    """Selects candidate 0 and returns its estimate plus ``offset`` Laplace scales."""

    def __init__(self, offset):
        self.offset = offset
        self.spends = []
        self.last = None

    def select(self, block, groups, estimates, penalties, epsilon):
        self.spends.append(epsilon)
        self.last = np.asarray(estimates[0], dtype=float)
        return 0

    def measure(self, block, rows, epsilon):
        self.spends.append(epsilon)
        b = 1 / float(epsilon)
        return self.last + self.offset * b, b


@pytest.mark.parametrize("offset,stages,expected_T", [
    (0.0, 5, 1 + 2),                   # nothing informative: stop after stage 0
    (10.0, 5, 1 + 2 + 4 + 8 + 16),     # always informative: every stage
    (10.0, 1, 1),                      # one stage only
])
def test_auto_rounds_follow_the_doubling_rule(offset, stages, expected_T):
    W = sp.csr_matrix(np.tril(np.ones((64, 64))))
    oracle = EchoOracle(offset)
    eps = Fraction(2)
    result = run_mwem([Block(W, [], 64)], eps, oracle,
                      MWEMOptions(rounds="auto", max_stages=stages, total=1000, replay=0,
                                  measure="query"))
    assert result.rounds == expected_T
    assert sum(oracle.spends) == eps
    per_round = [2 * e for k, _, e in result.spends if k == "select"]
    e = eps / (2 ** stages - 1)
    if offset == 0 and stages > 1:      # stage 0 at e, then the rest in 2 rounds
        assert per_round == [e, (eps - e) / 2, (eps - e) / 2]
    else:                               # every round at the same budget
        assert set(per_round) == {e}


# ---------------------------------------------------------------------------------------
# Accuracy (seeded, deterministic)


def spiky_data(n, N, rng):
    cells = np.concatenate([
        np.zeros(int(N * 0.9), int),
        rng.normal(n * 0.6, n * 0.03, int(N * 0.07)).astype(int),
        rng.normal(n * 0.8, n * 0.01, N - int(N * 0.9) - int(N * 0.07)).astype(int)])
    return np.bincount(np.clip(cells, 0, n - 1), minlength=n).astype(float)


def test_error_falls_with_epsilon_and_beats_the_noisy_histogram_at_small_epsilon():
    n, N = 256, 2000
    rng = np.random.default_rng(7)
    W = range_matrix(n, 1000, rng)
    x = spiky_data(n, N, np.random.default_rng(3))
    truth = W @ x
    block = Block(W, [], n)
    mwem_rmse, hist_rmse = [], []
    for eps in (Fraction(1, 100), Fraction(1, 10), Fraction(1)):
        m, h = [], []
        for seed in range(3):
            result = run_mwem([block], eps, SeededOracle([x], seed, fast=True, record=False),
                              MWEMOptions(rounds=10, total=N))
            m.append(np.sqrt(np.mean((result.answers[0] - truth) ** 2)))
            noise = np.random.default_rng(100 + seed).laplace(0, 1 / float(eps), n)
            h.append(np.sqrt(np.mean((W @ (x + noise) - truth) ** 2)))
        mwem_rmse.append(np.mean(m))
        hist_rmse.append(np.mean(h))
    assert mwem_rmse[0] > 2 * mwem_rmse[1] > 4 * mwem_rmse[2]
    assert mwem_rmse[0] < 0.7 * hist_rmse[0]          # the paper's small-ε regime


def test_log_space_update_survives_huge_counts_and_noise():
    rng = np.random.default_rng(9)
    n = 64
    W = range_matrix(n, 80, rng)
    x = np.zeros(n)
    x[3] = 1e12
    result = run_mwem([Block(W, [], n)], Fraction(1, 1000),
                      SeededOracle([x], seed=1, record=False),
                      MWEMOptions(rounds=30, replay=20, total=1e12))
    A = result.distributions[0]
    assert np.all(np.isfinite(A)) and np.all(A >= 0)
    assert A.sum() == pytest.approx(1e12, rel=1e-9)
    result = run_mwem([Block(W, [], n)], Fraction(1, 1000),
                      SeededOracle([np.zeros(n)], seed=1, record=False),
                      MWEMOptions(rounds=5, total=0))
    assert np.all(result.distributions[0] == 0)


@pytest.mark.parametrize("holes", [False, True])
def test_fifty_rounds_on_1024_cells_and_20000_queries(holes):
    """A large case (1024 cells, 20,000 ranges, T = 50): accurate at ε = 1."""
    n, m = 1024, 20000
    rng = np.random.default_rng(1)
    W = range_matrix(n, m, rng)
    if holes:       # not intervals any more: estimates by sparse products, not prefix sums
        nnz = np.diff(W.indptr)
        W.data[W.indptr[:-1] + rng.integers(0, 2**31, m) % nnz] = 0
        W.eliminate_zeros()
    x = np.bincount(rng.gamma(2, 40, 30000).astype(int) % n, minlength=n).astype(float)
    oracle = SeededOracle([x], fast=True, record=False)
    block = Block(W, [], n)
    result = run_mwem([block], 1, oracle, MWEMOptions(rounds=50))
    assert result.rounds == 50
    assert np.abs(result.answers[0] - W @ x).mean() < 0.01 * x.sum()


# ---------------------------------------------------------------------------------------
# Theorem 2.3


def test_error_bound_is_theorem_2_3():
    N, D, Q, T, eps = 10_000, 1024, 5000, 20, 0.5
    theorem = 2 * N * math.sqrt(math.log(D) / T) + 10 * T * math.log(Q) / eps
    assert mwem_error_bound(N, D, Q, T, eps, beta=2 * T / Q) == pytest.approx(theorem,
                                                                               rel=1e-12)
    assert mwem_error_bound(N, [32, 32], Q, T, eps, beta=2 * T / Q) == \
        pytest.approx(theorem, rel=1e-12)                            # product domain
    assert mwem_error_bound(N, D, Q, T, eps, 0.01) > mwem_error_bound(N, D, Q, T, eps, 0.1)
    assert mwem_error_bound(N, D, Q, T, Fraction(1, 2)) == mwem_error_bound(N, D, Q, T, 0.5)
    for bad in (dict(beta=0), dict(beta=1.5), dict(epsilon=0), dict(rounds=0),
                dict(n_cells=0), dict(n_cells=[4, 0]), dict(n_queries=0), dict(n_total=-1)):
        args = dict(n_total=N, n_cells=D, n_queries=Q, rounds=T, epsilon=eps)
        args.update(bad)
        with pytest.raises(DpsqlError):
            mwem_error_bound(**args)


# ---------------------------------------------------------------------------------------
# Validation and the privacy boundary


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(rounds=0), StrategyError, "rounds"),
    (dict(rounds=True), StrategyError, "rounds"),
    (dict(rounds="many"), StrategyError, "rounds"),
    (dict(rounds=2.5), StrategyError, "rounds"),
    (dict(iterate="first"), StrategyError, "iterate"),
    (dict(replay=-1), StrategyError, "replay"),
    (dict(max_stages=0), StrategyError, "max_stages"),
    (dict(max_stages=13), StrategyError, "max_stages"),
    (dict(cuboids=1), StrategyError, "cuboids"),
    (dict(init_share=1), PrivacyParameterError, "init_share"),
    (dict(init_share=-0.1), PrivacyParameterError, "init_share"),
    (dict(init_share="1/2"), PrivacyParameterError, "init_share"),
    (dict(total=-5), StrategyError, "total"),
    (dict(total=float("nan")), StrategyError, "total"),
    (dict(total=100, total_share=Fraction(1, 10)), PrivacyParameterError, "total_share"),
    (dict(total_share=0), PrivacyParameterError, "total_share"),
    (dict(init_share=Fraction(1, 2), total_share=Fraction(1, 2)), PrivacyParameterError,
     "nothing for the rounds"),
])
def test_option_validation(kwargs, error, match):
    with pytest.raises(error, match=match):
        MWEMOptions(**kwargs)


def test_option_defaults():
    opts = MWEMOptions()
    assert (opts.rounds, opts.iterate, opts.replay, opts.cuboids, opts.measure) == \
        ("rule", "last", defaults.REPLAY, False, "partition")
    assert opts.total is None and opts.total_share == defaults.TOTAL_SHARE
    assert MWEMOptions(total=50).total_share == 0
    assert MWEMOptions(init_share=0.1).init_share == Fraction(1, 10)


def test_block_and_run_validation():
    W = sp.csr_matrix(np.eye(3))
    with pytest.raises(StrategyError, match="one column per cell"):
        Block(W, [], 4)
    with pytest.raises(StrategyError, match=r"\[0, 1\]"):
        Block(2 * W, [], 3)
    with pytest.raises(StrategyError, match="range"):
        Block(W, [(2, 5)], 3)
    with pytest.raises(StrategyError, match="range"):
        Block(W, [(1, 1)], 3)
    with pytest.raises(StrategyError, match="n_cells"):
        Block(W, [], 0)
    assert Block(np.eye(3), [[0, 3]], 3).groups == ((0, 3),)
    oracle = SeededOracle([np.ones(3)])
    with pytest.raises(PrivacyParameterError):
        run_mwem([Block(W, [], 3)], 0, oracle)
    with pytest.raises(StrategyError, match="no queries"):
        run_mwem([Block(sp.csr_matrix((0, 3)), [], 3)], 1, oracle)
    with pytest.raises(StrategyError, match="Block"):
        run_mwem([], 1, oracle)
    with pytest.raises(StrategyError, match="MWEMOptions"):
        run_mwem([Block(W, [], 3)], 1, oracle, {"rounds": 3})
    assert oracle.spends == []                       # refused before anything was spent


def test_mwem_module_is_public_only():
    assert not (_closure("dpsql.mechanisms.mwem.core") & FORBIDDEN)


# ---------------------------------------------------------------------------------------
# The default rule for T (issue 21): from ε and N alone, N possibly the run's noisy estimate


def test_default_rounds_grow_with_the_signal_and_stay_clamped():
    values = [defaults.default_rounds(eps, 10_000) for eps in (0.001, 0.01, 0.1, 1, 100)]
    assert values == sorted(values) and values[0] == defaults.T_MIN
    assert values[-1] == defaults.T_MAX
    T = defaults.default_rounds(Fraction(1, 10), 30_000)
    assert T == round(defaults.RULE_C * 3000 ** defaults.RULE_A)
    # K blocks: each gets the rule at ε_R N / K
    assert defaults.default_rounds(0.1, 30_000, 3) == 3 * defaults.default_rounds(0.1, 10_000)
    assert defaults.max_rounds(3) == 3 * defaults.T_MAX
    assert defaults.default_rounds(0.1, 0.0) == defaults.T_MIN      # N floored at 1


@pytest.mark.parametrize("total", [None, 5000.0])
def test_the_default_run_takes_the_rules_T_on_its_own_N(total):
    n = 64
    rng = np.random.default_rng(3)  # test data only
    x = rng.multinomial(5000, rng.dirichlet(np.ones(n))).astype(float)
    W = sp.csr_matrix(np.tril(np.ones((n, n))))
    eps = Fraction(1, 2)
    result = run_mwem([Block(W, [], n)], eps, SeededOracle([x], seed=4),
                      MWEMOptions(total=total, replay=2))
    eps_rounds = eps * (1 - (defaults.TOTAL_SHARE if total is None else 0))
    assert result.rounds == defaults.default_rounds(eps_rounds, result.total, 1)
    assert (result.total == 5000.0) == (total is not None)
    assert result.epsilon == eps
    assert any("default rule" in note for note in result.notes)
    # the checks before the charge assume the rule's largest T: every step gets at least
    from dpsql.mechanisms.mwem.options import step_epsilons
    smallest = step_epsilons([Block(W, [], n)], eps, MWEMOptions(total=total))["round"]
    assert all(e >= smallest for kind, _, e in result.spends if kind in ("select", "measure"))

"""MWEM's implicit all-ranges block (RangeBlock, AllIntervals) and the box fast path of the
MW update. Test oracles use seeded numpy noise: test doubles, not private mechanisms."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp

from dpsql.errors import StrategyError
from dpsql.mechanisms.mwem.core import (AllIntervals, Block, MWEMOptions, RangeBlock, interval_answers,
                        interval_index, run_mwem)
from dpsql.mechanisms.mwem.state import Measured, WeightState


def all_ranges(n: int) -> sp.csr_matrix:
    """Every range [lo, hi] over n cells, rows in interval_index order."""
    rows = [np.arange(lo, hi + 1) for lo in range(n) for hi in range(lo, n)]
    indptr = np.concatenate([[0], np.cumsum([r.size for r in rows])])
    return sp.csr_matrix((np.ones(indptr[-1]), np.concatenate(rows), indptr),
                         shape=(len(rows), n))


def test_interval_index_and_answers_follow_the_explicit_rows():
    n = 7
    W = all_ranges(n).toarray()
    for r, (lo, hi) in enumerate((lo, hi) for lo in range(n) for hi in range(lo, n)):
        assert interval_index(n, lo, hi) == r
        assert np.array_equal(np.flatnonzero(W[r]), np.arange(lo, hi + 1))
    x = np.random.default_rng(0).poisson(5, n).astype(float)
    np.testing.assert_allclose(interval_answers(np.concatenate([[0], np.cumsum(x)])), W @ x)
    assert RangeBlock(n).n_queries == W.shape[0] and RangeBlock(n).groups == ()


class Enumerate:
    """A stand-in sampler: returns a chosen index and records the EM probabilities
    ∝ exp(ε·score/2) of the scores it was given (sensitivity 1)."""

    def __init__(self, picks):
        self.picks, self.probs = list(picks), []

    def __call__(self, scores, epsilon, *, sensitivity):
        assert sensitivity == 1.0
        z = float(epsilon) * np.asarray(scores) / 2.0
        p = np.exp(z - z.max())
        self.probs.append(p / p.sum())
        return self.picks.pop(0)


@pytest.mark.parametrize("excluded", [(), ((0, 0), (1, 3)), ((0, 4),), ((2, 2), (0, 1))])
@pytest.mark.parametrize("epsilon", [0.3, 2.0])
def test_two_stage_draw_is_exactly_the_exponential_mechanism(excluded, epsilon):
    n = 5
    rng = np.random.default_rng(3)
    est = np.concatenate([[0], np.cumsum(rng.random(n) * 10)])
    ans = np.concatenate([[0], np.cumsum(rng.poisson(3, n))]).astype(float)
    cands = AllIntervals(n, excluded)
    # the exponential mechanism over the allowed ranges, listed
    ranges = [(lo, hi) for lo in range(n) for hi in range(lo, n) if (lo, hi) not in excluded]
    scores = np.array([abs(est[hi + 1] - est[lo] - (ans[hi + 1] - ans[lo]))
                       for lo, hi in ranges])
    target = np.exp(epsilon * scores / 2 - (epsilon * scores / 2).max())
    target /= target.sum()
    # every path of the two-stage draw: P(l) · P(k | l), summed over both orientations
    got = dict.fromkeys(ranges, 0.0)
    D = est - ans
    first = Enumerate([0, 0])
    cands.sample(est, ans, epsilon, first)
    positions = [p for p in range(n + 1)
                 if any(p in (lo, hi + 1) for lo, hi in ranges)]
    assert len(first.probs[0]) == len(positions)
    for i, l in enumerate(positions):
        partners = [k for k in range(n + 1) if k != l and
                    (min(k, l), max(k, l) - 1) not in excluded]
        for j, k in enumerate(partners):
            draw = Enumerate([i, j])
            assert cands.sample(est, ans, epsilon, draw) == (min(k, l), max(k, l) - 1)
            got[(min(k, l), max(k, l) - 1)] += draw.probs[0][i] * draw.probs[1][j]
        assert np.allclose(draw.probs[1], np.exp(
            epsilon / 2 * (np.abs(D[l] - D[partners]) - np.abs(D[l] - D[partners]).max()))
            / np.exp(epsilon / 2 * (np.abs(D[l] - D[partners])
                                    - np.abs(D[l] - D[partners]).max())).sum())
    np.testing.assert_allclose([got[r] for r in ranges], target, rtol=1e-10, atol=1e-15)
    assert len(cands) == len(ranges)
    assert all(cands.allowed(lo, hi) for lo, hi in ranges)
    assert not any(cands.allowed(lo, hi) for lo, hi in excluded)


def test_two_stage_draw_frequencies_with_the_seeded_sampler():
    """Sampled through a real Gumbel-max sampler: frequencies match the EM probabilities."""
    from dpsql.noise.samplers import SeededTestSampler

    n, eps = 4, 1.0
    est = np.array([0.0, 1.0, 5.0, 5.5, 9.0])
    ans = np.array([0.0, 2.0, 2.0, 6.0, 6.0])
    cands = AllIntervals(n, {(1, 1)})
    ranges = [(lo, hi) for lo in range(n) for hi in range(lo, n) if (lo, hi) != (1, 1)]
    scores = np.array([abs(est[hi + 1] - est[lo] - (ans[hi + 1] - ans[lo]))
                       for lo, hi in ranges])
    p = np.exp(eps * scores / 2)
    p /= p.sum()
    sampler = SeededTestSampler(11)
    draws = 20000
    counts = dict.fromkeys(ranges, 0)
    for _ in range(draws):
        counts[cands.sample(est, ans, eps, sampler.exponential)] += 1
    freq = np.array([counts[r] for r in ranges]) / draws
    assert np.all(np.abs(freq - p) < 4 * np.sqrt(p * (1 - p) / draws) + 1e-3)


class RangeSeededOracle:
    """select_interval over a known data vector with a seeded Gumbel-max sampler; Laplace
    measurements. Records the choices and the noise."""

    def __init__(self, x, seed=0):
        self.x = np.asarray(x, dtype=float)
        self.rng = np.random.default_rng(seed)
        self.spent, self.choices, self.noise = Fraction(0), [], []

    def _exponential(self, scores, epsilon, *, sensitivity):
        return int(np.argmax(float(epsilon) * np.asarray(scores) / (2 * sensitivity)
                             + self.rng.gumbel(size=len(scores))))

    def select_interval(self, block, candidates, estimates, epsilon):
        assert block == 0 and isinstance(epsilon, Fraction)
        self.spent += epsilon
        lo, hi = candidates.sample(estimates, np.concatenate([[0], np.cumsum(self.x)]),
                                   epsilon, self._exponential)
        self.choices.append((lo, hi))
        return lo, hi

    def select(self, *args):
        raise AssertionError("a RangeBlock never calls select")

    def measure(self, block, rows, epsilon):
        self.spent += epsilon
        b = 1.0 / float(epsilon)
        noise = self.rng.laplace(0.0, b, rows.shape[0])
        self.noise.append(noise)
        return rows @ self.x + noise, b


class ExplicitReplay:
    """Answers a run on the explicit all-ranges Block with the implicit run's choices."""

    def __init__(self, x, implicit: RangeSeededOracle, n):
        self.x, self.n = x, n
        self.choices, self.noise = list(implicit.choices), list(implicit.noise)

    def select(self, block, groups, estimates, penalties, epsilon):
        lo, hi = self.choices.pop(0)
        return int(np.flatnonzero(groups.starts == interval_index(self.n, lo, hi))[0])

    def measure(self, block, rows, epsilon):
        return rows @ self.x + self.noise.pop(0), 1.0 / float(epsilon)


@pytest.mark.parametrize("opts", [dict(rounds=8, replay=5), dict(rounds=6, replay=0,
                                                                 iterate="average"),
                                  dict(rounds="auto", max_stages=3, replay=3)])
def test_range_block_matches_the_explicit_all_ranges_block(opts):
    n = 12
    x = np.random.default_rng(5).poisson(20, n).astype(float)
    x[3] += 300
    implicit = RangeSeededOracle(x, seed=2)
    options = MWEMOptions(total=float(x.sum()), **opts)
    res = run_mwem([RangeBlock(n)], Fraction(1, 2), implicit, options)
    assert implicit.spent == Fraction(1, 2) and res.epsilon == Fraction(1, 2)
    assert len(set(implicit.choices)) == len(implicit.choices)     # no range twice
    W = all_ranges(n)
    ref = run_mwem([Block(W, [], n)], Fraction(1, 2), ExplicitReplay(x, implicit, n), options)
    np.testing.assert_allclose(res.distributions[0], ref.distributions[0], rtol=1e-9)
    np.testing.assert_allclose(res.answers[0], ref.answers[0], rtol=1e-9, atol=1e-9)
    assert [m.rows for m in res.measurements] == [m.rows for m in ref.measurements]


def test_range_block_is_accurate_on_4096_cells():
    """Every one of 8.4 M ranges, T = 20: well under the uniform guess (its speed on 4,357
    cells is printed by benchmarks/mwem_adult.py; no wall-clock limit here)."""
    n, N = 4096, 30000
    rng = np.random.default_rng(8)
    x = np.bincount(np.clip(rng.normal(1000, 200, N).astype(int), 0, n - 1),
                    minlength=n).astype(float)
    res = run_mwem([RangeBlock(n)], 1, RangeSeededOracle(x, seed=1),
                   MWEMOptions(rounds=20, replay=50, total=N))
    truth = interval_answers(np.concatenate([[0], np.cumsum(x)]))
    uniform = interval_answers(np.concatenate([[0], np.cumsum(np.full(n, N / n))]))
    assert res.answers[0].size == n * (n + 1) // 2
    assert np.mean((res.answers[0] - truth) ** 2) < 0.01 * np.mean((uniform - truth) ** 2)


def test_select_interval_answers_are_checked_and_range_blocks_validated():
    class Bad(RangeSeededOracle):
        def __init__(self, x, out):
            super().__init__(x)
            self.out = out

        def select_interval(self, block, candidates, estimates, epsilon):
            return self.out

    for out in [(2, 1), (0, 9), (0.5, 1), "ab", (0, 1, 2), None, (True, 1)]:
        with pytest.raises(StrategyError, match="select_interval"):
            run_mwem([RangeBlock(4)], 1, Bad(np.ones(4), out), MWEMOptions(rounds=2, total=4))
    for bad in (0, -1, 10**6, 2.0, True):
        with pytest.raises(StrategyError, match="RangeBlock.n_cells"):
            RangeBlock(bad)
    # every range measured: the candidates start over (a 1-cell block has one range)
    oracle = RangeSeededOracle(np.array([5.0]))
    res = run_mwem([RangeBlock(1)], 1, oracle, MWEMOptions(rounds=3, total=5))
    assert oracle.choices == [(0, 0)] * 3 and res.answers[0].size == 1


def _rectangle(shape, a, b, c, d) -> sp.csr_matrix:
    M = np.zeros(shape)
    M[a:b, c:d] = 1
    return sp.csr_matrix(M.reshape(1, -1))


def test_box_fast_path_matches_the_general_update():
    """Ranges and rectangles take the scalar-step path; the result is the exact MW step."""
    rng = np.random.default_rng(12)
    shape, total = (6, 9), 5000.0
    rows = [_rectangle(shape, a, b, c, d) for a, b, c, d in
            [(0, 6, 0, 9), (1, 3, 2, 7), (4, 5, 0, 1), (0, 1, 3, 9), (2, 6, 8, 9)]]
    rows.append(sp.csr_matrix((np.ones(5), np.arange(10, 15), [0, 5]), shape=(1, 54)))
    rows.append(sp.csr_matrix((np.ones(4), [7, 10, 13, 16], [0, 4]), shape=(1, 54)))
    fast, plain = WeightState(54), WeightState(54)
    start = rng.normal(0, 2, 54)
    fast.set_log_weights(start)
    plain.set_log_weights(start)
    for step in range(30):
        R = rows[step % len(rows)]
        noisy = np.asarray(R @ rng.poisson(90, 54), dtype=float).reshape(1)
        m_fast, m_plain = Measured(R, noisy), Measured(R, noisy)
        assert m_fast.box is not None
        m_plain.box = None
        fast.update(m_fast, total)
        plain.update(m_plain, total)
        np.testing.assert_allclose(fast.logw, plain.logw, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(fast.p, plain.p, rtol=1e-9)
    gap = sp.csr_matrix(np.array([[1.0, 0, 1, 1] + [0] * 50]))          # runs of 1 and 2
    half = sp.csr_matrix(np.array([[0.5, 0.5] + [0] * 52]))
    staircase = sp.vstack([_rectangle(shape, 0, 1, 0, 3), _rectangle(shape, 1, 2, 1, 3)])
    uneven = sp.csr_matrix(np.array([[1.0, 0, 1, 0, 0, 1] + [0] * 48]))   # strides 2, 3
    for R in (gap, half, sp.csr_matrix(staircase.sum(axis=0)), uneven):
        assert Measured(R, np.zeros(1)).box is None
    assert Measured(_rectangle(shape, 1, 4, 2, 5), np.zeros(1)).box == (11, 3, 3, 9)
    every_other = sp.csr_matrix(np.array([[1.0, 0, 1, 0, 1] + [0] * 49]))
    assert Measured(every_other, np.zeros(1)).box == (0, 3, 1, 2)      # a box too
    unsorted = sp.csr_matrix((np.ones(2), [1, 0], [0, 2]), shape=(1, 54))
    assert Measured(unsorted, np.zeros(1)).box is None


def test_box_path_survives_huge_steps():
    state = WeightState(10)
    R = sp.csr_matrix((np.ones(3), [2, 3, 4], [0, 3]), shape=(1, 10))
    meas = Measured(R, np.array([1e15]))
    for _ in range(50):
        state.update(meas, 1e3)
    assert np.all(np.isfinite(state.p)) and math.isclose(state.p.sum(), 1.0)
    assert state.p[2:5].sum() > 0.999
    for a, b in itertools.pairwise(range(0, 10, 5)):
        assert np.all(np.isfinite(state.logw[a:b]))


# ------------------------------------------------------------ the kernel's select_interval

def _em_probs(est, ans, ranges, eps):
    """Exponential-mechanism probabilities ∝ exp(eps·score/2) over the listed ranges."""
    scores = np.array([abs(est[hi + 1] - est[lo] - (ans[hi + 1] - ans[lo])) for lo, hi in ranges])
    z = eps * scores / 2.0
    p = np.exp(z - z.max())
    return p / p.sum()


class _MisScaled:
    """The seeded sampler with its ε multiplied by ``factor`` (a wrong-scale sampler)."""

    private = False

    def __init__(self, seed, factor):
        from dpsql.noise.samplers import SeededTestSampler

        self.inner, self.factor = SeededTestSampler(seed), factor

    def exponential(self, scores, epsilon, *, sensitivity):
        return self.inner.exponential(scores, float(epsilon) * self.factor,
                                      sensitivity=sensitivity)


def test_kernel_select_interval_draws_the_exponential_mechanism():
    """dpsql.kernel.oracles.MeasureOracle.select_interval with the seeded test sampler: 6,000
    draws over the 14 allowed ranges of 5 cells (one excluded), chi-square against the exponential
    mechanism's probabilities at ε (every expected count ≥ 5 here, checked), α = 0.001, 13
    degrees of freedom, ε = 1. Power: a sampler 30% off in scale (ε×1.3 or ε/1.3) shifts
    the probabilities enough that the non-central chi-square exceeds the critical value with
    probability > 1 − 1e-6 (computed below; it rounds to 1.0 in double precision), and with
    these seeds both wrong scales are rejected while the kernel's draws are not."""
    from scipy import stats

    from dpsql.kernel.oracles import MeasureOracle
    from dpsql.noise.samplers import SeededTestSampler

    n, eps, draws = 5, Fraction(1), 6000
    x = np.array([4.0, 0.0, 7.0, 2.0, 3.0])
    est = np.concatenate([[0.0], np.cumsum([1.0, 6.0, 2.0, 5.0, 2.5])])
    ans = np.concatenate([[0.0], np.cumsum(x)])
    excluded = {(1, 2)}
    ranges = [(lo, hi) for lo in range(n) for hi in range(lo, n) if (lo, hi) not in excluded]
    p = _em_probs(est, ans, ranges, float(eps))
    assert np.all(draws * p >= 5)
    dof = len(ranges) - 1
    crit = stats.chi2.ppf(0.999, dof)
    for factor in (1.3, 1 / 1.3):
        q = _em_probs(est, ans, ranges, float(eps) * factor)
        power = stats.ncx2.sf(crit, dof, draws * np.sum((q - p) ** 2 / p))
        assert power > 1 - 1e-6, (factor, power)

    def chi2(sampler):
        oracle = MeasureOracle([x], sampler, eps * draws)
        cands = AllIntervals(n, excluded)
        counts = dict.fromkeys(ranges, 0)
        for _ in range(draws):
            counts[oracle.select_interval(0, cands, est, eps)] += 1
        assert oracle.spent == eps * draws == oracle.budget        # exact accounting
        observed = np.array([counts[r] for r in ranges], dtype=float)
        return float(np.sum((observed - draws * p) ** 2 / (draws * p)))

    assert chi2(SeededTestSampler(31)) < crit
    assert chi2(_MisScaled(32, 1.3)) > crit
    assert chi2(_MisScaled(33, 1 / 1.3)) > crit


class _Recording:
    private = False

    def __init__(self, seed):
        from dpsql.noise.samplers import SeededTestSampler

        self.inner, self.calls = SeededTestSampler(seed), []

    def exponential(self, scores, epsilon, *, sensitivity):
        self.calls.append((epsilon, sensitivity))
        return self.inner.exponential(scores, epsilon, sensitivity=sensitivity)

    def laplace(self, values, scale, *, sensitivity, epsilon=None):
        return self.inner.laplace(values, scale, sensitivity=sensitivity, epsilon=epsilon)


def test_kernel_select_interval_budget_is_exact_and_inputs_checked():
    from dpsql.kernel.oracles import MeasureOracle

    x = np.array([3.0, 1.0, 0.0, 2.0])
    est = np.linspace(0.0, 6.0, 5)
    sampler = _Recording(4)
    oracle = MeasureOracle([x], sampler, Fraction(1))
    for _ in range(3):
        lo, hi = oracle.select_interval(0, AllIntervals(4), est, Fraction(1, 3))
        assert 0 <= lo <= hi < 4 and type(lo) is int and type(hi) is int
    assert oracle.spent == Fraction(1)                     # 3 × 1/3, exactly
    # two sampler calls per draw, each at the step's exact ε and sensitivity 1
    assert sampler.calls == [(Fraction(1, 3), 1.0)] * 6
    with pytest.raises(StrategyError, match="more than its charged epsilon"):
        oracle.select_interval(0, AllIntervals(4), est, Fraction(1, 10**9))
    assert oracle.spent == Fraction(1) and len(sampler.calls) == 6

    fresh = MeasureOracle([x], _Recording(5), Fraction(1))
    bad = [(AllIntervals(5), est), (AllIntervals(3), est), ("ranges", est),
           (AllIntervals(4), est[:4]), (AllIntervals(4), np.append(est[:4], np.nan)),
           (AllIntervals(4), np.append(est[:4], np.inf)), (AllIntervals(4), "abcde"),
           (AllIntervals(1 * 4, {(0, 4)}), est),
           (AllIntervals(1, {(0, 0)}), np.zeros(2))]
    for cands, e in bad:
        with pytest.raises(StrategyError, match="select_interval"):
            fresh.select_interval(0, cands, e, Fraction(1, 2))
    with pytest.raises(StrategyError, match="no block"):
        fresh.select_interval(1, AllIntervals(4), est, Fraction(1, 2))
    for eps in (0, -1):
        with pytest.raises(StrategyError, match="epsilon > 0"):
            fresh.select_interval(0, AllIntervals(4), est, eps)
    assert fresh.spent == 0 and fresh._sampler.calls == []        # refused: nothing spent
    fresh.close()
    with pytest.raises(StrategyError, match="closed"):
        fresh.select_interval(0, AllIntervals(4), est, Fraction(1, 2))


def test_run_mwem_on_a_range_block_through_the_kernel_oracle_spends_exactly():
    from dpsql.kernel.oracles import MeasureOracle
    from dpsql.noise.samplers import SeededTestSampler

    n = 30
    x = np.random.default_rng(6).poisson(8, n).astype(float)
    x[7] += 100
    for eps, opts in [(Fraction(1, 3), dict(rounds=7, replay=5)),
                      (Fraction(7, 10), dict(rounds="auto", max_stages=3, replay=3)),
                      (Fraction(1, 2), dict(rounds=4))]:
        oracle = MeasureOracle([x], SeededTestSampler(9), eps)
        res = run_mwem([RangeBlock(n)], eps, oracle, MWEMOptions(**opts))
        assert oracle.spent == eps == res.epsilon                # exact Fractions
        selects = [s[2] for s in res.spends if s[0] == "select"]
        rounds = [m.rows for m in res.measurements if m.kind == "round"]
        assert len(selects) == len(rounds) > 0
        assert len(set(rounds)) == len(rounds)                 # no range measured twice
        truth = interval_answers(np.concatenate([[0], np.cumsum(x)]))
        assert res.answers[0].size == truth.size


def test_metric_oracle_still_refuses_select_interval():
    from dpsql.kernel.metric_oracle import MetricMeasureOracle
    from dpsql.noise.samplers import SeededTestSampler

    x = np.array([1.0, 2.0, 3.0])
    dist = np.abs(np.arange(3.0)[:, None] - np.arange(3.0)[None, :])
    oracle = MetricMeasureOracle([x], [dist], SeededTestSampler(1), Fraction(1))
    with pytest.raises(StrategyError, match="not all ranges"):
        oracle.select_interval(0, AllIntervals(3), np.arange(4.0), Fraction(1, 2))
    assert oracle.spent == 0
    assert "select_interval" in type(oracle).__dict__         # overridden, never inherited
    with pytest.raises(StrategyError):
        run_mwem([RangeBlock(3)], 1, oracle, MWEMOptions(rounds=2, total=6))

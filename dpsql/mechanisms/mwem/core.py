"""MWEM: multiplicative weights with the exponential mechanism, against a measure oracle.

Hardt, Ligett & McSherry, *A Simple and Practical Algorithm for Differentially Private Data
Release* (NIPS 2012), Figure 1. The algorithm keeps a synthetic distribution ``A`` (a
nonnegative weighting of the cells summing to the row count ``N``) and repeats for
``i = 1..T``:

1. **select** (exponential mechanism, ``ε/(2T)``) a query ``qᵢ`` on which ``A`` is badly
   wrong: score ``|qᵢ·A − qᵢ·x|``;
2. **measure** (Laplace, ``ε/(2T)``) ``mᵢ = qᵢ·x + Lap(b)``;
3. **update** ``Aᵢ(c) ∝ Aᵢ₋₁(c) · exp(qᵢ(c) · (mᵢ − qᵢ·Aᵢ₋₁) / (2N))``, renormalised to ``N``.

This module is pure (DESIGN.md): it never imports the engine or the kernel and never sees
the data vector ``x``. Steps 1 and 2 are calls to a :class:`MeasureOracle` that the kernel
binds to the data; everything else is computed from the oracle's released outputs.

**Blocks (paper §4, the factored form).** The workload comes as blocks over disjoint
column groups; block ``g`` has ``n_g`` cells and its own query rows ``W_g`` (entries in
[0, 1]). No query spans two blocks, so the MW distribution over the product domain stays a
product ``A(c₁, …, c_K) = N Π_g p_g(c_g)`` and each block keeps its own ``A_g = N p_g``;
a query of block ``g`` has answer ``q·A_g``. Lifting a block query to the product domain
(``q ⊗ 1``) and running flat MW gives the same answers (tested). Every record contributes to
every block, so budgets compose *sequentially* across blocks, never in parallel.

Which block a round selects in is public: the oracle's exponential mechanism works within
one block, so rounds are dealt to blocks by a deterministic smooth weighted round-robin
with weight ``ln n_g`` (blocks of one cell have nothing to learn and get no rounds). With
``T_g = T ln n_g / ln |D|`` the MW term of Theorem 2.3 for block ``g``,
``2N √(ln n_g / T_g)``, equals the flat bound's ``2N √(ln |D| / T)`` on the product domain
``|D| = Π n_g`` (up to rounding ``T_g`` to an integer).

**All ranges, implicit** (paper §3.1). A :class:`RangeBlock` ``(n)`` stands for every
range query ``[lo, hi]`` over ``n`` ordered cells — ``n(n+1)/2`` rows (9.5 M for 4,357
cells) that are never listed. The state hands the oracle the estimates as prefix sums and
the set of ranges already measured (:class:`AllIntervals`); the oracle's
``select_interval`` draws from the exponential mechanism over all the other ranges (score
``|est − true|``, sensitivity 1) in ``O(n log n)`` by an exact two-stage draw
(:meth:`AllIntervals.sample`); the measurement and the MW update are those of one explicit
range row, and the answers are all ranges, by ``lo`` then ``hi``
(:func:`interval_index`). The form takes nothing but the public cell count, and given the
same choices and noise it equals the explicit all-ranges block (tested).

**Practical variants** (paper §2.3.3, §3.3), all in :class:`MWEMOptions`:

- ``iterate``: ``"average"`` returns the mean of ``A₁ … A_T`` (what the theorem covers);
  ``"last"`` returns ``A_T`` (what the paper uses in its experiments; the default).
- ``replay``: after each round's update, re-apply the MW update over every past measurement
  of every block, in order, this many extra times (no new measurement, no budget).
- Already-measured candidates are not offered again until every candidate of the block has
  been measured (the paper's reference code rejects prior queries the same way).
- ``cuboids``: candidates are whole output groups (a GROUP BY marginal): score
  ``Σ_r |est_r − true_r| − (number of rows)``, measured in one Laplace step with the
  group's L1 sensitivity (1 for a marginal). Rows of the block that no declared group
  covers are single-row candidates (penalty 1).
- ``init_share``: spend that share of ε first on a noisy histogram of each block (identity
  rows, split equally over the blocks that have queries) and start from it: negatives
  clipped to 0, then every cell raised by the Laplace scale ``b`` and rescaled to ``N``:
  ``A₀ = N (h⁺ + b) / Σ(h⁺ + b)``. That is a mix of the clipped histogram with the uniform
  distribution, with uniform weight ``n b / (Σh⁺ + n b)``: nearly the histogram when it is
  accurate, nearly uniform when noise dominates; and no cell starts at zero weight, which
  MW could never raise again.
- ``init="marginals"`` (with ``init_share``; our variant for blocks over several columns):
  measure the block's one-column marginals instead of its histogram — all of them in one
  Laplace step, whose L1 sensitivity is the number of columns ``k`` (every cell lies in one
  value of each column) — and start from their product, each marginal clipped and raised by
  the Laplace scale as above. The marginal rows join the replayed measurements. On
  ``age × hours_per_week`` (7,326 cells) ``Σ n_j`` = 74 + 99 = 173 noisy counts replace
  7,326: the noisy histogram at ε·share is mostly noise there, the marginals are not, and
  the product is a far better start than uniform for range queries
  (benchmarks/mwem_adult.py).
  A block of one column (or without a declared shape) measures its histogram.
- ``measure="partition"`` (our variant): when the selected query is a single 0/1 *box* —
  a range, or a rectangle ``Π_j [lo_j, hi_j]`` over the block's shape — measure in the
  same Laplace step every box of the partition it induces: each axis splits into below /
  inside / above, giving at most ``3^k`` disjoint boxes covering all cells, the query
  first (:func:`dpsql.mechanisms.mwem.state.box_partition`). Disjoint rows have L1 sensitivity 1, the
  query's own, so the step costs the same ``ε/(2T)`` and the noise on the query is the same,
  but MW learns up to ``3^k − 1`` more counts; each piece is applied as its own update.
  Groups (``cuboids``), non-box rows and blocks of more than four columns (``3^k > 81``
  pieces) are measured as before.
- ``total``: the public row count ``N`` (declared in the policy), or ``None`` to spend
  ``total_share`` of ε on the all-ones row of block 0; the noisy count is floored at 1.

**Budget.** Shares are exact :class:`~fractions.Fraction` s: ``ε_R = ε − ε_total − ε_init``
goes to the rounds; a round with budget ``e`` spends ``e/2`` on selection and ``e − e/2``
on measurement. Fixed ``T``: ``e = ε_R / T`` (the paper's ``ε/(2T)`` each).

**Automatic T** (``rounds="auto"``; the paper sketches doubling in §2.3.3, this is our
rule). Stage ``s = 0, 1, …, S−1`` (``S = max_stages``) runs ``T_s = T₀ 2^s`` rounds,
``T₀`` = number of blocks that get rounds. The per-round budget is fixed in advance at
``e = ε_R / (T₀ (2^S − 1))``, so stages cost a fixed geometric sequence ``e T₀ 2^s``. After
each stage we look at the released measurements only: a round is *informative* when its
measured discrepancy ``Σ_r |m_r − est_r|`` (``est`` = the estimate it was selected on)
exceeds ``b (k + 2√k)`` for a group of ``k`` rows measured with Laplace scale ``b`` — what
pure noise exceeds with probability about 5% (``k = 1``: ``3b``, ``P = e⁻³``). If at least
half the stage's rounds were informative, the approximation still has errors above the
noise level and doubling continues; otherwise the *next* stage (``2 T_s`` rounds) is the
last and receives all the remaining budget: once the coarse errors are fixed, the rest of
the budget buys fewer, more accurate measurements than further doubling would. Stopping
only at the last stage is the same as never stopping. ``T`` then lies between
``min(3, 2^S − 1) T₀`` and ``(2^S − 1) T₀`` (3 and 31 per block with the default
``S = 5``); every path spends exactly ``ε_R``. On synthetic range workloads (three data
shapes, ``N`` = 2000 and 50000, ε = 0.01, 0.1, 1) it stayed within 2× of the better of
``T = 10`` and ``T = 30`` chosen in hindsight, and sometimes beat both.

**Numerics and speed** (:mod:`dpsql.mechanisms.mwem.state`). The MW state is log weights, so no
update overflows (tested with ``N = 10¹²`` and Laplace noise far larger than ``N``). An
update touches only the measured rows' cells (a cached ``exp`` and its sum, recomputed
exactly after every pass); a single 0/1 row on a *box* of cells — a range, or a rectangle
in C order: equal runs at a constant stride — is one scalar step on a strided view
(``w *= e^s``, no gather, no ``exp`` per cell). The per-round estimates ``W_g A_g`` use
prefix sums when every row of a block is a 0/1 interval of cells (range queries): 50
rounds on 1024 cells and 20 000 range queries with the default ``replay`` take well under
a second; on Adult (benchmarks/mwem_adult.py, shared machine) 40 rounds with
``replay = 300`` take about 2 s over all 9.5 M ranges of 4,357 cells and about 4 s over
2,000 rectangles of 7,326 cells.

**Privacy.** Every release is an oracle call: the exponential mechanism with budget ``εᵢ``
(score sensitivity = the largest column L1 norm over the candidate groups; 1 for the
ranges of a RangeBlock, drawn by ``select_interval`` at the same ``εᵢ``) or the Laplace
mechanism with ``b = Δ₁/εᵢ``, ``Δ₁`` computed by the kernel from the rows it is handed
(the largest column L1 norm: ``k`` for ``k`` stacked marginals, 1 for a partition) — each
``εᵢ``-DP. Which call comes next, on which block,
candidates and rows, and with which ``εᵢ``, is a function of public inputs (blocks,
options, ε) and of earlier oracle outputs only. By adaptive sequential composition of pure
DP — which holds even when the ``εᵢ`` are chosen adaptively, provided every path's sum
stays within the budget (Rogers, Roth, Ullman & Vadhan, *Privacy Odometers and Filters*,
NIPS 2016, basic-composition filter) — the run is ``(Σ εᵢ)``-DP, and the exact sum is ``ε``
on every path (checked at the end; overspending is refused before the call). The returned
distributions and answers are post-processing.

**Accuracy is data-dependent.** MWEM spends its budget where the current approximation is
worst, so its error depends on the data (and on the noise it drew): there is no closed-form
standard error per answer, unlike the data-independent matrix-mechanism strategies.
:func:`mwem_error_bound` gives the paper's worst-case high-probability bound (Theorem 2.3);
on realistic, skewed data the error is usually far below it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from fractions import Fraction
from typing import Protocol

import numpy as np
import scipy.sparse
import scipy.sparse as sp

from dpsql.noise.accounting import to_exact
from dpsql.errors import PrivacyParameterError, StrategyError
from dpsql.mechanisms.mwem.groups import (AllIntervals, CandidateGroups, GroupValues, group_sensitivities,
                          interval_answers, interval_index)
from dpsql.mechanisms.mwem.options import Block, MWEMMeasurement, MWEMOptions, MWEMResult, RangeBlock
from dpsql.mechanisms.mwem.state import BlockState, Measured, box_partition, interval_rows, make_state

# the state classes lived here before mwem_state.py; the old private names stay importable
_BlockState, _Measured, _interval_rows = BlockState, Measured, interval_rows

__all__ = [
    "AllIntervals",
    "Block",
    "CandidateGroups",
    "GroupValues",
    "group_sensitivities",
    "MWEMMeasurement",
    "MWEMOptions",
    "MWEMResult",
    "MeasureOracle",
    "RangeBlock",
    "interval_answers",
    "interval_index",
    "mwem_error_bound",
    "run_mwem",
]

#: a round is informative when its discrepancy exceeds b·(k + SIGNAL_SDS·√k)
SIGNAL_SDS = 2.0


class MeasureOracle(Protocol):
    """The kernel-side measure callback (DESIGN.md): noisy answers, never the counts."""

    def select(self, block: int, groups: Sequence[scipy.sparse.csr_matrix], estimates: Sequence[np.ndarray],  # noqa: E501
               penalties: np.ndarray, epsilon: Fraction) -> int:
        """Exponential mechanism over candidate groups of block `block`'s queries: score_g = sum_r |estimates[g][r] - true answer of groups[g] row r| - penalties[g]; sensitivity = max over groups of the largest column L1 norm of the group (the oracle computes it; 1 for a single 0/1 query or a GROUP BY marginal). Spends epsilon."""  # noqa: E501

    def measure(self, block: int, rows: scipy.sparse.csr_matrix, epsilon: Fraction) -> tuple[np.ndarray, float]:  # noqa: E501
        """Noisy answers rows @ x_block + Laplace(b), b = L1 sensitivity(rows)/epsilon; returns (noisy, b). Spends epsilon."""  # noqa: E501

    def select_interval(self, block: int, candidates: AllIntervals, estimates: np.ndarray,
                        epsilon: Fraction) -> tuple[int, int]:
        """Only for a RangeBlock: exponential mechanism over every range [lo, hi] of the block's cells that candidates allows; estimates are the prefix sums of A (n + 1 values); score |estimates[hi+1] - estimates[lo] - count of [lo, hi]|, sensitivity 1. The kernel computes the data's prefix sums and calls candidates.sample(estimates, prefix, epsilon, sampler.exponential). Spends epsilon; returns (lo, hi)."""  # noqa: E501


# ---------------------------------------------------------------------------------------
# Internal state


class _Spender:
    """Wraps the oracle: logs every spend, refuses to overspend, checks what comes back."""

    def __init__(self, oracle, budget: Fraction):
        self.oracle = oracle
        self.budget = budget
        self.spent = Fraction(0)
        self.log: list = []

    def _charge(self, kind: str, block: int, epsilon: Fraction) -> Fraction:
        epsilon = Fraction(epsilon)
        if epsilon <= 0 or self.spent + epsilon > self.budget:
            raise StrategyError(f"internal error: MWEM asked to spend {epsilon} with "
                                f"{self.budget - self.spent} left; refusing")
        self.spent += epsilon
        self.log.append((kind, block, epsilon))
        return epsilon

    def select(self, block, groups, estimates, penalties, epsilon) -> int:
        epsilon = self._charge("select", block, epsilon)
        k = self.oracle.select(block, groups, estimates, penalties, epsilon)
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) \
                or not 0 <= k < len(groups):
            raise StrategyError(f"the oracle's select returned {k!r}; expected a candidate "
                                f"index in [0, {len(groups)})")
        return int(k)

    def select_interval(self, block, candidates, estimates, epsilon) -> tuple[int, int]:
        epsilon = self._charge("select", block, epsilon)
        out = self.oracle.select_interval(block, candidates, estimates, epsilon)
        try:
            lo, hi = (int(v) for v in out)
            ok = all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in out)
        except (TypeError, ValueError):
            ok = False
        if not ok or not candidates.allowed(lo, hi):
            raise StrategyError(f"the oracle's select_interval returned {out!r}; expected a "
                                f"range (lo, hi) of the {candidates.n} cells not measured yet")
        return lo, hi

    def measure(self, kind, block, rows, epsilon) -> tuple[np.ndarray, float]:
        epsilon = self._charge(kind if kind != "round" else "measure", block, epsilon)
        out = self.oracle.measure(block, rows, epsilon)
        try:
            noisy, scale = out
            noisy = np.array(noisy, dtype=float).reshape(-1)
            scale = float(scale)
        except (TypeError, ValueError) as exc:
            raise StrategyError("the oracle's measure must return (noisy answers, scale)") \
                from exc
        if noisy.size != rows.shape[0] or not np.all(np.isfinite(noisy)) \
                or not (math.isfinite(scale) and scale > 0):
            raise StrategyError(f"the oracle's measure returned {noisy.size} finite values "
                                f"and scale {scale!r}; expected {rows.shape[0]} and a "
                                f"positive scale")
        return noisy, scale


def _smooth_round_robin(weights: np.ndarray):
    """Deterministic interleaving: block g gets a share w_g / Σw of every prefix (±1)."""
    credit = np.zeros(weights.size)
    total = weights.sum()
    while True:
        credit += weights
        g = int(np.argmax(credit))
        credit[g] -= total
        yield g


# ---------------------------------------------------------------------------------------
# The algorithm


def _init_rows(block, init: str) -> tuple[sp.csr_matrix, tuple]:
    """The rows ``init_share`` measures and the axis sizes they cover.

    ``"histogram"``: the identity (one axis of ``n`` cells). ``"marginals"``: for each axis
    ``j`` of the block's ``shape`` (a RangeBlock or a block without a shape: one axis), one
    row per value ``v`` counting the cells whose ``j``-th coordinate is ``v``. Every cell
    lies in exactly one row per axis, so the stacked rows' L1 sensitivity is the number of
    axes (the oracle calibrates to it).
    """
    n = block.n_cells
    shape = getattr(block, "shape", None) or (n,)
    if init == "histogram" or len(shape) == 1:
        return sp.identity(n, format="csr"), (n,)
    coords = np.unravel_index(np.arange(n), shape)
    offsets = np.concatenate([[0], np.cumsum(shape)[:-1]])
    rows = np.concatenate([offsets[j] + coords[j] for j in range(len(shape))])
    cols = np.tile(np.arange(n), len(shape))
    R = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(int(sum(shape)), n))
    return R, tuple(shape)


def _init_log_weights(noisy: np.ndarray, scale: float, axes: tuple) -> np.ndarray:
    """``log A₀`` up to a constant: per axis, the clipped noisy counts plus the Laplace scale
    ``b`` (no value starts at zero weight), multiplied over the axes (a product
    distribution; one axis: the mixed histogram of the module docstring)."""
    parts = np.split(np.log(np.maximum(noisy, 0.0) + scale), np.cumsum(axes)[:-1])
    logw = parts[0]
    for part in parts[1:]:
        logw = np.add.outer(logw, part).reshape(-1)
    return logw


def run_mwem(blocks, epsilon, oracle: MeasureOracle,
             options: MWEMOptions | None = None) -> MWEMResult:
    """Run MWEM on ``blocks`` spending exactly ``epsilon`` through ``oracle``.

    ``blocks``: a list of :class:`Block` (one for a flat workload). ``epsilon``: the total
    budget (exact; floats are read through their repr). Returns an :class:`MWEMResult`
    whose ``spends`` sum to ``epsilon`` exactly. See the module docstring.
    """
    opts = MWEMOptions() if options is None else options
    if not isinstance(opts, MWEMOptions):
        raise StrategyError(f"options must be MWEMOptions, got {type(opts).__name__}")
    eps = to_exact(epsilon, "epsilon")
    if eps <= 0:
        raise PrivacyParameterError(f"MWEM's epsilon must be > 0, got {epsilon!r}")
    blocks = list(blocks)
    if not blocks or not all(isinstance(b, (Block, RangeBlock)) for b in blocks):
        raise StrategyError("run_mwem needs a nonempty list of Block (or RangeBlock) values")
    if not any(b.n_queries for b in blocks):
        raise StrategyError("MWEM was given no queries: every block's W has zero rows")

    spender = _Spender(oracle, eps)
    notes: list[str] = []
    measurements: list[MWEMMeasurement] = []
    eps_total = eps * opts.total_share
    eps_init = eps * opts.init_share
    eps_rounds = eps - eps_total - eps_init

    # The row count N.
    if opts.total is None:
        ones = sp.csr_matrix(np.ones((1, blocks[0].n_cells)))
        noisy, scale = spender.measure("total", 0, ones, eps_total)
        measurements.append(MWEMMeasurement("total", 0, None, noisy, scale))
        total = max(float(noisy[0]), 1.0)
        notes.append(f"N estimated with ε·{opts.total_share} (Laplace scale {scale:.3g}), "
                     f"floored at 1")
    else:
        total = opts.total
        notes.append("N is the declared public total")

    states = [make_state(b, opts.cuboids) for b in blocks]
    active = [g for g, b in enumerate(blocks) if b.n_queries > 0]

    # Initial distribution: uniform, or a noisy histogram (or product of noisy one-column
    # marginals) mixed with uniform.
    if eps_init > 0:
        share = eps_init / len(active)
        for g in active:
            rows, axes = _init_rows(blocks[g], opts.init)
            noisy, scale = spender.measure("init", g, rows, share)
            measurements.append(MWEMMeasurement("init", g, None, noisy, scale))
            states[g].set_log_weights(_init_log_weights(noisy, scale, axes))
            if opts.init == "marginals":
                states[g].history.append(Measured(rows, noisy))
        what = ("noisy histogram" if opts.init == "histogram" else
                "product of noisy one-column marginals (all measured in one Laplace step, "
                "replayed with the rounds)")
        notes.append(f"A0: {what} per block (ε·{opts.init_share} split over "
                     f"{len(active)} block(s)), clipped at 0, floored by the Laplace scale, "
                     f"scaled to N")

    # Public schedule of blocks.
    weights = np.array([math.log(b.n_cells) if g in active else 0.0
                        for g, b in enumerate(blocks)])
    if not np.any(weights > 0):
        weights = np.array([1.0 if g in active else 0.0 for g in range(len(blocks))])
    schedule = _smooth_round_robin(weights)
    n_weighted = int(np.count_nonzero(weights))

    round_no = 0

    def run_round(e: Fraction) -> bool:
        """One select + measure + update round with budget e; True if informative."""
        nonlocal round_no
        g = next(schedule)
        state = states[g]
        half = e / 2
        start, stop, rows, est = state.select(spender, g, half, total)
        size = stop - start
        pieces = (box_partition(rows, state.shape)
                  if opts.measure == "partition" and size == 1 else None)
        noisy, scale = spender.measure("round", g, rows if pieces is None else pieces,
                                       e - half)
        round_no += 1
        measurements.append(MWEMMeasurement("round", g, (start, stop), noisy, scale,
                                            round_no))
        state.rounds += 1
        discrepancy = float(np.abs(noisy[:size] - est).sum())
        informative = discrepancy > scale * (size + SIGNAL_SDS * math.sqrt(size))
        if pieces is None:
            new = [Measured(rows, noisy)]
        else:                           # each piece is a box: one scalar step each
            new = [Measured(pieces[i], noisy[i:i + 1]) for i in range(pieces.shape[0])]
        for meas in new:
            state.history.append(meas)
            state.update(meas, total)
        state.renormalise()
        for _ in range(opts.replay):
            for other in states:
                for past in other.history:
                    other.update(past, total)
                other.renormalise()
        if opts.iterate == "average":
            for other in states:
                other.sum_p += other.p
        return informative

    if opts.rounds == "auto":
        S, T0 = opts.max_stages, n_weighted
        e = eps_rounds / (T0 * (2 ** S - 1))
        remaining = eps_rounds
        stop_after = None
        stages = []
        s = 0
        while True:
            T_s = T0 * 2 ** s
            final = s == S - 1 or stop_after is not None
            per_round = remaining / T_s if final else e
            informative = sum(run_round(per_round) for _ in range(T_s))
            remaining -= per_round * T_s
            stages.append(f"{T_s} ({informative} informative)")
            if final:
                break
            if 2 * informative < T_s:
                stop_after = s
            s += 1
        why = (f"doubling stopped after stage {stop_after} (signal below noise), the last "
               f"stage took the remaining budget" if stop_after is not None
               else f"all {S} stages ran at the same per-round budget")
        notes.append(f"rounds='auto': T = {round_no} over stages {', '.join(stages)}; {why}")
    else:
        e = eps_rounds / opts.rounds
        for _ in range(opts.rounds):
            run_round(e)
        notes.append(f"T = {round_no} rounds at ε_R/T each (half selection, half "
                     f"measurement)")

    if spender.spent != eps:
        raise StrategyError(f"internal error: MWEM spent {spender.spent}, not the requested "
                            f"{eps}")
    if len(blocks) > 1:
        notes.append("rounds per block (smooth round-robin, weight ln n_g): "
                     + ", ".join(str(s.rounds) for s in states))
    notes.append("MWEM's error is data-dependent: no closed-form standard error; "
                 "mwem_error_bound gives the worst-case bound of Theorem 2.3")

    distributions, answers = [], []
    for state in states:
        p = state.sum_p / round_no if opts.iterate == "average" else state.p
        A = total * p
        distributions.append(A)
        answers.append(state.answers(A))
    return MWEMResult(
        distributions=tuple(distributions),
        answers=tuple(answers),
        rounds=round_no,
        spends=tuple(spender.log),
        notes=tuple(notes),
        total=total,
        rounds_per_block=tuple(s.rounds for s in states),
        measurements=tuple(measurements),
    )


# ---------------------------------------------------------------------------------------
# The worst-case guarantee


def mwem_error_bound(n_total, n_cells, n_queries, rounds, epsilon, beta=0.05) -> float:
    """Theorem 2.3's bound on MWEM's maximum query error, holding with probability ≥ 1 − β.

    Hardt, Ligett & McSherry, Theorem 2.3 (proof in their Appendix A): for any data set of
    ``N`` records over a universe ``D``, any set ``Q`` of linear queries with values in
    [0, 1], any ``T`` and ``ε > 0``, with probability at least ``1 − 2T/|Q|`` the average
    ``A = avg_{i≤T} Aᵢ`` output by MWEM satisfies

        ``max_{q∈Q} |q(A) − q(B)| ≤ 2N √(log|D| / T) + 10 T log|Q| / ε``   (natural logs).

    The proof's two slack terms come from Lemma A.1: the exponential mechanism at
    ``ε/(2T)`` picks a query within ``4T ln(2T|Q|/β)/ε`` of the worst one, and each Laplace
    measurement is within ``2T ln(2T/β)/ε``, each with probability ≥ 1 − β/(2T) per
    round. We return the bound for any ``β``::

        2N √(ln|D| / T) + (4T ln(2T|Q|/β) + 2T ln(2T/β)) / ε

    which equals the theorem's expression exactly at ``β = 2T/|Q|``. ``n_cells`` is ``|D|``,
    or the list of block sizes for the factored form (``|D| = Π n_g``, the product domain).
    ``epsilon`` is the budget of the rounds (excluding any share spent on ``N`` or on an
    initial histogram). The theorem covers the plain algorithm (single-query selection,
    uniform start, exact ``N``, averaged output); replay, cuboids and the last iterate are
    heuristics outside it. It is a worst case: MWEM's actual error is data-dependent and
    usually much smaller.
    """
    sizes = [n_cells] if isinstance(n_cells, numbers.Integral) else list(n_cells)
    if not sizes or any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 1
                        for s in sizes):
        raise StrategyError(f"n_cells must be an integer >= 1 or a list of them, "
                            f"got {n_cells!r}")
    log_domain = sum(math.log(int(s)) for s in sizes)
    for name, value in (("n_queries", n_queries), ("rounds", rounds)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise StrategyError(f"{name} must be an integer >= 1, got {value!r}")
    if isinstance(n_total, bool) or not isinstance(n_total, numbers.Real) \
            or not math.isfinite(n_total) or n_total < 0:
        raise StrategyError(f"n_total must be a finite number >= 0, got {n_total!r}")
    eps = float(to_exact(epsilon, "epsilon"))
    if not eps > 0:
        raise PrivacyParameterError(f"epsilon must be > 0, got {epsilon!r}")
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not 0 < beta < 1:
        raise StrategyError(f"beta must be a failure probability in (0, 1), got {beta!r}")
    T, Q = int(rounds), int(n_queries)
    mw_term = 2.0 * float(n_total) * math.sqrt(log_domain / T)
    noise_term = (4 * T * math.log(2 * T * Q / beta) + 2 * T * math.log(2 * T / beta)) / eps
    return mw_term + noise_term

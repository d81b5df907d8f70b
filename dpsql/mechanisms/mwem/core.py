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
  ``total_share`` of ε (default 1/20) on the all-ones row of block 0; the noisy count is
  floored at 1.

**Budget.** Shares are exact :class:`~fractions.Fraction` s: ``ε_R = ε − ε_total − ε_init``
goes to the rounds; a round with budget ``e`` spends ``e/2`` on selection and ``e − e/2``
on measurement. Fixed ``T``: ``e = ε_R / T`` (the paper's ``ε/(2T)`` each).

**Defaults** (``rounds="rule"``, ``replay = 100``, ``measure="partition"``; issue 21): ``T``
comes from the workload and ε alone, by a rule fitted on synthetic data only
(:mod:`dpsql.mechanisms.mwem.defaults`): ``T = K · clamp(round(C (ε_R N / K)^A), 2, 40)``
with ``K`` the blocks that get rounds and ``N`` the public row count or, when the policy
does not declare it, the run's own noisy estimate (released first, with ``total_share`` of
ε). T is then a function of public inputs and of a released value, fixed before the first
round; every round gets ``ε_R / T``, so every path spends exactly ``ε_R`` (the composition
argument below covers a T chosen from earlier outputs). The tuned variants stay options.

**Doubling T** (``rounds="auto"``; the paper sketches doubling in §2.3.3, this is our
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
rounds on 1024 cells and 20 000 range queries with ``replay = 10`` take well under
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
from fractions import Fraction

import numpy as np
import scipy.sparse as sp

from dpsql.errors import PrivacyParameterError, StrategyError
from dpsql.mechanisms.mwem import defaults
from dpsql.mechanisms.mwem.bound import mwem_error_bound
from dpsql.mechanisms.mwem.groups import (AllIntervals, CandidateGroups, GroupValues,
                                          group_sensitivities, interval_answers, interval_index)
from dpsql.mechanisms.mwem.options import (Block, MWEMMeasurement, MWEMOptions, MWEMResult,
                                           RangeBlock)
from dpsql.mechanisms.mwem.spender import MeasureOracle, Spender, smooth_round_robin
from dpsql.mechanisms.mwem.start import init_log_weights, init_rows
from dpsql.mechanisms.mwem.state import (BlockState, Measured, box_partition, interval_rows,
                                         make_state)
from dpsql.noise.accounting import to_exact

# older private names stay importable (tests, benchmarks)
_BlockState, _Measured, _interval_rows = BlockState, Measured, interval_rows
_init_rows, _init_log_weights, _Spender = init_rows, init_log_weights, Spender

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
    run = _Run(blocks, eps, oracle, opts)
    run.estimate_total()
    run.initialise()
    if opts.rounds == "auto":
        run.doubling()
    else:
        run.fixed()
    return run.result()


class _Run:
    """One MWEM run: the spender, the per-block states and the record of what it did."""

    def __init__(self, blocks, eps: Fraction, oracle, opts: MWEMOptions):
        self.blocks, self.eps, self.opts = blocks, eps, opts
        self.spender = Spender(oracle, eps)
        self.notes: list[str] = []
        self.measurements: list[MWEMMeasurement] = []
        self.eps_total = eps * opts.total_share
        self.eps_init = eps * opts.init_share
        self.eps_rounds = eps - self.eps_total - self.eps_init
        self.states = [make_state(b, opts.cuboids) for b in blocks]
        self.active = [g for g, b in enumerate(blocks) if b.n_queries > 0]
        weights = np.array([math.log(b.n_cells) if g in self.active else 0.0
                            for g, b in enumerate(blocks)])
        if not np.any(weights > 0):
            weights = np.array([1.0 if g in self.active else 0.0 for g in range(len(blocks))])
        self.schedule = smooth_round_robin(weights)       # public schedule of blocks
        self.n_weighted = int(np.count_nonzero(weights))
        self.round_no = 0
        self.total = 0.0

    def estimate_total(self) -> None:
        """The row count N: public, or the noisy all-ones row (floored at 1)."""
        opts = self.opts
        if opts.total is not None:
            self.total = opts.total
            self.notes.append("N is the declared public total")
            return
        ones = sp.csr_matrix(np.ones((1, self.blocks[0].n_cells)))
        noisy, scale = self.spender.measure("total", 0, ones, self.eps_total)
        self.measurements.append(MWEMMeasurement("total", 0, None, noisy, scale))
        self.total = max(float(noisy[0]), 1.0)
        self.notes.append(f"N estimated with ε·{opts.total_share} (Laplace scale {scale:.3g}), "
                          f"floored at 1")

    def initialise(self) -> None:
        """A0: uniform, or a noisy histogram (or product of noisy one-column marginals)
        mixed with uniform (module docstring, ``init_share``)."""
        opts = self.opts
        if self.eps_init <= 0:
            return
        share = self.eps_init / len(self.active)
        for g in self.active:
            rows, axes = init_rows(self.blocks[g], opts.init)
            noisy, scale = self.spender.measure("init", g, rows, share)
            self.measurements.append(MWEMMeasurement("init", g, None, noisy, scale))
            self.states[g].set_log_weights(init_log_weights(noisy, scale, axes))
            if opts.init == "marginals":
                self.states[g].history.append(Measured(rows, noisy))
        what = ("noisy histogram" if opts.init == "histogram" else
                "product of noisy one-column marginals (all measured in one Laplace step, "
                "replayed with the rounds)")
        self.notes.append(f"A0: {what} per block (ε·{opts.init_share} split over "
                          f"{len(self.active)} block(s)), clipped at 0, floored by the "
                          f"Laplace scale, scaled to N")

    def run_round(self, e: Fraction) -> bool:
        """One select + measure + update round with budget e; True if informative."""
        opts, total = self.opts, self.total
        g = next(self.schedule)
        state = self.states[g]
        half = e / 2
        start, stop, rows, est = state.select(self.spender, g, half, total)
        size = stop - start
        pieces = (box_partition(rows, state.shape)
                  if opts.measure == "partition" and size == 1 else None)
        noisy, scale = self.spender.measure("round", g, rows if pieces is None else pieces,
                                            e - half)
        self.round_no += 1
        self.measurements.append(MWEMMeasurement("round", g, (start, stop), noisy, scale,
                                                 self.round_no))
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
            for other in self.states:
                for past in other.history:
                    other.update(past, total)
                other.renormalise()
        if opts.iterate == "average":
            for other in self.states:
                other.sum_p += other.p
        return informative

    def fixed(self) -> None:
        """A fixed T (given, or the default rule's), each round at ``ε_R / T``."""
        if self.opts.rounds == "rule":
            T = defaults.default_rounds(self.eps_rounds, self.total, self.n_weighted)
            how = defaults.describe(self.eps_rounds, self.total, self.n_weighted, T)
        else:
            T, how = self.opts.rounds, f"T = {self.opts.rounds} rounds"
        e = self.eps_rounds / T
        for _ in range(T):
            self.run_round(e)
        self.notes.append(f"{how}, at ε_R/T each (half selection, half measurement)")

    def doubling(self) -> None:
        """``rounds="auto"``: doubling stages (module docstring, "Doubling T")."""
        S, T0 = self.opts.max_stages, self.n_weighted
        e = self.eps_rounds / (T0 * (2 ** S - 1))
        remaining = self.eps_rounds
        stop_after = None
        stages = []
        s = 0
        while True:
            T_s = T0 * 2 ** s
            final = s == S - 1 or stop_after is not None
            per_round = remaining / T_s if final else e
            informative = sum(self.run_round(per_round) for _ in range(T_s))
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
        self.notes.append(f"rounds='auto': T = {self.round_no} over stages "
                          f"{', '.join(stages)}; {why}")

    def result(self) -> MWEMResult:
        spender, opts = self.spender, self.opts
        if spender.spent != self.eps:
            raise StrategyError(f"internal error: MWEM spent {spender.spent}, not the "
                                f"requested {self.eps}")
        if len(self.blocks) > 1:
            self.notes.append("rounds per block (smooth round-robin, weight ln n_g): "
                              + ", ".join(str(s.rounds) for s in self.states))
        self.notes.append("MWEM's error is data-dependent: no closed-form standard error; "
                          "mwem_error_bound gives the worst-case bound of Theorem 2.3")
        distributions, answers = [], []
        for state in self.states:
            p = state.sum_p / self.round_no if opts.iterate == "average" else state.p
            A = self.total * p
            distributions.append(A)
            answers.append(state.answers(A))
        return MWEMResult(
            distributions=tuple(distributions),
            answers=tuple(answers),
            rounds=self.round_no,
            spends=tuple(spender.log),
            notes=tuple(self.notes),
            total=self.total,
            rounds_per_block=tuple(s.rounds for s in self.states),
            measurements=tuple(self.measurements),
        )

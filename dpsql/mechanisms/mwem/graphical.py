"""MWEM over a graphical model: batches whose columns are all connected and whose full
product is far over the dense limit (issue 16).

MWEM's factored form (:mod:`dpsql.mechanisms.mwem.core`) keeps one dense weight vector per
connected group of columns; all 2-way marginals over ten columns are one group of ~10⁸ cells.
Here the synthetic distribution is replaced by a graphical model, as in MWEM+PGM (McKenna,
Sheldon & Miklau, "Graphical-model based estimation and inference for differential
privacy", ICML 2019, §5, the MWEM experiment) and AIM (McKenna, Mullins, Sheldon & Miklau,
VLDB 2022, §4): the model is the set of region marginals over the batch's cliques
(:func:`dpsql.inference.pgm.regions_of` of every column set a block uses), never the full
product, re-estimated after each measurement from all measurements so far. Each round:

1. **select** (exponential mechanism, half the round's ε) the candidate marginal (each
   distinct column set of the batch's blocks) on which the model is worst: score
   ``‖M_r(model) − M_r(x)‖₁ − b·n_r`` (AIM's score; ``b·n_r`` is the expected L1 norm of
   the measurement's Laplace noise on the ``n_r`` cells, so a marginal already known to
   noise level is not picked for nothing). The kernel computes ``M_r(x)``
   (:class:`dpsql.kernel.marginal_oracle.MarginalOracle`), sensitivity 1;
2. **measure** (Laplace, the other half) that full marginal, L1 sensitivity 1;
3. **estimate** the model from every noisy marginal: Private-PGM's local-polytope estimate
   (:func:`dpsql.inference.pgm.estimate`, warm-started from the previous model) with the
   measurements' own loss ``½ Σ ‖(M_r(μ) − y_r)/b_r‖²`` (the Gaussian likelihood surrogate
   for Laplace noise: MWEM+PGM uses the L1 loss; ``pgm`` is written for the squared one).
   This replaces MWEM's multiplicative-weights update (and its replay): both fit the model
   to all past measurements. A region that no measurement ties two of its columns together
   (an unmeasured pair of an all-pairs batch) then holds the product of the model's
   one-column marginals, as the maximum-entropy graphical model of Private-PGM would: the
   local polytope alone leaves it the additive (minimum-norm) completion, clipped at zero,
   which was 1.6x worse in RMSE at ε = 1 on Adult's pairs (benchmarks/mwem_wide.py).

The answers are each block's rows applied to the model's marginal on its columns.

**Options carried over** (:class:`~dpsql.mechanisms.mwem.options.MWEMOptions`): ``rounds``
(an integer, or ``"rule"``: :func:`dpsql.mechanisms.mwem.defaults.default_rounds` with one
group, as for a batch of one connected block), ``total`` / ``total_share`` (N public or
measured as the 0-way marginal first), ``init_share`` (each used column's 1-way marginal, all
in one Laplace step of L1 sensitivity = the number of columns, whatever ``init`` says: a
histogram of the full product is what this form avoids). Not carried over, refused before
the charge (:func:`check_options`): ``rounds="auto"`` (doubling needs a cheap round),
``iterate="average"`` (no average of models is kept), ``cuboids`` and ``measure``
(candidates are always whole marginals, measured whole). ``replay`` is ignored (the
estimate refits every measurement). δ > 0 is refused, as for every MWEM: pure ε-DP.

**Privacy.** Every release is an oracle call: the exponential mechanism at ``εᵢ`` with
sensitivity 1, or Laplace at ``b = k/εᵢ`` (rounded up to the sampler's grid and verified
by the kernel) on ``k`` full marginals. Which call comes next, with which ``εᵢ``, is a
function of public inputs (the batch's blocks, options, ε) and of earlier oracle outputs
only; the spends are fixed before the run (``ε_R / T`` per round, T public or from the
released N) and sum exactly to ε (checked at the end). By basic sequential composition of
pure DP the run is ε-DP; the model and the answers are post-processing.

**Accuracy** is data-dependent, as for every MWEM: no standard error per answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql.errors import BatchTooLarge, PrivacyParameterError, StrategyError
from dpsql.inference import pgm
from dpsql.mechanisms.mwem import defaults
from dpsql.noise.accounting import MIN_EPSILON
from dpsql.workload import limits as planning
from dpsql.workload.marginals import MarginalMeasurement


def candidates_of(union) -> tuple:
    """The distinct non-empty column sets of the blocks (sorted tuples, largest first)."""
    return tuple(C for C in union.cliques() if C)


def check_options(options, spec: str = "mwem") -> None:
    """Refuse, before the charge, the options the graphical form does not carry over."""
    bad = []
    if options.rounds == "auto":
        bad.append("rounds=auto (use rule or an integer)")
    if options.iterate != "last":
        bad.append("iterate=average")
    if options.cuboids:
        bad.append("cuboids=true (candidates are whole marginals already)")
    if options.measure == "query":
        bad.append("measure=query (a selected marginal is measured whole)")
    if bad:
        raise StrategyError(
            f"{spec}: this batch's columns are all connected and its full product is over "
            f"the dense limit, so MWEM runs over a graphical model, which does not take "
            f"{'; '.join(bad)}; nothing was charged")


def planned_rounds(options, eps_rounds: Fraction | None = None, total: float | None = None):
    """T for the run: the given integer, or the default rule with one group (the rule's
    largest choice when ``eps_rounds`` or ``total`` is not known yet)."""
    if options.rounds != "rule":
        return int(options.rounds)
    if eps_rounds is None or total is None:
        return defaults.max_rounds(1)
    return defaults.default_rounds(eps_rounds, total, 1)


def _identity(columns, sizes, scale: float = 1.0) -> MarginalMeasurement:
    """The full marginal on ``columns`` as a measurement, weighted by ``scale`` (1/b)."""
    return MarginalMeasurement(columns, tuple(np.eye(sizes[i]) for i in columns), scale)


#: the most rounds of one re-estimate after a measurement (warm-started), and the fewest a
#: run must afford within its time limit (else it is refused before the charge)
INNER_ROUNDS, MIN_INNER_ROUNDS = 100, 10
#: the last estimate may take this many times the rounds of the others, and stops at this
#: relative step (tighter than :data:`dpsql.inference.pgm.TOLERANCE`: the answers come from it)
FINAL_FACTOR, FINAL_TOLERANCE = 5, 1e-7


def planned_work(union, epsilon, options, limits, spec: str = "mwem") -> tuple[int, int]:
    """(rounds per re-estimate, rounds of the last one) from public sizes, or a one-line
    refusal before the charge: a spend's ε below the samplers' smallest, the model's region
    marginals and the kernel's clique marginals over ``limits.max_memory``, or fewer than
    :data:`MIN_INNER_ROUNDS` rounds per estimate within ``limits.time_limit`` (T + 1 + the
    last estimate's :data:`FINAL_FACTOR` estimates of :func:`dpsql.inference.pgm.round_seconds`
    each, T the largest the options allow)."""
    check_options(options, spec)
    sizes = tuple(int(n) for n in union.sizes)
    candidates = candidates_of(union)
    eps = Fraction(epsilon)
    eps_total = eps * options.total_share if options.total is None else Fraction(0)
    eps_rounds = eps - eps_total - eps * options.init_share
    T = planned_rounds(options)
    smallest = min(e for e in (eps_rounds / T / 2, eps_total, eps * options.init_share)
                   if e > 0)
    if smallest < MIN_EPSILON:
        raise PrivacyParameterError(
            f"{spec} at epsilon = {float(eps):g} spends epsilon = {float(smallest):.3g} on a "
            f"step, below the smallest the noise samplers accept ({float(MIN_EPSILON):g}); "
            "ask for fewer rounds or a larger epsilon")
    regions = pgm.regions_of(candidates)
    cells = sum(math.prod(sizes[i] for i in R) for R in regions)
    memory = cells * (pgm.BYTES_PER_CELL + 8)
    per_round = pgm.round_seconds(sizes, [_identity(C, sizes) for C in candidates])
    affordable = int(limits.time_limit / ((T + 1 + FINAL_FACTOR) * max(per_round, 1e-12)))
    why = None
    if memory > limits.max_memory:
        why = (f"needs about {planning.show_bytes(memory)} for its {cells:,} region cells, "
               f"over max_memory = {planning.show_bytes(limits.max_memory)}")
    elif affordable < MIN_INNER_ROUNDS:
        why = (f"needs about {(T + 1 + FINAL_FACTOR) * MIN_INNER_ROUNDS * per_round:.3g} s "
               f"({T} rounds, {MIN_INNER_ROUNDS} estimate rounds each over {cells:,} region "
               f"cells), over time_limit = {limits.time_limit:g} s")
    if why is not None:
        raise BatchTooLarge(
            f"{spec} over a graphical model of this batch {why}; nothing was charged; ask "
            "for fewer rounds, split the batch (fewer columns per statement), or raise "
            "max_memory / time_limit")
    inner = min(INNER_ROUNDS, affordable)
    return inner, inner * FINAL_FACTOR


@dataclass
class GraphicalResult:
    """The run's answers per block, its region tables and what it did (public)."""

    answers: list
    tables: dict
    rounds: int
    spends: tuple
    selected: tuple
    notes: tuple


class _Run:
    def __init__(self, union, eps: Fraction, oracle, options, inner_rounds: int):
        self.union, self.sizes = union, tuple(int(n) for n in union.sizes)
        self.candidates = candidates_of(union)
        self.eps, self.oracle, self.opts, self.inner = eps, oracle, options, inner_rounds
        self.spent, self.log, self.notes = Fraction(0), [], []
        self.measured: list = []                # (MarginalMeasurement, y / b)
        self.selected: list = []
        self.tables = None

    def _spend(self, kind: str, epsilon: Fraction) -> Fraction:
        if epsilon <= 0 or self.spent + epsilon > self.eps:
            raise StrategyError(f"internal error: MWEM asked to spend {epsilon} with "
                                f"{self.eps - self.spent} left; refusing")
        self.spent += epsilon
        self.log.append((kind, epsilon))
        return epsilon

    def measure(self, kind: str, column_sets, epsilon: Fraction) -> list:
        noisy, b = self.oracle.measure(column_sets, self._spend(kind, epsilon))
        if len(noisy) != len(column_sets) or not (math.isfinite(b) and b > 0):
            raise StrategyError("the oracle's measure returned the wrong number of marginals")
        for C, y in zip(column_sets, noisy):
            m = _identity(C, self.sizes, 1.0 / b)
            y = np.asarray(y, dtype=float).reshape(-1)
            if y.size != m.size or not np.all(np.isfinite(y)):
                raise StrategyError("the oracle's measure returned malformed marginals")
            self.measured.append((m, y / b))
        return noisy

    def fit(self, max_rounds: int, tolerance: float = pgm.TOLERANCE) -> None:
        ms = [m for m, _ in self.measured]
        y = np.concatenate([v for _, v in self.measured])
        prior = self.tables
        self.tables, _ = pgm.estimate(self.sizes, ms, y, max_rounds=max_rounds,
                                      tolerance=tolerance,
                                      regions=self.candidates,
                                      start=lambda regions: {R: prior[R] for R in regions})
        read = [set(m.columns) for m in ms]
        for R in self.tables:           # no measurement ties two of its columns
            if len(R) > 1 and all(len(set(R) & C) <= 1 for C in read):
                self.tables[R] = self.independent(R)

    def independent(self, R: tuple) -> np.ndarray:
        """The product of the model's one-column marginals on R, scaled to its total."""
        total = float(next(iter(self.tables.values())).sum())
        T = np.full((), total)
        for i in R:
            m = np.maximum(self.marginal((i,)), 0.0)
            T = np.multiply.outer(T, m / m.sum() if m.sum() > 0 else
                                  np.full(m.size, 1.0 / m.size))
        return T

    def marginal(self, C: tuple) -> np.ndarray:
        R = pgm.home(tuple(self.tables), C, self.sizes)
        summed = tuple(a for a, i in enumerate(R) if i not in C)
        T = self.tables[R]
        return (T.sum(axis=summed) if summed else T).reshape(-1)

    def start(self, total: float) -> None:
        regions = pgm.regions_of(self.candidates)
        self.tables = {R: np.full(tuple(self.sizes[i] for i in R),
                                  total / math.prod(self.sizes[i] for i in R))
                       for R in regions}

    def round(self, e: Fraction) -> None:
        half = e / 2
        b = 1.0 / float(e - half)                 # the measurement's scale, about (public)
        estimates = [self.marginal(C) for C in self.candidates]
        penalties = [b * math.prod(self.sizes[i] for i in C) for C in self.candidates]
        k = self.oracle.select(estimates, penalties, self._spend("select", half))
        if isinstance(k, bool) or not 0 <= int(k) < len(self.candidates):
            raise StrategyError(f"the oracle's select returned {k!r}")
        self.selected.append(self.candidates[int(k)])
        self.measure("measure", [self.candidates[int(k)]], e - half)
        self.fit(self.inner)


def run_mwem_graphical(union, epsilon, oracle, options, inner_rounds: int,
                       final_rounds: int) -> GraphicalResult:
    """Run MWEM over a graphical model (module docstring) on the blocks of ``union`` (a
    :class:`~dpsql.workload.blocks.UnionWorkload`), spending exactly ``epsilon`` through
    ``oracle``; each re-estimate takes at most ``inner_rounds`` rounds, the last one
    ``final_rounds``."""
    eps = Fraction(epsilon)
    opts = options
    check_options(opts)
    run = _Run(union, eps, oracle, opts, inner_rounds)
    eps_total = eps * opts.total_share if opts.total is None else Fraction(0)
    eps_init = eps * opts.init_share
    eps_rounds = eps - eps_total - eps_init
    if opts.total is None:
        total = max(float(run.measure("total", [()], eps_total)[0][0]), 1.0)
        run.notes.append(f"N estimated with ε·{opts.total_share}, floored at 1")
    else:
        total = float(opts.total)
        b = 1.0 / float(eps_rounds)   # public N: weighted like a measurement, never spent
        run.measured.append((MarginalMeasurement((), (), 1.0 / b), np.array([total / b])))
    run.start(total)
    if eps_init > 0:
        used = sorted({i for C in run.candidates for i in C})
        run.measure("init", [(i,) for i in used], eps_init)
        run.fit(inner_rounds)
        run.notes.append(f"start: the {len(used)} one-column marginals, ε·{opts.init_share} "
                         "in one Laplace step")
    T = planned_rounds(opts, eps_rounds, total)
    for _ in range(T):
        run.round(eps_rounds / T)
    run.fit(final_rounds, FINAL_TOLERANCE)
    if run.spent != eps:
        raise StrategyError(f"internal error: MWEM spent {run.spent}, not {eps}")
    run.notes.append(f"T = {T} rounds over a graphical model of {len(run.tables)} region "
                     f"marginals ({len(run.candidates)} candidate marginals; "
                     f"{len(set(run.selected))} distinct measured)")
    answers = [pgm.block_answers(run.tables, block, run.sizes) for block in union.blocks]
    return GraphicalResult(answers, run.tables, T, tuple(run.log), tuple(run.selected),
                           tuple(run.notes))

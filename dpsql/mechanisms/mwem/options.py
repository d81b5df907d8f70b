"""MWEM's inputs, options and results (Hardt, Ligett & McSherry; see :mod:`dpsql.mechanisms.mwem.core`).

Frozen, validated values: a :class:`Block` of the (factored) workload (or the implicit
:class:`RangeBlock` of every range over one column), the practical variants
in :class:`MWEMOptions`, and what a run returns (:class:`MWEMResult`). Public only.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import scipy.sparse as sp

from dpsql.noise.accounting import to_exact
from dpsql.errors import PrivacyParameterError, StrategyError
from dpsql.mechanisms.mwem import defaults


@dataclass(frozen=True)
class Block:
    """One block of the factored workload: its own cells and its own query rows.

    ``W`` (``m × n_cells``, entries in [0, 1]) holds the block's queries over its cells in C
    order over the block's columns; ``groups`` are row ranges ``(start, stop)`` forming the
    SQL outputs (a GROUP BY's rows), used as candidates when ``cuboids`` is on. ``shape``
    (optional, public) is the cells' shape over the block's columns (C order, product
    ``n_cells``); ``init="marginals"`` measures its one-column marginals.
    """

    W: sp.csr_matrix
    groups: tuple
    n_cells: int
    shape: tuple | None = None

    def __post_init__(self) -> None:
        if isinstance(self.n_cells, bool) or not isinstance(self.n_cells, numbers.Integral) \
                or self.n_cells < 1:
            raise StrategyError(f"Block.n_cells must be an integer >= 1, got {self.n_cells!r}")
        n = int(self.n_cells)
        try:
            W = sp.csr_matrix(self.W, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise StrategyError(f"Block.W must be a matrix (scipy.sparse or array), got "
                                f"{type(self.W).__name__}") from exc
        if W.ndim != 2 or W.shape[1] != n:
            raise StrategyError(f"Block.W has shape {W.shape}; it needs one column per cell "
                                f"(n_cells = {n})")
        W = W.copy()
        W.sum_duplicates()
        W.sort_indices()
        if W.nnz and not (np.all(np.isfinite(W.data)) and W.data.min() >= 0
                          and W.data.max() <= 1):
            raise StrategyError("Block.W entries must lie in [0, 1] (counting queries); "
                                "rescale weighted queries first")
        m = W.shape[0]
        groups = []
        for item in self.groups:
            try:
                start, stop = item
            except (TypeError, ValueError) as exc:
                raise StrategyError(f"Block.groups entries must be (start, stop) row ranges, "
                                    f"got {item!r}") from exc
            if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool)
                       for v in (start, stop)) or not 0 <= start < stop <= m:
                raise StrategyError(f"Block.groups range {item!r} is not a nonempty range of "
                                    f"W's {m} rows: need integers 0 <= start < stop <= {m}")
            groups.append((int(start), int(stop)))
        shape = self.shape
        if shape is not None:
            try:
                shape = tuple(int(d) for d in shape)
            except (TypeError, ValueError) as exc:
                raise StrategyError(f"Block.shape must be a tuple of integers, got "
                                    f"{self.shape!r}") from exc
            if not shape or min(shape) < 1 or math.prod(shape) != n:
                raise StrategyError(f"Block.shape {self.shape!r} does not describe the "
                                    f"block's {n} cells (positive sizes, product {n})")
        object.__setattr__(self, "W", W)
        object.__setattr__(self, "groups", tuple(groups))
        object.__setattr__(self, "n_cells", n)
        object.__setattr__(self, "shape", shape)

    @property
    def n_queries(self) -> int:
        return self.W.shape[0]


#: largest implicit range block: its answers (n(n+1)/2 floats) must fit in memory
MAX_RANGE_CELLS = 8192


@dataclass(frozen=True)
class RangeBlock:
    """The implicit block of *every* range query over one ordered column of ``n_cells``.

    Query ``r`` is the range ``[lo, hi]`` of cells (inclusive, ``0 <= lo <= hi < n``), by
    ``lo`` then ``hi`` (:func:`dpsql.mechanisms.mwem.groups.interval_index`): ``n(n+1)/2`` queries,
    never listed — estimates and the selection use prefix sums, so a round costs
    ``O(n log n)``, not ``O(n²)``. Only the public cell count is stored; it needs an oracle
    with ``select_interval`` (:class:`dpsql.mechanisms.mwem.core.MeasureOracle`). MWEM's answers for the
    block are all ``n(n+1)/2`` ranges, in that order.
    """

    n_cells: int

    def __post_init__(self) -> None:
        n = self.n_cells
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) \
                or not 1 <= n <= MAX_RANGE_CELLS:
            raise StrategyError(f"RangeBlock.n_cells must be an integer in [1, "
                                f"{MAX_RANGE_CELLS}], got {n!r}")
        object.__setattr__(self, "n_cells", int(n))

    @property
    def n_queries(self) -> int:
        return self.n_cells * (self.n_cells + 1) // 2

    @property
    def groups(self) -> tuple:
        return ()


def _share(value, name: str) -> Fraction:
    share = to_exact(value, name)
    if not 0 <= share < 1:
        raise PrivacyParameterError(f"MWEMOptions.{name} must be in [0, 1), got {value!r}")
    return share


@dataclass(frozen=True)
class MWEMOptions:
    """MWEM's options (see the module docstring for what each does)."""

    rounds: int | str = "rule"          # T >= 1, "rule" (defaults.py) or "auto" (doubling)
    iterate: str = "last"               # "last" (practice) or "average" (theory)
    replay: int = defaults.REPLAY       # extra MW passes over past measurements per round
    init_share: Fraction = Fraction(0)  # share of ε for a noisy initial distribution
    init: str = "histogram"             # what init_share measures: "histogram" or "marginals"
    cuboids: bool = False               # candidates: whole output groups, else single rows
    measure: str = "partition"          # "partition": a box and its complement, or "query"
    total: float | None = None          # public row count N; None: estimate it
    total_share: Fraction | None = None  # share of ε for N when total is None (default
                                         # defaults.TOTAL_SHARE)
    max_stages: int = 5                 # rounds="auto": at most this many doubling stages

    def __post_init__(self) -> None:
        rounds = self.rounds
        if isinstance(rounds, str):
            if rounds not in ("rule", "auto"):
                raise StrategyError(f"MWEMOptions.rounds must be an integer >= 1, 'rule' or "
                                    f"'auto', got {rounds!r}")
        elif isinstance(rounds, bool) or not isinstance(rounds, numbers.Integral) or rounds < 1:
            raise StrategyError(f"MWEMOptions.rounds must be an integer >= 1, 'rule' or "
                                f"'auto', got {rounds!r}")
        else:
            object.__setattr__(self, "rounds", int(rounds))
        if self.iterate not in ("last", "average"):
            raise StrategyError(f"MWEMOptions.iterate must be 'last' or 'average', "
                                f"got {self.iterate!r}")
        for name, low, high in (("replay", 0, 1000), ("max_stages", 1, 12)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
                    or not low <= value <= high:
                raise StrategyError(f"MWEMOptions.{name} must be an integer in "
                                    f"[{low}, {high}], got {value!r}")
            object.__setattr__(self, name, int(value))
        if self.init not in ("histogram", "marginals"):
            raise StrategyError(f"MWEMOptions.init must be 'histogram' or 'marginals', "
                                f"got {self.init!r}")
        if self.measure not in ("query", "partition"):
            raise StrategyError(f"MWEMOptions.measure must be 'query' or 'partition', "
                                f"got {self.measure!r}")
        if not isinstance(self.cuboids, bool):
            raise StrategyError(f"MWEMOptions.cuboids must be True or False, "
                                f"got {self.cuboids!r}")
        init_share = _share(self.init_share, "init_share")
        if self.total is None:
            total_share = (defaults.TOTAL_SHARE if self.total_share is None
                           else _share(self.total_share, "total_share"))
            if total_share == 0:
                raise PrivacyParameterError(
                    "MWEMOptions.total_share must be > 0 when total is None: the row count N "
                    "is then estimated with that share of ε; or declare a public total")
        else:
            if isinstance(self.total, bool) or not isinstance(self.total, numbers.Real) \
                    or not math.isfinite(self.total) or self.total < 0:
                raise StrategyError(f"MWEMOptions.total must be a finite number >= 0 (the "
                                    f"public row count) or None, got {self.total!r}")
            if self.total_share not in (None, 0):
                raise PrivacyParameterError(
                    f"MWEMOptions.total_share = {self.total_share!r} is only spent when total "
                    f"is None; with a public total leave total_share unset")
            total_share = Fraction(0)
            object.__setattr__(self, "total", float(self.total))
        if init_share + total_share >= 1:
            raise PrivacyParameterError(
                f"MWEMOptions: init_share + total_share = {float(init_share + total_share):g} "
                f"leaves nothing for the rounds; the two must sum to less than 1")
        object.__setattr__(self, "init_share", init_share)
        object.__setattr__(self, "total_share", total_share)


@dataclass(frozen=True)
class MWEMMeasurement:
    """One released Laplace measurement (public): what was measured and what came back."""

    kind: str            # "total", "init" or "round"
    block: int
    rows: tuple          # (start, stop) rows of the block's W (a RangeBlock: (r, r + 1),
                         # r = interval_index(n, lo, hi)); None for total / init
    noisy: np.ndarray    # measure="partition": the query's value first, then the boxes
                         # around it (mwem_state.box_partition's order)
    scale: float         # Laplace scale b
    round: int | None = None


@dataclass(frozen=True)
class MWEMResult:
    """MWEM's output: per-block distributions and answers, and the record of its spending."""

    distributions: tuple     # per block: nonnegative cell weights summing to `total`
    answers: tuple           # per block: W_g @ distributions[g]
    rounds: int              # T, the number of select + measure rounds run
    spends: tuple            # (kind, block, epsilon Fraction): "total", "init", "select", "measure"
    notes: tuple
    total: float             # N used (public or noisy)
    rounds_per_block: tuple = ()
    measurements: tuple = field(default=(), repr=False)

    @property
    def epsilon(self) -> Fraction:
        return sum((s[2] for s in self.spends), Fraction(0))


# ---------------------------------------------------------------------------------------
# Checks before the charge: every spend's ε and the run's time, from public inputs only

#: a round's fixed cost in work units (about nanoseconds on one core): the oracle's two
#: secure-sampler calls and the bookkeeping (measured: 2-4 ms a round on Adult)
ROUND_COST = 2_000_000
#: a round's cost per cell and per nonzero of the block's queries (estimates, scores)
CELL_COST = 200
#: fixed cost of one MW update (or renormalisation) besides its cells (measured: 20-30 µs)
UPDATE_COST = 30_000
#: an update's or renormalisation's cost per cell it touches
UPDATE_CELL_COST = 50
#: the largest predicted work of one MWEM run, in the same units: about five minutes on one
#: core (calibrated on Adult, benchmarks/mwem_adult.py's runs predict well below it).
#: Checked before the charge (:func:`check_run`), so a run that would not finish is refused,
#: not charged and then killed
MAX_WORK = 300 * 10**9


def _rounds_bound(blocks, options) -> tuple[int, list]:
    """(largest number of rounds a run can take, the blocks that get rounds)."""
    active = [b for b in blocks if b.n_queries > 0]
    weighted = [b for b in active if b.n_cells > 1] or active
    if options.rounds == "auto":
        return len(weighted) * (2 ** options.max_stages - 1), active
    if options.rounds == "rule":                # the rule's largest choice
        return defaults.max_rounds(len(weighted)), active
    return options.rounds, active


def step_epsilons(blocks, epsilon, options) -> dict:
    """The smallest ε each kind of spend of a run gets (exact): ``total`` (the row count),
    ``init`` (each block's initial histogram or marginals), ``round`` (each selection and
    each measurement: half a round's budget). Mirrors :func:`dpsql.mechanisms.mwem.core.run_mwem`'s split."""
    eps = to_exact(epsilon, "epsilon")
    T, active = _rounds_bound(blocks, options)
    eps_total = eps * options.total_share
    eps_init = eps * options.init_share
    eps_rounds = eps - eps_total - eps_init
    if options.rounds in ("auto", "rule"):
        e = eps_rounds / T              # T0 (2^S - 1), or the rule's most: the smallest
    else:
        e = eps_rounds / options.rounds
    steps = {"round": e / 2}
    if options.total is None:
        steps["total"] = eps_total
    if eps_init > 0:
        steps["init"] = eps_init / max(1, len(active))
    return steps


def _measured_cells(block, options) -> tuple[int, int]:
    """(history entries, cells touched) that one round's measurement adds to a block."""
    n = block.n_cells
    if isinstance(block, RangeBlock):
        return (3 if options.measure == "partition" else 1), n
    W = block.W
    k = len(block.shape) if block.shape else 1
    if options.measure == "partition" and k <= 4:
        return 3 ** k, n                # the pieces cover every cell once
    row_nnz = np.diff(W.indptr)
    cells = int(row_nnz.max(initial=0))
    if options.cuboids:
        cells = max([cells] + [int(row_nnz[a:b].sum()) for a, b in block.groups])
    return 1, max(cells, 1)


def predicted_work(blocks, options) -> float:
    """Work units (about nanoseconds on one core; :data:`ROUND_COST` and the other
    constants) of the longest run the options allow: rounds × (selection over the block's
    cells and queries + the update of what it measures) + replay × every past measurement
    replayed each round (their number grows with the rounds: T(T+1)/2 replayed updates)."""
    T, active = _rounds_bound(blocks, options)
    if not active:
        return 0.0
    n_sum = sum(b.n_cells for b in active)
    per_round, per_update = 0.0, 0.0
    for b in active:
        n = b.n_cells
        select = n * (math.log2(n) + 1) if isinstance(b, RangeBlock) else b.W.nnz + n
        entries, cells = _measured_cells(b, options)
        update = entries * UPDATE_COST + UPDATE_CELL_COST * cells
        per_update = max(per_update, update)
        per_round = max(per_round, CELL_COST * select + update)
    per_round += ROUND_COST + (CELL_COST * n_sum if options.iterate == "average" else 0)
    renormalise = UPDATE_COST * len(active) + UPDATE_CELL_COST * n_sum
    init = 0.0
    if options.init_share:
        axes = [len(b.shape) if getattr(b, "shape", None) and options.init == "marginals"
                else 1 for b in active]
        init = sum(UPDATE_COST + UPDATE_CELL_COST * b.n_cells * k
                   for b, k in zip(active, axes))
    replayed = init if options.init == "marginals" else 0.0    # marginals join the replay
    replay = options.replay * (per_update * T * (T + 1) / 2 + T * (renormalise + replayed))
    return T * per_round + replay + init


def check_run(blocks, epsilon, options, spec: str = "mwem") -> None:
    """Refuse, before the charge, an MWEM run that the kernel would refuse or could not
    finish: a spend's ε below the samplers' smallest (:data:`dpsql.noise.accounting.MIN_EPSILON`)
    or a predicted run time above :data:`MAX_WORK`. Public inputs only (blocks, ε, options);
    ``explain`` and ``answer`` both call it, so explain accepts exactly what answer runs."""
    from dpsql.noise.accounting import MIN_EPSILON

    name = spec.strip() if isinstance(spec, str) else "mwem"
    steps = step_epsilons(blocks, epsilon, options)
    what = {"round": "each round's selection and measurement", "total": "the row count",
            "init": "each block's initial measurement"}
    for kind, step in steps.items():
        if step < MIN_EPSILON:
            fix = ("ask for fewer rounds" if kind == "round" else
                   f"ask for a larger {kind}_share")
            raise PrivacyParameterError(
                f"{name} at epsilon = {float(epsilon):g} spends epsilon = {float(step):.3g} on "
                f"{what[kind]}, below the smallest the noise samplers accept "
                f"({float(MIN_EPSILON):g}); {fix} or a larger epsilon")
    work = predicted_work(blocks, options)
    if work > MAX_WORK:
        T, active = _rounds_bound(blocks, options)
        cells = sum(b.n_cells for b in active)
        queries = sum(b.n_queries for b in active)
        raise StrategyError(
            f"{name} is predicted to run about {work / 1e9:.3g} s ({T:,} rounds x per-round "
            f"cost over {cells:,} cells and {queries:,} queries, replay {options.replay}), "
            f"more than the limit of {MAX_WORK / 1e9:g} s; ask for fewer rounds, a smaller "
            f"replay or a smaller batch")

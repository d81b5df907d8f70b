"""Strategy selection for batches compiled to Kronecker blocks (issue 16), public inputs only.

:func:`select` is :func:`dpsql.mechanisms.matrix.select` for an
:class:`~dpsql.sql.implicit.ImplicitWorkload`: it plans the structured candidates, prices
them with the kernel's own sensitivity (:func:`dpsql.workload.marginals.
computed_l2_sensitivity`) and reports each one's RMSE and its ratio to the singular value
bound, computed without the product (:func:`dpsql.strategies.symmetric.restricted_svdb`
for GROUP BY blocks; no bound is claimed for blocks with predicates inside).

Candidates today:

- ``residual`` — ResidualPlanner's closed form for the exact total variance of the blocks
  (:func:`dpsql.strategies.residual.blocks_plan`), measured through marginals;
- the dense candidates (``identity``, ``eigen``, …) need the full product; they are listed
  as skipped, with the product's size, when it is over
  :data:`dpsql.sql.implicit.DENSE_MAX_CELLS`.

Gaussian noise only (δ > 0); the release path sends pure-ε batches to the dense form.
"""

from __future__ import annotations

import math
import time

import numpy as np

from dpsql.errors import StrategyError
from dpsql.inference.implicit import residual_block_stderr
from dpsql.noise.gaussian import calibrate_with_rounding
from dpsql.store.results import Candidate, Explanation
from dpsql.strategies import residual, symmetric
from dpsql.strategies import AUTO_CANDIDATES

#: the bound is skipped (explain says so) when its eigenvalues need more flops than this
MAX_BOUND_FLOPS = 2e9


class ResidualChoice:
    """The chosen structured plan: the residual weights and the kernel's marginal plan."""

    def __init__(self, workload, rplan, mplan):
        self.workload, self.residual, self.plan = workload, rplan, mplan

    @property
    def sensitivity(self) -> float:
        return self.plan.sensitivity

    def stderr(self, sigma: float) -> np.ndarray:
        """Every answer's exact standard error, block by block, in row order."""
        sizes, a = self.residual.sizes, self.residual.a
        return self.workload.assemble([residual_block_stderr(sizes, a, b, sigma)
                                       for b in self.workload.union.blocks])


def bound_total(workload) -> tuple[float, str]:
    """(svdb total, note): the singular value bound of the blocks, or NaN and why not.

    The bound's cost is predicted first (``Σ_S size_S³`` flops over the invariant blocks of
    the closure) and it is skipped, with a note, over :data:`MAX_BOUND_FLOPS`."""
    union = workload.union
    try:
        parts = symmetric.column_parts(union)
        sizes = union.sizes
        flops = sum(math.prod(1 + sizes[i] - parts[i][0] for i in range(len(sizes))
                              if i not in S) ** 3
                    for S in residual.closure([b.used for b in union.blocks]))
        if flops > MAX_BOUND_FLOPS:
            return math.nan, (f"bound skipped: its invariant blocks need ~{flops:.1e} flops "
                              f"(limit {MAX_BOUND_FLOPS:.0e})")
        return float(symmetric.restricted_svdb(union)), ""
    except StrategyError as exc:
        return math.nan, f"no lower bound computed: {exc}"


#: predicted bytes per answer (answer, standard error, half-width, its key tuple, the table
#: row) and per marginal cell (the engine's counts, the summed-down and transformed copies)
BYTES_PER_ANSWER, BYTES_PER_CELL = 256, 32


def predicted_bytes(workload) -> int:
    """Memory the implicit path needs: answers and the cliques' marginals, never the product
    (measured: 54 MB for 232,391 answers over 175 cliques; this predicts 60 MB)."""
    union = workload.union
    cells = sum(math.prod(union.sizes[i] for i in c) for c in union.cliques())
    factors = sum(F.size for b in union.blocks for F in b.factors)
    return BYTES_PER_ANSWER * workload.n_queries + BYTES_PER_CELL * cells + 8 * factors


def check_limits(workload) -> None:
    """Refuse (before any charge) a batch whose predicted memory is over ``max_memory``."""
    from dpsql.errors import BatchTooLarge
    from dpsql.workload import limits

    need, limit = predicted_bytes(workload), limits.current()
    if need > limit.max_memory:
        big = sorted(workload.union.cliques(), key=len, reverse=True)[:2]
        raise BatchTooLarge(
            f"this batch needs about {limits.show_bytes(need)} to plan and answer "
            f"({workload.n_queries:,} answers; largest blocks read "
            + "; ".join(", ".join(workload.union.columns[i] for i in B) for B in big)
            + f"), over {limit.describe()}; nothing was charged; split the batch")


def select(policy, workload, eps, dlt, calibration: str,
           reuse: bool = False) -> tuple[Explanation, ResidualChoice]:
    """The structured candidates' expected errors and the chosen one (no data, no budget).
    ``reuse``: the request asked for answers from past releases, which implicit batches do
    not combine yet: explain says so (the answers are what they would be without it)."""
    check_limits(workload)
    started = time.perf_counter()
    rplan = residual.blocks_plan(workload.union)
    choice = ResidualChoice(workload, rplan, residual.as_marginal_plan(rplan))
    p = choice.plan.n_measurements
    sigma = calibrate_with_rounding(eps, dlt, choice.sensitivity, p, calibration)
    stderr = choice.stderr(sigma)
    rmse = float(np.sqrt(np.mean(stderr ** 2))) if stderr.size else 0.0
    total, note = bound_total(workload)
    from dpsql.mechanisms.matrix import bound_rmse

    bound = bound_rmse("gaussian", eps, dlt, calibration, total, workload.n_queries) \
        if math.isfinite(total) else math.nan
    seconds = time.perf_counter() - started
    best = Candidate("residual", sigma, choice.sensitivity, rmse, stderr, seconds=seconds,
                     bound_ratio=rmse / bound if bound > 0 else math.nan, plan=choice.plan,
                     note=f"{len(choice.plan.measurements)} residual measurements over "
                          f"{len(choice.plan.cliques())} cliques, {p} rows")
    skipped = [Candidate(name, math.nan, math.nan, math.nan, np.zeros(0),
                         note=f"skipped: needs the full product of {workload.n_cells:,} "
                              "cells (the batch is compiled to Kronecker blocks)")
               for name in AUTO_CANDIDATES]
    if reuse:
        skipped.append(Candidate("reuse", math.nan, math.nan, math.nan, np.zeros(0),
                                 note="skipped: answers from past releases are not combined "
                                      "with batches compiled to blocks yet (no effect on "
                                      "these answers)"))
    expl = Explanation(policy.table, float(eps), float(dlt), "residual", sigma, rmse, stderr,
                       workload.n_queries, workload.n_cells, (best, *skipped),
                       tuple((o.query.index, o.start, o.stop) for o in workload.outputs),
                       bound_rmse=bound, mechanism="gaussian", bound_note=note)
    return expl, choice

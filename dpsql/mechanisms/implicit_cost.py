"""The request-level cost of a batch compiled to Kronecker blocks, from the sizes it works on.

A batch over more than :data:`dpsql.sql.implicit.DENSE_MAX_CELLS` cells takes the implicit
path (:mod:`dpsql.mechanisms.implicit`, :mod:`dpsql.release.implicit`): it never builds the
product of its columns, so the dense candidates' model (:mod:`dpsql.workload.limits`, cubic
in the cells) does not apply — it predicted 49 s for a 5-column Adult CUBE that takes 0.2 s.
Its work grows with what it does touch (public: the policy's parts and the query text):

- ``m``: the answers (compile's row maps, every answer's standard error, half-width, the
  least-squares answers block by block, the result tables' rows);
- ``cells``: the maximal cliques' marginals, ``Σ_C Π_{i∈C} n_i`` (the engine's counts, the
  measurements summed down from them, the noise draws: every candidate measures at most
  these many values);
- ``blocks``: the Kronecker blocks and the closure of their cliques (per-block Python work:
  the residual plan's weights, one marginal per block);
- ``flops``: the singular value bound's eigenvalues, ``Σ_S size_S³`` over the invariant
  blocks (:func:`bound_flops`; 0 when the bound is skipped).

:func:`request_cost` is the whole request (memory: :func:`predicted_bytes`; time:
:data:`IMPLICIT_TIME_FIT` on :func:`features`); :func:`check_limits` refuses, before any
charge, a batch whose prediction is over ``max_memory`` or ``time_limit``.
"""

from __future__ import annotations

import math

from dpsql.errors import BatchTooLarge, StrategyError
from dpsql.strategies import residual, symmetric
from dpsql.workload import limits as planning

#: the bound is skipped (explain says so) when its eigenvalues need more flops than this
MAX_BOUND_FLOPS = 2e9
#: predicted bytes per answer (answer, standard error, half-width, its key tuple, the table
#: row) and per marginal cell (the engine's counts, the summed-down and transformed copies)
BYTES_PER_ANSWER, BYTES_PER_CELL = 256, 32
#: the request's own Python objects besides its arrays (as the dense path's
#: :data:`dpsql.mechanisms.fit.REQUEST_OVERHEAD_BYTES`)
OVERHEAD_BYTES = 2 ** 19

#: seconds per unit of (fixed, m, cells, blocks, flops) (:func:`features`) of a whole
#: implicit request (compile, selection, the kernel's measurements and noise, the answers,
#: the result tables; the data scan of a 30,000-row table included, larger tables' extra
#: scan not: :func:`dpsql.workload.limits.release_cost`). Fitted by ``python
#: benchmarks/limits_requests.py --fit implicit`` (non-negative least squares on the relative error
#: of process CPU time, one BLAS thread, 2026-11-28) on twelve requests over a synthetic
#: table of 30,000 random rows and eight made-up categorical columns of 3..15 values (never
#: the Adult data or its columns): GROUP BY CUBE over 3-6 of them and a half of the grouping
#: sets of 7, 1,920..1.7·10⁶ cells, 1,920..1.1·10⁶ answers, 0.25..72 s; worst ratio on its
#: own batches 1.68. The bound's flops keep the dense model's ``4/FLOPS`` (not fitted).
#: Formula: ``0.167 + 9.38e-6·m + 3.38e-5·cells + 1.78e-3·blocks + 4·flops/FLOPS``.
IMPLICIT_TIME_FIT = (0.167, 9.38e-06, 3.38e-05, 1.78e-03, 4.0 / planning.FLOPS)


def cells(workload) -> float:
    """``Σ_C Π_{i∈C} n_i`` over the batch's maximal cliques (the marginals it reads)."""
    union = workload.union
    cliques = union.cliques()
    maximal = [C for C in cliques if not any(set(C) < set(D) for D in cliques)]
    return float(sum(math.prod(union.sizes[i] for i in C) for C in maximal))


def bound_flops(workload) -> float:
    """Flops of the singular value bound's eigenvalues (``Σ_S size_S³`` over the invariant
    blocks of the closure, plus ``n_i³`` per range column's Gram), NaN when the bound does
    not apply (the reason is :func:`dpsql.mechanisms.implicit.bound_total`'s)."""
    flops, grouped = _bound_flops(workload)
    return flops + grouped


def bound_skipped(workload) -> float | None:
    """The flops that skip the bound (over :data:`MAX_BOUND_FLOPS`), else None (a batch
    of range columns only, with no GROUP BY columns' invariant blocks, is never skipped)."""
    flops, grouped = _bound_flops(workload)
    return flops + grouped if grouped > 0 and flops + grouped > MAX_BOUND_FLOPS else None


def _bound_flops(workload) -> tuple[float, float]:
    try:
        general, _, union, _ = symmetric.split_for_bound(workload.union)
    except StrategyError:
        return math.nan, math.nan
    flops = float(sum(workload.union.sizes[i] ** 3 for i in general))
    if union is None:
        return flops, 0.0
    try:
        parts = symmetric.column_parts(union)
    except StrategyError:
        return math.nan, math.nan
    sizes = union.sizes
    return flops, float(sum(
        math.prod(1 + sizes[i] - parts[i][0] for i in range(len(sizes)) if i not in S) ** 3
        for S in residual.closure([b.used for b in union.blocks])))


def features(workload) -> tuple:
    """(1, m answers, clique cells, blocks + closure, bound flops when computed)."""
    flops = bound_flops(workload)
    closure = len(residual.closure([b.used for b in workload.union.blocks]))
    computed = math.isfinite(flops) and bound_skipped(workload) is None
    return (1.0, float(workload.n_queries), cells(workload),
            float(len(workload.union.blocks) + closure), flops if computed else 0.0)


def predicted_bytes(workload) -> int:
    """Memory the implicit path needs: answers and the cliques' marginals, never the product
    (measured: 54 MB for 232,391 answers over 175 cliques; this predicts 60 MB)."""
    union = workload.union
    marginals = sum(math.prod(union.sizes[i] for i in c) for c in union.cliques())
    factors = sum(F.size for b in union.blocks for F in b.factors)
    return BYTES_PER_ANSWER * workload.n_queries + BYTES_PER_CELL * marginals + 8 * factors


def request_cost(workload) -> planning.Cost:
    """The whole implicit request's predicted peak memory and time (module docstring)."""
    seconds = sum(c * f for c, f in zip(IMPLICIT_TIME_FIT, features(workload)))
    return planning.Cost(predicted_bytes(workload) + OVERHEAD_BYTES, seconds)


def check_limits(workload) -> None:
    """Refuse (before any charge) a batch whose predicted memory or time is over the
    limits, naming its widest blocks and how to split it."""
    limit = planning.current()
    why = request_cost(workload).over(limit)
    if why is None:
        return
    big = sorted(workload.union.cliques(), key=len, reverse=True)[:2]
    raise BatchTooLarge(
        f"this batch is too large to plan and answer within {limit.describe()}: it {why} "
        f"({workload.n_queries:,} answers; largest blocks read "
        + "; ".join(", ".join(workload.union.columns[i] for i in B) for B in big)
        + "); nothing was charged; split the batch (fewer columns per GROUP BY or CUBE), "
        "or raise max_memory / time_limit")

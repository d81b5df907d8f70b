"""Which candidates fit the planning limits: checked from sizes before any heavy numerics.

:func:`screen` runs first in :func:`dpsql.mechanisms.matrix.select`, before the singular
value bound (an eigendecomposition) or any strategy is planned. It predicts each
candidate's peak memory and time from the batch's size (:mod:`dpsql.workload.limits`) and
skips the ones over the current limits (``explain`` lists them with the limit they
exceed); the bound is skipped too when it would not fit. A batch is refused
(:class:`~dpsql.errors.BatchTooLarge`) only when no candidate fits, or when a strategy named
explicitly does not, with the batch's size, the columns and statements that make it large
and how to split it. :func:`out_of_memory` is the same refusal for an allocation that
failed anyway (numpy's ``MemoryError``): never an internal error, and before any charge.
"""

from __future__ import annotations

from types import SimpleNamespace

from dpsql.errors import BatchTooLarge
from dpsql.sql.compile import Workload, query_columns
from dpsql.store.selection_cache import Evaluation
from dpsql.strategies import spec
from dpsql.workload import limits as planning


def predicted(workload: Workload, family: str, name: str, strategy) -> planning.Cost:
    """A candidate's predicted planning cost (its own time estimate when it has one)."""
    n, m, nnz = workload.n_cells, workload.n_queries, workload.W.nnz
    estimate = getattr(strategy, "estimated_seconds", None)
    seconds = estimate(SimpleNamespace(n=n)) if estimate is not None else 0.0
    base = spec.parse(name)[0]
    key = f"{base}/laplace" if family == "laplace" and base == "eigen" else base
    return planning.candidate_cost(key, n, m, nnz, seconds)


def bound_fits(workload: Workload) -> str | None:
    """None when the singular value bound fits the limits, else why it is skipped."""
    cost = planning.bound_cost(workload.n_cells, workload.n_queries, workload.W.nnz,
                               planning.gram_ops(workload.W))
    why = cost.over(planning.current())
    return None if why is None else f"lower bound (svdb) not computed: it {why}"


def bound_seconds(workload: Workload) -> float:
    """The singular value bound's predicted time (seconds)."""
    return planning.bound_cost(workload.n_cells, workload.n_queries, workload.W.nnz,
                               planning.gram_ops(workload.W)).seconds


def screen(workload: Workload, names: list, auto: bool) -> tuple[list, list]:
    """(candidates that fit, skipped ones as evaluations). Raises :class:`BatchTooLarge`
    when none fits, or when the one strategy asked for by name does not."""
    limits = planning.current()
    fitting, skipped, cheapest = [], [], None
    for family, name, strategy in names:
        cost = predicted(workload, family, name, strategy)
        why = cost.over(limits)
        if why is None:
            fitting.append((family, name, strategy))
            continue
        if cheapest is None or cost.memory < cheapest[1].memory:
            cheapest = (name, cost, why)
        skipped.append(Evaluation(family, name, status="skipped",
                                  note=f"skipped: planning it {why} (predicted)"))
    if not fitting:
        name, _, why = cheapest
        strategies = "every strategy exceeds them; the cheapest" if auto else "strategy"
        raise too_large(workload, f"{strategies}, {name}, {why}")
    return fitting, skipped


def too_large(workload: Workload, why: str) -> BatchTooLarge:
    """The refusal: the limit, the batch's size, and where to split it."""
    limits = planning.current()
    parts = ", ".join(f"{p.column}={p.n_parts}" for p in workload.partitions) or "none"
    return BatchTooLarge(
        f"this batch is too large to plan within {limits.describe()}: "
        f"{workload.n_queries:,} queries over {workload.n_cells:,} cells (parts per column: "
        f"{parts}); {why}; nothing was charged. Split the batch: {_largest(workload)}; the "
        "cells are the product of the parts of the columns one batch uses, so put statements "
        "over different columns in different batches, or group by fewer columns (or raise "
        "max_memory / time_limit)")


def out_of_memory(workload: Workload) -> BatchTooLarge:
    """An allocation failed (numpy's MemoryError) although the prediction fitted."""
    return too_large(workload, "an allocation failed while planning it (out of memory)")


def _largest(workload: Workload, top: int = 3) -> str:
    """The statements with the most answers, and their columns."""
    outs = sorted((o for o in workload.outputs if o.query is not None),
                  key=lambda o: o.start - o.stop)[:top]
    return "; ".join(
        f"statement {o.query.index + 1} has {o.stop - o.start:,} answers over "
        f"{', '.join(sorted(query_columns(o.query))) or 'no column'}" for o in outs)

"""Which candidates fit the planning limits: checked from sizes before any heavy numerics.

:func:`screen` runs first in :func:`dpsql.mechanisms.selection.select`, before the singular
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

import numpy as np

from dpsql.errors import BatchTooLarge
from dpsql.mechanisms import implicit_cost
from dpsql.sql.compile import Workload, query_columns
from dpsql.store.selection_cache import Evaluation
from dpsql.strategies import spec
from dpsql.workload import limits as planning


def predicted(workload: Workload, family: str, name: str, strategy,
              fitted: bool = True) -> planning.Cost:
    """A candidate's predicted planning cost (its own time estimate when it has one;
    ``fitted=False``: the model before calibration, for ``benchmarks/limits.py --fit``)."""
    n, m, nnz = workload.n_cells, workload.n_queries, workload.W.nnz
    estimate = getattr(strategy, "estimated_seconds", None)
    seconds = estimate(SimpleNamespace(n=n, m=m)) if estimate is not None and fitted else 0.0
    base = spec.parse(name)[0]
    key = f"{base}/laplace" if family == "laplace" and base == "eigen" else base
    return planning.candidate_cost(key, n, m, nnz, seconds, fitted,
                                   strategy_gram_ops(base, workload.shape),
                                   planning.row_gram_ops(workload.W))


def strategy_gram_ops(base: str, shape: tuple) -> float:
    """Multiply-adds of the sparse product ``AᵀA`` the least-squares factors form from the
    strategy's ``A``: ``Σ nnz(row)²``, which for the wavelet's Kronecker product over the
    columns is the product of each column's Haar sum (public: the parts per column). On
    the 5-column Adult CUBE that is 2.7·10⁹ (~5 s); the one-column batches the time model
    is fitted on never exceed 10⁷. Other strategies: 0 (their fitted terms cover them)."""
    if base != "wavelet":
        return 0.0
    from dpsql.strategies.wavelet import haar_matrix

    total = 1.0
    for k in shape:
        total *= float(np.square(np.diff(haar_matrix(int(k)).indptr).astype(float)).sum())
    return total


#: seconds of a dense request's own work besides its steps (parse, compile, explain's
#: table, the intervals' set-up) and per candidate evaluated besides its planning step
#: (its noise scale and expected errors, its explain row, its forked worker when it runs in
#: one): fitted by ``python benchmarks/limits_requests.py --fit dense`` (non-negative least
#: squares on the relative error of what the steps' model leaves, process CPU time) on
#: whole requests over the synthetic table of :mod:`benchmarks.limits_requests` (made-up
#: columns, never the Adult data): CUBEs and GROUP BYs of 12..840 cells, auto (13
#: candidates), δ = 0 (6) and a strategy named (1), 24 requests, 2026-11-28 at load
#: average ~5 on the 2 cores; worst ratio on its own requests 2.36 (what is left is
#: proportional to the steps, which that load slows: not a per-request cost). Formula of a
#: request's time: ``REQUEST_FIXED_SECONDS + release + bound + Σ (step + CANDIDATE_SECONDS)``.
REQUEST_FIXED_SECONDS, CANDIDATE_SECONDS = 0.0298, 0.0262


def release(workload: Workload) -> planning.Cost:
    """The kernel, the answers and the write of whichever candidate is chosen, and the
    request's fixed work (:data:`REQUEST_FIXED_SECONDS`)."""
    cost = planning.release_cost(workload.n_cells, workload.n_queries)
    return planning.Cost(cost.memory, cost.seconds + REQUEST_FIXED_SECONDS)


def candidate_seconds(workload: Workload, family: str, name: str, strategy) -> float:
    """A candidate's share of the request's time: its planning step and its pricing."""
    return predicted(workload, family, name, strategy).seconds + CANDIDATE_SECONDS


def _bound(workload: Workload) -> planning.Cost:
    return planning.bound_cost(workload.n_cells, workload.n_queries, workload.W.nnz,
                               planning.gram_ops(workload.W))


def bound_fits(workload: Workload) -> str | None:
    """None when the singular value bound fits the limits, else why it is skipped: its
    memory, or its time plus the release's over ``time_limit`` (the request's total)."""
    cost = _bound(workload)
    why = planning.Cost(cost.memory, cost.seconds + release(workload).seconds).over(
        planning.current())
    return None if why is None else f"lower bound (svdb) not computed: it {why}"


def bound_seconds(workload: Workload) -> float:
    """The singular value bound's predicted time (seconds)."""
    return planning.bound_cost(workload.n_cells, workload.n_queries, workload.W.nnz,
                               planning.gram_ops(workload.W)).seconds


def screen(workload: Workload, names: list, auto: bool) -> tuple[list, list]:
    """(candidates that fit, skipped ones as evaluations). ``time_limit`` bounds the whole
    request: the release (:func:`release`), the bound when it fits, and every candidate
    evaluated, admitted cheapest first while their sum fits; ``max_memory`` bounds each
    step's peak plus what the candidates admitted before it hold (:func:`held`). Raises
    :class:`BatchTooLarge` when none fits, or when the one strategy asked for by name does
    not."""
    limits = planning.current()
    costs = [predicted(workload, family, name, strategy) for family, name, strategy in names]
    costs = [planning.Cost(c.memory, c.seconds + CANDIDATE_SECONDS) for c in costs]
    spent = release(workload).seconds + (_bound(workload).seconds
                                         if bound_fits(workload) is None else 0.0)
    why, holding = {}, 0.0
    for i in sorted(range(len(names)), key=lambda k: costs[k].seconds):
        total = planning.Cost(costs[i].memory + holding, spent + costs[i].seconds)
        why[i] = costs[i].over(limits) or _over_in_total(total, limits)
        if why[i] is None:
            spent, holding = total.seconds, holding + held(workload, names[i][1])
    fitting = [names[i] for i in range(len(names)) if why[i] is None]
    skipped = [Evaluation(names[i][0], names[i][1], status="skipped",
                          note=f"skipped: planning it {why[i]} (predicted)")
               for i in range(len(names)) if why[i] is not None]
    if not fitting:
        i = min(range(len(names)), key=lambda k: costs[k].memory)
        strategies = "every strategy exceeds them; the cheapest" if auto else "strategy"
        raise too_large(workload, f"{strategies}, {names[i][1]}, {why[i]}")
    return fitting, skipped


def held(workload: Workload, name: str) -> float:
    """Bytes a candidate's evaluation keeps until the choice is made (its solver's n x n
    factor; none for the identity): the evaluations of one request are held together."""
    return 0.0 if spec.parse(name)[0] == "identity" else 8.0 * workload.n_cells ** 2


#: the request's own Python objects besides the steps (parsed batch, compiled workload,
#: result conversion): about 0.5 MiB on the smallest batches
REQUEST_OVERHEAD_BYTES = 2 ** 19


def _over_in_total(total: planning.Cost, limits: planning.Limits) -> str | None:
    if total.memory > limits.max_memory:
        return (f"would bring the request to about {planning.show_bytes(total.memory)} "
                f"held at once, over max_memory = {planning.show_bytes(limits.max_memory)}")
    if total.seconds > limits.time_limit:
        return (f"would take the request to about {total.seconds:.3g} s in total, "
                f"over time_limit = {limits.time_limit:g} s")
    return None


def request_cost(workload: Workload, names: list) -> planning.Cost:
    """The whole request as :func:`screen` admits it: its peak memory (the largest step plus
    what every kept candidate holds until the choice, :func:`held`) and its total time
    (release, bound, every candidate kept). A batch compiled to Kronecker blocks is priced
    by what the implicit path works on (:func:`dpsql.mechanisms.implicit_cost.request_cost`:
    its answers, marginals and blocks), never the dense product's candidates."""
    if getattr(workload, "implicit", False):
        return implicit_cost.request_cost(workload)
    kept, _ = screen(workload, names, True)
    steps = [release(workload)] + [predicted(workload, f, n, s) for f, n, s in kept]
    steps += [planning.Cost(0.0, CANDIDATE_SECONDS * len(kept))]
    if bound_fits(workload) is None:
        steps.append(_bound(workload))
    memory = (max(c.memory for c in steps) + sum(held(workload, n) for _, n, _ in kept)
              + REQUEST_OVERHEAD_BYTES)
    return planning.Cost(memory, sum(c.seconds for c in steps))


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

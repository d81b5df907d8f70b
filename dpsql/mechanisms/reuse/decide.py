"""How a batch is answered given past releases (public inputs only): which rows are free, what
the rest costs, and every answer's error with old and new measurements combined.

:func:`decide` runs three steps: the pool of usable releases (:func:`usable_pool`), which
rows they answer free (:func:`free_rows`), and the fresh sub-batch for the others
(:func:`fresh_sub_batch`). Which rows are free depends on what was released before and on
the request, never on the data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np
import scipy.sparse as sp

from dpsql.mechanisms import selection, tight
from dpsql.mechanisms.reuse.pool import Analysis, Pool
from dpsql.mechanisms.reuse.records import record_of
from dpsql.mechanisms.target import smallest_epsilon
from dpsql.store.results import Explanation as _Explanation


@dataclass
class Decision:
    """How a batch is answered: ``new`` is the selection for the rows measured now (None when
    every row is free); ``expl`` what the user is shown (combined errors)."""

    expl: object
    new: object
    epsilon: object              # what the new part costs (0 when every row is free)
    pool: Pool | None
    free: np.ndarray
    planned: int | None = None   # the pool term of the new measurement


def sub_workload(workload, rows: np.ndarray):
    """The batch restricted to ``rows`` (same cells); what the new part measures."""
    from dpsql.sql.compile import Workload

    return Workload(workload.table, workload.partitions,
                    sp.csr_matrix(workload.W)[np.flatnonzero(rows)], ())


@dataclass(frozen=True)
class _Request:
    """The request as :func:`decide` selects for it, on the batch or on a part of it."""

    con: object
    policy: object
    eps: object
    dlt: object
    strategy: str
    calibration: str
    objective: str
    target: float | None

    def select(self, workload, eps):
        """The selection for ``workload`` at ``eps``."""
        return selection.select(self.con, self.policy, workload, eps, self.dlt,
                                self.strategy, self.calibration, self.objective)

    def fresh(self, workload):
        """``(ε, selection)`` measuring ``workload`` on its own: at the requested ε, or at the
        smallest ε meeting the target."""
        if self.target is None:
            return Fraction(self.eps), self.select(workload, self.eps)
        return smallest_epsilon(self.con, self.policy, workload, self.dlt, self.strategy,
                                self.calibration, self.target, self.objective)


def decide(con, policy, workload, records, eps, dlt, strategy, calibration,
           objective: str = "rmse", target: float | None = None) -> Decision:
    """Which rows are free, what the rest costs, and every answer's error (public inputs).

    A row is free when the past releases answer it *and* no less accurately than this
    request would: its GLS standard error is at most the one the full batch would get at this
    ε (or, for an accuracy-first request, at most the target). The other rows are selected
    for and measured as a batch of their own (at the requested ε, or the smallest ε meeting
    the target); every answer then combines old and new measurements."""
    ask = _Request(con, policy, eps, dlt, strategy, calibration, objective, target)
    pool = Pool(policy, workload, records) if records else None
    if pool is not None and pool.too_costly:
        return _noted(_afresh(ask, workload), pool.too_costly)
    pool = usable_pool(policy, workload, records, pool)
    if pool is None:
        return _afresh(ask, workload)
    old = pool.analyse(workload.W)
    free, full = free_rows(ask, workload, old)
    if free.all():
        return _all_free(policy, workload, pool, old, free)
    decision = fresh_sub_batch(ask, workload, pool, free, full)
    if decision is None:
        # too many measurements to combine (e.g. identity on a very wide product): the batch
        # is measured afresh, as without reuse
        return _afresh(ask, workload)
    return decision


def _noted(decision: Decision, note: str) -> Decision:
    """The decision with a row in explain's table saying why past releases were not used."""
    from dpsql.store.results import Candidate

    row = Candidate("reuse", math.nan, math.nan, math.nan, np.zeros(0), note=note)
    decision.expl = replace(decision.expl, candidates=decision.expl.candidates + (row,))
    return decision


def usable_pool(policy, workload, records, pool: Pool | None = None) -> Pool | None:
    """Step 1: the pool of the past releases that fit its limits (:class:`Pool`), or None
    when there are none."""
    if pool is None:
        pool = Pool(policy, workload, records) if records else None
    if pool is None or not pool.records:
        return None
    return pool


def free_rows(ask: _Request, workload, old: Analysis) -> tuple[np.ndarray, tuple | None]:
    """Step 2: ``(free, full)``: the rows the pool answers at least as accurately as this
    request asks; ``full`` is ``(ε, selection)`` of the whole batch measured afresh when that
    was needed to tell (a request at a given ε), else None."""
    se_old = np.sqrt(old.variance)
    if ask.target is None:
        full = ask.fresh(workload)
        return old.estimable & (se_old <= full[1].stderr * (1 + 1e-9)), full
    free = old.estimable & (se_old <= ask.target)
    if ask.objective == "rmse" and old.estimable.all() and len(se_old) \
            and math.sqrt(float(np.mean(old.variance))) <= ask.target:
        free[:] = True     # the RMSE target is the batch's: past releases meet it
    return free, None


def fresh_sub_batch(ask: _Request, workload, pool: Pool, free: np.ndarray,
                    full: tuple | None) -> Decision | None:
    """Step 3: the rows not free, selected for and measured as a batch of their own (at the
    requested ε, or the smallest ε at which the *combined* error meets the target), added to
    the pool as its planned term; every answer's error combines old and new. None when the
    pool cannot take the new measurement."""
    if free.any() or full is None:
        rest = sub_workload(workload, ~free)
        cost, new = ask.fresh(rest)
        if ask.target is not None:      # the smallest ε meeting the target *combined*
            cost, new = tight.combined_epsilon(
                pool, workload, new, cost, ask.dlt, ask.calibration, ask.target,
                ask.objective, lambda e: ask.select(rest, e),
                lambda c, scale: record_of(0, workload, c.plan.A,
                                           np.zeros(c.plan.n_measurements), c.mechanism,
                                           scale, limit=False))
    else:
        cost, new = full
    best = next(c for c in new.candidates
                if c.strategy == new.strategy and c.mechanism == new.mechanism)
    m = best.plan.n_measurements
    rec = record_of(0, workload, best.plan.A, np.zeros(m), new.mechanism, new.sigma,
                    limit=False)
    if not pool.can_add(rec):
        return None
    planned = pool.add(rec)
    stderr = np.sqrt(pool.analyse(workload.W).variance)
    expl = replace(new, stderr=stderr, rmse=float(np.sqrt(np.mean(stderr ** 2))),
                   n_queries=workload.n_queries, statements=_statements(workload),
                   free=tuple(int(k) for k in np.flatnonzero(free)),
                   reused_from=pool.release_ids)
    return Decision(expl, new, cost, pool, free, planned)


def _afresh(ask: _Request, workload) -> Decision:
    """The whole batch measured afresh, as without past releases."""
    cost, expl = ask.fresh(workload)
    return Decision(expl, expl, cost, None, np.zeros(workload.n_queries, bool))


def _all_free(policy, workload, pool: Pool, old: Analysis, free: np.ndarray) -> Decision:
    """Every row answered by past releases alone: nothing to measure, nothing charged."""
    se_old = np.sqrt(old.variance)
    rmse = float(np.sqrt(np.mean(old.variance))) if len(se_old) else 0.0
    expl = _Explanation(policy.table, 0.0, 0.0, "reuse", math.nan, rmse, se_old,
                        workload.n_queries, workload.n_cells, (), _statements(workload),
                        mechanism="reuse", free=tuple(range(len(se_old))),
                        reused_from=pool.release_ids)
    return Decision(expl, None, Fraction(0), pool, free)


def _statements(workload) -> tuple:
    """Each statement's index and its rows in ``W``, as an explanation reports them."""
    return tuple((o.query.index, o.start, o.stop) for o in workload.outputs)

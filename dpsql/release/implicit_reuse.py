"""Answers from past releases for a batch compiled to Kronecker blocks (issue 16).

:func:`plan` plans the batch as :class:`~dpsql.release.implicit.ImplicitPlan` does, then asks
the past releases (:func:`dpsql.mechanisms.reuse.blocks.analyse`: GLS per region over the
clique marginals, public inputs only) which rows they answer. Same rule as dense batches
(:mod:`dpsql.mechanisms.reuse.decide`): a row is *free* when past releases answer it no less
accurately than this request would (its GLS standard error at most the one the batch gets
at this ε). Then:

- every row free: nothing is measured, nothing is charged (:class:`FreeImplicitPlan`);
- every row of some blocks free: those blocks are answered from past releases and only the
  other blocks are planned and measured, at the requested ε (:class:`ReusedImplicitPlan`):
  one charge, the same ε as without past releases, spent on fewer blocks;
- otherwise (or when the analysis is skipped for its cost, or nothing stored informs the
  batch) the batch is planned exactly as without past releases, and explain says why.

Privacy: past measurements are the output of releases already charged; answering from them
is post-processing (Dwork & Roth 2014, Prop. 2.1). The new measurement goes through the
kernel like any other. Which rows are free depends on stored releases and public sizes only.

Old and new combine per region (:meth:`dpsql.mechanisms.reuse.blocks.Past.combine`): the
new measurement's pieces over subsets of a region's columns join that region's GLS pool, so
its rows are answered by one GLS over old and new measurements of its marginal, where the
pool's limits allow; a row takes that answer when its variance is smaller than the new
measurement's own, else the new answer (a public choice; each is unbiased with its
reported error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from dpsql.mechanisms.reuse import blocks as reuse_blocks
from dpsql.mechanisms.reuse import records as reuse_records
from dpsql.mechanisms.reuse.records import marginal_records
from dpsql.noise.accounting import PrivacyCost
from dpsql.release.implicit import ImplicitPlan
from dpsql.release.mechanism import Answers, Ask, Cost, FreePlan, Plan, Public, Shown
from dpsql.release.support import _request_params
from dpsql.store.results import Candidate, Explanation

#: what explain says of old and new answers in a partly free batch compiled to blocks
RULE = ("an answer whose clique holds past measurements combines them with the new ones by "
        "generalised least squares over that clique's marginal, where that is affordable and "
        "more accurate (else the new measurement answers it)")


def plan(ask: Ask, public: Public, policy, queries, workload) -> Plan:
    """The batch's plan given past releases (module docstring)."""
    base = ImplicitPlan.of(ask, public, policy, queries, workload)
    if not ask.reuse:
        return base
    records = reuse_records.load(public.con, policy, public.private, public.reuse_from)
    if not records:
        return base
    if ask.nonnegative:
        return _noted(base, "skipped: nonnegative answers on a batch compiled to blocks "
                            "are estimated from its own measurements only")
    past, why = reuse_blocks.analyse(policy, workload, records)
    if past is None:
        return _noted(base, why) if why else base
    se = base.explanation.stderr
    free = past.estimable & (np.sqrt(past.variance) <= se * (1 + 1e-9))
    if free.all():
        return FreeImplicitPlan.of(ask, policy, queries, workload, past)
    kept = _measured_blocks(workload, free)
    if len(kept) == len(workload.union.blocks):      # nothing free: all measured, as base
        sub, fed, new = workload, np.arange(workload.n_queries), base
    else:
        sub, fed = _sub_workload(workload, kept)
        new = ImplicitPlan.of(ask, public, policy, queries, sub)
    reused = ReusedImplicitPlan.of_reused(policy, queries, workload, sub, fed, kept, new,
                                          past)
    if not reused.use_old.any():
        return _noted(base, f"no answer free or improved: past releases {_ids(past)} "
                            "inform some rows, but less accurately than this request")
    return reused


def _ids(past) -> str:
    return ", ".join(str(r) for r in past.release_ids)


def _noted(plan: Plan, note: str) -> Plan:
    """``plan`` with a row in explain's table saying why past releases were not used."""
    row = Candidate("reuse", math.nan, math.nan, math.nan, np.zeros(0), note=note)
    expl = plan.explanation
    plan.explanation = replace(expl, candidates=expl.candidates + (row,))
    return plan


def _measured_blocks(workload, free: np.ndarray) -> list[int]:
    """The blocks some of whose rows are not free (in block order)."""
    needed = np.zeros(len(workload.union.blocks), bool)
    for r in workload.rows:
        if not free[r.target].all():
            needed[r.block] = True
    return [int(k) for k in np.flatnonzero(needed)]


def _sub_workload(workload, kept: list[int]):
    """``(sub, fed)``: the batch with only the blocks ``kept`` (same columns), its rows the
    batch's rows ``fed`` those blocks assemble, renumbered in order: what the new
    measurement plans for (its statements are the whole batch's, in explain)."""
    union = replace(workload.union, blocks=tuple(workload.union.blocks[k] for k in kept))
    where = {k: j for j, k in enumerate(kept)}
    mine = [r for r in workload.rows if r.block in where]
    fed = np.unique(np.concatenate([r.target for r in mine]))
    position = np.full(workload.n_queries, -1, dtype=np.int64)
    position[fed] = np.arange(fed.size)
    rows = tuple(replace(r, block=where[r.block], target=position[r.target]) for r in mine)
    return replace(workload, union=union, rows=rows, outputs=(),
                   n_queries=int(fed.size)), fed


def fed_mask(fed: np.ndarray, n: int) -> np.ndarray:
    """The rows ``fed`` as a mask over the batch's ``n`` rows."""
    out = np.zeros(n, bool)
    out[fed] = True
    return out


def _spread(values: np.ndarray, fed: np.ndarray, n: int, fill: float) -> np.ndarray:
    """The sub-batch's per-row ``values`` at the batch's rows ``fed``, ``fill`` elsewhere."""
    out = np.full(n, fill)
    out[fed] = values
    return out


@dataclass
class ReusedImplicitPlan(ImplicitPlan):
    """Only the blocks not free are measured (``workload`` is that sub-batch, its rows the
    batch's rows ``fed``); each row's answer comes from past releases (``use_old``) or from
    the new measurement."""

    whole: object = None
    fed: np.ndarray | None = None
    past: object = None
    use_old: np.ndarray | None = None
    terms: list | None = None        # the new pieces in the regions' pools (Past.combine)

    @classmethod
    def of_reused(cls, policy, queries, whole, sub, fed, kept, new: ImplicitPlan, past):
        """``new``: the plan of the blocks ``kept`` (``sub``, the batch's rows ``fed``)."""
        n = whole.n_queries
        terms = past.combine(sub, kept, new.choice.plan, new.choice.mechanism,
                             new.explanation.sigma)
        se_new = _spread(new.explanation.stderr, fed, n, math.inf)
        use_old = past.estimable & (np.sqrt(past.variance) < se_new)
        stderr = np.where(use_old, np.sqrt(past.variance), se_new)
        rmse = float(np.sqrt(np.mean(stderr ** 2))) if stderr.size else 0.0
        ids = past.release_ids
        expl = replace(new.explanation, stderr=stderr, rmse=rmse,
                       free=tuple(int(k) for k in np.flatnonzero(~fed_mask(fed, n))),
                       reused_from=ids, reuse_rule=RULE, n_queries=n,
                       statements=tuple((o.query.index, o.start, o.stop)
                                        for o in whole.outputs))
        return cls(policy, queries, expl,
                   replace(new.cost, expected_rmse=rmse, n_queries=n,
                           reused_from=",".join(str(r) for r in ids)),
                   replace(new.shown, expected_rmse=rmse), workload=sub, choice=new.choice,
                   post=new.post, rounds=new.rounds, whole=whole, fed=fed, past=past,
                   use_old=use_old, terms=terms)

    def infer(self, m) -> Answers:
        n = self.whole.n_queries
        self.past.fill(self.terms, self.workload, self.choice.plan, m.y,
                       self.choice.mechanism, self.explanation.sigma)
        new = _spread(self.choice.answers(m.y), self.fed, n, math.nan)
        answers = np.where(self.use_old, self.past.answers(), new)
        halfwidth = np.where(self.use_old, self.past.halfwidths(), _spread(
            self.choice.halfwidth(self.explanation.sigma), self.fed, n, math.inf))
        answers, comment = _rounded(answers, self.post[1])
        stderr = self.explanation.stderr
        parts = [(out, answers, stderr, halfwidth) for out in self.whole.outputs]
        record = marginal_records(m.release_id, self.workload, self.choice.plan, m.y,
                                  self.choice.mechanism, self.explanation.sigma)
        return Answers(parts, comment, record or None)


class FreeImplicitPlan(FreePlan):
    """Every answer comes from past releases (:class:`~dpsql.release.mechanism.FreePlan`'s
    measure and infer: nothing is measured, nothing is spent; the release is still recorded
    at zero cost), planned for a wide batch from the clique pools."""

    @classmethod
    def of(cls, ask, policy, queries, workload, past):
        se = np.sqrt(past.variance)
        rmse = float(np.sqrt(np.mean(past.variance))) if se.size else 0.0
        statements = tuple((o.query.index, o.start, o.stop) for o in workload.outputs)
        expl = Explanation(policy.table, 0.0, 0.0, "reuse", math.nan, rmse, se,
                           workload.n_queries, workload.n_cells, (), statements,
                           mechanism="reuse", free=tuple(range(se.size)),
                           reused_from=past.release_ids)
        params = _request_params(ask.epsilon, ask.delta, ask.strategy, ask.calibration,
                                 "dp") | ask.flags
        plan = cls(policy, queries, expl,
                   Cost(cost=PrivacyCost(0, 0), mechanism="reuse", strategy="reuse",
                        n_queries=workload.n_queries, n_cells=workload.n_cells,
                        params=params, rho=0.0, expected_rmse=rmse,
                        reused_from=",".join(str(r) for r in past.release_ids)),
                   Shown(0.0, 0.0, "reuse", math.nan, rmse))
        if ask.release:
            answers, comment = _rounded(past.answers(), ask.integer)
            plan.answers = Answers([(out, answers, se, past.halfwidths())
                                    for out in workload.outputs], comment)
        return plan


def _rounded(answers, integer: bool):
    """(answers, comment): the integer post-processing (free: it reads released values only)."""
    if not integer:
        return answers, None
    return np.rint(answers), ("dpsql post-processing: rounded to integers. stderr, ci_low "
                              "and ci_high describe the unrounded estimate.")

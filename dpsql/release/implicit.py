"""The matrix mechanism on a batch compiled to Kronecker blocks (issue 16).

Same path as :mod:`dpsql.release.matrix` — plan (public) → kernel → infer — but nothing is
built on the full product of the columns: the strategy is measured through the cliques'
marginals (:meth:`dpsql.kernel.boundary.Kernel.release_marginals`) and the answers and their
exact standard errors are computed block by block (:mod:`dpsql.inference.implicit`). Gaussian
(residual) or Laplace (each clique's marginal) noise, as :func:`dpsql.mechanisms.implicit.select`
chose.

Consistency post-processing: ``nonnegative`` answers come from the local-polytope estimate
of the measured marginals (:mod:`dpsql.inference.pgm`, Private-PGM relaxed), its rounds
bounded from public sizes before the charge; ``integer`` rounds the answers.

What the implicit path does not do yet sends the batch to the dense form instead
(:func:`compile_for`; the dense compile refuses products over its cell limit with the sizes
and how to split): a strategy named explicitly, accuracy targets, and SUM/AVG
(:mod:`dpsql.release.joint`). Its measurements are kept for later batches, one piece per
clique measurement over that measurement's columns only
(:func:`dpsql.mechanisms.reuse.records.marginal_records`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dpsql.mechanisms import implicit as selection
from dpsql.mechanisms.reuse.records import marginal_records
from dpsql.noise.accounting import PrivacyCost
from dpsql.noise.gaussian import rounding_slack, zcdp_rho
from dpsql.workload.values import times_contribution
from dpsql.release.mechanism import Answers, Ask, Cost, Plan, Public, Shown
from dpsql.release.support import _request_params


def _dense_only(ask: Ask, policy, queries=()) -> str | None:
    """Why this request needs the dense form, or None when the implicit path serves it."""
    from dpsql.sql.vectors import has_values

    if has_values(queries):
        return "SUM or AVG (a measurement block per data vector)"
    if ask.strategy != "auto":
        return f"strategy {ask.strategy!r}"
    if ask.objective is not None:
        return "an accuracy target"
    return None


def compile_for(ask: Ask, public: Public):
    """(policy, queries, workload): the implicit form when the batch is large and the
    request is one the implicit path serves, else the dense form."""
    from dpsql.sql import memo

    from dpsql.errors import UnsupportedQueryError
    from dpsql.sql.compile import MAX_CELLS

    policy, queries = public.parse(ask.sql)
    key = memo.batch_key(ask.sql, public.policies)
    workload = memo.compiled(key, queries, policy, implicit=True)
    reason = _dense_only(ask, policy, queries) if getattr(workload, "implicit", False) \
        else None
    if reason is not None:
        if workload.n_cells > MAX_CELLS:
            raise UnsupportedQueryError(
                f"{reason} needs the batch's full cell product, and this batch's has "
                f"{workload.n_cells:,} cells (limit {MAX_CELLS:,}): batches this wide are "
                "answered through Kronecker blocks, which do not serve it yet; nothing was "
                "charged; ask without it (strategy auto, epsilon) or split the batch over "
                "fewer columns")
        workload = memo.compiled(key, queries, policy)
    return policy, queries, workload


#: an implicit batch with conditions inside its blocks (ranges, IN lists: rows with several
#: ones) is also planned in the dense form when its product has at most this many cells, and
#: the better one is used. The issue's feasibility bound for the dense optimum is 8,192 cells,
#: but its selection takes minutes there on this machine (eigen 6 s and optimal 148 s at 702
#: cells under load), so the comparison stops at 2,048.
DENSE_COMPARE_CELLS = 2048


def _has_conditions(workload) -> bool:
    """Whether some block row sums several parts of a column without being the all-ones
    row (a range or IN list: what the residual plan does not optimise for)."""
    for block in workload.union.blocks:
        for i in block.used:
            F = block.factors[i]
            if F.shape[0] > 1 and np.any((F != 0).sum(axis=1) > 1):
                return True
            if F.shape[0] == 1 and 1 < np.count_nonzero(F) < F.shape[1]:
                return True
    return False


def dense_alternative(ask: Ask, public: Public, policy, queries, workload):
    """The dense form of a small implicit batch with conditions inside its blocks, for
    ``auto`` to compare with the structured plan (None: not compared)."""
    from dpsql.sql import memo

    if workload.n_cells > DENSE_COMPARE_CELLS or not _has_conditions(workload):
        return None
    return memo.compiled(memo.batch_key(ask.sql, public.policies), queries, policy)


def better(structured: "ImplicitPlan", dense: Plan) -> Plan:
    """The plan with the smaller expected RMSE; the loser is listed in explain's table."""
    from dataclasses import replace

    s, d = structured.explanation, dense.explanation
    mine = tuple(c for c in s.candidates if np.isfinite(c.rmse))
    if d.rmse < s.rmse:
        dense.explanation = replace(d, candidates=d.candidates + mine)
        return dense
    dense_rows = tuple(c for c in d.candidates if np.isfinite(c.rmse))
    kept = tuple(c for c in s.candidates
                 if not any(c.strategy == o.strategy for o in dense_rows))
    structured.explanation = replace(s, candidates=kept + dense_rows)
    return structured


@dataclass
class ImplicitPlan(Plan):
    """Gaussian measurements of the residual strategy, read through marginals."""

    workload: object = None
    choice: object = None
    post: tuple = (False, False)     # (nonnegative, integer)
    rounds: int = 0                  # the non-negative estimate's most rounds

    @classmethod
    def of(cls, ask: Ask, public: Public, policy, queries, workload) -> "ImplicitPlan":
        eps = ask.epsilon
        expl, choice = selection.select(policy, workload, eps, ask.delta, ask.calibration)
        params = _request_params(eps, ask.delta, ask.strategy, ask.calibration, "dp") \
            | ask.flags
        scale, mplan = expl.sigma, choice.plan
        gaussian = choice.mechanism == "gaussian"
        k = policy.contribution          # rows per unit of privacy (1: a row)
        rho = zcdp_rho(scale, times_contribution(k, mplan.sensitivity)
                       + rounding_slack(scale, mplan.n_measurements)) \
            if gaussian else float(eps) ** 2 / 2.0
        cost = PrivacyCost(eps, ask.delta if gaussian else 0)
        if gaussian and k != 1:                   # a script's pre-check reads it (x k)
            expl = replace(expl, planned_rho=rho)
        return cls(
            policy, queries, expl,
            Cost(cost=cost, mechanism=choice.mechanism, strategy=expl.strategy,
                 n_queries=workload.n_queries, n_cells=workload.n_cells, params=params,
                 calibration=ask.calibration if gaussian else None, sigma=scale,
                 sensitivity=k * choice.sensitivity, rho=rho, expected_rmse=expl.rmse,
                 bound_ratio=expl.bound_ratio),
            Shown(float(eps), float(cost.delta), expl.strategy, scale, expl.rmse),
            workload=workload, choice=choice, post=(ask.nonnegative, ask.integer),
            rounds=_affordable_rounds(choice, workload) if ask.nonnegative else 0)

    def measure(self, handle):
        return handle.release(self.workload, self.choice.plan, self.explanation.sigma,
                              mechanism=self.choice.mechanism)

    def infer(self, m) -> Answers:
        answers = self.choice.answers(m.y)
        stderr = self.explanation.stderr
        halfwidth = self.choice.halfwidth(self.explanation.sigma)
        answers, comment = _post_process(self, m.y, answers)
        parts = [(out, answers, stderr, halfwidth) for out in self.workload.outputs]
        record = marginal_records(m.release_id, self.workload, self.choice.plan, m.y,
                                  self.choice.mechanism, self.explanation.sigma)
        return Answers(parts, comment, record or None)


def _affordable_rounds(choice, workload) -> int:
    """The non-negative estimate's most rounds within the request's limits (public sizes);
    refused before any charge when it cannot run."""
    from dpsql.errors import BatchTooLarge
    from dpsql.inference import pgm
    from dpsql.workload import limits as planning

    limit = planning.current()
    rounds, why = pgm.planned_rounds(workload.union.sizes,
                                     pgm.block_measurements(workload.union.blocks), limit)
    if why is not None:
        raise BatchTooLarge(
            f"nonnegative answers for this batch are too costly within {limit.describe()}: "
            f"the estimate {why}; nothing was charged; ask without nonnegative, split the "
            "batch (fewer columns per statement), or raise max_memory / time_limit")
    return rounds


def _post_process(plan: ImplicitPlan, y, answers):
    """(answers, the tables' comment): the local-polytope estimate's answers when
    non-negative answers were asked, rounded when integers were (post-processing of ``y``)."""
    nonnegative, integer = plan.post
    if not (nonnegative or integer):
        return answers, None
    notes = []
    if nonnegative:
        from dpsql.inference import pgm

        union = plan.workload.union
        least_squares = np.concatenate([np.ravel(a) for a in plan.choice.block_answers(y)])
        marginals = getattr(plan.choice, "region_marginals", None)
        tables, rounds = pgm.estimate(
            union.sizes, pgm.block_measurements(union.blocks), least_squares,
            max_rounds=plan.rounds,
            start=None if marginals is None else (lambda regions: marginals(y, regions)))
        answers = plan.workload.assemble([pgm.block_answers(tables, b, union.sizes)
                                          for b in union.blocks])
        notes.append("the least-squares answers projected onto those of non-negative, "
                     "consistent marginals (a Private-PGM estimate over the local "
                     f"polytope, {rounds} rounds)")
    if integer:
        answers = np.rint(answers)
        notes.append("rounded to integers")
    return answers, ("dpsql post-processing: " + "; ".join(notes) + ". stderr, ci_low and "
                     "ci_high describe the unconstrained least-squares estimate.")

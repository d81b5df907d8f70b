"""The matrix mechanism as a release-path mechanism: Gaussian or Laplace noise on a selected
strategy (:mod:`dpsql.mechanisms.selection`), combined with past releases' measurements or
answered from them alone (:mod:`dpsql.mechanisms.reuse`), at a given ε or at the smallest ε
that meets an accuracy target. Public inputs only until ``measure``."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dpsql.errors import DpsqlError, StrategyError
from dpsql.inference.least_squares import LeastSquares, consistent
from dpsql.mechanisms import halfwidths
from dpsql.mechanisms.reuse import records as reuse_records
from dpsql.mechanisms.reuse.decide import decide
from dpsql.noise.accounting import PrivacyCost
from dpsql.noise.gaussian import rounding_slack, zcdp_rho
from dpsql.strategies.gaussian.dual import blas_threads
from dpsql.workload.values import times_contribution
from dpsql.release.mechanism import Answers, Ask, Cost, FreePlan, Plan, Public, Shown
from dpsql.release.support import _request_params


def plan(ask: Ask, public: Public) -> Plan:
    """How the batch is answered and what it costs:
    :func:`dpsql.mechanisms.reuse.decide.decide` (strategy selection over the rows not
    answered free by past releases), or, for a batch compiled to Kronecker blocks,
    :class:`dpsql.release.implicit.ImplicitPlan`, or, for a batch with SUM/AVG,
    :func:`dpsql.release.joint.plan` (one block per data vector, one charge).

    Planned on one BLAS thread (:func:`~dpsql.strategies.gaussian.dual.blas_threads`; its
    forked planning workers inherit it): the candidates' factorisations are small and many,
    and two OpenBLAS threads spin-wait on a shared machine — the 5-column split batch of
    ``benchmarks/highdim_sql.py`` took 15 s of CPU with two and 7 s with one."""
    with blas_threads():
        return _plan(ask, public)


def _plan(ask: Ask, public: Public) -> Plan:
    from dpsql.release import implicit, implicit_reuse, joint
    from dpsql.sql.vectors import has_values

    policy, queries, workload = implicit.compile_for(ask, public)
    if ask.objective is not None and policy.privacy_unit is not None:
        raise StrategyError(f"accuracy targets are not served on table {policy.table!r}, which "
                         f"declares privacy unit {policy.privacy_unit!r}; ask by epsilon")
    if has_values(queries):                   # SUM / AVG: one release of several blocks
        return joint.plan(ask, public, policy, queries, workload)
    if getattr(workload, "implicit", False):
        structured = implicit_reuse.plan(ask, public, policy, queries, workload)
        dense = implicit.dense_alternative(ask, public, policy, queries, workload)
        if dense is None:
            return structured
        try:
            other = _dense_plan(ask, public, policy, queries, dense)
        except DpsqlError:         # over the planning limits, or no dense candidate fits
            return structured
        return implicit.better(structured, other)
    return _dense_plan(ask, public, policy, queries, workload)


def _dense_plan(ask: Ask, public: Public, policy, queries, workload) -> Plan:
    records = (reuse_records.load(public.con, policy, public.private, public.reuse_from)
               if ask.reuse else [])
    objective, target = ask.objective if ask.objective is not None else ("rmse", None)
    d = decide(public.con, policy, workload, records,
               None if ask.objective else ask.epsilon, ask.delta, ask.strategy,
               ask.calibration, objective, target)
    eps = ask.epsilon
    if ask.objective is not None:
        eps = d.epsilon
        if ask.release and d.new is not None and ask.confirm is not True:
            raise DpsqlError(
                f"an expected {objective.replace('_', ' ')} of {target:g} needs epsilon = "
                f"{float(eps):g} (delta = {float(ask.delta):g}, strategy "
                f"{d.expl.strategy}); nothing was charged; pass confirm=True to spend it")
    params = _request_params(eps, ask.delta, ask.strategy, ask.calibration, "dp") | ask.flags
    kind = FreeMatrixPlan if d.new is None else MatrixPlan
    return kind.of(ask, public, policy, queries, workload, d, eps, params)


@dataclass
class MatrixPlan(Plan):
    """New measurements ``y = A x + noise`` on the chosen strategy (the rows not free)."""

    workload: object = None
    decision: object = None
    best: object = None              # the chosen Candidate (plan, sensitivity, solver)
    halfwidth: object = None         # the answers' 95% interval half-widths (answer only)
    post: tuple = (False, False)     # (nonnegative, integer)
    _solver: object = None

    @classmethod
    def of(cls, ask, public, policy, queries, workload, d, eps, params):
        expl, new = d.expl, d.new
        best = next(c for c in new.candidates if c.strategy == new.strategy
                    and c.mechanism == new.mechanism)
        gaussian = new.mechanism == "gaussian"
        cost = PrivacyCost(eps, ask.delta if gaussian else 0)
        rho = _rho(new, eps, best.plan, policy.contribution)
        if gaussian and policy.contribution != 1:    # a script's pre-check reads it (x k)
            expl = replace(expl, planned_rho=rho)
        plan = cls(
            policy, queries, expl,
            Cost(cost=cost, mechanism=new.mechanism, strategy=new.strategy,
                 n_queries=workload.n_queries, n_cells=workload.n_cells, params=params,
                 calibration=ask.calibration if gaussian else None, sigma=new.sigma,
                 sensitivity=best.sensitivity, rho=rho,
                 expected_rmse=expl.rmse, bound_ratio=new.bound_ratio,
                 reused_from=_sources(d)),
            Shown(float(eps), float(cost.delta), expl.strategy, new.sigma, expl.rmse),
            workload=workload, decision=d, best=best, post=(ask.nonnegative, ask.integer))
        if ask.release:
            plan.halfwidth = plan._halfwidths(public.con)
        return plan

    @property
    def solver(self):
        if self._solver is None:
            self._solver = self.best.solver or LeastSquares(self.best.plan)
        return self._solver

    def _halfwidths(self, con):
        d = self.decision
        if d.pool is None:
            return halfwidths.interval_halfwidths(con, self.explanation, self.solver,
                                                 self.workload)
        return d.pool.halfwidths(self.workload.W, self.explanation.stderr ** 2)

    def measure(self, handle):
        new = self.decision.new
        return handle.release(self.workload, self.best.plan, new.sigma,
                              mechanism=new.mechanism)

    def infer(self, m) -> Answers:
        d, W, chosen = self.decision, self.workload.W, self.best.plan
        if d.pool is None:
            answers = self.solver.answers(W, m.y)
        else:
            d.pool.set_y(d.planned, m.y)
            answers = d.pool.answers(W)
        answers, comment = _post_process(d, chosen, W, m.y, answers, *self.post)
        stderr = self.explanation.stderr
        parts = [(out, answers, stderr, self.halfwidth) for out in self.workload.outputs]
        record = reuse_records.record_of(m.release_id, self.workload, chosen.A, m.y,
                                         d.new.mechanism, d.new.sigma)
        return Answers(parts, comment, record)


class FreeMatrixPlan(FreePlan):
    """A dense batch answered wholly from past releases (:class:`FreePlan`)."""

    @classmethod
    def of(cls, ask, public, policy, queries, workload, d, eps, params):
        expl = d.expl
        plan = cls(
            policy, queries, expl,
            Cost(cost=PrivacyCost(0, 0), mechanism="reuse", strategy="reuse",
                 n_queries=workload.n_queries, n_cells=workload.n_cells, params=params,
                 rho=0.0, expected_rmse=expl.rmse, reused_from=_sources(d)),
            Shown(0.0, 0.0, "reuse", math.nan, expl.rmse))
        if ask.release:
            W = workload.W
            halfwidth = d.pool.halfwidths(W, expl.stderr ** 2)
            answers, comment = _post_process(d, None, W, None, d.pool.answers(W),
                                             ask.nonnegative, ask.integer)
            plan.answers = Answers([(out, answers, expl.stderr, halfwidth)
                                    for out in workload.outputs], comment)
        return plan


def _sources(d) -> str | None:
    """The past releases a decision combines, as recorded in the ledger."""
    return ",".join(str(r) for r in d.pool.release_ids) if d.pool is not None else None


def _post_process(d, plan, W, y, answers, nonnegative: bool, integer: bool):
    """Consistency post-processing (:func:`dpsql.inference.least_squares.consistent`): over
    the plan's measurements, or over every combined measurement when past releases are
    reused."""
    if not (nonnegative or integer):
        return answers, None
    if d.pool is not None:
        A, ys, Wr = d.pool.stacked(W)
        return consistent(_Stacked(A), Wr, ys, answers, nonnegative, integer)
    return consistent(plan, W, y, answers, nonnegative, integer)


class _Stacked:
    """The weighted stack of every combined measurement, seen as one plan."""

    def __init__(self, A):
        self.A = A


def _rho(expl, eps, plan, contribution: int = 1) -> float:
    """zCDP cost recorded with the charge: Δ²/2σ² (Gaussian, Bun & Steinke 2016 Prop. 1.6,
    grid slack included; Δ times the rows per unit of privacy) or ε²/2 (pure ε-DP implies
    ε²/2-zCDP, ibid. Prop. 1.4)."""
    if expl.mechanism == "laplace":
        return float(eps) ** 2 / 2.0
    return zcdp_rho(expl.sigma, times_contribution(contribution, plan.sensitivity)
                    + rounding_slack(expl.sigma, plan.n_measurements))

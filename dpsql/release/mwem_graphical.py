"""``strategy='mwem'`` on a batch the factored form cannot hold (issue 16): MWEM over a
graphical model (:mod:`dpsql.mechanisms.mwem.graphical`), measured through the cliques'
marginals (:meth:`dpsql.kernel.boundary.Kernel.release_adaptive_marginals`).

:func:`dpsql.release.adaptive.plan_mwem` tries the factored form first (one dense weight
vector per connected group of columns); when a group's product is over the dense cell limit
it comes here, with the batch compiled to Kronecker blocks. Public only until ``measure``:
the options, the spends and the run's time and memory are checked from public sizes
(:func:`~dpsql.mechanisms.mwem.graphical.planned_work`) before anything is charged; the
kernel then charges the full ε once and runs the algorithm against its marginal oracle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from dpsql.mechanisms import catalog
from dpsql.mechanisms.mwem import graphical
from dpsql.noise.accounting import PrivacyCost
from dpsql.release.mechanism import Answers, Ask, Cost, Plan, Public, Shown
from dpsql.release.support import _request_params


def implicit_workload(ask: Ask, public: Public, policy, queries):
    """The batch as Kronecker blocks when its full product is over the dense limit, else
    None (the factored form's refusal was about something else)."""
    from dpsql.sql import memo
    from dpsql.sql.compile import MAX_CELLS

    key = memo.batch_key(ask.sql, public.policies)
    workload = memo.compiled(key, queries, policy, implicit=True)
    if not getattr(workload, "implicit", False) or workload.n_cells <= MAX_CELLS:
        return None
    return workload


@dataclass
class GraphicalMWEMPlan(Plan):
    """MWEM over a graphical model: one charge, then the kernel's marginal oracle."""

    workload: object = None
    candidates: tuple = ()
    algorithm: object = None

    def measure(self, handle):
        return handle.release_adaptive_marginals(
            self.workload, self.candidates, Fraction(self.cost.cost.epsilon), self.algorithm)

    def infer(self, result) -> Answers:
        answers = self.workload.assemble(result.answers)
        blank = np.full(len(answers), math.nan)
        return Answers([(out, answers, blank, blank) for out in self.workload.outputs],
                       "dpsql: MWEM over a graphical model (" + "; ".join(result.notes)
                       + "); data-dependent error, no standard errors", None)


def plan(ask: Ask, public: Public, policy, queries, workload, options) -> GraphicalMWEMPlan:
    """The plan (public only): refused here, before the charge, when the options are not
    carried over or the run cannot fit the request's limits."""
    from dpsql.workload import limits as planning

    eps = Fraction(ask.epsilon)
    inner, final = graphical.planned_work(workload.union, eps, options,
                                          planning.current(), ask.strategy)
    expl = catalog.explain_mwem(policy, [(workload, ())], ask.epsilon, options, ask.strategy)
    candidates = graphical.candidates_of(workload.union)
    note = (f"MWEM over a graphical model (MWEM+PGM, McKenna et al. ICML 2019; AIM §4): "
            f"{len(candidates)} candidate marginals, the model their region marginals, "
            f"never the {workload.n_cells:,}-cell product; at most {inner} estimate rounds "
            f"per measurement. Its error is data-dependent; the bound that follows is plain "
            f"MWEM's on the full product, not a guarantee of this form. ")
    expl = replace(expl, candidates=tuple(replace(c, note=note + c.note)
                                          for c in expl.candidates))

    def algorithm(oracle):
        return graphical.run_mwem_graphical(workload.union, eps, oracle, options, inner,
                                            final)

    cost = Cost(cost=PrivacyCost(ask.epsilon, 0), mechanism="mwem", strategy=ask.strategy,
                n_queries=workload.n_queries, n_cells=workload.n_cells,
                params=_request_params(ask.epsilon, 0, ask.strategy, "analytic", "dp"),
                sensitivity=1.0, rho=float(ask.epsilon) ** 2 / 2.0)
    return GraphicalMWEMPlan(policy, queries, expl, cost,
                             Shown(float(ask.epsilon), 0.0, ask.strategy),
                             workload=workload, candidates=candidates, algorithm=algorithm)

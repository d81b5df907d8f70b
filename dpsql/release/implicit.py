"""The matrix mechanism on a batch compiled to Kronecker blocks (issue 16).

Same path as :mod:`dpsql.release.matrix` — plan (public) → kernel → infer — but nothing is
built on the full product of the columns: the strategy is measured through the cliques'
marginals (:func:`dpsql.kernel.release_marginals`) and the answers and their exact standard
errors are computed block by block (:mod:`dpsql.inference.implicit`).

What the implicit path does not do yet sends the batch to the dense form instead
(:func:`compile_for`; the dense compile refuses products over its cell limit with the sizes
and how to split): pure ε-DP (δ = 0, Laplace), a strategy named explicitly, accuracy targets,
and nonnegative/integer post-processing. Answers from past releases are not combined with an
implicit batch (explain says so); its measurements are not stored for reuse.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpsql.mechanisms import implicit as selection
from dpsql.noise.accounting import PrivacyCost
from dpsql.noise.gaussian import rounding_slack, zcdp_rho
from dpsql.release.mechanism import Answers, Ask, Cost, Plan, Public, Shown
from dpsql.release.support import _request_params
from dpsql.store.results import Z95


def _dense_only(ask: Ask, policy) -> str | None:
    """Why this request needs the dense form, or None when the implicit path serves it."""
    if ask.delta == 0 or policy.delta == 0:
        return "pure epsilon-DP"
    if ask.strategy != "auto":
        return f"strategy {ask.strategy!r}"
    if ask.objective is not None:
        return "an accuracy target"
    if ask.nonnegative or ask.integer:
        return "nonnegative/integer answers"
    return None


def compile_for(ask: Ask, public: Public):
    """(policy, queries, workload): the implicit form when the batch is large and the
    request is one the implicit path serves, else the dense form."""
    from dpsql.sql import memo

    policy, queries = public.parse(ask.sql)
    key = memo.batch_key(ask.sql, public.policies)
    workload = memo.compiled(key, queries, policy, implicit=True)
    if getattr(workload, "implicit", False) and _dense_only(ask, policy) is not None:
        workload = memo.compiled(key, queries, policy)
    return policy, queries, workload


@dataclass
class ImplicitPlan(Plan):
    """Gaussian measurements of the residual strategy, read through marginals."""

    workload: object = None
    choice: object = None

    @classmethod
    def of(cls, ask: Ask, public: Public, policy, queries, workload) -> "ImplicitPlan":
        eps = ask.epsilon
        expl, choice = selection.select(policy, workload, eps, ask.delta, ask.calibration,
                                        reuse=ask.reuse)
        params = _request_params(eps, ask.delta, ask.strategy, ask.calibration, "dp") \
            | ask.flags
        sigma, mplan = expl.sigma, choice.plan
        rho = zcdp_rho(sigma, mplan.sensitivity + rounding_slack(sigma, mplan.n_measurements))
        cost = PrivacyCost(eps, ask.delta)
        return cls(
            policy, queries, expl,
            Cost(cost=cost, mechanism="gaussian", strategy=expl.strategy,
                 n_queries=workload.n_queries, n_cells=workload.n_cells, params=params,
                 calibration=ask.calibration, sigma=sigma, sensitivity=mplan.sensitivity,
                 rho=rho, expected_rmse=expl.rmse, bound_ratio=expl.bound_ratio),
            Shown(float(eps), float(cost.delta), expl.strategy, sigma, expl.rmse),
            workload=workload, choice=choice)

    def measure(self, handle):
        return handle.release(self.workload, self.choice.plan, self.explanation.sigma,
                              mechanism="gaussian")

    def infer(self, m) -> Answers:
        answers = implicit_answers(self.choice, m.y)
        stderr = self.explanation.stderr
        halfwidth = Z95 * stderr
        parts = [(out, answers, stderr, halfwidth) for out in self.workload.outputs]
        return Answers(parts, None, None)


def implicit_answers(choice, y: np.ndarray) -> np.ndarray:
    """The batch's answers from the residual measurements ``y`` (kernel order), block by
    block (:func:`dpsql.inference.implicit.residual_block_answers`)."""
    from dpsql.inference.implicit import residual_block_answers

    tensors, start = {}, 0
    for meas in choice.plan.measurements:
        shape = tuple(F.shape[0] for F in meas.factors)
        size = int(np.prod(shape, dtype=np.int64))
        tensors[meas.columns] = np.asarray(y[start:start + size]).reshape(shape)
        start += size
    if start != len(y):
        raise ValueError(f"expected {start} measurements, got {len(y)}")
    sizes, a = choice.residual.sizes, choice.residual.a
    per_block = [residual_block_answers(sizes, a, tensors, b)[0]
                 for b in choice.workload.union.blocks]
    return choice.workload.assemble(per_block)

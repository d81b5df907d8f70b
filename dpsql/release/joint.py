"""A batch mixing COUNT with SUM and AVG: one workload, one release, one charge.

Each data vector the batch reads (the counts; the per-cell sums of each bounded value,
:mod:`dpsql.sql.vectors`) is a measurement block whose strategy is chosen as for any batch
(:func:`dpsql.mechanisms.selection.select` on its rows, one noise family: Gaussian when
δ > 0, Laplace when δ = 0). The budget is then split between the blocks to minimise the
batch's total expected error, measured in each aggregate's own unit of one row's largest
contribution:

    minimise  Σ_answers Var(answer) / M²       (M = 1 for COUNT and AVG's count,
                                                M = max(|lo|, |hi|) for a SUM of [lo, hi])

Block ``b`` with strategy sensitivity ``Δ_b`` and error factor ``F_b`` (the sum of its
answers' variances per unit noise variance) gets

- **Gaussian**: the share ``s_b ∝ Δ_b √F_b`` of the whitened sensitivity
  (``σ_b = k M_b Δ_b / (√s_b D)``, ``Σ s_b = 1``, ``D`` the largest whitened sensitivity the
  charged (ε, δ) allows at σ = 1). The objective is ``Σ_b Δ_b² F_b / (s_b D²)``, and
  Lagrange's condition ``Δ_b² F_b / s_b² = λ`` gives the shares;
- **Laplace**: the share ``ε_b ∝ (Δ₁_b² F_b)^(1/3)`` of ε (``b_b ≈ k M_b Δ₁_b / ε_b``, the
  objective ``Σ_b 2 Δ₁_b² F_b / ε_b²``; ``Σ ε_b = ε`` exactly).

The kernel checks the scales together (:mod:`dpsql.kernel.joint`). AVG answers are
post-processing of the release (:mod:`dpsql.inference.ratios`). Not served here, refused
before any charge: accuracy targets, and nonnegative/integer post-processing; past
releases are not combined (their measurements are not stored either). The implicit
(Kronecker) path measures counts only: a batch with SUM/AVG always takes the dense form
(:func:`dpsql.release.implicit.compile_for`), within the dense path's cell limit and the
planning limits (refused over them, naming the sizes, before any charge).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from dpsql.errors import StrategyError
from dpsql.inference import ratios
from dpsql.inference.least_squares import LeastSquares
from dpsql.kernel.joint import block_sensitivity, whitened_sensitivity
from dpsql.mechanisms import halfwidths, selection
from dpsql.noise.accounting import PrivacyCost
from dpsql.noise.gaussian import (calibrate_with_rounding, exact_zcdp_rho, gaussian_shortfall,
                                  rounding_slack, sensitivity_with_slack)
from dpsql.noise.laplace import laplace_scale
from dpsql.release.mechanism import Answers, Ask, Cost, Plan, Public, Shown
from dpsql.release.support import _request_params
from dpsql.sql import vectors
from dpsql.workload.values import JointPlan, ValueBound, VectorPlan

#: shares are rounded to this many parts (exact fractions); the remainder goes to block 0
SHARE_DENOMINATOR = 10 ** 9


def refuse_unserved(ask: Ask, policy, workload) -> None:
    """What a batch with SUM/AVG cannot ask for, refused before any charge."""
    if getattr(workload, "implicit", False):      # compile_for gives SUM batches the dense
        raise StrategyError("internal error: a batch with SUM or AVG reached the "  # form
                            "high-dimensional path")
    if ask.objective is not None:
        raise StrategyError("accuracy targets are for COUNT batches; a batch with SUM or AVG "
                            "asks by epsilon (see its expected errors with explain)")
    if ask.nonnegative or ask.integer:
        raise StrategyError("nonnegative/integer post-processing is for COUNT batches; drop "
                            "it for a batch with SUM or AVG")


def plan(ask: Ask, public: Public, policy, queries, workload) -> "JointReleasePlan":
    """Select a strategy per data vector, split the budget, and price the release."""
    refuse_unserved(ask, policy, workload)
    split = vectors.split(workload)
    family = "laplace" if ask.delta == 0 or policy.delta == 0 else "gaussian"
    chosen = [_select(ask, public, policy, v, family) for v in split.vectors]
    k = policy.contribution
    if family == "gaussian":
        blocks, rho = _gaussian(ask, split, chosen, k)
    else:
        blocks, rho = _laplace(ask, split, chosen, k), float(ask.epsilon) ** 2 / 2
    label = "joint(" + "; ".join(f"{v.label}: {c.strategy}"
                                 for v, (_, c) in zip(split.vectors, chosen)) + ")"
    joint = JointPlan(tuple(blocks), label)
    expls = [_rescaled(e, c, b.scale) for (e, c), b in zip(chosen, blocks)]
    return JointReleasePlan.of(ask, public, policy, queries, split, joint, expls, chosen,
                               family, rho)


def _select(ask, public, policy, vector, family):
    """(Explanation, chosen Candidate) of one data vector's rows, as for any batch."""
    expl = selection.select(public.con, policy, vector.workload, ask.epsilon, ask.delta,
                            ask.strategy, ask.calibration, family=family)
    best = next(c for c in expl.candidates
                if c.strategy == expl.strategy and c.mechanism == expl.mechanism)
    return expl, best


def _factor(expl, best) -> float:
    """``F``: the sum of the answers' variances per unit noise variance."""
    unit = best.sigma ** 2 * (2.0 if best.mechanism == "laplace" else 1.0)
    return float(np.sum(expl.stderr ** 2) / unit)


def _gaussian(ask, split, chosen, k: int) -> tuple[list, float]:
    """Each block's σ (module docstring) and the ρ the charge records."""
    p = sum(c.plan.n_measurements for _, c in chosen)
    sigma_c = calibrate_with_rounding(ask.epsilon, ask.delta, 1.0, p, ask.calibration)
    target = ((1.0 + rounding_slack(sigma_c, p)) / sigma_c
              - math.ldexp(math.sqrt(p), -40)) * (1 - 1e-9)
    weights = [c.plan.sensitivity * math.sqrt(max(_factor(e, c), 1e-300)) for e, c in chosen]
    shares = [w / sum(weights) for w in weights]
    slack = sum(math.ldexp(math.sqrt(c.plan.n_measurements * s), -20)
                / (k * c.plan.sensitivity)
                for (v, (_, c), s) in zip(split.vectors, chosen, shares) if v.value is not None)
    D = target / (1 + slack)
    blocks = []
    for v, (_, c), s in zip(split.vectors, chosen, shares):
        bound = 1.0 if v.value is None else float(ValueBound(v.value.lo, v.value.hi).bound)
        blocks.append(VectorPlan(v.value, c.plan, k * bound * c.plan.sensitivity
                                 / (math.sqrt(s) * D)))
    n = split.base.n_cells
    for _ in range(60):          # float safety: widen until the kernel's own check passes
        whitened = whitened_sensitivity(n, JointPlan(tuple(blocks), ""), k)
        if gaussian_shortfall(1.0, ask.epsilon, ask.delta, whitened, p,
                              ask.calibration) is None:
            rho = exact_zcdp_rho(1.0, sensitivity_with_slack(1.0, whitened, p))
            return blocks, _float_up(rho)
        blocks = [replace(b, scale=b.scale * (1 + 1e-9)) for b in blocks]
    raise StrategyError("internal error: the joint noise scales do not meet the charge")


def _float_up(value: Fraction) -> float:
    f = float(value)
    return f if Fraction(f) >= value else math.nextafter(f, math.inf)


def _laplace(ask, split, chosen, k: int) -> list:
    """Each block's share of ε (exact fractions summing to ε) and its Laplace scale."""
    weights = [(c.plan.l1_sensitivity ** 2 * max(_factor(e, c), 1e-300)) ** (1 / 3)
               for e, c in chosen]
    parts = [Fraction(math.floor(w / sum(weights) * SHARE_DENOMINATOR), SHARE_DENOMINATOR)
             for w in weights]
    parts[0] += 1 - sum(parts)
    eps = Fraction(ask.epsilon)
    blocks = []
    for v, (_, c), part in zip(split.vectors, chosen, parts):
        block = VectorPlan(v.value, c.plan, 1.0, eps * part)
        b = laplace_scale(block.epsilon, block_sensitivity(block, k, "l1"),
                          c.plan.n_measurements)
        blocks.append(replace(block, scale=b))
    return blocks


def _rescaled(expl, best, scale: float):
    """A vector's explanation at its own scale in the joint release."""
    stderr = expl.stderr * (scale / best.sigma)
    rmse = float(np.sqrt(np.mean(stderr ** 2))) if stderr.size else 0.0
    return replace(expl, sigma=scale, stderr=stderr, rmse=rmse)


@dataclass
class JointReleasePlan(Plan):
    """The blocks' measurements in one kernel call; COUNT, SUM and AVG answers from them."""

    split: object = None
    joint: JointPlan | None = None
    parts: tuple = ()             # per vector: (Explanation at its scale, solver)
    halfwidths: tuple = ()

    @classmethod
    def of(cls, ask, public, policy, queries, split, joint, expls, chosen, family, rho):
        eps = ask.epsilon
        cost = PrivacyCost(eps, ask.delta if family == "gaussian" else 0)
        params = _request_params(eps, ask.delta, ask.strategy, ask.calibration, "dp")
        stderr = np.full(split.base.n_queries, np.nan)
        for r, (v, i) in enumerate(split.numerator):
            if split.kinds[r] != "avg":
                stderr[r] = expls[v].stderr[i]
        expl = _explanation(policy, split, joint, expls, family, eps, cost.delta, stderr, rho)
        plan = cls(policy, queries, expl,
                   Cost(cost=cost, mechanism=family, strategy=joint.strategy,
                        n_queries=split.base.n_queries, n_cells=split.base.n_cells,
                        params=params, calibration=ask.calibration if family == "gaussian"
                        else None, rho=rho),
                   Shown(float(eps), float(cost.delta), joint.strategy),
                   split=split, joint=joint,
                   parts=tuple((e, c.solver or LeastSquares(c.plan))
                               for e, (_, c) in zip(expls, chosen)))
        if ask.release:
            plan.halfwidths = tuple(
                halfwidths.interval_halfwidths(public.con, e, solver, v.workload)
                for (e, solver), v in zip(plan.parts, split.vectors))
        return plan

    def measure(self, handle):
        return handle.release(self.split.base, self.joint, math.nan,
                              mechanism=self.cost.mechanism)

    def infer(self, m) -> Answers:
        answers, start = [], 0
        for (_, solver), v in zip(self.parts, self.split.vectors):
            stop = start + solver.plan.n_measurements
            answers.append(solver.answers(v.workload.W, m.y[start:stop]))
            start = stop
        kinds = self.split.kinds
        ranges = [_avg_range(q) for q in self.split.owners]
        value, se, low, high, n_null = ratios.assemble(
            kinds, self.split.numerator, self.split.denominator, answers,
            [e.stderr for e, _ in self.parts], list(self.halfwidths), ranges)
        parts = [(out, value, se, (high - low) / 2, (low, high))
                 for out in self.split.base.outputs]
        return Answers(parts, ratios.comment(kinds, n_null), None)


def _explanation(policy, split, joint, expls, family, eps, delta, stderr, rho):
    """What explain prints for a joint release: one line per data vector, in its own units
    (never one figure mixing counts and sums), and the AVG answers."""
    k = policy.contribution
    if family == "gaussian":
        weights = [float(b.bound * k) ** 2 * b.plan.sensitivity ** 2 / b.scale ** 2
                   for b in joint.blocks]
        shares = [w / sum(weights) for w in weights]
        scale, what = "sigma", "of the whitened sensitivity"
    else:
        shares = [float(b.epsilon / Fraction(eps)) for b in joint.blocks]
        scale, what = "scale b", "of epsilon"
    unit = (f"; privacy unit {policy.privacy_unit!r}, at most {k} rows per unit: every "
            f"sensitivity x {k}" if policy.privacy_unit is not None else "")
    lines = [f"joint release: {len(joint.blocks)} data vectors, one charge ({family} noise); "
             "the budget split minimises the sum over every answer of its variance / M^2 "
             f"(M: one row's largest contribution, 1 for COUNT){unit}"]
    for v, b, e, share in zip(split.vectors, joint.blocks, expls, shares):
        bound = "" if v.value is None else f" (M = {float(b.bound):g})"
        lines.append(f"  {v.label}{bound}: {e.n_queries} answers, strategy {e.strategy}, "
                     f"{scale} {b.scale:.4g}, share {share:.3f} {what}, expected RMSE "
                     f"{e.rmse:.4g}")
    n_avg = split.kinds.count("avg")
    if n_avg:
        lines.append(f"  AVG: {n_avg} answers = SUM / COUNT of this release (standard errors "
                     "by the delta method once released; NULL where the noisy COUNT <= 0)")
    from dpsql.store.results import Explanation

    return Explanation(policy.table, float(eps), float(delta), joint.strategy, math.nan,
                       math.nan, stderr, split.base.n_queries, split.base.n_cells, (),
                       tuple((o.query.index, o.start, o.stop) for o in split.base.outputs),
                       mechanism=family, parts=tuple(lines), planned_rho=rho)


def _avg_range(query):
    if query.aggregate != "avg":
        return None
    return ValueBound(query.value.lo, query.value.hi).avg_range

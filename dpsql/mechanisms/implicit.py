"""Strategy selection for batches compiled to Kronecker blocks (issue 16), public inputs only.

:func:`select` is :func:`dpsql.mechanisms.selection.select` for an
:class:`~dpsql.sql.implicit.ImplicitWorkload`: it plans the structured candidates, prices
them with the kernel's own sensitivity (:func:`dpsql.workload.marginals.
computed_l2_sensitivity`) and reports each one's RMSE and its ratio to the singular value
bound, computed without the product (:func:`dpsql.strategies.symmetric.restricted_svdb`
for GROUP BY blocks; no bound is claimed for blocks with predicates inside).

Candidates today:

- ``residual`` (Gaussian, δ > 0) — ResidualPlanner's closed form for the exact total
  variance of the blocks (:func:`dpsql.strategies.residual.blocks_plan`), measured through
  marginals;
- ``marginals`` (Laplace, pure ε) — each maximal clique's marginal, identity factors, L1
  sensitivity = the number of cliques (:class:`MarginalsChoice`); it wins for one or a few
  GROUP BYs, where Laplace at sensitivity 1 beats any Gaussian;
- ``kron`` (Gaussian with δ > 0, or Laplace; only for batches with ranges or IN lists inside
  their blocks, such as a quantile's CDF counts) — a union of Kronecker strategies
  (:mod:`dpsql.strategies.union_kron`: HDMM's OPT⊗ per range column, OPT₊ weights over
  groups of blocks; :class:`KronChoice`);
- the dense candidates (``identity``, ``eigen``, …) need the full product; they are listed
  as skipped, with the product's size, when it is over
  :data:`dpsql.sql.implicit.DENSE_MAX_CELLS`.

The chosen candidate's ``plan`` field holds its choice object (its kernel plan is
``choice.plan``; it answers and gives standard errors and half-widths).
"""

from __future__ import annotations

import math
import time

import numpy as np

from dpsql.errors import StrategyError
from dpsql.inference.implicit import (residual_block_answers, residual_block_stderr,
                                      residual_marginal)
from dpsql.mechanisms.implicit_cost import MAX_BOUND_FLOPS, bound_skipped, check_limits
from dpsql.noise.gaussian import calibrate_with_rounding
from dpsql.store.results import Z95, Candidate, Explanation
from dpsql.strategies import residual, symmetric
from dpsql.strategies import AUTO_CANDIDATES
from dpsql.workload.values import times_contribution


class ResidualChoice:
    """The residual plan (Gaussian): the residual weights and the kernel's marginal plan."""

    mechanism = "gaussian"

    def __init__(self, workload, rplan, mplan):
        self.workload, self.residual, self.plan = workload, rplan, mplan

    @property
    def sensitivity(self) -> float:
        return self.plan.sensitivity

    @property
    def n_measurements(self) -> int:
        """(read with the sensitivity when a script pre-checks the charge's ρ)"""
        return self.plan.n_measurements

    def scale(self, eps, dlt, calibration: str, contribution: int = 1) -> float:
        return calibrate_with_rounding(eps, dlt,
                                       times_contribution(contribution, self.sensitivity),
                                       self.plan.n_measurements, calibration)

    def stderr(self, sigma: float) -> np.ndarray:
        """Every answer's exact standard error, block by block, in row order."""
        sizes, a = self.residual.sizes, self.residual.a
        return self.workload.assemble([residual_block_stderr(sizes, a, b, sigma)
                                       for b in self.workload.union.blocks])

    def halfwidth(self, sigma: float) -> np.ndarray:
        return Z95 * self.stderr(sigma)

    def answers(self, y: np.ndarray) -> np.ndarray:
        """The batch's answers from the residual measurements ``y`` (kernel order)."""
        return self.workload.assemble(self.block_answers(y))

    def block_answers(self, y: np.ndarray) -> list:
        """Each block's least-squares answers (all its rows), in block order."""
        tensors = _split(self.plan, y)
        sizes, a = self.residual.sizes, self.residual.a
        return [residual_block_answers(sizes, a, tensors, b)[0]
                for b in self.workload.union.blocks]

    def region_marginals(self, y: np.ndarray, regions) -> dict:
        """The least-squares marginal on each region (columns), from ``y``."""
        tensors = _split(self.plan, y)
        return {R: residual_marginal(self.residual.sizes, self.residual.a, tensors, R)
                for R in regions}


class MarginalsChoice:
    """Each maximal clique's marginal measured directly with Laplace noise (pure ε-DP).

    One row is in exactly one cell of each of the k marginals: L1 sensitivity k (the kernel
    derives it from the identity factors). A block on clique B, measured in the marginal of
    C ⊇ B, answers ``√w (⊗_{i∈B} F_i)`` of the noisy marginal summed over C∖B: each answer is
    a sum of K = Π_{i∈B} nnz(row_i) · Π_{i∈C∖B} n_i noisy cells (0/1 factors), variance
    ``2b² w Σ row² ·Π n``; its 95% half-width is the Laplace sum's (per distinct K)."""

    mechanism = "laplace"

    def __init__(self, workload):
        from dpsql.workload import marginals

        self.workload = workload
        union = workload.union
        self.cliques = _maximal(union.cliques())
        self.plan = marginals.make("marginals", union.sizes, [
            marginals.MarginalMeasurement(C, tuple(np.eye(union.sizes[i]) for i in C), 1.0)
            for C in self.cliques])
        self.sensitivity = marginals.computed_l1_sensitivity(self.plan)

    def scale(self, eps, dlt, calibration: str, contribution: int = 1) -> float:
        from dpsql.noise.laplace import laplace_scale

        return laplace_scale(eps, times_contribution(contribution, self.sensitivity),
                             self.plan.n_measurements)

    def _home(self, B) -> tuple:
        sizes = self.workload.union.sizes
        return min((C for C in self.cliques if set(B) <= set(C)),
                   key=lambda C: math.prod(sizes[i] for i in C))

    def _per_block(self, block, what: str) -> np.ndarray:
        sizes = self.workload.union.sizes
        C = self._home(block.used)
        out = np.full(1, float(math.prod(sizes[i] for i in C if i not in block.used)))
        for i in block.used:
            F = block.factors[i]
            out = np.kron(out, (F * F).sum(axis=1) if what == "sq" else (F != 0).sum(axis=1))
        return out * (block.weight if what == "sq" else 1.0)

    def stderr(self, b: float) -> np.ndarray:
        return self.workload.assemble([np.sqrt(2.0 * b * b * self._per_block(blk, "sq"))
                                       for blk in self.workload.union.blocks])

    def halfwidth(self, b: float) -> np.ndarray:
        from dpsql.inference.intervals import laplace_interval_halfwidth

        K = self.workload.assemble([self._per_block(blk, "nnz")
                                    for blk in self.workload.union.blocks])
        out = np.zeros(K.size)
        for k in np.unique(K[K > 0]):
            out[K == k] = laplace_interval_halfwidth(np.ones((1, int(k))), 1.0)[0] * b
        return out

    def answers(self, y: np.ndarray) -> np.ndarray:
        return self.workload.assemble(self.block_answers(y))

    def block_answers(self, y: np.ndarray) -> list:
        tensors = _split(self.plan, y)
        per_block = []
        for block in self.workload.union.blocks:
            C = self._home(block.used)
            T = tensors[C].sum(axis=tuple(a for a, i in enumerate(C) if i not in block.used))
            per_block.append(block.answer(T))
        return per_block

    def region_marginals(self, y: np.ndarray, regions) -> dict:
        """The noisy marginal on each region, summed down from its smallest clique."""
        tensors = _split(self.plan, y)
        out = {}
        for R in regions:
            C = self._home(R)
            out[R] = tensors[C].sum(axis=tuple(a for a, i in enumerate(C) if i not in R))
        return out


class KronChoice:
    """A union of Kronecker strategies (:mod:`dpsql.strategies.union_kron`): Gaussian (L2
    factors, residual plans for the other columns) or Laplace (L1 factors, clique
    marginals), measured through marginals; the kernel derives its sensitivity itself."""

    def __init__(self, workload, norm: str):
        from dpsql.inference import union_kron as infer
        from dpsql.strategies import union_kron
        from dpsql.workload import marginals

        self.workload, self.norm = workload, norm
        self.mechanism = "gaussian" if norm == "l2" else "laplace"
        self.kron = union_kron.plan(workload.union, norm)
        found = union_kron.measurements(self.kron)
        self.keys = [(j, A) for j, A, _ in found]
        self.plan = marginals.make("kron", workload.union.sizes, [m for _, _, m in found])
        self.sensitivity = self.plan.sensitivity if norm == "l2" else \
            marginals.computed_l1_sensitivity(self.plan)
        self._group = {k: j for j, g in enumerate(self.kron.groups) for k in g.blocks}
        blocks = workload.union.blocks
        self._variance = workload.assemble([infer.block_variance(self.kron, self._group[k], b)
                                            for k, b in enumerate(blocks)])
        self._top = None if norm == "l2" else workload.assemble(
            [infer.block_max_weight(self.kron, self._group[k], b) for k, b in enumerate(blocks)])

    def scale(self, eps, dlt, calibration: str, contribution: int = 1) -> float:
        sensitivity = times_contribution(contribution, self.sensitivity)
        if self.norm == "l1":
            from dpsql.noise.laplace import laplace_scale

            return laplace_scale(eps, sensitivity, self.plan.n_measurements)
        return calibrate_with_rounding(eps, dlt, sensitivity, self.plan.n_measurements,
                                       calibration)

    def stderr(self, scale: float) -> np.ndarray:
        factor = 2.0 if self.norm == "l1" else 1.0      # Laplace: variance 2b²
        return float(scale) * np.sqrt(factor * self._variance)

    def halfwidth(self, scale: float) -> np.ndarray:
        if self.norm == "l2":
            return Z95 * self.stderr(scale)
        from dpsql.inference.intervals import laplace_sum_halfwidth

        return laplace_sum_halfwidth(self._variance, self._top, scale)

    def answers(self, y: np.ndarray) -> np.ndarray:
        return self.workload.assemble(self.block_answers(y))

    def _tensors(self, y: np.ndarray) -> dict:
        tensors, start = {}, 0
        for key, meas in zip(self.keys, self.plan.measurements):
            shape = tuple(F.shape[0] for F in meas.factors)
            tensors[key] = np.asarray(y[start:start + math.prod(shape)]).reshape(shape)
            start += math.prod(shape)
        if start != len(y):
            raise StrategyError(f"internal error: expected {start} measurements, got {len(y)}")
        return tensors

    def block_answers(self, y: np.ndarray) -> list:
        from dpsql.inference import union_kron as infer

        tensors = self._tensors(y)
        return [infer.block_answers(self.kron, self._group[k], b, tensors)
                for k, b in enumerate(self.workload.union.blocks)]

    def region_marginals(self, y: np.ndarray, regions) -> dict | None:
        """Each region's least-squares marginal, read from the group of a block on exactly
        those columns (a start for :func:`dpsql.inference.pgm.estimate`); None when some
        region has no such block or a one-part column."""
        from dpsql.inference import union_kron as infer
        from dpsql.workload.blocks import KronBlock, identity_factor, ones_factor

        sizes, blocks = self.workload.union.sizes, self.workload.union.blocks
        owner: dict = {}
        for k, b in enumerate(blocks):
            owner.setdefault(b.used, k)
        if any(R not in owner or any(sizes[i] == 1 for i in R) for R in regions):
            return None
        tensors, out = self._tensors(y), {}
        for R in regions:
            whole = KronBlock(tuple(identity_factor(n) if i in R else ones_factor(n)
                                    for i, n in enumerate(sizes)))
            out[R] = infer.block_answers(self.kron, self._group[owner[R]], whole,
                                         tensors).reshape(tuple(sizes[i] for i in R))
        return out


def _maximal(cliques) -> tuple:
    return tuple(C for C in cliques if not any(set(C) < set(D) for D in cliques))


def _split(plan, y: np.ndarray) -> dict:
    """The kernel's ``y`` as one tensor per measurement (columns -> tensor)."""
    tensors, start = {}, 0
    for meas in plan.measurements:
        shape = tuple(F.shape[0] for F in meas.factors)
        size = math.prod(shape)
        tensors[meas.columns] = np.asarray(y[start:start + size]).reshape(shape)
        start += size
    if start != len(y):
        raise StrategyError(f"internal error: expected {start} measurements, got {len(y)}")
    return tensors


def _kron_choices(workload, gaussian: bool) -> list:
    """The union-of-Kronecker candidates when some block has ranges or IN lists inside:
    Laplace (L1 factors) always, Gaussian (L2) when δ > 0."""
    from dpsql.strategies.union_kron import general_columns

    if not general_columns(workload.union):
        return []
    return [KronChoice(workload, norm) for norm in (("l2", "l1") if gaussian else ("l1",))]


def bound_total(workload) -> tuple[float, str]:
    """(svdb total, note): the singular value bound of the blocks, or NaN and why not.

    The bound's cost is predicted first (``Σ_S size_S³`` flops over the invariant blocks of
    the closure, on the GROUP BY columns when range columns are factored out:
    :func:`dpsql.strategies.symmetric.union_svdb`) and it is skipped, with a note, over
    :data:`MAX_BOUND_FLOPS`."""
    try:
        flops = bound_skipped(workload)
        if flops is not None:
            return math.nan, (f"bound skipped: its invariant blocks need ~{flops:.1e} flops "
                              f"(limit {MAX_BOUND_FLOPS:.0e})")
        return float(symmetric.union_svdb(workload.union)), ""
    except StrategyError as exc:
        text = str(exc)
        return math.nan, text if text.startswith("no lower bound") else \
            f"no lower bound computed: {text}"


def _candidate(choice, eps, dlt, calibration: str, bound: float, k: int = 1) -> Candidate:
    started = time.perf_counter()
    scale = choice.scale(eps, dlt, calibration, k)
    stderr = choice.stderr(scale)
    rmse = float(np.sqrt(np.mean(stderr ** 2))) if stderr.size else 0.0
    return Candidate(choice.plan.strategy, scale, k * choice.sensitivity, rmse, stderr,
                     seconds=time.perf_counter() - started, plan=choice,
                     bound_ratio=rmse / bound if bound > 0 else math.nan,
                     mechanism=choice.mechanism)


def select(policy, workload, eps, dlt, calibration: str):
    """The structured candidates' expected errors and the chosen one (no data, no budget):
    ``(Explanation, choice)``. δ > 0: the residual plan (Gaussian) and the marginals
    (Laplace, no δ spent) compete; δ = 0, or a pure budget: the marginals only. Answers
    from past releases are weighed afterwards (:mod:`dpsql.release.implicit_reuse`)."""
    check_limits(workload)
    total, note = bound_total(workload)
    from dpsql.mechanisms.halfwidths import bound_rmse

    choices = [MarginalsChoice(workload)]
    gaussian = dlt > 0 and policy.delta > 0
    if gaussian:
        rplan = residual.blocks_plan(workload.union)
        choices.insert(0, ResidualChoice(workload, rplan, residual.as_marginal_plan(rplan)))
    choices += _kron_choices(workload, gaussian)
    candidates, k = [], policy.contribution      # rows per unit of privacy
    for choice in choices:
        bound = k * bound_rmse(choice.mechanism, eps, dlt, calibration, total,
                               workload.n_queries) if math.isfinite(total) else math.nan
        candidates.append(_candidate(choice, eps, dlt, calibration, bound, k))
    best = min(candidates, key=lambda c: c.rmse)
    skipped = [Candidate(name, math.nan, math.nan, math.nan, np.zeros(0),
                         note=f"skipped: needs the full product of {workload.n_cells:,} "
                              "cells (the batch is compiled to Kronecker blocks)")
               for name in AUTO_CANDIDATES]
    bound = k * bound_rmse(best.mechanism, eps, dlt, calibration, total, workload.n_queries) \
        if math.isfinite(total) else math.nan
    expl = Explanation(policy.table, float(eps), float(dlt), best.strategy, best.sigma,
                       best.rmse, best.stderr, workload.n_queries, workload.n_cells,
                       (*candidates, *skipped),
                       tuple((o.query.index, o.start, o.stop) for o in workload.outputs),
                       bound_rmse=bound, mechanism=best.mechanism, bound_note=note)
    return expl, best.plan

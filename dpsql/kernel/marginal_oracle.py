"""MWEM's measure callback over marginals (issue 16): for batches too wide for the full
product, the kernel reads the cliques' marginals once and answers selections and
measurements of whole marginals, never the counts.

:class:`MarginalOracle` holds the marginals of a run that :meth:`Kernel.release_adaptive_marginals
<dpsql.kernel.boundary.Kernel.release_adaptive_marginals>` has already charged, and spends that
charge step by step. The candidates are fixed when the oracle is built (public: the batch's
column sets); every true answer is a *full* marginal over a candidate's columns' declared
parts (every part, zeros included), computed here from the engine's clique marginals.

- :meth:`select`: the exponential mechanism (McSherry & Talwar 2007) over the candidates,
  score ``‖estimate_r − M_r(x)‖₁ − penalty_r`` (AIM's quality score, McKenna et al., VLDB
  2022, §4). Adding or removing one row changes exactly one cell of each full marginal
  ``M_r(x)`` by 1, so each score moves by at most 1 (the estimates and penalties are public
  inputs): sensitivity 1, fixed here, never taken from the caller. The secure sampler draws
  with probability ∝ ``exp(ε'·score / 2)``: ε'-DP.
- :meth:`measure`: the full marginals of ``k`` column sets (each a candidate or a subset of
  one; ``()`` is the row count) with Laplace noise. One row lands in exactly one cell of each,
  so the stacked L1 sensitivity is ``k``, derived here from the request's length; the scale
  ``b`` is :func:`~dpsql.noise.laplace.laplace_scale` at that sensitivity and verified by the
  exact condition ``(Δ₁ + p·2^k(b)) / b ≤ ε'`` before anything is sampled: ε'-DP.

Every call checks its ε against what is left of the charge (exact Fractions) before it
computes anything; the run is then ε-DP by basic composition (see the kernel method).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from dpsql.errors import StrategyError
from dpsql.kernel.oracles import Allowance
from dpsql.kernel.scales import _refuse_if
from dpsql.noise.laplace import laplace_scale, laplace_shortfall


class MarginalOracle(Allowance):
    """Selections and Laplace measurements of full marginals (module docstring)."""

    def __init__(self, counts: dict, sizes, candidates, sampler, epsilon: Fraction):
        super().__init__(epsilon)
        self._counts = dict(counts)
        self._sizes = tuple(int(n) for n in sizes)
        self.candidates = tuple(tuple(int(i) for i in C) for C in candidates)
        self._sampler = sampler
        self._cache: dict = {}
        if not self.candidates:
            raise StrategyError("internal error: a marginal oracle needs candidates")

    def close(self) -> None:
        self._counts, self._cache = {}, {}

    def _true(self, columns: tuple) -> np.ndarray:
        """The full marginal on ``columns`` (sorted), summed down from the smallest clique
        marginal read (exact: integer counts under 2⁵³)."""
        if not self._counts:
            raise StrategyError("internal error: the oracle is closed")
        if columns not in self._cache:
            held = [c for c in self._counts if set(columns) <= set(c)]
            if list(columns) != sorted(set(columns)) or not held:
                raise StrategyError(f"internal error: columns {columns!r} are not in a "
                                    "clique the kernel read")
            key = min(held, key=lambda c: (math.prod(self._sizes[i] for i in c), c))
            summed = tuple(a for a, i in enumerate(key) if i not in columns)
            T = self._counts[key].sum(axis=summed) if summed else self._counts[key]
            self._cache[columns] = np.asarray(T, dtype=float).reshape(-1)
        return self._cache[columns]

    def select(self, estimates, penalties, epsilon) -> int:
        """The exponential mechanism over the candidates (module docstring); ``estimates``:
        one flat marginal per candidate, ``penalties``: one public number per candidate."""
        penalties = np.asarray(penalties, dtype=float).reshape(-1)
        if len(estimates) != len(self.candidates) or penalties.size != len(self.candidates) \
                or not np.all(np.isfinite(penalties)):
            raise StrategyError("internal error: select needs one estimate and one finite "
                                "penalty per candidate")
        scores = np.empty(len(self.candidates))
        for r, (C, est) in enumerate(zip(self.candidates, estimates)):
            est = np.asarray(est, dtype=float).reshape(-1)
            truth = self._true(C)
            if est.size != truth.size or not np.all(np.isfinite(est)):
                raise StrategyError(f"internal error: candidate {r} needs {truth.size} "
                                    "finite estimates")
            scores[r] = float(np.abs(est - truth).sum()) - penalties[r]
        eps = self._spend(epsilon)
        return int(self._sampler.exponential(scores, eps, sensitivity=1.0))

    def measure(self, column_sets, epsilon) -> tuple[list, float]:
        """``(noisy marginals, b)``: each column set's full marginal plus Laplace(b),
        ``b`` derived from the stacked L1 sensitivity ``k = len(column_sets)``."""
        sets = [tuple(int(i) for i in C) for C in column_sets]
        if not sets or len(set(sets)) != len(sets):
            raise StrategyError("internal error: measure needs distinct column sets")
        values = [self._true(C) for C in sets]
        eps = self._affordable(epsilon)
        flat = np.concatenate(values)
        sensitivity = float(len(sets))
        b = laplace_scale(eps, sensitivity, flat.size)
        _refuse_if(laplace_shortfall(b, eps, sensitivity, flat.size),
                   "MWEM marginal measurement", after_charge=True)
        eps = self._spend(eps)
        y, _ = self._sampler.laplace(flat, b, sensitivity=sensitivity, epsilon=eps)
        y = np.asarray(y, dtype=float)
        bounds = np.cumsum([0] + [v.size for v in values])
        return [y[a:z] for a, z in zip(bounds[:-1], bounds[1:])], b

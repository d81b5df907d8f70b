"""MWEM's measure callback: the kernel's oracle, which answers with noise, never the counts.

:class:`MeasureOracle` holds the data vectors of a run that :meth:`Kernel.release_adaptive
<dpsql.kernel.boundary.Kernel.release_adaptive>` has already charged, and spends that charge
step by step (the exponential mechanism and Laplace), checking each step's scale first.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import scipy.sparse as sp

from dpsql.errors import StrategyError
from dpsql.kernel.scales import _on_grid, _refuse_if
from dpsql.mechanisms.mwem.groups import AllIntervals, CandidateGroups, GroupValues, group_sensitivities
from dpsql.noise import verify
from dpsql.noise.laplace import laplace_shortfall
from dpsql.workload.matrix import exact_l1_sensitivity


class Allowance:
    """What an oracle may still spend of its run's charge, in exact :class:`~fractions.Fraction`
    arithmetic: every step's ε is checked against it before the step computes anything, so
    the steps of a run compose (basic composition) to at most the charged ε."""

    def __init__(self, epsilon) -> None:
        self.budget = Fraction(epsilon)
        self.spent = Fraction(0)

    def _affordable(self, epsilon) -> Fraction:
        """The step's ε, exactly, if it fits in what is left (nothing is spent yet)."""
        eps = Fraction(epsilon)
        if eps <= 0:
            raise StrategyError("internal error: a step must spend epsilon > 0")
        if self.spent + eps > self.budget:
            raise StrategyError(
                f"internal error: the algorithm asked for more than its charged epsilon "
                f"({float(self.spent + eps)!r} > {float(self.budget)!r}); refusing")
        return eps

    def _spend(self, epsilon) -> Fraction:
        """Spend the step's ε (checked by :meth:`_affordable`); returns it exactly."""
        eps = self._affordable(epsilon)
        self.spent += eps
        return eps


class MeasureOracle(Allowance):
    """The measure callback of data-dependent algorithms: noisy answers, never the counts.

    Each call spends part of the charged ``epsilon`` (exact :class:`~fractions.Fraction`
    sums); a call that would overspend is refused before anything is computed. Only 0/1-style
    rows on the exact 2**-20 grid are accepted, so the true answers ``rows @ x`` are exact.

    - :meth:`select`: the exponential mechanism (McSherry & Talwar 2007) over candidate
      groups of queries, score ``Σ_r |estimate_r − answer_r| − penalty``. One row added or
      removed moves each answer of a group by its column entry, so a score moves by at most
      the group's largest column L1 norm; the sensitivity is the maximum over groups. The
      secure sampler selects with probability ∝ exp(ε' · score / (2 Δ)): ε'-DP.
    - :meth:`measure`: Laplace noise with scale ``b = Δ₁(rows)/ε'`` (exact L1 sensitivity):
      ε'-DP.

    Scales: the selection's sensitivity is verified by exact integer column sums
    (:func:`dpsql.noise.verify.group_l1_shortfall`) and the measurement's ``b`` by the exact
    condition ``(Δ₁ + p·2^k(b)) / b ≤ ε'`` (:func:`dpsql.noise.laplace.laplace_shortfall`)
    before the step spends or samples; a shortfall raises :class:`ScaleRefused`. (The
    exponential mechanism's temperature ``2Δ/ε'`` is derived by the kernel's sampler from
    the verified Δ and the step's ε'; :meth:`select_interval`'s sensitivity is the constant 1.)
    - :meth:`select_interval`: the exponential mechanism over *every* range of an ordered
      block (MWEM's :class:`~dpsql.mechanisms.mwem.core.RangeBlock`), never listed; ε'-DP (see there).
    """

    def __init__(self, xs, sampler, epsilon: Fraction):
        super().__init__(epsilon)
        self._xs = list(xs)
        self._sampler = sampler
        self._cache: dict = {}

    def close(self) -> None:
        self._xs = []
        self._cache = {}

    def _verified_laplace(self, eps: Fraction, sensitivity: float, size: int,
                          what: str) -> float:
        """The Laplace scale of a step (:func:`dpsql.noise.laplace.laplace_scale`), verified
        by the exact condition ``(Δ + p·2^k(b)) / b ≤ ε`` before it is used."""
        from dpsql.noise.laplace import laplace_scale

        b = laplace_scale(eps, sensitivity, size)
        _refuse_if(laplace_shortfall(b, eps, sensitivity, size), what, after_charge=True)
        return b

    def _x(self, block: int) -> np.ndarray:
        if not self._xs:
            raise StrategyError("internal error: the oracle is closed")
        if isinstance(block, bool) or not 0 <= int(block) < len(self._xs):
            raise StrategyError(f"internal error: no block {block!r}")
        return self._xs[int(block)]

    def _checked(self, x: np.ndarray, rows) -> sp.csr_matrix:
        R = sp.csr_matrix(rows, dtype=float)
        if R.shape[1] != x.size or not _on_grid(R):
            raise StrategyError("internal error: measurement rows must be on the exact grid "
                                "and match the block's cells")
        return R

    def _answers(self, block: int, W) -> np.ndarray:
        """``W @ x`` for a block's whole query matrix, computed once per run."""
        key = (int(block), id(W))
        if key not in self._cache:
            self._cache[key] = (W, np.asarray(self._checked(self._x(block), W) @ self._x(block),
                                              dtype=float).reshape(-1))
        return self._cache[key][1]

    def _selection_inputs(self, block: int, groups, estimates, penalties):
        """Checked (estimates, penalties, true answers) of a selection's candidate rows."""
        if not isinstance(groups, CandidateGroups) or len(groups) == 0:
            raise StrategyError("internal error: select needs non-empty CandidateGroups")
        penalties = np.asarray(penalties, dtype=float).reshape(-1)
        values = (estimates.values if isinstance(estimates, GroupValues) else
                  np.concatenate([np.asarray(e, dtype=float).reshape(-1) for e in estimates]))
        if penalties.size != len(groups) or values.size != groups.row_index.size \
                or not np.all(np.isfinite(values)) or not np.all(np.isfinite(penalties)):
            raise StrategyError("internal error: select needs finite estimates for every "
                                "candidate row and one penalty per group")
        return values, penalties, self._answers(block, groups.W)[groups.row_index]

    def select(self, block: int, groups, estimates, penalties, epsilon) -> int:
        """``groups`` is a :class:`dpsql.mechanisms.mwem.groups.CandidateGroups` (rows of one matrix)."""
        values, penalties, answers = self._selection_inputs(block, groups, estimates,
                                                            penalties)
        # the sensitivity is recomputed here, from the rows, never taken from the caller,
        # and verified exactly (integer column sums) before it sets the temperature
        sensitivity = float(group_sensitivities(groups.W, groups.starts, groups.stops).max())
        if not sensitivity > 0:
            raise StrategyError("internal error: every candidate group is empty")
        eps = self._affordable(epsilon)
        _refuse_if(verify.group_l1_shortfall(groups.W, groups.starts, groups.stops,
                                             sensitivity), "MWEM selection",
                   after_charge=True)
        eps = self._spend(eps)
        diff = np.abs(values - answers)
        scores = np.add.reduceat(diff, groups.offsets[:-1]) - penalties
        return int(self._sampler.exponential(scores, eps, sensitivity=sensitivity))

    def select_interval(self, block: int, candidates, estimates, epsilon) -> tuple[int, int]:
        """The exponential mechanism over all ranges ``[lo, hi]`` of block ``block``'s ``n``
        ordered cells that ``candidates`` (an :class:`~dpsql.mechanisms.mwem.groups.AllIntervals` over
        those ``n`` cells) allows; ``estimates`` are the prefix sums of MWEM's current
        distribution (``n + 1`` finite values). Spends ``epsilon``; returns ``(lo, hi)``.

        Privacy (Hardt, Ligett & McSherry, §2: MWEM's selection step is the exponential
        mechanism; McSherry & Talwar 2007). The score of a range is ``|E[hi+1] − E[lo] −
        count[lo, hi]|`` with public estimates ``E``. Adding or removing one row changes one
        range count by at most 1 (a range is a 0/1 query), so every score moves by at most 1:
        sensitivity 1, fixed here, never taken from the caller. The output is drawn with
        probability ∝ ``exp(ε'·score / 2)`` over the allowed ranges (the candidate set
        depends only on past public outputs), which is ε'-DP. The draw is
        :meth:`AllIntervals.sample`: two calls of the kernel's exponential sampler
        (``self._sampler.exponential``, OpenDP's exact Gumbel-max in production) whose
        product is exactly that one distribution over ranges (its docstring), so the
        privacy of the step is that of the single exponential mechanism over all ranges,
        not of the two calls separately — up to floating-point rounding of the scores and of
        the sampler's scale (rounded up by at most one ulp), as for any scored selection.

        The budget is checked and charged through :meth:`_spend` exactly like
        :meth:`select` (exact Fraction sums; a call that would overspend, or whose inputs
        are invalid, is refused before anything is computed or spent).
        """
        x = self._x(block)
        if not isinstance(candidates, AllIntervals) or candidates.n != x.size \
                or len(candidates) <= 0:
            raise StrategyError(f"internal error: select_interval needs a non-empty "
                                f"AllIntervals over the block's {x.size} cells")
        if any(not (0 <= lo <= hi < x.size) for lo, hi in candidates.excluded):
            raise StrategyError("internal error: select_interval's excluded ranges must lie "
                                "within the block's cells")
        try:
            est = np.array(estimates, dtype=float).reshape(-1)
        except (TypeError, ValueError) as exc:
            raise StrategyError("internal error: select_interval needs numeric estimates") \
                from exc
        if est.size != x.size + 1 or not np.all(np.isfinite(est)):
            raise StrategyError(f"internal error: select_interval needs {x.size + 1} finite "
                                f"prefix-sum estimates, got {est.size}")
        eps = self._spend(epsilon)
        prefix = np.concatenate([[0.0], np.cumsum(x)])      # exact: integer counts < 2**32
        lo, hi = candidates.sample(est, prefix, eps, self._sampler.exponential)
        return int(lo), int(hi)

    def measure(self, block: int, rows, epsilon) -> tuple[np.ndarray, float]:
        x = self._x(block)
        R = self._checked(x, rows)
        sensitivity = exact_l1_sensitivity(R)
        if not sensitivity > 0:
            raise StrategyError("internal error: nothing to measure")
        eps = self._affordable(epsilon)
        b = self._verified_laplace(eps, sensitivity, R.shape[0], "MWEM measurement")
        eps = self._spend(eps)
        y, _ = self._sampler.laplace(np.asarray(R @ x, dtype=float), b,
                                     sensitivity=sensitivity, epsilon=eps)
        return np.asarray(y, dtype=float), b

"""MWEM's side of the kernel's measure callback: the oracle protocol and a guard around it.

:class:`MeasureOracle` is what the kernel binds to the data (DESIGN.md: the algorithm never
sees the counts); :class:`Spender` wraps it for :func:`dpsql.mechanisms.mwem.core.run_mwem`,
logging every spend in exact fractions, refusing to overspend the run's budget and checking
what comes back. :func:`smooth_round_robin` is the public schedule of blocks. Public only.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from fractions import Fraction
from typing import Protocol

import numpy as np
import scipy.sparse

from dpsql.errors import StrategyError
from dpsql.mechanisms.mwem.groups import AllIntervals


class MeasureOracle(Protocol):
    """The kernel-side measure callback (DESIGN.md): noisy answers, never the counts."""

    def select(self, block: int, groups: Sequence[scipy.sparse.csr_matrix], estimates: Sequence[np.ndarray],  # noqa: E501
               penalties: np.ndarray, epsilon: Fraction) -> int:
        """Exponential mechanism over candidate groups of block `block`'s queries: score_g = sum_r |estimates[g][r] - true answer of groups[g] row r| - penalties[g]; sensitivity = max over groups of the largest column L1 norm of the group (the oracle computes it; 1 for a single 0/1 query or a GROUP BY marginal). Spends epsilon."""  # noqa: E501

    def measure(self, block: int, rows: scipy.sparse.csr_matrix, epsilon: Fraction) -> tuple[np.ndarray, float]:  # noqa: E501
        """Noisy answers rows @ x_block + Laplace(b), b = L1 sensitivity(rows)/epsilon; returns (noisy, b). Spends epsilon."""  # noqa: E501

    def select_interval(self, block: int, candidates: AllIntervals, estimates: np.ndarray,
                        epsilon: Fraction) -> tuple[int, int]:
        """Only for a RangeBlock: exponential mechanism over every range [lo, hi] of the block's cells that candidates allows; estimates are the prefix sums of A (n + 1 values); score |estimates[hi+1] - estimates[lo] - count of [lo, hi]|, sensitivity 1. The kernel computes the data's prefix sums and calls candidates.sample(estimates, prefix, epsilon, sampler.exponential). Spends epsilon; returns (lo, hi)."""  # noqa: E501



class Spender:
    """Wraps the oracle: logs every spend, refuses to overspend, checks what comes back."""

    def __init__(self, oracle, budget: Fraction):
        self.oracle = oracle
        self.budget = budget
        self.spent = Fraction(0)
        self.log: list = []

    def _charge(self, kind: str, block: int, epsilon: Fraction) -> Fraction:
        epsilon = Fraction(epsilon)
        if epsilon <= 0 or self.spent + epsilon > self.budget:
            raise StrategyError(f"internal error: MWEM asked to spend {epsilon} with "
                                f"{self.budget - self.spent} left; refusing")
        self.spent += epsilon
        self.log.append((kind, block, epsilon))
        return epsilon

    def select(self, block, groups, estimates, penalties, epsilon) -> int:
        epsilon = self._charge("select", block, epsilon)
        k = self.oracle.select(block, groups, estimates, penalties, epsilon)
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) \
                or not 0 <= k < len(groups):
            raise StrategyError(f"the oracle's select returned {k!r}; expected a candidate "
                                f"index in [0, {len(groups)})")
        return int(k)

    def select_interval(self, block, candidates, estimates, epsilon) -> tuple[int, int]:
        epsilon = self._charge("select", block, epsilon)
        out = self.oracle.select_interval(block, candidates, estimates, epsilon)
        try:
            lo, hi = (int(v) for v in out)
            ok = all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in out)
        except (TypeError, ValueError):
            ok = False
        if not ok or not candidates.allowed(lo, hi):
            raise StrategyError(f"the oracle's select_interval returned {out!r}; expected a "
                                f"range (lo, hi) of the {candidates.n} cells not measured yet")
        return lo, hi

    def measure(self, kind, block, rows, epsilon) -> tuple[np.ndarray, float]:
        epsilon = self._charge(kind if kind != "round" else "measure", block, epsilon)
        out = self.oracle.measure(block, rows, epsilon)
        try:
            noisy, scale = out
            noisy = np.array(noisy, dtype=float).reshape(-1)
            scale = float(scale)
        except (TypeError, ValueError) as exc:
            raise StrategyError("the oracle's measure must return (noisy answers, scale)") \
                from exc
        if noisy.size != rows.shape[0] or not np.all(np.isfinite(noisy)) \
                or not (math.isfinite(scale) and scale > 0):
            raise StrategyError(f"the oracle's measure returned {noisy.size} finite values "
                                f"and scale {scale!r}; expected {rows.shape[0]} and a "
                                f"positive scale")
        return noisy, scale


def smooth_round_robin(weights: np.ndarray):
    """Deterministic interleaving: block g gets a share w_g / Σw of every prefix (±1)."""
    credit = np.zeros(weights.size)
    total = weights.sum()
    while True:
        credit += weights
        g = int(np.argmax(credit))
        credit[g] -= total
        yield g

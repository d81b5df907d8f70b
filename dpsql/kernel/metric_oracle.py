"""The d_X measure callback: :class:`MetricMeasureOracle`, the kernel's oracle for d_X MWEM
and SmallDB, whose steps are checked against the kernel's own cell metrics
(:meth:`Kernel.release_adaptive_metric <dpsql.kernel.boundary.Kernel.release_adaptive_metric>`).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import scipy.sparse as sp

from dpsql.errors import StrategyError
from dpsql.kernel.oracles import MeasureOracle
from dpsql.kernel.scales import _refuse_if
from dpsql.noise import verify


class MetricMeasureOracle(MeasureOracle):
    """The measure callback of d_X algorithms (same interface as :class:`MeasureOracle`).

    ``epsilon`` arguments are ε per unit of the record distance, spent from the charged
    metric budget (exact sums, overspending refused before anything is computed). Each
    block ``g`` has its cell metric ``d_g`` (the record metric restricted to the block's
    columns: ``d_g(u, v) ≤ d(u, v)``, the record distance being a sum over columns), so a step
    that is d_X-private at ``ε_i`` w.r.t. ``d_g`` is also at ``ε_i`` w.r.t. ``d``.

    - :meth:`select`: the d_X exponential mechanism (:func:`dpsql.mechanisms.dx.mechanisms.dx_exponential`)
      over candidate groups, score ``Σ_r |estimate_r − answer_r| − penalty``: moving one
      record ``i → j`` moves it by at most ``Σ_r |W[r,i] − W[r,j]|``, so the Lipschitz
      constant is the max over candidate groups and cell pairs of that over ``d(i, j)``,
      recomputed here from the rows and the metric, never taken from the caller.
    - :meth:`measure`: d_X Laplace, one scale for all rows: ``b = c_R / ε_i`` (rounded up by
      :func:`dpsql.noise.laplace.laplace_scale`), ``c_R = max_pairs Σ_r |R[r,i] − R[r,j]| / d``;
      the values ``R x`` are on the sampler's lattice, so the loss is ``‖R(x − x')‖₁ / b ≤
      ε_i·d(i, j)`` (Kamalaruban et al., Proposition 1).
    - :meth:`select_synthetic`: SmallDB's selection over candidate histograms.

    Scales: every Lipschitz constant ``c`` above (computed by
    :class:`dpsql.mechanisms.dx.mechanisms.PairDifferences`) is verified on each edge of the
    block's cell metric with exact integer differences, ``Σ_r |R[r,i] − R[r,j]| ≤ c·d(i, j)``
    (``max_r`` for SmallDB; :func:`dpsql.noise.verify.metric_lipschitz_shortfall`), and the
    Laplace ``b`` by ``(c + p·2^k(b)) / b ≤ ε_i`` exactly, before the step spends or
    samples; a shortfall raises :class:`ScaleRefused`. The exponential mechanism's
    temperature ``2c/ε_i`` is derived by the kernel's sampler from the verified ``c``.

    When no candidate (or measured row) depends on the cells (``c = 0``: they count the same
    on every cell, so under change-one neighbours their answers never change) any scale is
    private; the oracle then uses ``1 / d_min`` so that MWEM's bookkeeping stays finite.
    """

    def __init__(self, xs, graphs, sampler, epsilon: Fraction):
        from dpsql.mechanisms.dx.mechanisms import metric_pairs

        super().__init__(xs, sampler, epsilon)
        if len(graphs) != len(self._xs):
            raise StrategyError("internal error: one cell metric per block is needed")
        self._pairs = [metric_pairs(g) for g in graphs]
        for I, J, _, n in self._pairs:
            if not verify.is_connected(n, I, J):
                raise StrategyError("internal error: a block's cell graph is not connected")
        self._diffs: dict = {}
        self._exact: dict = {}

    def close(self) -> None:
        super().close()
        self._diffs = {}
        self._exact = {}

    def _lipschitz_shortfall(self, block: int, S, c: float, what: str, cache: bool = True,
                             **form) -> None:
        """Verify ``c`` on the block's edges with exact integer differences (kept per
        matrix for the run, like :meth:`_differences`); refuse on a shortfall."""
        I, J, d, n = self._pairs[int(block)]
        key = (int(block), id(S))
        if cache and key not in self._exact:
            self._exact[key] = (S, verify.edge_differences(S, I, J) if len(I) else None)
        diffs = self._exact[key][1] if cache else None
        _refuse_if(verify.metric_lipschitz_shortfall(S, I, J, d, n, c, diffs=diffs,
                                                     connected=True, **form),
                   what, after_charge=True)

    def _differences(self, block: int, W):
        from dpsql.mechanisms.dx.mechanisms import PairDifferences

        key = (int(block), id(W))
        if key not in self._diffs:
            self._diffs[key] = (W, PairDifferences(self._checked(self._x(block), W),
                                                   self._pairs[int(block)]))
        return self._diffs[key][1]

    def _positive(self, block: int, c: float) -> float:
        if c > 0:
            return float(c)
        d = self._pairs[int(block)][2]
        return 1.0 / float(d.min()) if d.size else 1.0

    def select(self, block: int, groups, estimates, penalties, epsilon) -> int:
        from dpsql.mechanisms.dx.mechanisms import dx_exponential

        values, penalties, answers = self._selection_inputs(block, groups, estimates,
                                                            penalties)
        c = self._differences(block, groups.W).groups(groups.starts, groups.stops).max()
        c = self._positive(block, c)
        eps = self._affordable(epsilon)
        self._lipschitz_shortfall(block, groups.W, c, "d_X MWEM selection", form="sum",
                                  starts=groups.starts, stops=groups.stops)
        eps = self._spend(eps)
        diff = np.abs(values - answers)
        scores = np.add.reduceat(diff, groups.offsets[:-1]) - penalties
        return dx_exponential(scores, eps, c, sampler=self._sampler)

    def measure(self, block: int, rows, epsilon) -> tuple[np.ndarray, float]:
        from dpsql.mechanisms.dx.mechanisms import PairDifferences

        x = self._x(block)
        R = self._checked(x, rows)
        if R.shape[0] == 0:
            raise StrategyError("internal error: nothing to measure")
        c = self._positive(block, PairDifferences(R, self._pairs[int(block)]).total())
        eps = self._affordable(epsilon)
        self._lipschitz_shortfall(block, R, c, "d_X MWEM measurement", cache=False,
                                  form="sum")
        b = self._verified_laplace(eps, c, R.shape[0], "d_X MWEM measurement")
        eps = self._spend(eps)
        y, _ = self._sampler.laplace(np.asarray(R @ x, dtype=float), b, sensitivity=c,
                                     epsilon=eps)
        return np.asarray(y, dtype=float), b

    def select_interval(self, *args, **kwargs):
        """Not available under d_X: the standard oracle's all-ranges selection assumes
        sensitivity 1 per record, not the metric's constant. Refused, never inherited."""
        raise StrategyError("internal error: d_X MWEM selects among explicit candidate rows "
                            "(Block), not all ranges (RangeBlock)")

    def select_synthetic(self, block: int, W, candidates, size: int, total: int,
                         epsilon) -> int:
        """SmallDB: index of the candidate histogram (a row of ``candidates``, ``size``
        records each) chosen by the d_X exponential mechanism with score
        ``−max_k |W_k x − (total/size)·W_k y|`` (:func:`dpsql.mechanisms.dx.mechanisms.smalldb_scores`,
        exact in units of ``1/size``; the Lipschitz constant ``max_pairs max_k |W[k,i] −
        W[k,j]| / d`` is scaled by ``size`` to match)."""
        from dpsql.mechanisms.dx.mechanisms import dx_exponential, smalldb_scores

        x = self._x(block)
        Wc = self._checked(x, W)
        Y = sp.csr_matrix(candidates, dtype=float)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1 \
                or isinstance(total, bool) or not isinstance(total, int) or total < 0:
            raise StrategyError("internal error: SmallDB needs integer size >= 1, total >= 0")
        sums = np.asarray(Y.sum(axis=1)).reshape(-1)
        if Y.shape[0] == 0 or Y.shape[1] != x.size or (Y.data < 0).any() \
                or not np.all(sums == size):
            raise StrategyError(f"internal error: SmallDB candidates must be histograms of "
                                f"{size} records over the block's {x.size} cells")
        diffs = self._differences(block, W)
        c = self._positive(block, float(diffs.rows().max(initial=0.0)))
        eps = self._affordable(epsilon)
        self._lipschitz_shortfall(block, Wc, c, "d_X SmallDB selection", cache=False,
                                  form="max")
        sensitivity = math.nextafter(c * size, math.inf)
        eps = self._spend(eps)
        scores = smalldb_scores(Wc, x, Y, size, total)
        return dx_exponential(scores, eps, sensitivity, sampler=self._sampler)

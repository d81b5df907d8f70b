"""The privacy boundary: the only code that reads the data.

``Kernel.release`` (DESIGN.md, step 4):

1. charges the ledger, atomically (check and insert in one transaction, committed);
2. asks the engine for the cell counts ``x`` (one GROUP BY);
3. computes ``A x`` and adds Gaussian or Laplace noise from the secure sampler;
4. returns ``y`` and drops ``x``.

Nothing but ``y`` crosses this boundary: strategies, inference and result writing see only
``y``, ``W``, ``A`` and σ. If the charge is refused, nothing was read, released or charged.
Charging *before* the data is read means that whatever happens once the data is touched —
an answer, or an engine failure that some row might provoke — has been paid for: no outcome
that depends on the data is ever free. (The engine is also written so that no value can make
the count fail; this ordering is the backstop.) If anything fails after the charge, the
budget stays spent (never a free retry of fresh noise).

Exactness of ``A x``: the sampler rounds ``A x`` to its grid and adds exact lattice noise,
with the rounding charged in the sensitivity (see :mod:`dpsql.noise.gaussian`). That argument needs
``A x`` computed exactly: plans carry entries on the 2**-20 grid with magnitude at most 1
(:func:`dpsql.workload.matrix.make_plan`), which makes float64 products exact for tables
of fewer than 2**32 rows; the kernel refuses any other plan rather than risk a
floating-point leak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import scipy.sparse as sp

from dpsql.engines import duckdb as engine
from dpsql.store import ledger
from dpsql.errors import StrategyError
from dpsql.noise.samplers import SecureGaussianSampler
from dpsql.mechanisms.mwem.groups import AllIntervals, CandidateGroups, GroupValues, group_sensitivities
from dpsql.workload.matrix import EXACT_ROWS, QUANTUM_BITS, Plan, exact_l1_sensitivity



def _on_grid(A) -> bool:
    """Entries are multiples of 2**-20 with magnitude <= 1 (None is the identity)."""
    if A is None:
        return True
    data = A.data if sp.issparse(A) else np.asarray(A)
    scaled = data * float(2 ** QUANTUM_BITS)
    return bool(np.all(np.abs(data) <= 1) and np.all(scaled == np.round(scaled)))


@dataclass(frozen=True)
class Measurement:
    release_id: int
    result_tables: list
    y: np.ndarray          # noisy measurements (public once released)
    sigma: float
    grid: float
    private: bool


class Kernel:
    """Reads data, charges, adds noise. Holds the sampler; tests may pass a seeded one."""

    def __init__(self, sampler=None):
        self.sampler = sampler if sampler is not None else SecureGaussianSampler()

    @property
    def private(self) -> bool:
        return bool(getattr(self.sampler, "private", False))

    def release(self, con, policy, workload, plan: Plan, sigma: float,
                request: ledger.Charge, *, mechanism: str = "gaussian") -> Measurement:
        """Charge ``request``, read ``x``, return ``y = A x + noise`` (module docstring).

        ``mechanism`` is ``gaussian`` (``sigma`` is σ, L2 sensitivity) or ``laplace``
        (``sigma`` is the Laplace scale ``b``, L1 sensitivity; pure ε-DP: ``b ≥ Δ₁/ε``, so
        for neighbours ``‖A x − A x'‖₁ ≤ Δ₁`` the density ratio is at most e^ε).
        """
        if mechanism not in ("gaussian", "laplace"):
            raise StrategyError(f"internal error: unknown noise mechanism {mechanism!r}")
        if mechanism == "laplace" and not math.isfinite(plan.l1_sensitivity):
            raise StrategyError(f"strategy {plan.strategy!r} has no exact L1 sensitivity")
        if not plan.integral or not _on_grid(plan.A):
            raise StrategyError(
                f"strategy {plan.strategy!r} is not on the exact 2**-20 grid; the kernel "
                "only releases plans whose products A x are computed exactly")
        if not (np.isfinite(sigma) and sigma > 0):
            raise StrategyError("internal error: the noise scale must be positive and finite")
        release_id, names = ledger.charge(con, policy, request)   # committed here
        x = _data_vector(con, policy, workload)
        values = plan.measure(x)
        del x
        if mechanism == "laplace":
            y, grid = self.sampler.laplace(values, sigma, sensitivity=plan.l1_sensitivity,
                                           epsilon=request.cost.epsilon)
        else:
            y, grid = self.sampler.sample(values, sigma, sensitivity=plan.sensitivity)
        return Measurement(release_id, names, np.asarray(y, dtype=float), sigma, grid,
                           self.private)

    def release_per_query(self, con, policy, workload, scales: np.ndarray,
                          request: ledger.Charge) -> Measurement:
        """Charge, read ``x``, return ``y_k = (W x)_k + Laplace(b_k)`` (d_X Laplace).

        Privacy (Kamalaruban et al., d_X-private Laplace): the scales come from
        :func:`dpsql.mechanisms.dx.scales.dx_laplace_scales`, which verified ``Σ_k |W[k,i] − W[k,j]| / b_k ≤
        ε·d(i, j)`` for every pair of cells; with independent Laplace noise of scale ``b_k``
        per query the output densities for neighbours ``i → j`` differ by at most that
        factor. ``b_k = 0`` marks a query constant over every cell: under change-one
        neighbours its answer never changes, and it is released exact.
        """
        W = sp.csr_matrix(workload.W)
        scales = np.asarray(scales, dtype=float).reshape(-1)
        if scales.size != W.shape[0] or not np.all(np.isfinite(scales)) or np.any(scales < 0):
            raise StrategyError("internal error: one finite scale >= 0 per query is needed")
        if not _on_grid(W):
            raise StrategyError("internal error: the workload is not on the exact grid")
        release_id, names = ledger.charge(con, policy, request)   # committed here
        x = _data_vector(con, policy, workload)
        values = np.asarray(W @ x, dtype=float).reshape(-1)
        del x
        y = values.copy()
        for b in np.unique(scales[scales > 0]):
            k = np.flatnonzero(scales == b)
            y[k], _ = self.sampler.laplace(values[k], float(b), sensitivity=1.0)
        return Measurement(release_id, names, y, math.nan, 0.0, self.private)

    def release_adaptive(self, con, policy, blocks, epsilon: Fraction,
                         request: ledger.Charge, algorithm):
        """Run a data-dependent algorithm (MWEM) against the data, charged up front.

        DESIGN.md: the algorithm gets a *measure callback* (:class:`MeasureOracle`) instead
        of the counts. The ledger is charged the full ``epsilon`` first (nothing is read
        before, so a refused charge costs nothing and an aborted run refunds nothing); the
        oracle then answers ``select`` (exponential mechanism) and ``measure`` (Laplace)
        calls and refuses any call that would take the total spent past ``epsilon``. By
        basic composition of these pure-DP steps the run is ``epsilon``-DP.

        ``blocks`` lists each block's compiled workload (its columns and cells);
        ``algorithm(oracle)`` returns the result. Returns ``(release_id, names, result,
        private)``.
        """
        release_id, names = ledger.charge(con, policy, request)   # committed here
        xs = [_data_vector(con, policy, workload) for workload in blocks]
        oracle = MeasureOracle(xs, self.sampler, epsilon)
        try:
            result = algorithm(oracle)
        finally:
            oracle.close()
        return release_id, names, result, self.private

    def release_adaptive_metric(self, con, policy, blocks, graphs,
                                epsilon_per_unit: Fraction, request: ledger.Charge, algorithm):
        """:meth:`Kernel.release_adaptive` for metric (d_X) algorithms: d_X MWEM and SmallDB.

        ``request`` must charge exactly ``epsilon_per_unit`` to the table's metric budget
        (``request.metric_epsilon``); the charge is committed before any data is read, so a
        refused charge costs nothing and an aborted run refunds nothing. ``graphs`` is each
        block's public cell metric (:func:`dpsql.policy.metric.cell_distance_graph`). The algorithm gets
        a :class:`MetricMeasureOracle`, which refuses to spend past ``epsilon_per_unit``; by
        composition of d_X privacy (Kamalaruban et al., Fact 1: losses per pair add up) the run
        is d_X-private at ``epsilon_per_unit``. Returns ``(release_id, names, result, private)``.
        """
        eps = Fraction(epsilon_per_unit)
        if request.metric_epsilon is None or Fraction(request.metric_epsilon) != eps \
                or request.cost.epsilon != 0 or request.cost.delta != 0:
            raise StrategyError("internal error: a metric release charges exactly its ε per unit "
                                "distance to the metric budget, and nothing else")
        if len(graphs) != len(blocks):
            raise StrategyError("internal error: one cell metric per block is needed")
        release_id, names = ledger.charge(con, policy, request)   # committed here
        xs = [_data_vector(con, policy, workload) for workload in blocks]
        oracle = MetricMeasureOracle(xs, graphs, self.sampler, eps)
        try:
            result = algorithm(oracle)
        finally:
            oracle.close()
        return release_id, names, result, self.private


def _data_vector(con, policy, workload) -> np.ndarray:
    """The cell counts of a compiled workload (called only after the charge is committed)."""
    columns = [(p.column, policy.column(p.column), p.unit_to_part) for p in workload.partitions]
    x = engine.data_vector(con, policy.table, columns, workload.n_cells)
    if x.sum() >= EXACT_ROWS:
        raise StrategyError("the table is too large for exact products (2**32 rows or more); "
                            "this release was charged and nothing was released")
    return x


class MeasureOracle:
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
    - :meth:`select_interval`: the exponential mechanism over *every* range of an ordered
      block (MWEM's :class:`~dpsql.mechanisms.mwem.core.RangeBlock`), never listed; ε'-DP (see there).
    """

    def __init__(self, xs, sampler, epsilon: Fraction):
        self._xs = list(xs)
        self._sampler = sampler
        self.budget = Fraction(epsilon)
        self.spent = Fraction(0)
        self._cache: dict = {}

    def close(self) -> None:
        self._xs = []
        self._cache = {}

    def _spend(self, epsilon) -> Fraction:
        eps = Fraction(epsilon)
        if eps <= 0:
            raise StrategyError("internal error: a measurement must spend epsilon > 0")
        if self.spent + eps > self.budget:
            raise StrategyError(
                f"internal error: the algorithm asked for more than its charged epsilon "
                f"({float(self.spent + eps)!r} > {float(self.budget)!r}); refusing")
        self.spent += eps
        return eps

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
        # the sensitivity is recomputed here, from the rows, never taken from the caller
        sensitivity = float(group_sensitivities(groups.W, groups.starts, groups.stops).max())
        if not sensitivity > 0:
            raise StrategyError("internal error: every candidate group is empty")
        eps = self._spend(epsilon)
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
        from dpsql.noise.laplace import laplace_scale

        x = self._x(block)
        R = self._checked(x, rows)
        sensitivity = exact_l1_sensitivity(R)
        if not sensitivity > 0:
            raise StrategyError("internal error: nothing to measure")
        eps = self._spend(epsilon)
        b = laplace_scale(eps, sensitivity, R.shape[0])
        y, _ = self._sampler.laplace(np.asarray(R @ x, dtype=float), b,
                                     sensitivity=sensitivity, epsilon=eps)
        return np.asarray(y, dtype=float), b


# --------------------------------------------------------------------- metric (d_X) oracle

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
        self._diffs: dict = {}

    def close(self) -> None:
        super().close()
        self._diffs = {}

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
        eps = self._spend(epsilon)
        diff = np.abs(values - answers)
        scores = np.add.reduceat(diff, groups.offsets[:-1]) - penalties
        return dx_exponential(scores, eps, c, sampler=self._sampler)

    def measure(self, block: int, rows, epsilon) -> tuple[np.ndarray, float]:
        from dpsql.mechanisms.dx.mechanisms import PairDifferences
        from dpsql.noise.laplace import laplace_scale

        x = self._x(block)
        R = self._checked(x, rows)
        if R.shape[0] == 0:
            raise StrategyError("internal error: nothing to measure")
        c = self._positive(block, PairDifferences(R, self._pairs[int(block)]).total())
        eps = self._spend(epsilon)
        b = laplace_scale(eps, c, R.shape[0])
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
        sensitivity = math.nextafter(c * size, math.inf)
        eps = self._spend(epsilon)
        scores = smalldb_scores(Wc, x, Y, size, total)
        return dx_exponential(scores, eps, sensitivity, sampler=self._sampler)

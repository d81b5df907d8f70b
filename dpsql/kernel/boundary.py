"""The kernel's release methods: charge the ledger, read the data, add noise.

``Kernel.release`` (DESIGN.md, step 4):

0. derives the plan's exact sensitivity and checks the noise scale it is given against the
   cost it will charge (:func:`~dpsql.kernel.scales._checked_scale`); a shortfall raises
   :class:`ScaleRefused` with nothing charged or read;
1. charges the ledger, atomically (check and insert in one transaction, committed);
2. asks the engine for the cell counts ``x`` (one GROUP BY, :mod:`dpsql.kernel.data`);
3. computes ``A x`` and adds Gaussian or Laplace noise from the secure sampler;
4. returns ``y`` and drops ``x``.

The other methods are the same boundary for plans measured through marginals, batches
mixing COUNT with SUM/AVG (:meth:`Kernel.release_joint`), d_X Laplace
and the data-dependent runs (MWEM, d_X MWEM, SmallDB, through the oracles of
:mod:`dpsql.kernel.oracles` and :mod:`dpsql.kernel.metric_oracle`); each method's docstring
states its privacy argument, the package's docstring (:mod:`dpsql.kernel`) the boundary's.

Exactness of ``A x``: the sampler rounds ``A x`` to its grid and adds exact lattice noise,
with the rounding charged in the sensitivity (see :mod:`dpsql.noise.gaussian`). That argument needs
``A x`` computed exactly: plans carry entries on the 2**-20 grid with magnitude at most 1
(:func:`dpsql.workload.matrix.make_plan`), which makes float64 products exact for tables
of fewer than 2**32 rows; the kernel refuses any other plan
(:func:`~dpsql.kernel.scales._on_grid`) and any larger table (:mod:`dpsql.kernel.data`)
rather than risk a floating-point leak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import scipy.sparse as sp

from dpsql.errors import StrategyError
from dpsql.kernel.data import (SparkLink, _clique_marginals, _data_vector, _data_vectors,
                               reader)
from dpsql.kernel.joint import checked_joint, sum_measure
from dpsql.kernel.metric_oracle import MetricMeasureOracle
from dpsql.kernel.marginal_oracle import MarginalOracle
from dpsql.kernel.oracles import MeasureOracle
from dpsql.kernel.scales import (_cell_graph, _check_metric_charge, _checked_marginal_scale,
                                 _checked_scale, _on_grid, _refuse_if, _row_level_only,
                                 _same_graph)
from dpsql.noise import verify
from dpsql.noise.samplers import SecureGaussianSampler
from dpsql.store import ledger
from dpsql.workload.marginals import MarginalPlan
from dpsql.workload.matrix import Plan
from dpsql.workload.values import JointPlan, merge_cells


@dataclass(frozen=True)
class Measurement:
    release_id: int
    result_tables: list
    y: np.ndarray          # noisy measurements (public once released)
    sigma: float
    grid: float
    private: bool


class Kernel:
    """Reads data, charges, adds noise. Holds the sampler (tests may pass a seeded one) and
    the way to Spark (:class:`~dpsql.kernel.data.SparkLink`, for tables whose policy names
    a Spark source). Every release method reaches the table's source and checks its
    columns (:func:`~dpsql.kernel.data.reader`: catalog only) before the charge."""

    def __init__(self, sampler=None, *, spark: SparkLink | None = None):
        self.sampler = sampler if sampler is not None else SecureGaussianSampler()
        self.spark = spark

    def check_source(self, con, policy) -> None:
        """The policy's source reachable with every declared column readable (protect);
        the catalog only, never a value."""
        reader(con, policy, self.spark)

    @property
    def private(self) -> bool:
        return bool(getattr(self.sampler, "private", False))

    def release(self, con, policy, workload, plan: Plan, sigma: float,
                request: ledger.Charge, *, mechanism: str = "gaussian") -> Measurement:
        """Charge ``request``, read ``x``, return ``y = A x + noise`` (module docstring).

        ``mechanism`` is ``gaussian`` (``sigma`` is σ) or ``laplace`` (``sigma`` is the
        Laplace scale ``b``). The same call serves a batch answered partly from past
        releases (reuse): only the new measurements pass here, and they are checked like
        any other; the old ones are already public (post-processing).

        Privacy argument, checked here before the charge
        (:func:`~dpsql.kernel.scales._checked_scale`), never taken from the caller:

        - sensitivity: recomputed from the rounded plan, exactly (largest column L2 / L1
          norm of ``A``, :func:`~dpsql.workload.matrix.exact_l2_sensitivity`), not read from
          ``plan.sensitivity``; add/remove one row moves ``A x`` by one column of ``A``;
        - Gaussian, charged (ε, δ) with calibration ``analytic`` or ``classic``: σ must meet
          the exact privacy profile (Balle & Wang 2018) at the sensitivity plus the
          sampler's grid slack at σ, with ε and δ rounded down, and, when the charge says
          classic, the classic formula too (:func:`~dpsql.noise.gaussian.gaussian_shortfall`);
          the charge's ρ, as the accountant will read it, must be at least the exact
          ``Δ'²/2σ²`` and at most 1e-9 above it (the zCDP total is then a true bound);
        - Laplace, charged (ε, 0): ``(Δ₁ + p·2^k(b)) / b ≤ ε`` in exact rationals
          (:func:`~dpsql.noise.laplace.laplace_shortfall`): for neighbours
          ``‖A x − A x'‖₁ ≤ Δ₁`` the density ratio is at most e^ε.

        The sampler is then given the kernel's sensitivity (the secure one also checks
        OpenDP's own map against it). A shortfall raises :class:`ScaleRefused`: nothing is
        charged, read or sampled.
        """
        if isinstance(plan, MarginalPlan):      # issue 16: measured through marginals
            return self.release_marginals(con, policy, workload, plan, sigma, request,
                                          mechanism)
        if isinstance(plan, JointPlan):         # issue 20: COUNT and SUM blocks together
            return self.release_joint(con, policy, workload, plan, request, mechanism)
        if mechanism not in ("gaussian", "laplace"):
            raise StrategyError(f"internal error: unknown noise mechanism {mechanism!r}")
        if not plan.integral or not _on_grid(plan.A):
            raise StrategyError(
                f"strategy {plan.strategy!r} is not on the exact 2**-20 grid; the kernel "
                "only releases plans whose products A x are computed exactly")
        if not (np.isfinite(sigma) and sigma > 0):
            raise StrategyError("internal error: the noise scale must be positive and finite")
        sensitivity = _checked_scale(workload, plan, float(sigma), request, mechanism,
                                     policy.contribution)
        read = reader(con, policy, self.spark)
        release_id, names = ledger.charge(con, policy, request)   # committed here
        x = _data_vector(read, policy, workload)
        values = plan.measure(x)
        del x
        return self._noisy(values, sigma, sensitivity, request, mechanism, release_id, names)

    def release_per_query(self, con, policy, workload, scales: np.ndarray,
                          request: ledger.Charge) -> Measurement:
        """Charge, read ``x``, return ``y_k = (W x)_k + Laplace(b_k)`` (d_X Laplace).

        Privacy (Kamalaruban et al., d_X-private Laplace). Charged: ``request.metric_epsilon``
        = ε per unit distance, to the metric budget (standard ε, δ = 0). The scales ``b``
        come from the caller's convex program
        (:func:`dpsql.mechanisms.dx.scales.dx_laplace_scales`); the kernel does not trust
        them: before the charge it builds the cell metric itself from the declared policy
        (:func:`dpsql.policy.metric.cell_distance_graph`) and verifies, on every edge
        ``(u, v)`` of the connected cell graph, ``Σ_k |W[k,u] − W[k,v]| / b_k ≤ ε·d(u, v)``
        with exact integer differences and float sums rounded against the caller
        (:func:`dpsql.noise.verify.dx_scales_shortfall`). Edges suffice (the loss is a
        pseudometric; the graph's path metric is the cell metric). With independent Laplace
        noise of scale ``b_k`` per query (on the sampler's lattice, which holds every
        ``(W x)_k``, so no rounding) the output densities for neighbours ``u → v`` differ
        by at most that factor. ``b_k = 0`` marks a query equal on both ends of every
        edge, i.e. constant over every cell: under change-one neighbours its answer never
        changes, and it is released exact. A shortfall raises :class:`ScaleRefused` with
        nothing charged or read.
        """
        _row_level_only(policy, "d_X Laplace release")
        W = sp.csr_matrix(workload.W)
        scales = np.asarray(scales, dtype=float).reshape(-1)
        if scales.size != W.shape[0] or not np.all(np.isfinite(scales)) or np.any(scales < 0):
            raise StrategyError("internal error: one finite scale >= 0 per query is needed")
        if not _on_grid(W):
            raise StrategyError("internal error: the workload is not on the exact grid")
        eps = Fraction(request.metric_epsilon) if isinstance(request, ledger.Charge) \
            and request.metric_epsilon is not None else None
        _check_metric_charge(request, eps)
        graph = _cell_graph(policy, workload)
        _refuse_if(verify.dx_scales_shortfall(W, scales, graph.i, graph.j, graph.d,
                                              graph.n_cells, eps), "d_X Laplace release")
        read = reader(con, policy, self.spark)
        release_id, names = ledger.charge(con, policy, request)   # committed here
        x = _data_vector(read, policy, workload)
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

        Scales: each step's sensitivity and Laplace scale are derived inside the oracle from
        the rows asked for and the step's ε, then verified by the kernel's own exact checks
        before that step samples (see :class:`MeasureOracle`). These checks can only run
        after the charge: which rows a step measures depends on earlier noisy outputs, so
        they are not known before the run. A refused step aborts the run with nothing
        sampled in that step; the charge stays spent (as for any failure after the charge:
        no free retries), and nothing is published.

        ``blocks`` lists each block's compiled workload (its columns and cells);
        ``algorithm(oracle)`` returns the result. Returns ``(release_id, names, result,
        private)``.
        """
        _row_level_only(policy, "data-dependent release (MWEM)")
        read = reader(con, policy, self.spark)
        release_id, names = ledger.charge(con, policy, request)   # committed here
        xs = [_data_vector(read, policy, workload) for workload in blocks]
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

        The cell metrics are the kernel's own, built from the declared policy before the
        charge; ``graphs`` given by the caller must equal them (else :class:`ScaleRefused`,
        nothing charged). Each step's Lipschitz constant and Laplace scale are verified on
        the edges of those metrics before it samples (:class:`MetricMeasureOracle`); as for
        :meth:`release_adaptive` this can only happen after the charge (the rows depend on
        earlier noisy outputs), and a refused step aborts the run with its charge spent.
        """
        eps = Fraction(epsilon_per_unit)
        _row_level_only(policy, "d_X data-dependent release")
        _check_metric_charge(request, eps)
        if len(graphs) != len(blocks):
            raise StrategyError("internal error: one cell metric per block is needed")
        own = [_cell_graph(policy, workload) for workload in blocks]
        for given, mine in zip(graphs, own):
            if not _same_graph(given, mine):
                _refuse_if("the cell metric given differs from the policy's",
                           "d_X data-dependent release")
        read = reader(con, policy, self.spark)
        release_id, names = ledger.charge(con, policy, request)   # committed here
        xs = [_data_vector(read, policy, workload) for workload in blocks]
        oracle = MetricMeasureOracle(xs, own, self.sampler, eps)
        try:
            result = algorithm(oracle)
        finally:
            oracle.close()
        return release_id, names, result, self.private

    def release_adaptive_marginals(self, con, policy, workload, candidates,
                                   epsilon: Fraction, request: ledger.Charge, algorithm):
        """:meth:`release_adaptive` for batches wider than the full product (issue 16): MWEM
        over a graphical model. The ledger is charged the full ``epsilon`` first; one engine
        scan then reads the marginals of the maximal ``candidates`` (column index sets of
        ``workload``'s columns, public), and ``algorithm`` gets a :class:`MarginalOracle`
        (exponential mechanism over the candidates' full marginals, sensitivity 1; Laplace on
        ``k`` full marginals, L1 sensitivity ``k``; both derived and checked there, each step
        refused past ``epsilon``). By basic composition of these pure-DP steps the run is
        ``epsilon``-DP. Returns ``(release_id, names, result, private)``."""
        _row_level_only(policy, "data-dependent release (MWEM)")
        sets = {tuple(int(i) for i in C) for C in candidates}
        cliques = tuple(C for C in sets if C and not any(set(C) < set(D) for D in sets))
        read = reader(con, policy, self.spark)
        release_id, names = ledger.charge(con, policy, request)   # committed here
        counts = _clique_marginals(read, policy, workload, cliques)
        oracle = MarginalOracle(counts, workload.shape, candidates, self.sampler, epsilon)
        try:
            result = algorithm(oracle)
        finally:
            oracle.close()
        return release_id, names, result, self.private

    # --------------------------------------------- releases through marginals (issue 16)

    def release_marginals(self, con, policy, workload, plan: MarginalPlan, sigma: float,
                          request: ledger.Charge, mechanism: str = "gaussian") -> Measurement:
        """Charge, read the cliques' marginals (never the full product), return ``y = A x +
        noise`` for a :class:`~dpsql.workload.marginals.MarginalPlan` (Gaussian σ, or Laplace
        scale ``b`` on :func:`~dpsql.workload.marginals.computed_l1_sensitivity` for a pure
        charge: ``(Δ₁ + p·2^k(b))/b ≤ ε`` exactly,
        :func:`~dpsql.kernel.scales._checked_laplace`). :meth:`release` dispatches such plans
        here.

        Privacy argument, checked before the charge, never taken from the caller
        (:func:`~dpsql.kernel.scales._checked_marginal_scale`):

        - sensitivity: the kernel recomputes, from the plan's factors and scales,
          :func:`~dpsql.workload.marginals.computed_l2_sensitivity` — the exact rational bound
          ``Σ_k scale_k² Π_i max_j ‖F_{k,i}[:, j]‖₂²`` on the squared L2 sensitivity of the
          stacked rows (a Kronecker product's column norm is the product of its factors'; a
          union's squared column norm is the sum over its blocks), enlarged by the proven
          bound on the float64 evaluation error of ``A x`` for tables under 2³² rows
          (:mod:`dpsql.workload.marginals`), so the function actually computed has at most
          that sensitivity;
        - σ must meet the exact privacy profile at that sensitivity plus the sampler's grid
          slack, with the charge's ρ matching (:func:`~dpsql.kernel.scales._checked_gaussian`),
          as for dense plans.

        Data access: one engine call, the marginals of the plan's maximal cliques over the
        columns' declared parts (every part present, zeros included); each measurement's
        marginal is summed down from a clique's (exact: integer counts under 2⁵³).
        """
        if mechanism not in ("gaussian", "laplace"):
            raise StrategyError(f"internal error: unknown noise mechanism {mechanism!r}")
        if not (np.isfinite(sigma) and sigma > 0):
            raise StrategyError("internal error: the noise scale must be positive and finite")
        sensitivity = _checked_marginal_scale(workload, plan, float(sigma), request,
                                              mechanism, policy.contribution)
        read = reader(con, policy, self.spark)
        release_id, names = ledger.charge(con, policy, request)   # committed here
        counts = _clique_marginals(read, policy, workload, plan.cliques())
        values = np.concatenate([_measure_marginal(m, counts, plan.sizes)
                                 for m in plan.measurements])
        del counts
        return self._noisy(values, sigma, sensitivity, request, mechanism, release_id, names)

    # ------------------------------------------- COUNT and SUM blocks together (issue 20)

    def release_joint(self, con, policy, workload, joint: JointPlan, request: ledger.Charge,
                      mechanism: str = "gaussian") -> Measurement:
        """Charge once, read the counts and every bounded value's per-cell sums in one scan,
        return each block's ``A_b v_b + noise`` (concatenated, blocks in order).

        Privacy argument, checked before the charge (:func:`~dpsql.kernel.joint.checked_joint`,
        from the plans' exact columns and the declared bounds, never from the caller):
        one row moves every block in the same cell ``j``, block ``b`` by ``v_b A_b e_j`` with
        ``|v_b| ≤ M_b`` (the bound of its clamp, :mod:`dpsql.workload.values`; 1 for counts),
        and one unit by at most ``k`` rows (``max_rows_per_unit``). Gaussian: whitened by
        each block's σ the release is one Gaussian mechanism with σ = 1 and sensitivity
        ``k·sqrt(max_j Σ_b M_b² ‖A_b e_j‖²/σ_b²)`` plus float and lattice slack, checked
        against the charged (ε, δ) and ρ like any Gaussian release. Laplace: each block's
        scale against its share ε_b at L1 sensitivity ``k M_b Δ₁(A_b)``, the shares summing
        to at most the charged ε (basic composition). A shortfall raises
        :class:`ScaleRefused`: nothing is charged, read or sampled.

        The engine clamps each value to exactly the bounds the sensitivity was derived from
        (:func:`dpsql.kernel.data._sum_of`); sums of values are multiplied exactly and
        rounded once (:func:`~dpsql.kernel.joint.sum_measure`), counts as for any dense plan.
        A block on merged cells measures its vector summed exactly over them (one row still
        lands in one merged cell, so the column bounds above hold with ``A_b e_{cells[j]}``).
        """
        sensitivities = checked_joint(workload, joint, request, mechanism,
                                      policy.contribution)
        read = reader(con, policy, self.spark)
        release_id, names = ledger.charge(con, policy, request)   # committed here
        x, sums = _data_vectors(read, policy, workload, joint.values)
        ys, pending = [], iter(sums)
        for block, sensitivity in zip(joint.blocks, sensitivities):
            n = block.plan.n if block.plan.A is None else block.plan.A.shape[1]
            values = (block.plan.measure(merge_cells(block.cells, x, n)) if block.value is None
                      else sum_measure(block.plan, merge_cells(block.cells, next(pending), n),
                                       block.value))
            if mechanism == "laplace":
                y, _ = self.sampler.laplace(values, block.scale, sensitivity=sensitivity,
                                            epsilon=block.epsilon)
            else:
                y, _ = self.sampler.sample(values, block.scale, sensitivity=sensitivity)
            ys.append(np.asarray(y, dtype=float))
        del x, sums
        return Measurement(release_id, names, np.concatenate(ys), math.nan, 0.0,
                           self.private)

    def _noisy(self, values: np.ndarray, sigma: float, sensitivity: float,
               request: ledger.Charge, mechanism: str, release_id: int,
               names: list) -> Measurement:
        """``values`` plus the release's noise from the sampler, given the sensitivity the
        kernel checked: Laplace of scale ``b = sigma`` with the charged ε, or Gaussian σ."""
        if mechanism == "laplace":
            y, grid = self.sampler.laplace(values, sigma, sensitivity=sensitivity,
                                           epsilon=request.cost.epsilon)
        else:
            y, grid = self.sampler.sample(values, sigma, sensitivity=sensitivity)
        return Measurement(release_id, names, np.asarray(y, dtype=float), sigma, grid,
                           self.private)


def _measure_marginal(m, counts: dict, sizes) -> np.ndarray:
    """``scale · (⊗F_i) m`` on the marginal of the measurement's columns, summed down from
    the smallest clique marginal that contains them (float64 mode products, as bounded)."""
    from dpsql.workload.blocks import apply_along

    key = min((c for c in counts if set(m.columns) <= set(c)),
              key=lambda c: math.prod(sizes[i] for i in c))
    T = counts[key].sum(axis=tuple(a for a, i in enumerate(key) if i not in m.columns))
    for axis, F in enumerate(m.factors):
        T = apply_along(T, F, axis)
    return (np.asarray(T, dtype=float) * m.scale).reshape(-1)

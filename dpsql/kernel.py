"""The privacy boundary: the only code that reads the data.

``Kernel.release`` (DESIGN.md, step 4):

0. derives the plan's exact sensitivity and checks the noise scale it is given against the
   cost it will charge (:func:`_checked_scale`); a shortfall raises :class:`ScaleRefused`
   with nothing charged or read;
1. charges the ledger, atomically (check and insert in one transaction, committed);
2. asks the engine for the cell counts ``x`` (one GROUP BY);
3. computes ``A x`` and adds Gaussian or Laplace noise from the secure sampler;
4. returns ``y`` and drops ``x``.

The kernel owns noise scales (issue 15): no σ, Laplace ``b``, d_X scale, sensitivity or
Lipschitz constant computed by a caller is used before the kernel has checked it against
the charge with exact (or provably conservative) arithmetic. The matrix and d_X Laplace
releases check before the charge; data-dependent runs (MWEM, d_X MWEM, SmallDB) check each
step in their oracle before it spends or samples, which can only be after the run's charge.
Each method's docstring states its privacy argument.

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
from dpsql.errors import ScaleRefused, StrategyError
from dpsql.noise import verify
from dpsql.noise.composition import Spend
from dpsql.noise.gaussian import (exact_zcdp_rho, gaussian_shortfall, sensitivity_with_slack)
from dpsql.noise.laplace import laplace_shortfall
from dpsql.noise.samplers import SecureGaussianSampler
from dpsql.mechanisms.mwem.groups import AllIntervals, CandidateGroups, GroupValues, group_sensitivities
from dpsql.workload.marginals import (MarginalPlan, computed_l1_sensitivity,
                                     computed_l2_sensitivity)
from dpsql.workload.matrix import EXACT_ROWS, QUANTUM_BITS, Plan, exact_l1_sensitivity

#: a recorded zCDP ρ may overstate the exact one by at most this (relative); above, the
#: ledger's record does not match the σ used and the release is refused
RHO_MATCH = Fraction(1, 10**9)


def _refuse_if(reason: str | None, what: str, after_charge: bool = False) -> None:
    if reason is not None:
        tail = ("; nothing was sampled (the run's charge stays spent)" if after_charge
                else "; nothing was charged or read")
        raise ScaleRefused(f"the kernel refuses the {what}: {reason}{tail}")



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

        ``mechanism`` is ``gaussian`` (``sigma`` is σ) or ``laplace`` (``sigma`` is the
        Laplace scale ``b``). The same call serves a batch answered partly from past
        releases (reuse): only the new measurements pass here, and they are checked like
        any other; the old ones are already public (post-processing).

        Privacy argument, checked here before the charge (:meth:`_checked_scale`), never
        taken from the caller:

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
            return release_marginals(self, con, policy, workload, plan, sigma, request,
                                     mechanism)
        if mechanism not in ("gaussian", "laplace"):
            raise StrategyError(f"internal error: unknown noise mechanism {mechanism!r}")
        if not plan.integral or not _on_grid(plan.A):
            raise StrategyError(
                f"strategy {plan.strategy!r} is not on the exact 2**-20 grid; the kernel "
                "only releases plans whose products A x are computed exactly")
        if not (np.isfinite(sigma) and sigma > 0):
            raise StrategyError("internal error: the noise scale must be positive and finite")
        sensitivity = _checked_scale(workload, plan, float(sigma), request, mechanism)
        release_id, names = ledger.charge(con, policy, request)   # committed here
        x = _data_vector(con, policy, workload)
        values = plan.measure(x)
        del x
        if mechanism == "laplace":
            y, grid = self.sampler.laplace(values, sigma, sensitivity=sensitivity,
                                           epsilon=request.cost.epsilon)
        else:
            y, grid = self.sampler.sample(values, sigma, sensitivity=sensitivity)
        return Measurement(release_id, names, np.asarray(y, dtype=float), sigma, grid,
                           self.private)

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

        The cell metrics are the kernel's own, built from the declared policy before the
        charge; ``graphs`` given by the caller must equal them (else :class:`ScaleRefused`,
        nothing charged). Each step's Lipschitz constant and Laplace scale are verified on
        the edges of those metrics before it samples (:class:`MetricMeasureOracle`); as for
        :meth:`release_adaptive` this can only happen after the charge (the rows depend on
        earlier noisy outputs), and a refused step aborts the run with its charge spent.
        """
        eps = Fraction(epsilon_per_unit)
        _check_metric_charge(request, eps)
        if len(graphs) != len(blocks):
            raise StrategyError("internal error: one cell metric per block is needed")
        own = [_cell_graph(policy, workload) for workload in blocks]
        for given, mine in zip(graphs, own):
            if not _same_graph(given, mine):
                _refuse_if("the cell metric given differs from the policy's",
                           "d_X data-dependent release")
        release_id, names = ledger.charge(con, policy, request)   # committed here
        xs = [_data_vector(con, policy, workload) for workload in blocks]
        oracle = MetricMeasureOracle(xs, own, self.sampler, eps)
        try:
            result = algorithm(oracle)
        finally:
            oracle.close()
        return release_id, names, result, self.private


def _checked_scale(workload, plan: Plan, sigma: float, request: ledger.Charge,
                   mechanism: str) -> float:
    """The plan's exact sensitivity, once σ (or b) and the charge are verified against it
    (:meth:`Kernel.release`); raises :class:`ScaleRefused` otherwise. Public inputs only."""
    what = f"{mechanism} release of strategy {plan.strategy!r}"
    if not isinstance(request, ledger.Charge):
        raise StrategyError("internal error: a release needs its ledger Charge")
    if request.mechanism != mechanism:
        _refuse_if(f"the charge records mechanism {request.mechanism!r}", what)
    n_cols = plan.n if plan.A is None else plan.A.shape[1]
    if n_cols != workload.n_cells:
        _refuse_if(f"the plan covers {n_cols} cells, the workload {workload.n_cells}", what)
    p = plan.n_measurements
    if request.sigma is not None and float(request.sigma) != sigma:
        _refuse_if(f"the charge records scale {request.sigma!r} but {sigma!r} was given",
                   what)
    cost = request.cost
    if mechanism == "laplace":
        if cost.delta != 0:
            _refuse_if("a Laplace release is pure: its charge must have delta = 0", what)
        sensitivity = 1.0 if plan.A is None else exact_l1_sensitivity(plan.A)
        _refuse_if(laplace_shortfall(sigma, cost.epsilon, sensitivity, p), what)
        return sensitivity
    sensitivity = 1.0 if plan.A is None else verify.exact_l2_norm(plan.A)
    _refuse_if(gaussian_shortfall(sigma, cost.epsilon, cost.delta, sensitivity, p,
                                  request.calibration), what)
    need = exact_zcdp_rho(sigma, sensitivity_with_slack(sigma, sensitivity, p))
    if request.rho is None:
        _refuse_if("a Gaussian charge must record its zCDP rho", what)
    counted = Spend.of(cost.epsilon, cost.delta, mechanism, request.rho).rho
    if counted is None or counted < need:
        _refuse_if(f"the charge records rho={request.rho!r}, below the exact "
                   f"{float(need)!r} of sigma={sigma!r}", what)
    if Fraction(request.rho) > need * (1 + RHO_MATCH):
        _refuse_if(f"the charge records rho={request.rho!r}, not the {float(need)!r} of "
                   f"sigma={sigma!r}", what)
    return sensitivity


def _cell_graph(policy, workload):
    """The kernel's own cell metric of a block, from the declared policy (public)."""
    from dpsql.policy.metric import cell_distance_graph

    if getattr(policy, "metric", None) is None:
        raise StrategyError(f"table {policy.table!r} declares no metric model")
    return cell_distance_graph(policy.metric, workload.partitions, policy)


def _check_metric_charge(request: ledger.Charge, eps: Fraction) -> None:
    if not isinstance(request, ledger.Charge) or request.metric_epsilon is None \
            or Fraction(request.metric_epsilon) != eps \
            or request.cost.epsilon != 0 or request.cost.delta != 0:
        raise StrategyError("internal error: a metric release charges exactly its ε per unit "
                            "distance to the metric budget, and nothing else")


def _same_graph(given, mine) -> bool:
    """Whether the caller's cell metric is the kernel's own (same edges, same lengths)."""
    return (all(hasattr(given, k) for k in ("i", "j", "d", "shape"))
            and tuple(given.shape) == tuple(mine.shape)
            and np.array_equal(given.i, mine.i) and np.array_equal(given.j, mine.j)
            and np.array_equal(given.d, mine.d))


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
        self._xs = list(xs)
        self._sampler = sampler
        self.budget = Fraction(epsilon)
        self.spent = Fraction(0)
        self._cache: dict = {}

    def close(self) -> None:
        self._xs = []
        self._cache = {}

    def _affordable(self, epsilon) -> Fraction:
        """The step's ε, exactly, if it fits in what is left (nothing is spent yet)."""
        eps = Fraction(epsilon)
        if eps <= 0:
            raise StrategyError("internal error: a measurement must spend epsilon > 0")
        if self.spent + eps > self.budget:
            raise StrategyError(
                f"internal error: the algorithm asked for more than its charged epsilon "
                f"({float(self.spent + eps)!r} > {float(self.budget)!r}); refusing")
        return eps

    def _spend(self, epsilon) -> Fraction:
        eps = self._affordable(epsilon)
        self.spent += eps
        return eps

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


# ------------------------------------------------- releases through marginals (issue 16)

def release_marginals(kernel: Kernel, con, policy, workload, plan: MarginalPlan,
                      sigma: float, request: ledger.Charge,
                      mechanism: str = "gaussian") -> Measurement:
    """Charge, read the cliques' marginals (never the full product), return ``y = A x +
    noise`` for a :class:`~dpsql.workload.marginals.MarginalPlan` (Gaussian σ, or Laplace
    scale ``b`` on :func:`~dpsql.workload.marginals.computed_l1_sensitivity` for a pure
    charge: ``(Δ₁ + p·2^k(b))/b ≤ ε`` exactly, :func:`_checked_laplace`).

    Privacy argument, checked before the charge, never taken from the caller:

    - sensitivity: the kernel recomputes, from the plan's factors and scales,
      :func:`~dpsql.workload.marginals.computed_l2_sensitivity` — the exact rational bound
      ``Σ_k scale_k² Π_i max_j ‖F_{k,i}[:, j]‖₂²`` on the squared L2 sensitivity of the
      stacked rows (a Kronecker product's column norm is the product of its factors'; a
      union's squared column norm is the sum over its blocks), enlarged by the proven bound
      on the float64 evaluation error of ``A x`` for tables under 2³² rows (the module's
      docstring), so the function actually computed has at most that sensitivity;
    - σ must meet the exact privacy profile at that sensitivity plus the sampler's grid
      slack, with the charge's ρ matching (:func:`_checked_gaussian`), as for dense plans.

    Data access: one engine call, the marginals of the plan's maximal cliques over the
    columns' declared parts (every part present, zeros included); each measurement's
    marginal is summed down from a clique's (exact: integer counts under 2⁵³).
    """
    if mechanism not in ("gaussian", "laplace"):
        raise StrategyError(f"internal error: unknown noise mechanism {mechanism!r}")
    if not (np.isfinite(sigma) and sigma > 0):
        raise StrategyError("internal error: the noise scale must be positive and finite")
    what = f"{mechanism} release of strategy {plan.strategy!r}"
    if tuple(plan.sizes) != tuple(workload.shape):
        _refuse_if(f"the plan covers parts {plan.sizes}, the workload {workload.shape}", what)
    if mechanism == "laplace":
        sensitivity = computed_l1_sensitivity(plan)
        _checked_laplace(float(sigma), request, sensitivity, plan.n_measurements, what)
    else:
        sensitivity = computed_l2_sensitivity(plan)
        _checked_gaussian(float(sigma), request, sensitivity, plan.n_measurements, what)
    release_id, names = ledger.charge(con, policy, request)   # committed here
    columns = [(p.column, policy.column(p.column), p.unit_to_part)
               for p in workload.partitions]
    cliques = plan.cliques()
    counts = engine.marginals(con, policy.table, columns, cliques)
    if max(float(T.sum()) for T in counts.values()) >= EXACT_ROWS:
        raise StrategyError("the table is too large for exact products (2**32 rows or more); "
                            "this release was charged and nothing was released")
    values = np.concatenate([_measure_marginal(m, counts, plan.sizes)
                             for m in plan.measurements])
    del counts
    if mechanism == "laplace":
        y, grid = kernel.sampler.laplace(values, sigma, sensitivity=sensitivity,
                                         epsilon=request.cost.epsilon)
    else:
        y, grid = kernel.sampler.sample(values, sigma, sensitivity=sensitivity)
    return Measurement(release_id, names, np.asarray(y, dtype=float), sigma, grid,
                       kernel.private)


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


def _checked_laplace(b: float, request: ledger.Charge, sensitivity: float, p: int,
                     what: str) -> None:
    """``b`` and the charge against the L1 sensitivity the kernel derived: a pure charge and
    ``(Δ₁ + p·2^k(b)) / b ≤ ε`` exactly (:func:`~dpsql.noise.laplace.laplace_shortfall`)."""
    if not isinstance(request, ledger.Charge):
        raise StrategyError("internal error: a release needs its ledger Charge")
    if request.mechanism != "laplace":
        _refuse_if(f"the charge records mechanism {request.mechanism!r}", what)
    if request.cost.delta != 0:
        _refuse_if("a Laplace release is pure: its charge must have delta = 0", what)
    if request.sigma is not None and float(request.sigma) != b:
        _refuse_if(f"the charge records scale {request.sigma!r} but {b!r} was given", what)
    _refuse_if(laplace_shortfall(b, request.cost.epsilon, sensitivity, p), what)


def _checked_gaussian(sigma: float, request: ledger.Charge, sensitivity: float, p: int,
                      what: str) -> None:
    """σ and the charge against a sensitivity the kernel derived (the Gaussian half of
    :func:`_checked_scale`): the exact profile with grid slack, and ρ matching the charge."""
    if not isinstance(request, ledger.Charge):
        raise StrategyError("internal error: a release needs its ledger Charge")
    if request.mechanism != "gaussian":
        _refuse_if(f"the charge records mechanism {request.mechanism!r}", what)
    if request.sigma is not None and float(request.sigma) != sigma:
        _refuse_if(f"the charge records scale {request.sigma!r} but {sigma!r} was given", what)
    cost = request.cost
    _refuse_if(gaussian_shortfall(sigma, cost.epsilon, cost.delta, sensitivity, p,
                                  request.calibration), what)
    need = exact_zcdp_rho(sigma, sensitivity_with_slack(sigma, sensitivity, p))
    if request.rho is None:
        _refuse_if("a Gaussian charge must record its zCDP rho", what)
    counted = Spend.of(cost.epsilon, cost.delta, "gaussian", request.rho).rho
    if counted is None or counted < need or Fraction(request.rho) > need * (1 + RHO_MATCH):
        _refuse_if(f"the charge records rho={request.rho!r}, not the exact {float(need)!r} "
                   f"of sigma={sigma!r}", what)

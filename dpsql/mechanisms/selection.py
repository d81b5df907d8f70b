"""Strategy selection: the expected error of each candidate strategy, from public inputs only.

For a compiled workload and a privacy request this module builds each candidate's plan
(through the strategy cache when the strategy is costly), calibrates its noise, computes the
exact per-answer standard errors by least squares, and picks the smallest expected RMSE. It
never reads data and never touches the budget: ``explain`` is this module's output.

The work splits in two: :func:`evaluate` (plan, least squares, error factors per unit noise
variance) and the lower bound (:func:`certified_bound`, else the singular value bound) do
not depend on ε, δ or the calibration and are stored in the selection cache
(:mod:`dpsql.store.selection_cache`); :func:`price` (noise scale, standard errors, RMSE) is
redone for every request, by the same arithmetic, so a cache hit gives the same numbers
bit for bit. The noise families and each plan's noise scale live in
:mod:`dpsql.mechanisms.matrix`, the singular value bound in :mod:`dpsql.mechanisms.halfwidths`.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np

from dpsql import cancel
from dpsql.store import selection_cache
from dpsql.store import strategy_cache
from dpsql.errors import StrategyError
from dpsql.mechanisms import fit, halfwidths, matrix
from dpsql.inference import least_squares
from dpsql.inference.least_squares import LeastSquares
from dpsql.store.results import Candidate, Explanation
from dpsql.store.selection_cache import Evaluation
from dpsql.sql.compile import Workload

#: auto skips a strategy whose estimated selection time exceeds this many seconds
AUTO_TIME_LIMIT = 30.0
#: the chosen plan's Cholesky factor (8 n² bytes) is stored for n up to this
MAX_STORED_FACTOR = 4096
#: CPU seconds per byte of a Cholesky factor to store it (DELETE + INSERT) and checkpoint
#: it (:func:`factor_worth_storing`)
FACTOR_STORE_SECONDS_PER_BYTE = 1.5e-8


def _plan_for(con, name: str, strategy, workload: Workload, family: str,
              predicted: float = 0.0):
    """(plan, seconds, cached, key, digest): the strategy's plan, from the strategy cache
    when it is costly, its key in that cache (None when not cached) and, when stored here,
    its matrix's digest. A plan ``predicted`` to take long is computed in a killable worker
    (:func:`dpsql.cancel.run`)."""
    info = matrix.workload_info(workload)
    started = time.perf_counter()
    key = digest = None
    if getattr(strategy, "cacheable", False) and con is not None:
        key = strategy_cache.fingerprint(name, strategy, info, family)
        plan = strategy_cache.load(con, key)
        if plan is not None:
            return plan, time.perf_counter() - started, True, key, None
    plan = cancel.run(strategy.plan, info, seconds=predicted)
    seconds = time.perf_counter() - started
    if key is not None:
        digest = strategy_cache.store(con, key, plan, seconds)
    return plan, seconds, False, key, digest


def evaluate(con, family: str, name: str, strategy, workload: Workload, auto: bool,
             w_hash: str | None = None) -> Evaluation:
    """One candidate's plan and error factors: everything about it that does not depend on
    ε, δ or the calibration (``auto``: skip it over the time limit, and record a strategy
    that does not apply instead of raising). ``w_hash`` (:func:`workload_hash` of ``W``)
    names a cheap strategy's plan for the strategy cache."""
    estimate = getattr(strategy, "estimated_seconds", None)
    seconds = estimate(matrix.workload_info(workload)) if estimate is not None else 0.0
    if auto and seconds > AUTO_TIME_LIMIT:
        return Evaluation(family, name, status="skipped",
                          note=f"skipped by auto: estimated {seconds:.0f} s to select, over "
                               f"the {AUTO_TIME_LIMIT:.0f} s limit (ask for it by name)")
    predicted = fit.predicted(workload, family, name, strategy).seconds
    try:
        plan, seconds, cached, key, digest = _plan_for(con, name, strategy, workload,
                                                       family, predicted)
        solver, factors = cancel.run(_solved, plan, workload.W,
                                     seconds=least_squares.solve_seconds(plan, workload.W))
    except StrategyError as exc:
        if not auto:
            raise
        return Evaluation(family, name, note=str(exc), status="error")
    except MemoryError:
        if not auto:
            raise                      # select turns it into the BatchTooLarge refusal
        return Evaluation(family, name, status="skipped",
                          note="skipped: out of memory while planning it")
    if key is None and plan.A is not None and w_hash is not None:
        key = strategy_cache.rows_fingerprint(name, strategy, w_hash, workload.shape, family)
    return Evaluation(family, name, factors, plan, seconds=seconds, cached=cached,
                      plan_key=key, solver=solver, digest=digest)


def _solved(plan, W) -> tuple:
    """(solver, error factors) of a plan: its least-squares factorisation and the answers'
    variances per unit noise variance."""
    solver = LeastSquares(plan)
    return solver, solver.error_factors(W)


def price(e: Evaluation, eps, dlt, calibration: str, bound: float,
          contribution: int = 1) -> Candidate:
    """A candidate at this ε, δ and calibration: its noise scale and standard errors
    (``contribution``: the policy's rows per unit of privacy, which scales every
    sensitivity)."""
    if e.factors is None:
        return Candidate(e.name, math.nan, math.nan, math.nan, np.zeros(0), note=e.note,
                         mechanism=e.family)
    scale, variance = matrix.noise_scale(e.family, e.plan, eps, dlt, calibration, contribution)
    stderr = np.sqrt(variance * np.maximum(e.factors, 0.0))
    rmse = float(np.sqrt(np.mean(stderr ** 2))) if len(stderr) else 0.0
    sensitivity = contribution * (e.plan.l1_sensitivity if e.family == "laplace"
                                  else e.plan.sensitivity)
    return Candidate(e.name, scale, sensitivity, rmse, stderr, seconds=e.seconds,
                     bound_ratio=rmse / bound if bound > 0 else math.nan, cached=e.cached,
                     plan=e.plan, mechanism=e.family)


def requested(policy, dlt, strategy: str) -> list[tuple]:
    """``(family, name, strategy object)`` of every candidate a request compares."""
    family = matrix.family_of(dlt)
    known, auto = matrix.registry(family)
    if strategy == "auto":
        names = [(family, n, known[n]) for n in auto]
        if family == "gaussian" and policy.delta == 0:
            family = "laplace"         # a pure budget: only pure mechanisms may spend it
            known, auto = matrix.registry(family)
            names = [(family, n, known[n]) for n in auto]
        elif family == "gaussian":    # Laplace (pure ε, no δ spent) competes too
            l1, l1_auto = matrix.registry("laplace")
            names += [("laplace", n, l1[n]) for n in l1_auto]
        return names
    return [(family, *matrix.resolve(strategy, family))]


def select(con, policy, workload: Workload, eps, dlt, strategy: str,
           calibration: str, objective: str = "rmse", family: str | None = None
           ) -> Explanation:
    """Every candidate's expected error and the best one (no data, no budget).

    ``objective``: ``rmse`` (the workload's RMSE, default) or ``max_stderr`` (the largest
    standard error of any answer) is what ``auto`` minimises. The ε-free part of the work
    (:func:`evaluate`, the singular value bound) comes from the selection cache when this
    workload was seen with the same candidates (:mod:`dpsql.store.selection_cache`); the chosen
    candidate then carries its real plan, re-read and re-verified, and a solver whose
    factorisation is read (or computed) only when it is used. ``family`` (``gaussian`` or
    ``laplace``) keeps only that noise family's candidates (a joint release has one); the
    policy's ``contribution`` (rows per unit of privacy) scales every noise scale."""
    auto = strategy == "auto"
    k = getattr(policy, "contribution", 1)
    wanted = [n for n in requested(policy, dlt, strategy) if family in (None, n[0])]
    names, skipped = fit.screen(workload, wanted, auto)
    bound_note = fit.bound_fits(workload)        # sizes first: before any eigenvalue
    for fresh in (False, True):
        started = time.perf_counter()
        try:
            total, evals, hit, where = _evaluations(con, workload, names, auto, fresh,
                                                    bound_note is None)
        except MemoryError:
            raise fit.out_of_memory(workload) from None
        bounds_by = {f: k * halfwidths.bound_rmse(f, eps, dlt, calibration, total,
                                                  workload.n_queries)
                     for f in {f for f, _, _ in names}}
        candidates = [price(e, eps, dlt, calibration, bounds_by[e.family], k) for e in evals]
        usable = [i for i, c in enumerate(candidates) if np.isfinite(c.rmse)]
        if not usable:
            raise StrategyError("no strategy can answer this batch: "
                                + "; ".join(c.note for c in candidates))
        i = min(usable, key=lambda k: _metric(candidates[k].stderr, objective))
        if hit:
            chosen = _materialise(con, evals[i], names[i][2], workload)
            if chosen is None:
                continue                 # an entry that does not fit its plans: recompute
            candidates[i] = replace(candidates[i], plan=chosen[0], solver=chosen[1],
                                    seconds=time.perf_counter() - started)
        else:
            candidates[i] = replace(candidates[i], solver=evals[i].solver)
            _remember(con, where, workload, total, evals, i)
        break
    best = candidates[i]
    candidates += [price(e, eps, dlt, calibration, math.nan, k) for e in skipped]
    return Explanation(policy.table, float(eps), float(dlt), best.strategy, best.sigma,
                       best.rmse, best.stderr, workload.n_queries, workload.n_cells,
                       tuple(candidates),
                       tuple((o.query.index, o.start, o.stop) for o in workload.outputs),
                       bound_rmse=bounds_by[best.mechanism], mechanism=best.mechanism,
                       bound_note=bound_note or "",
                       bound_name=CERTIFIED if math.isfinite(certified_bound(evals)) else "svdb")


def _evaluations(con, workload: Workload, names, auto: bool, fresh: bool,
                 with_bound: bool = True):
    """(lower bound, evaluations, from the cache?, (entry key, W hash)) for ``names``: the
    bound is :func:`certified_bound` when ``optimal`` planned, else svdb (NaN without
    ``with_bound``: over the planning limits)."""
    where = None
    if con is not None:
        w_hash = selection_cache.cached_hash(workload)
        where = (selection_cache.key(w_hash, workload.shape, names, auto, AUTO_TIME_LIMIT),
                 w_hash)
        found = None if fresh else selection_cache.load(con, *where, workload, names)
        if found is not None:
            return found[0], found[1], True, where
    evals = [evaluate(con, f, n, obj, workload, auto, where and where[1])
             for f, n, obj in names]
    total = certified_bound(evals) if with_bound else math.nan
    if with_bound and not math.isfinite(total):
        if _gram_shared(con, workload, names):
            _ = matrix.workload_info(workload).V   # here, once: not again in the bound's worker
        total = cancel.run(halfwidths.svdb, matrix.workload_info(workload),
                           seconds=fit.bound_seconds(workload))
    return total, evals, False, where


#: the name :attr:`Explanation.bound_name` gives :func:`certified_bound`
CERTIFIED = "dual bound of optimal"


def certified_bound(evals) -> float:
    """The dual lower bound the ``optimal`` solver certified, when it planned this workload
    (its plan's ``lower_bound`` note), else NaN.

    It replaces the singular value bound (svdb) as the explained lower bound: any dual
    point's ``h(w)²`` is a lower bound on ``tr(V (AᵀA)⁻¹)`` over every strategy with unit
    column norms, the same quantity svdb bounds (svdb is ``h`` at uniform ``w``), evaluated
    from float64 eigenvalues at the solver's best point, within its certified gap of the
    optimum: at least svdb up to that gap (1.4% above it on 1,024 points + 1,500 ranges),
    and one eigendecomposition fewer (0.12 s at n = 1,024). For Laplace, ``Δ₁ ≥ Δ₂`` column
    by column, so it bounds that family too (as for svdb: :mod:`~dpsql.mechanisms.halfwidths`).
    """
    found = [note[1] for e in evals if e.factors is not None and e.plan is not None
             and e.plan.strategy == "optimal" for note in e.plan.notes
             if isinstance(note, tuple) and len(note) == 2 and note[0] == "lower_bound"]
    found = [float(v) for v in found if isinstance(v, (int, float)) and math.isfinite(v)
             and v > 0]
    return max(found) if found else math.nan


def _gram_shared(con, workload: Workload, names) -> bool:
    """Whether the bound reads the Gram matrix ``V`` that this process computes anyway (a
    cacheable candidate's :func:`strategy_cache.fingerprint` hashes it): then it is computed
    before the bound's worker forks, instead of once in the worker and again here."""
    info = matrix.workload_info(workload)
    if con is None or info.W is None or info.W.shape[0] < info.n:
        return False
    return any(getattr(obj, "cacheable", False) for _, _, obj in names)


def _materialise(con, e: Evaluation, strategy, workload: Workload):
    """(plan, solver) of a candidate from the selection cache, or None when its matrix does
    not have the numbers the entry recorded (the entry is then recomputed)."""
    found = strategy_cache.load_entry(con, e.plan_key) if e.plan_key is not None else None
    if found is None:    # the identity, or a matrix no longer stored: plan it again
        plan = strategy.plan(matrix.workload_info(workload))
        digest = None
        if e.plan_key is not None and plan.A is not None:
            digest = strategy_cache.store(con, e.plan_key, plan, 0.0)
    else:
        plan, digest = found
    if not selection_cache.same_numbers(plan, e.plan) or \
            (plan.A is None) != (e.plan_key is None):
        return None
    if plan.A is None:
        return plan, LeastSquares(plan)
    key = solver_key(e.plan_key, digest)
    return plan, LeastSquares(plan, factor=selection_cache.factor_loader(con, key, plan.n),
                              key=key)


def solver_key(plan_key: str, digest: str) -> str:
    """The name of a plan's exact matrix: its strategy-cache key and the matrix digest."""
    return f"{plan_key}:{digest}"


def factor_worth_storing(plan) -> bool:
    """Whether the chosen plan's Cholesky factor is stored for later hits: only when
    recomputing it (:func:`~dpsql.inference.least_squares.factorise_seconds`: the Gram
    ``AᵀA`` and its Cholesky factor) is predicted to cost more than storing it and its share
    of the checkpoint (``FACTOR_STORE_SECONDS_PER_BYTE`` per byte of its 8 n²), and n is at
    most :data:`MAX_STORED_FACTOR`. A hit without a stored factor factorises again
    (:class:`LeastSquares` given a loader that finds none), with the same result.

    Measured (``benchmarks/factor_store.py``: CPU s, one BLAS thread, dense n x n plans as
    ``optimal`` chooses, uncompressed BLOBs, 2 shared cores at load 3-11), recompute /
    store + its checkpoint / read back a stored one: n = 256: 0.003-0.005 / 0.02 / 0.006;
    n = 1,024: 0.07 / 0.10-0.13 / 0.04-0.05; n = 2,048: 0.44-0.51 / 0.45-0.51 / 0.22;
    n = 4,096: 3.2-3.3 / 2.4-3.5 / 0.9. A stored factor saves each later hit (``answer``)
    the recompute less the read: at n = 1,024 it cost the cold explain ~0.1 s to save
    ~0.025 s per later answer (4+ answers to pay back); at 2,048, ~0.5 s to save 0.25 s
    (2 answers); at 4,096, ~3 s to save 2.3 s (1-2). So it is stored from about n = 1,550
    (dense; the model predicts 0.08 s, 0.67 s and 5.3 s for the recomputes), and not for a
    sparse plan whose Gram is cheap."""
    n = plan.n
    return (plan.A is not None and n <= MAX_STORED_FACTOR
            and least_squares.factorise_seconds(plan.A)
            > FACTOR_STORE_SECONDS_PER_BYTE * 8 * n * n)


def _remember(con, where, workload: Workload, total: float, evals, chosen: int) -> None:
    """Store a fresh selection: the entry, the chosen plan's matrix (the costly strategies'
    are stored already) and its Cholesky factor when :func:`factor_worth_storing`; name the
    chosen solver's matrix."""
    if con is None:
        return
    e = evals[chosen]
    if e.plan_key is not None:
        if e.digest is not None:             # stored by this request (_plan_for)
            digest = e.digest
        elif strategy_cache.has(con, e.plan_key):
            digest = strategy_cache.digest(e.plan)
        else:
            digest = strategy_cache.store(con, e.plan_key, e.plan, e.seconds)
        e.solver.key = solver_key(e.plan_key, digest)
        factor = e.solver.cholesky if factor_worth_storing(e.plan) else None
        if factor is not None and not selection_cache.has_factor(con, e.solver.key):
            selection_cache.store_factor(con, e.solver.key, factor[0])
    selection_cache.store(con, *where, workload, total, evals)


def _metric(stderr: np.ndarray, objective: str) -> float:
    if len(stderr) == 0:
        return 0.0
    if objective == "max_stderr":
        return float(np.max(stderr))
    return float(np.sqrt(np.mean(np.square(stderr))))

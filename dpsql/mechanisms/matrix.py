"""Strategy selection: the expected error of each candidate strategy, from public inputs only.

For a compiled workload and a privacy request this module builds each candidate's plan
(through the strategy cache when the strategy is costly), calibrates its noise, computes the
exact per-answer standard errors by least squares, and picks the smallest expected RMSE. It
never reads data and never touches the budget: ``explain`` is this module's output.

The work splits in two: :func:`evaluate` (plan, least squares, error factors per unit noise
variance) and the singular value bound do not depend on ε, δ or the calibration and are
stored in the selection cache (:mod:`dpsql.store.selection_cache`); :func:`price` (noise scale,
standard errors, RMSE) is redone for every request, by the same arithmetic, so a cache hit
gives the same numbers bit for bit.

Two noise families. With δ = 0 only Laplace applies; with δ > 0, ``auto`` compares the best
of both and picks the smaller expected RMSE (a Laplace choice spends ε and no δ); a strategy
named explicitly with δ > 0 means Gaussian noise.

- ``gaussian`` for δ > 0: σ from the analytic Gaussian (Balle & Wang 2018) for the plan's
  L2 sensitivity plus the sampler's grid slack; per-measurement variance σ².
- ``laplace`` for δ = 0 (pure ε-DP): scale ``b`` for the plan's L1 sensitivity
  (:func:`dpsql.noise.laplace.laplace_scale`); per-measurement variance ``2 b²``.

In both, the answers' covariance is ``variance · W (AᵀA)⁺ Wᵀ`` (Li & Miklau, Eigen-Design
§2), so the least-squares error factors are shared. The singular value bound (svdb) gives the
smallest total error of any strategy: ``P · svdb(W)`` with ``P`` the variance at sensitivity
1. For Laplace, ``Δ₁ ≥ Δ₂`` column by column, so ``2 (Δ₁/ε)² tr(V (AᵀA)⁻¹) ≥ (2/ε²) svdb``:
the same bound holds with ``P = 2/ε²``.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from fractions import Fraction

import numpy as np
import scipy.sparse as sp

from dpsql import cancel
from dpsql.store import selection_cache
from dpsql.store import strategy_cache
from dpsql.errors import StrategyError
from dpsql.mechanisms import fit
from dpsql.inference.least_squares import LeastSquares
from dpsql.noise.gaussian import calibrate_with_rounding
from dpsql.store.results import Z95, Candidate, Explanation
from dpsql.store.selection_cache import Evaluation
from dpsql.sql.compile import Workload
from dpsql.strategies import AUTO_CANDIDATES, REGISTRY, WorkloadInfo, bounds, spec

#: auto skips a strategy whose estimated selection time exceeds this many seconds
AUTO_TIME_LIMIT = 30.0
#: the chosen plan's Cholesky factor (8 n² bytes) is stored for n up to this
MAX_STORED_FACTOR = 4096


def registry(family: str) -> tuple[dict, tuple]:
    """(registry, candidates auto compares) of a noise family."""
    if family == "laplace":
        from dpsql.strategies.laplace.candidates import L1_AUTO_CANDIDATES, L1_REGISTRY

        return L1_REGISTRY, L1_AUTO_CANDIDATES
    return REGISTRY, AUTO_CANDIDATES


def family_of(delta) -> str:
    """``laplace`` (pure ε-DP) when δ = 0, else ``gaussian``."""
    return "laplace" if delta == 0 else "gaussian"


def noise_scale(family: str, plan, eps, dlt, calibration: str) -> tuple[float, float]:
    """(scale, per-measurement variance) for ``plan`` in ``family``."""
    if family == "laplace":
        from dpsql.noise.laplace import laplace_scale

        b = laplace_scale(eps, plan.l1_sensitivity, plan.n_measurements)
        return b, 2.0 * b * b
    # ε and δ exactly as charged (the calibration rounds them down, as the kernel's check
    # does, so the kernel recomputes this very σ; issue 15)
    sigma = calibrate_with_rounding(eps, dlt, plan.sensitivity, plan.n_measurements,
                                    calibration)
    return sigma, sigma * sigma


def resolve(strategy, family: str):
    """(canonical spec, strategy object) for a requested strategy spec in ``family``.

    A spec is a name with optional options, e.g. ``eigen(principal_vectors=32)``
    (:mod:`dpsql.strategies.spec`)."""
    names, _ = registry(family)
    if not isinstance(strategy, str):
        raise StrategyError(f"a strategy must be named by a string, got {strategy!r}")
    name = spec.parse(strategy)[0]
    if name in names:
        return spec.resolve(strategy, names)
    other = "gaussian" if family == "laplace" else "laplace"
    if name in registry(other)[0] or name == "mwem":
        why = ("it adds Gaussian noise, which needs delta > 0" if other == "gaussian" else
               "it is a pure epsilon-DP strategy, asked for with delta = 0")
        raise StrategyError(
            f"strategy {name!r} cannot be used with delta "
            f"{'= 0' if family == 'laplace' else '> 0'}: {why}; choose 'auto' or one of "
            f"{sorted(names)}")
    raise StrategyError(
        f"unknown strategy {name!r}; choose 'auto' or one of {all_names()}")


def all_names() -> list[str]:
    """Every strategy name a request may use (either family, and mwem)."""
    return sorted(set(REGISTRY) | set(registry("laplace")[0]) | {"mwem"})


def check_spec(strategy) -> str:
    """Validate a strategy spec before it is used (interfaces call this on SET): ``auto``,
    ``mwem(...)`` or a strategy of either noise family with valid options. Returns the
    spec, stripped. Which family applies is decided by δ when the request runs."""
    if not isinstance(strategy, str):
        raise StrategyError(f"a strategy must be named by a string, got {strategy!r}")
    text = strategy.strip()
    name = spec.parse(text)[0]
    if name == "auto":
        if text.lower() != "auto":
            raise StrategyError("'auto' takes no options")
        return "auto"
    if name == "mwem":
        from dpsql.mechanisms.catalog import mwem_options

        mwem_options(text, _NO_POLICY)
        return text
    for family in ("gaussian", "laplace"):
        if name in registry(family)[0]:
            spec.resolve(text, registry(family)[0])
            return text
    raise StrategyError(f"unknown strategy {name!r}; choose 'auto' or one of {all_names()}")


class _NoPolicy:
    """Stands for a table without a declared row count when options are checked early."""

    rows = None
    table = "?"


_NO_POLICY = _NoPolicy()


def _plan_for(con, name: str, strategy, workload: Workload, family: str,
              predicted: float = 0.0):
    """(plan, seconds, cached, key): the strategy's plan, from the strategy cache when it is
    costly, and its key in that cache (None when not cached). A plan ``predicted`` to take
    long is computed in a killable worker (:func:`dpsql.cancel.run`)."""
    info = workload_info(workload)
    started = time.perf_counter()
    key = None
    if getattr(strategy, "cacheable", False) and con is not None:
        key = strategy_cache.fingerprint(name, strategy, info, family)
        plan = strategy_cache.load(con, key)
        if plan is not None:
            return plan, time.perf_counter() - started, True, key
    plan = cancel.run(strategy.plan, info, seconds=predicted)
    seconds = time.perf_counter() - started
    if key is not None:
        strategy_cache.store(con, key, plan, seconds)
    return plan, seconds, False, key


def evaluate(con, family: str, name: str, strategy, workload: Workload, auto: bool,
             w_hash: str | None = None) -> Evaluation:
    """One candidate's plan and error factors: everything about it that does not depend on
    ε, δ or the calibration (``auto``: skip it over the time limit, and record a strategy
    that does not apply instead of raising). ``w_hash`` (:func:`workload_hash` of ``W``)
    names a cheap strategy's plan for the strategy cache."""
    estimate = getattr(strategy, "estimated_seconds", None)
    seconds = estimate(workload_info(workload)) if estimate is not None else 0.0
    if auto and seconds > AUTO_TIME_LIMIT:
        return Evaluation(family, name, status="skipped",
                          note=f"skipped by auto: estimated {seconds:.0f} s to select, over "
                               f"the {AUTO_TIME_LIMIT:.0f} s limit (ask for it by name)")
    predicted = fit.predicted(workload, family, name, strategy).seconds
    try:
        plan, seconds, cached, key = _plan_for(con, name, strategy, workload, family,
                                               predicted)
        solver, factors = cancel.run(_solved, plan, workload.W, seconds=predicted)
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
                      plan_key=key, solver=solver)


def _solved(plan, W) -> tuple:
    """(solver, error factors) of a plan: its least-squares factorisation and the answers'
    variances per unit noise variance."""
    solver = LeastSquares(plan)
    return solver, solver.error_factors(W)


def price(e: Evaluation, eps, dlt, calibration: str, bound: float) -> Candidate:
    """A candidate at this ε, δ and calibration: its noise scale and standard errors."""
    if e.factors is None:
        return Candidate(e.name, math.nan, math.nan, math.nan, np.zeros(0), note=e.note,
                         mechanism=e.family)
    scale, variance = noise_scale(e.family, e.plan, eps, dlt, calibration)
    stderr = np.sqrt(variance * np.maximum(e.factors, 0.0))
    rmse = float(np.sqrt(np.mean(stderr ** 2))) if len(stderr) else 0.0
    sensitivity = e.plan.l1_sensitivity if e.family == "laplace" else e.plan.sensitivity
    return Candidate(e.name, scale, sensitivity, rmse, stderr, seconds=e.seconds,
                     bound_ratio=rmse / bound if bound > 0 else math.nan, cached=e.cached,
                     plan=e.plan, mechanism=e.family)


def requested(policy, dlt, strategy: str) -> list[tuple]:
    """``(family, name, strategy object)`` of every candidate a request compares."""
    family = family_of(dlt)
    known, auto = registry(family)
    if strategy == "auto":
        names = [(family, n, known[n]) for n in auto]
        if family == "gaussian" and policy.delta == 0:
            family = "laplace"         # a pure budget: only pure mechanisms may spend it
            names = [(family, n, registry(family)[0][n]) for n in registry(family)[1]]
        elif family == "gaussian":    # Laplace (pure ε, no δ spent) competes too
            l1, l1_auto = registry("laplace")
            names += [("laplace", n, l1[n]) for n in l1_auto]
        return names
    return [(family, *resolve(strategy, family))]


def select(con, policy, workload: Workload, eps, dlt, strategy: str,
           calibration: str, objective: str = "rmse") -> Explanation:
    """Every candidate's expected error and the best one (no data, no budget).

    ``objective``: ``rmse`` (the workload's RMSE, default) or ``max_stderr`` (the largest
    standard error of any answer) is what ``auto`` minimises. The ε-free part of the work
    (:func:`evaluate`, the singular value bound) comes from the selection cache when this
    workload was seen with the same candidates (:mod:`dpsql.store.selection_cache`); the chosen
    candidate then carries its real plan, re-read and re-verified, and a solver whose
    factorisation is read (or computed) only when it is used."""
    auto = strategy == "auto"
    names, skipped = fit.screen(workload, requested(policy, dlt, strategy), auto)
    bound_note = fit.bound_fits(workload)        # sizes first: before any eigenvalue
    for fresh in (False, True):
        started = time.perf_counter()
        try:
            total, evals, hit, where = _evaluations(con, workload, names, auto, fresh,
                                                    bound_note is None)
        except MemoryError:
            raise fit.out_of_memory(workload) from None
        bounds_by = {f: bound_rmse(f, eps, dlt, calibration, total, workload.n_queries)
                     for f in {f for f, _, _ in names}}
        candidates = [price(e, eps, dlt, calibration, bounds_by[e.family]) for e in evals]
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
    candidates += [price(e, eps, dlt, calibration, math.nan) for e in skipped]
    return Explanation(policy.table, float(eps), float(dlt), best.strategy, best.sigma,
                       best.rmse, best.stderr, workload.n_queries, workload.n_cells,
                       tuple(candidates),
                       tuple((o.query.index, o.start, o.stop) for o in workload.outputs),
                       bound_rmse=bounds_by[best.mechanism], mechanism=best.mechanism,
                       bound_note=bound_note or "")


def _evaluations(con, workload: Workload, names, auto: bool, fresh: bool,
                 with_bound: bool = True):
    """(svdb, evaluations, from the cache?, (entry key, W hash)) for ``names`` (svdb is NaN
    without ``with_bound``: over the planning limits)."""
    where = None
    if con is not None:
        w_hash = selection_cache.cached_hash(workload)
        where = (selection_cache.key(w_hash, workload.shape, names, auto, AUTO_TIME_LIMIT),
                 w_hash)
        found = None if fresh else selection_cache.load(con, *where, workload, names)
        if found is not None:
            return found[0], found[1], True, where
    if with_bound and _gram_shared(con, workload, names):
        _ = workload_info(workload).V     # here, once: not again in the bound's worker
    total = (cancel.run(svdb, workload_info(workload), seconds=fit.bound_seconds(workload))
             if with_bound else math.nan)
    evals = [evaluate(con, f, n, obj, workload, auto, where and where[1])
             for f, n, obj in names]
    return total, evals, False, where


def _gram_shared(con, workload: Workload, names) -> bool:
    """Whether the bound reads the Gram matrix ``V`` that this process computes anyway (a
    cacheable candidate's :func:`strategy_cache.fingerprint` hashes it): then it is computed
    before the bound's worker forks, instead of once in the worker and again here."""
    info = workload_info(workload)
    if con is None or info.W is None or info.W.shape[0] < info.n:
        return False
    return any(getattr(obj, "cacheable", False) for _, _, obj in names)


def _materialise(con, e: Evaluation, strategy, workload: Workload):
    """(plan, solver) of a candidate from the selection cache, or None when its matrix does
    not have the numbers the entry recorded (the entry is then recomputed)."""
    found = strategy_cache.load_entry(con, e.plan_key) if e.plan_key is not None else None
    if found is None:    # the identity, or a matrix no longer stored: plan it again
        plan = strategy.plan(workload_info(workload))
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


def _remember(con, where, workload: Workload, total: float, evals, chosen: int) -> None:
    """Store a fresh selection: the entry, the chosen plan's matrix (the costly strategies'
    are stored already) and its Cholesky factor; name the chosen solver's matrix."""
    if con is None:
        return
    e = evals[chosen]
    if e.plan_key is not None:
        if strategy_cache.has(con, e.plan_key):
            digest = strategy_cache.digest(e.plan)
        else:
            digest = strategy_cache.store(con, e.plan_key, e.plan, e.seconds)
        e.solver.key = solver_key(e.plan_key, digest)
        factor = e.solver.cholesky
        if (factor is not None and e.plan.n <= MAX_STORED_FACTOR
                and not selection_cache.has_factor(con, e.solver.key)):
            selection_cache.store_factor(con, e.solver.key, factor[0])
    selection_cache.store(con, *where, workload, total, evals)


def interval_halfwidths(con, expl: Explanation, solver: LeastSquares,
                        workload: Workload) -> np.ndarray:
    """Half-widths of the 95% intervals of the answers (public: no data).

    Gaussian noise: the answers' errors are Gaussian, so ``z_0.975 · stderr``. Laplace noise:
    each answer's error is ``Σ_k c_k L_k`` with ``c`` its row of ``W A⁺`` and ``L_k`` iid
    Laplace(b); :func:`dpsql.inference.intervals.laplace_interval_halfwidth` bounds its 95% quantile.
    Since ``L_k = b · Laplace(1)``, the half-width is ``b`` times the one at ``b = 1``,
    which depends on ``W`` and the plan only: it is computed once per (plan, workload) and
    kept in the selection cache (``con``), so a repeated release does not redo it.
    """
    if expl.mechanism != "laplace":
        return Z95 * expl.stderr
    W = workload.W
    units, name = None, None
    if con is not None and solver.key is not None:
        name = selection_cache.halfwidth_key(solver.key, selection_cache.cached_hash(workload),
                                             Z95)
        units = selection_cache.load_units(con, name, W.shape[0])
    if units is None:
        from dpsql.inference.intervals import laplace_interval_halfwidth

        units = _identity_halfwidths(W) if solver.plan.A is None else None
        step = max(1, int(4e7 // max(1, solver.plan.n_measurements)))  # ≤ 320 MB per chunk
        for start in range(0, W.shape[0] if units is None else 0, step):
            cancel.check()
            if start == 0:
                units = np.empty(W.shape[0])
            C = solver.coefficients(W[start:start + step])
            units[start:start + step] = laplace_interval_halfwidth(C, 1.0)
        if name is not None:
            selection_cache.store_units(con, name, units)
    return units * float(expl.sigma)


def _identity_halfwidths(W) -> np.ndarray | None:
    """Under the identity plan a 0/1 row's coefficients are its k ones, so its half-width
    (at b = 1) depends on k alone: one computation per distinct k instead of densifying
    every row (a CUBE over a million cells), or None when ``W`` is not 0/1."""
    from dpsql.inference.intervals import laplace_interval_halfwidth

    W = sp.csr_matrix(W)
    if W.nnz and not np.all(W.data == 1.0):
        return None
    counts = np.diff(W.indptr)
    units = np.zeros(W.shape[0])
    for k in np.unique(counts[counts > 0]):
        units[counts == k] = laplace_interval_halfwidth(np.ones((1, int(k))), 1.0)[0]
    return units


def _metric(stderr: np.ndarray, objective: str) -> float:
    if len(stderr) == 0:
        return 0.0
    if objective == "max_stderr":
        return float(np.max(stderr))
    return float(np.sqrt(np.mean(np.square(stderr))))


def smallest_epsilon(con, policy, workload: Workload, dlt, strategy: str, calibration: str,
                     target: float, objective: str):
    """The smallest ε (at this δ) whose expected error meets ``target``: (ε, explanation).

    Accuracy-first requests (no data read). Each candidate's error is its noise scale times a
    fixed factor, and every scale decreases in ε, so per candidate the smallest ε is found by
    bisection on ``log ε``; the cheapest candidate wins. ε is then rounded up to three
    significant digits (a readable charge) and the request explained at that ε with the same
    objective, whose choice meets the target by construction.
    """
    from dpsql.noise.accounting import MAX_EPSILON, MIN_EPSILON

    if isinstance(target, bool) or not isinstance(target, (int, float)) \
            or not math.isfinite(target) or target <= 0:
        raise StrategyError(f"an accuracy target must be a positive number, got {target!r}")
    one = select(con, policy, workload, Fraction(1), dlt, strategy, calibration, objective)
    lo_all, hi_all = math.log(float(MIN_EPSILON)), math.log(float(MAX_EPSILON))
    best = None
    for c in one.candidates:
        if not np.isfinite(c.rmse):
            continue
        family = c.mechanism
        _, var1 = noise_scale(family, c.plan, Fraction(1), dlt, calibration)
        shape = _metric(c.stderr, objective) / math.sqrt(var1)

        def error(log_eps: float) -> float:
            eps = min(max(Fraction(math.exp(log_eps)), MIN_EPSILON), MAX_EPSILON)
            return shape * math.sqrt(noise_scale(family, c.plan, eps, dlt, calibration)[1])

        if error(hi_all) > target:
            continue
        lo, hi = lo_all, hi_all
        if error(lo) <= target:
            hi = lo
        for _ in range(60):
            if hi - lo < 1e-9:
                break
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if error(mid) <= target else (mid, hi)
        if best is None or hi < best:
            best = hi
    if best is None:
        raise StrategyError(
            f"no strategy reaches an expected {objective.replace('_', ' ')} of {target:g} "
            f"at any epsilon up to {float(MAX_EPSILON):g}; ask for a looser target")
    eps = min(_round_up(math.exp(best)), MAX_EPSILON)
    return eps, select(con, policy, workload, eps, dlt, strategy, calibration, objective)


def _round_up(value: float) -> Fraction:
    """``value`` rounded up to three significant digits, as an exact decimal fraction."""
    from decimal import ROUND_CEILING, Decimal

    d = Decimal(repr(value))
    q = Decimal(1).scaleb(d.adjusted() - 2)
    return Fraction(d.quantize(q, rounding=ROUND_CEILING))


def svdb(info: WorkloadInfo) -> float:
    """Singular value bound on ``tr(V (AᵀA)⁻¹)·||A||²`` (:func:`strategies.bounds.svdb`).

    With few queries the eigenvalues come from the m x m matrix ``W Wᵀ`` (same non-zero
    spectrum), else from ``V``.
    """
    if info.W is not None and info.W.shape[0] < info.n:
        lam = np.linalg.eigvalsh((info.W @ info.W.T).toarray())
        return bounds.svdb_from_eigenvalues(lam, info.n)
    return bounds.svdb(info.V, info.n)


def bound_rmse(family: str, eps, dlt, calibration: str, bound_total: float,
               n_queries: int) -> float:
    """The RMSE no strategy of ``family`` can beat (the variance at sensitivity 1 × svdb)."""
    if family == "laplace":
        from dpsql.noise.laplace import laplace_scale

        b = laplace_scale(eps, 1.0, 1)
        variance = 2.0 * b * b
    else:
        variance = calibrate_with_rounding(float(eps), float(dlt), 1.0, 1, calibration) ** 2
    return math.sqrt(variance * bound_total / max(1, n_queries))


def workload_info(workload: Workload) -> WorkloadInfo:
    """The public structure strategies see (cached on the compiled workload)."""
    info = getattr(workload, "_strategy_info", None)
    if info is None:
        info = WorkloadInfo.from_matrix(workload.W, workload.shape)
        object.__setattr__(workload, "_strategy_info", info)
    return info

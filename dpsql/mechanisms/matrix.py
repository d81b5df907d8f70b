"""The matrix mechanism's strategies and noise: the registry of each noise family, strategy
specs resolved and checked, a plan's noise scale, and the public structure strategies see.

Public inputs only. Selecting among the candidates is :mod:`dpsql.mechanisms.selection`,
their interval half-widths and the lower bound :mod:`dpsql.mechanisms.halfwidths`, the
smallest ε meeting an accuracy target :mod:`dpsql.mechanisms.target`.

Two noise families. With δ = 0 only Laplace applies; with δ > 0, ``auto`` compares the best
of both and picks the smaller expected RMSE (a Laplace choice spends ε and no δ); a strategy
named explicitly with δ > 0 means Gaussian noise.

- ``gaussian`` for δ > 0: σ from the analytic Gaussian (Balle & Wang 2018) for the plan's
  L2 sensitivity plus the sampler's grid slack; per-measurement variance σ².
- ``laplace`` for δ = 0 (pure ε-DP): scale ``b`` for the plan's L1 sensitivity
  (:func:`dpsql.noise.laplace.laplace_scale`); per-measurement variance ``2 b²``.

In both, the answers' covariance is ``variance · W (AᵀA)⁺ Wᵀ`` (Li & Miklau, Eigen-Design
§2), so the least-squares error factors are shared.
"""

from __future__ import annotations

from dpsql.errors import StrategyError
from dpsql.noise.gaussian import calibrate_with_rounding
from dpsql.sql.compile import Workload
from dpsql.strategies import AUTO_CANDIDATES, REGISTRY, WorkloadInfo, spec
from dpsql.workload.values import times_contribution


def registry(family: str) -> tuple[dict, tuple]:
    """(registry, candidates auto compares) of a noise family."""
    if family == "laplace":
        from dpsql.strategies.laplace.candidates import L1_AUTO_CANDIDATES, L1_REGISTRY

        return L1_REGISTRY, L1_AUTO_CANDIDATES
    return REGISTRY, AUTO_CANDIDATES


def family_of(delta) -> str:
    """``laplace`` (pure ε-DP) when δ = 0, else ``gaussian``."""
    return "laplace" if delta == 0 else "gaussian"


def noise_scale(family: str, plan, eps, dlt, calibration: str,
                contribution: int = 1) -> tuple[float, float]:
    """(scale, per-measurement variance) for ``plan`` in ``family``; ``contribution``: the
    rows one unit of privacy adds or removes at most (the policy's ``max_rows_per_unit``),
    which multiplies the sensitivity (:func:`~dpsql.workload.values.times_contribution`)."""
    if family == "laplace":
        from dpsql.noise.laplace import laplace_scale

        b = laplace_scale(eps, times_contribution(contribution, plan.l1_sensitivity),
                          plan.n_measurements)
        return b, 2.0 * b * b
    # ε and δ exactly as charged (the calibration rounds them down, as the kernel's check
    # does, so the kernel recomputes this very σ; issue 15)
    sigma = calibrate_with_rounding(eps, dlt, times_contribution(contribution, plan.sensitivity),
                                    plan.n_measurements, calibration)
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


def workload_info(workload: Workload) -> WorkloadInfo:
    """The public structure strategies see (cached on the compiled workload)."""
    info = getattr(workload, "_strategy_info", None)
    if info is None:
        info = WorkloadInfo.from_matrix(workload.W, workload.shape)
        object.__setattr__(workload, "_strategy_info", info)
    return info

"""The kernel's checks of every noise scale and charge, from public inputs only.

The kernel never trusts a noise scale from its caller (DESIGN.md, "One privacy boundary"):
before a release is charged, :func:`_checked_scale` (dense plans) and
:func:`_checked_marginal_scale` (plans measured through marginals) derive the plan's exact
sensitivity and check σ or ``b`` and the charge against it — one Gaussian check
(:func:`_checked_gaussian`) and one Laplace check (:func:`_checked_laplace`) for both kinds
of plan; the d_X releases check their charge (:func:`_check_metric_charge`) and the cell
metric they are given against the kernel's own (:func:`_cell_graph`, :func:`_same_graph`).
A shortfall raises :class:`~dpsql.errors.ScaleRefused` through :func:`_refuse_if`.
:func:`_on_grid` is the plan check behind exact products ``A x``
(:mod:`dpsql.kernel.boundary`); the oracles use it and :func:`_refuse_if` too.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import scipy.sparse as sp

from dpsql.errors import ScaleRefused, StrategyError
from dpsql.noise import verify
from dpsql.noise.composition import Spend
from dpsql.noise.gaussian import exact_zcdp_rho, gaussian_shortfall, sensitivity_with_slack
from dpsql.noise.laplace import laplace_shortfall
from dpsql.store import ledger
from dpsql.workload.marginals import (MarginalPlan, computed_l1_sensitivity,
                                     computed_l2_sensitivity)
from dpsql.workload.matrix import QUANTUM_BITS, Plan, exact_l1_sensitivity
from dpsql.workload.values import times_contribution

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


def _checked_scale(workload, plan: Plan, sigma: float, request: ledger.Charge,
                   mechanism: str, contribution: int = 1) -> float:
    """The plan's exact sensitivity, once σ (or b) and the charge are verified against it
    (:meth:`Kernel.release <dpsql.kernel.boundary.Kernel.release>`): the largest column L1
    norm of ``A`` for Laplace, L2 for Gaussian, times ``contribution`` (the rows one unit
    of privacy adds or removes at most: ``k`` rows move ``A x`` by at most ``k`` columns),
    checked by :func:`_checked_laplace` or :func:`_checked_gaussian`; raises
    :class:`ScaleRefused` otherwise. Public inputs only."""
    what = f"{mechanism} release of strategy {plan.strategy!r}"
    _checked_charge(request, mechanism, what)
    n_cols = plan.n if plan.A is None else plan.A.shape[1]
    if n_cols != workload.n_cells:
        _refuse_if(f"the plan covers {n_cols} cells, the workload {workload.n_cells}", what)
    p = plan.n_measurements
    k = int(contribution)           # exact: k times a double, rounded up below
    if mechanism == "laplace":
        sensitivity = times_contribution(k, 1.0 if plan.A is None else exact_l1_sensitivity(plan.A))
        _checked_laplace(sigma, request, sensitivity, p, what)
        return sensitivity
    sensitivity = times_contribution(k, 1.0 if plan.A is None else verify.exact_l2_norm(plan.A))
    _checked_gaussian(sigma, request, sensitivity, p, what)
    return sensitivity



def _checked_marginal_scale(workload, plan: MarginalPlan, sigma: float,
                            request: ledger.Charge, mechanism: str,
                            contribution: int = 1) -> float:
    """:func:`_checked_scale` for a plan measured through marginals: the sensitivity the
    kernel derives from the plan's factors and scales
    (:func:`~dpsql.workload.marginals.computed_l1_sensitivity` for Laplace,
    :func:`~dpsql.workload.marginals.computed_l2_sensitivity` for Gaussian: exact bounds,
    enlarged for the float64 evaluation of ``A x``), once σ (or b) and the charge are
    verified against it by the same checks as dense plans (times ``contribution``, as in
    :func:`_checked_scale`)."""
    what = f"{mechanism} release of strategy {plan.strategy!r}"
    if tuple(plan.sizes) != tuple(workload.shape):
        _refuse_if(f"the plan covers parts {plan.sizes}, the workload {workload.shape}", what)
    k = int(contribution)
    if mechanism == "laplace":
        sensitivity = times_contribution(k, computed_l1_sensitivity(plan))
        _checked_laplace(sigma, request, sensitivity, plan.n_measurements, what)
    else:
        sensitivity = times_contribution(k, computed_l2_sensitivity(plan))
        _checked_gaussian(sigma, request, sensitivity, plan.n_measurements, what)
    return sensitivity


def _row_level_only(policy, what: str) -> None:
    """Refuse a release whose sensitivities assume one row per unit of privacy (MWEM, d_X)
    on a table declaring a privacy unit; nothing charged or read."""
    if getattr(policy, "privacy_unit", None) is not None:
        _refuse_if(f"table {policy.table!r} declares privacy unit {policy.privacy_unit!r}; "
                   "this mechanism's sensitivities are for one row", what)


def _checked_charge(request: ledger.Charge, mechanism: str, what: str,
                    scale: float | None = None) -> None:
    """The release's ledger Charge, for ``mechanism``, recording ``scale`` (if given) or no
    scale at all."""
    if not isinstance(request, ledger.Charge):
        raise StrategyError("internal error: a release needs its ledger Charge")
    if request.mechanism != mechanism:
        _refuse_if(f"the charge records mechanism {request.mechanism!r}", what)
    if scale is not None and request.sigma is not None and float(request.sigma) != scale:
        _refuse_if(f"the charge records scale {request.sigma!r} but {scale!r} was given",
                   what)


def _checked_laplace(b: float, request: ledger.Charge, sensitivity: float, p: int,
                     what: str) -> None:
    """``b`` and the charge against the L1 sensitivity the kernel derived: a pure charge and
    ``(Δ₁ + p·2^k(b)) / b ≤ ε`` exactly (:func:`~dpsql.noise.laplace.laplace_shortfall`)."""
    _checked_charge(request, "laplace", what, b)
    if request.cost.delta != 0:
        _refuse_if("a Laplace release is pure: its charge must have delta = 0", what)
    _refuse_if(laplace_shortfall(b, request.cost.epsilon, sensitivity, p), what)


def _checked_gaussian(sigma: float, request: ledger.Charge, sensitivity: float, p: int,
                      what: str) -> None:
    """σ and the charge against a sensitivity the kernel derived: the exact profile with grid
    slack (:func:`~dpsql.noise.gaussian.gaussian_shortfall`), and the charge's ρ at least the
    exact ``Δ'²/2σ²`` and at most :data:`RHO_MATCH` (relative) above it."""
    _checked_charge(request, "gaussian", what, sigma)
    cost = request.cost
    _refuse_if(gaussian_shortfall(sigma, cost.epsilon, cost.delta, sensitivity, p,
                                  request.calibration), what)
    need = exact_zcdp_rho(sigma, sensitivity_with_slack(sigma, sensitivity, p))
    if request.rho is None:
        _refuse_if("a Gaussian charge must record its zCDP rho", what)
    counted = Spend.of(cost.epsilon, cost.delta, "gaussian", request.rho).rho
    if counted is None or counted < need:
        _refuse_if(f"the charge records rho={request.rho!r}, below the exact "
                   f"{float(need)!r} of sigma={sigma!r}", what)
    if Fraction(request.rho) > need * (1 + RHO_MATCH):
        _refuse_if(f"the charge records rho={request.rho!r}, not the {float(need)!r} of "
                   f"sigma={sigma!r}", what)


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

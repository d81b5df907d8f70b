"""Measurement plans that read the data only through marginals, and their exact sensitivity.

A :class:`MarginalPlan` is a stack of :class:`MarginalMeasurement` s. Measurement ``k`` reads
the marginal ``m_k`` of the data on its columns ``C_k`` (indices into the workload's used
columns; the marginal's axes in that order) and releases ``scale_k · (⊗_{i∈C_k} F_{k,i}) m_k``
— as a matrix on the full data vector, ``A_k = scale_k · ⊗_i G_{k,i}`` with ``G_{k,i} =
F_{k,i}`` on ``C_k`` and a row of ones elsewhere. The residual strategy
(:mod:`dpsql.strategies.residual`) and Kronecker strategies are plans of this form.

Sensitivity (add/remove one row moves ``x`` by ``±e_j``, so ``A x`` by column ``j`` of the
stack). Column ``j`` of ``⊗_i G_i`` is ``⊗_i`` (column ``j_i`` of ``G_i``), whose L2 norm is
``Π_i ‖G_i[:, j_i]‖₂``; the ones rows have norm 1. So for the stack

    Δ₂² = max_j Σ_k scale_k² Π_{i∈C_k} ‖F_{k,i}[:, j_i]‖₂²  ≤  Σ_k scale_k² Π_{i∈C_k} c_{k,i}²,

``c_{k,i} = max_j ‖F_{k,i}[:, j]‖₂`` (equality for one Kronecker product, and for the
residual rows, whose columns all have the same norm). Likewise ``Δ₁ ≤ Σ_k scale_k Π_i
max_j ‖F_{k,i}[:, j]‖₁``. :func:`l2_bound_squared` evaluates the right-hand side exactly, in
rationals, from the float entries as given (floats are rationals), so no rounding can make it
too small.

Floating point. The kernel computes ``A_k m_k`` in float64, one mode product after another
(:func:`dpsql.workload.blocks.apply_along`), then multiplies by ``scale_k``. Every dot
product of length ``n`` in any summation order is within ``γ_n = n u / (1 − n u)`` (``u =
2⁻⁵³``) of the exact one relative to the sum of absolute products (Higham, *Accuracy and
Stability*, §3.1); by induction over the modes and the final scaling, the computed vector
differs from the exact one entrywise by at most ``θ_k · scale_k (⊗|F_{k,i}|) m_k`` with
``θ_k = (1 + u) Π_i (1 + γ_{n_i}) − 1``. Since ``‖(⊗|F_i|) m‖₂ ≤ Π_i c_{k,i} · ‖m‖₁`` and
``‖m‖₁`` is the number of rows ``R``, the error vector has ``‖e‖₂ ≤ θ Δ̄₂ R`` (``θ = max θ_k``,
``Δ̄₂`` the bound above). For neighbouring tables the computed releases therefore differ by
at most ``Δ̄₂ (1 + 2 θ R_max)`` (:func:`computed_l2_sensitivity`), with ``R_max = 2³²`` rows,
the largest table the kernel measures (it refuses larger ones after the charge, releasing
nothing). Public inputs only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

#: the kernel measures tables of fewer rows than this (its exactness limit)
MAX_ROWS = 1 << 32
_U = Fraction(1, 1 << 53)


@dataclass(frozen=True, eq=False)
class MarginalMeasurement:
    """``scale · (⊗ factors)`` applied to the marginal on ``columns`` (sorted indices)."""

    columns: tuple
    factors: tuple
    scale: float

    def __post_init__(self):
        cols = tuple(int(c) for c in self.columns)
        factors = tuple(np.array(F, dtype=float, ndmin=2) for F in self.factors)
        if list(cols) != sorted(set(cols)) or len(factors) != len(cols):
            raise ValueError("a marginal measurement needs sorted distinct columns, one "
                             "factor each")
        if not (math.isfinite(self.scale) and self.scale > 0) or \
                not all(np.all(np.isfinite(F)) for F in factors):
            raise ValueError("a marginal measurement needs finite factors and a scale > 0")
        for F in factors:
            F.setflags(write=False)
        object.__setattr__(self, "columns", cols)
        object.__setattr__(self, "factors", factors)
        object.__setattr__(self, "scale", float(self.scale))

    @property
    def size(self) -> int:
        return math.prod(F.shape[0] for F in self.factors)


@dataclass(frozen=True, eq=False)
class MarginalPlan:
    """A strategy measured through marginals (the kernel's ``release`` accepts it)."""

    strategy: str
    sizes: tuple                  # parts per used column
    measurements: tuple           # MarginalMeasurement
    sensitivity: float = math.nan  # computed_l2_sensitivity, set by :func:`make`

    @property
    def n_measurements(self) -> int:
        return sum(m.size for m in self.measurements)

    def cliques(self) -> tuple:
        """The maximal column sets measured: the marginals the engine is asked for."""
        sets = {m.columns for m in self.measurements}
        return tuple(sorted((s for s in sets if not any(set(s) < set(t) for t in sets)),
                            key=lambda s: (-len(s), s)))


def make(strategy: str, sizes, measurements) -> MarginalPlan:
    plan = MarginalPlan(strategy, tuple(int(n) for n in sizes), tuple(measurements))
    for m in plan.measurements:
        if any(c >= len(plan.sizes) or F.shape[1] != plan.sizes[c]
               for c, F in zip(m.columns, m.factors)):
            raise ValueError("a measurement's factors must match its columns' parts")
    object.__setattr__(plan, "sensitivity", computed_l2_sensitivity(plan))
    return plan


def _max_column_norm_squared(F: np.ndarray) -> Fraction:
    """``max_j Σ_i F_ij²`` exactly (the float entries read as rationals)."""
    best = Fraction(0)
    approx = (F.astype(float) ** 2).sum(axis=0)
    # exact sums for the columns whose float sum is within 1e-9 of the largest
    for j in np.flatnonzero(approx >= approx.max() * (1 - 1e-9)):
        best = max(best, sum((Fraction(float(v)) ** 2 for v in F[:, j]), Fraction(0)))
    return best


def l2_bound_squared(plan: MarginalPlan) -> Fraction:
    """``Σ_k scale_k² Π_i max_j ‖F_{k,i}[:, j]‖₂²``, exactly (module docstring)."""
    cache: dict = {}
    total = Fraction(0)
    for m in plan.measurements:
        term = Fraction(m.scale) ** 2
        for F in m.factors:
            key = (F.shape, F.tobytes())
            if key not in cache:
                cache[key] = _max_column_norm_squared(F)
            term *= cache[key]
        total += term
    return total


def _theta(plan: MarginalPlan) -> Fraction:
    """``max_k (1 + u) Π_i (1 + γ_{n_i}) − 1``: the float error of one measurement."""
    worst = Fraction(0)
    for m in plan.measurements:
        t = 1 + _U
        for F in m.factors:
            n = F.shape[1]
            t *= 1 + n * _U / (1 - n * _U)
        worst = max(worst, t - 1)
    return worst


def computed_l2_sensitivity(plan: MarginalPlan) -> float:
    """An upper bound on ``‖fl(A x) − fl(A x')‖₂`` for neighbouring tables of fewer than
    :data:`MAX_ROWS` rows: ``Δ̄₂ (1 + 2 θ R_max)`` (module docstring), as a float rounded up."""
    bound = l2_bound_squared(plan) * (1 + 2 * _theta(plan) * MAX_ROWS) ** 2
    root = math.sqrt(float(bound))
    while Fraction(root) ** 2 < bound:
        root = math.nextafter(root, math.inf)
    return root


def _max_column_abs_sum(F: np.ndarray) -> Fraction:
    """``max_j Σ_i |F_ij|`` exactly (the float entries read as rationals)."""
    approx = np.abs(F.astype(float)).sum(axis=0)
    best = Fraction(0)
    for j in np.flatnonzero(approx >= approx.max() * (1 - 1e-9)):
        best = max(best, sum((abs(Fraction(float(v))) for v in F[:, j]), Fraction(0)))
    return best


def computed_l1_sensitivity(plan: MarginalPlan) -> float:
    """An upper bound on ``‖fl(A x) − fl(A x')‖₁`` for neighbouring tables of fewer than
    :data:`MAX_ROWS` rows: ``Δ̄₁ (1 + 2 θ R_max)`` with ``Δ̄₁ = Σ_k scale_k Π_i max_j
    ‖F_{k,i}[:, j]‖₁`` exactly (module docstring: ``‖e‖₁ ≤ θ Δ̄₁ R``), rounded up."""
    total = Fraction(0)
    for m in plan.measurements:
        term = Fraction(m.scale)
        for F in m.factors:
            term *= _max_column_abs_sum(F)
        total += term
    bound = total * (1 + 2 * _theta(plan) * MAX_ROWS)
    value = float(bound)
    while Fraction(value) < bound:
        value = math.nextafter(value, math.inf)
    return value

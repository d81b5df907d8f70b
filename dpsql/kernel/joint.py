"""The kernel's checks of a joint release (COUNT and SUM blocks in one charge) and its exact
products on value sums. Public inputs only until :func:`sum_measure`, which the kernel calls
after the charge on the engine's per-cell sums.

Neighbours and sensitivity (the derivation of :mod:`dpsql.workload.values`): adding or
removing one row in cell ``j`` with value ``v_b`` in each bounded value ``b`` moves block
``b``'s measurement by ``v_b A_b e_j`` (``v = 1`` for the counts), with ``|v_b| <= M_b``,
*the same* ``j`` for every block. Under user-level privacy a unit is at most ``k`` rows,
and by the triangle inequality every bound below is ``k`` times the one for a row.

- **Gaussian** (one (ε, δ) charge, block ``b`` with noise ``σ_b``): divide each block by its
  σ (whitening); the release is then one Gaussian mechanism with σ = 1 on a vector whose
  neighbours are at L2 distance at most
  ``Δ_w = k · sqrt(max_j Σ_b M_b² ‖A_b e_j‖² / σ_b²)`` (exact rationals from the 2⁻²⁰ grid),
  plus the float slack below, plus the samplers' lattice rounding: block ``b`` rounds to
  ``2^k_b ≤ σ_b 2⁻⁴⁰``, at most ``2⁻⁴¹`` per whitened coordinate, ``2⁻⁴⁰ √p`` between two
  neighbours, which is the rounding slack of σ = 1 that :func:`_checked_gaussian` adds. The
  privacy profile of a Gaussian depends on Δ/σ only, so the analytic condition and the
  charge's ρ are checked at σ = 1 and ``Δ_w`` (:func:`dpsql.kernel.scales._checked_gaussian`).
- **Laplace** (pure ε): block ``b`` spends its share ``ε_b`` with the shares summing to at
  most the charged ε (exact fractions; basic composition); each block's scale is checked like
  any Laplace release at L1 sensitivity ``k M_b Δ₁(A_b)`` plus the float slack
  (:func:`~dpsql.noise.laplace.laplace_shortfall`).

Float slack of a sum block: ``A_b s_b`` is computed exactly in integers (:func:`sum_measure`)
and rounded once to the nearest double, an error at most ``|f| 2⁻⁵³ ≤ R M_b 2⁻⁵³ = M_b 2⁻²¹``
per coordinate (``|A| ≤ 1``, fewer than ``R = 2³²`` rows, which the kernel enforces), so
neighbours' computed values are at most ``M_b 2⁻²⁰`` further apart per coordinate than the
exact ones: ``√p_b M_b 2⁻²⁰`` in L2, ``p_b M_b 2⁻²⁰`` in L1. Counts are exact (as for every
dense plan) and carry no slack.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import scipy.sparse as sp

from dpsql.errors import StrategyError
from dpsql.kernel.scales import _checked_charge, _checked_gaussian, _on_grid, _refuse_if
from dpsql.noise.laplace import laplace_shortfall
from dpsql.workload.matrix import EXACT_ROWS, QUANTUM_BITS, exact_l1_sensitivity
from dpsql.workload.values import JointPlan, ValueBound

_Q = 2 ** QUANTUM_BITS
#: the float rounding of a sum block's exact product moves two neighbours apart by at most
#: ``M · 2**-FLOAT_SLACK_BITS`` per coordinate (module docstring; ``EXACT_ROWS`` = 2**32)
FLOAT_SLACK_BITS = 53 - 1 - int(math.log2(EXACT_ROWS))


def _up(value: Fraction) -> float:
    """The smallest double at least ``value``."""
    f = float(value)
    while Fraction(f) < value:
        f = math.nextafter(f, math.inf)
    return f


def _sqrt_up(value: Fraction) -> float:
    """A double at least ``sqrt(value)``, within a few ulps."""
    root = math.sqrt(float(value))
    while Fraction(root) ** 2 < value:
        root = math.nextafter(root, math.inf)
    return root


def _column_squares(plan, n: int) -> np.ndarray:
    """``Σ_i K_ij²`` per column with ``A = K / 2**20`` (exact int64; the identity: 2**40)."""
    if plan.A is None:
        return np.full(n, _Q * _Q, dtype=np.int64)
    if sp.issparse(plan.A):
        M = sp.csr_matrix(plan.A)
        ints = np.rint(M.data * _Q).astype(np.int64)
        out = np.zeros(n, dtype=np.int64)
        np.add.at(out, M.indices, ints * ints)
        return out
    ints = np.rint(np.asarray(plan.A, dtype=float) * _Q).astype(np.int64)
    return (ints * ints).sum(axis=0, dtype=np.int64)


def _float_slack(block) -> Fraction:
    """Per coordinate, how much further apart the float rounding can put two neighbours'
    computed values of a sum block (0 for the counts: exact)."""
    return Fraction(0) if block.value is None else block.bound / 2 ** FLOAT_SLACK_BITS


def checked_joint(workload, joint: JointPlan, request, mechanism: str,
                  contribution: int) -> list[float]:
    """Each block's sensitivity (raw units, for its sampler's consistency check), once the
    scales and the charge are verified together (module docstring); raises
    :class:`~dpsql.errors.ScaleRefused` otherwise. Public inputs only, before the charge."""
    what = f"{mechanism} release of the joint strategy {joint.strategy!r}"
    _checked_charge(request, mechanism, what)
    k = Fraction(int(contribution))
    for b in joint.blocks:
        if not b.plan.integral or not _on_grid(b.plan.A):
            raise StrategyError(f"strategy {b.plan.strategy!r} is not on the exact 2**-20 "
                                "grid; the kernel only releases exact plans")
        n_cols = b.plan.n if b.plan.A is None else b.plan.A.shape[1]
        if n_cols != workload.n_cells:
            _refuse_if(f"a block covers {n_cols} cells, the workload {workload.n_cells}", what)
        if not (math.isfinite(b.scale) and b.scale > 0):
            raise StrategyError("internal error: every noise scale must be positive and finite")
        if b.value is not None:
            ValueBound(b.value.lo, b.value.hi)          # the bounds the engine will clamp to
    if mechanism == "laplace":
        return _checked_laplace_blocks(joint, request, k, what)
    if mechanism != "gaussian":
        raise StrategyError(f"internal error: unknown noise mechanism {mechanism!r}")
    return _checked_gaussian_blocks(workload, joint, request, k, what)


def whitened_sensitivity(n_cells: int, joint: JointPlan, contribution: int) -> float:
    """The L2 sensitivity of the whitened joint release (each block divided by its σ),
    float slack included, rounded up: ``k sqrt(max_j Σ_b M_b² ‖A_b e_j‖² / σ_b²) + Σ_b √p_b
    M_b 2⁻²⁰ / σ_b`` (module docstring; exact rationals). The planner records its ρ from
    this same function."""
    k = Fraction(int(contribution))
    C = np.stack([_column_squares(b.plan, n_cells) for b in joint.blocks], axis=1)
    weights = [k * k * b.bound ** 2 / (Fraction(b.scale) ** 2 * _Q * _Q) for b in joint.blocks]
    rows = np.unique(C, axis=0) if C.size else np.zeros((0, len(weights)), dtype=np.int64)
    squared = max((sum((w * int(c) for w, c in zip(weights, row)), Fraction(0))
                   for row in rows), default=Fraction(0))
    slack = sum((_float_slack(b) * Fraction(_sqrt_up(Fraction(b.plan.n_measurements)))
                 / Fraction(b.scale) for b in joint.blocks), Fraction(0))
    return _up(Fraction(_sqrt_up(squared)) + slack)


def _checked_gaussian_blocks(workload, joint, request, k: Fraction, what: str) -> list:
    whitened = whitened_sensitivity(workload.n_cells, joint, int(k))
    if whitened <= 0:
        _refuse_if("the blocks' sensitivity is zero", what)
    _checked_gaussian(1.0, request, whitened, joint.n_measurements, what)
    return [block_sensitivity(b, k, "l2", workload.n_cells) for b in joint.blocks]


def _checked_laplace_blocks(joint, request, k: Fraction, what: str) -> list:
    if request.cost.delta != 0:
        _refuse_if("a Laplace release is pure: its charge must have delta = 0", what)
    shares = [b.epsilon for b in joint.blocks]
    if any(not isinstance(e, Fraction) or e <= 0 for e in shares):
        _refuse_if("every Laplace block needs its share of epsilon (a positive fraction)", what)
    if sum(shares) > request.cost.epsilon:
        _refuse_if(f"the blocks' shares of epsilon add up to {float(sum(shares))!r}, above the "
                   f"charged {float(request.cost.epsilon)!r}", what)
    out = []
    for b in joint.blocks:
        sensitivity = block_sensitivity(b, k, "l1")
        _refuse_if(laplace_shortfall(b.scale, b.epsilon, sensitivity, b.plan.n_measurements),
                   what)
        out.append(sensitivity)
    return out


def block_sensitivity(block, k, norm: str, n_cells: int | None = None) -> float:
    """One block's own sensitivity in its raw units, rounded up: ``k M ‖A‖`` (largest column
    L2 or L1 norm, exact) plus its float slack (``√p`` or ``p`` coordinates). The planner
    calibrates a Laplace block's scale with this same function."""
    p, k = block.plan.n_measurements, Fraction(int(k))
    if norm == "l2":
        squares = _column_squares(block.plan, n_cells if block.plan.A is None
                                  else block.plan.A.shape[1])
        base = Fraction(_sqrt_up(Fraction(int(squares.max()), _Q * _Q))) if len(squares) \
            else Fraction(0)
        slack = _float_slack(block) * Fraction(_sqrt_up(Fraction(p)))
    else:
        base = Fraction(1) if block.plan.A is None else Fraction(
            exact_l1_sensitivity(block.plan.A))
        slack = _float_slack(block) * p
    return _up(k * block.bound * base + slack)


# --------------------------------------------------------------- after the charge: sums

def sum_measure(plan, sums: np.ndarray, value) -> np.ndarray:
    """``A s`` for a block on the per-cell sums ``s`` of a bounded value: computed exactly in
    integers, then rounded once to the nearest double (the slack the checks above allow).

    ``s`` holds whole units ``u = 2**e`` (int64, ``Σ|s_j| < 2**62``) and ``A = K 2**-20``
    with integer ``|K| <= 2**20``. ``K s`` is summed in float64 over limbs of ``s`` small
    enough that every partial sum is an integer below 2**53 (exact in any order), and the
    limbs recombined in Python integers; the result ``(K s) 2**(e-20)`` is rounded once."""
    exponent = ValueBound(value.lo, value.hi).exponent
    s = np.asarray(sums, dtype=np.int64)
    if plan.A is None:
        exact = [int(v) for v in s]
        shift = exponent
    else:
        n = s.shape[0]
        bits = max(1, 52 - QUANTUM_BITS - max(1, int(n).bit_length()))
        sign = np.sign(s)
        mag = np.abs(s).astype(np.uint64)
        K = plan.A * _Q
        total = [0] * plan.A.shape[0]
        for limb in range(0, 63, bits):
            part = ((mag >> np.uint64(limb)) & np.uint64((1 << bits) - 1)).astype(np.float64)
            got = np.asarray(K @ (sign * part), dtype=np.float64).reshape(-1)
            for i, v in enumerate(got):
                total[i] += int(v) << limb
        exact = total
        shift = exponent - QUANTUM_BITS
    return np.array([math.ldexp(float(v), shift) for v in exact], dtype=np.float64)

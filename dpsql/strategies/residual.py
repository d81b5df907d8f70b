"""``residual``: the optimal Gaussian mechanism for weighted marginal workloads (ResidualPlanner).

Xiao, Gao et al., *An Optimal and Scalable Matrix Mechanism for Noisy Marginals under Convex
Loss Functions*, NeurIPS 2023 (§3 residual basis, §4 sum of variances, §5 max variance,
§6 reconstruction); the formulas as dpsql uses them are in NOTES, "Marginals in the residual
basis". No code is taken from the paper's implementation.

Columns ``i = 1..d`` have ``n_i`` parts, ``N = Π n_i``; the workload is a set of marginals
``Q_B`` (identity on the attributes B, a row of ones elsewhere) with Gram weights ``w_B``.
Per attribute ``P0 = 11ᵀ/n``, ``P1 = I − P0``; ``P_A = ⊗_i (P1 if i ∈ A else P0)`` are
orthogonal projections of rank ``m_A = Π_{i∈A}(n_i − 1)`` with constant diagonal ``m_A/N``.

- ``V = Σ_B w_B Q_BᵀQ_B = Σ_A v_A P_A``, ``v_A = Σ_{B⊇A} w_B Π_{i∉B} n_i`` (only A in the
  *closure*, subsets of a workload set, have ``v_A > 0``); svdb ``= (Σ_A m_A √v_A)² / N``.
- The strategy ``AᵀA = Σ_A a_A P_A`` has per-cell variance of marginal B
  ``Σ_{A⊆B} c(B, A)/a_A`` (:func:`dpsql.inference.implicit.residual_coefficient`), the same for
  every cell of B. The *sum of variances* over the returned cells, ``Σ_A g_A / a_A`` with
  ``g_A = Σ_{B⊇A} w_B · cells_B · c(B, A)``, is minimised under ``Σ_A a_A m_A / N = 1`` by
  ``a_A = N √(g_A/m_A) / Σ_C √(g_C m_C)`` with value ``(Σ_A √(g_A m_A))² / N``. For full
  marginals (``cells_B = Π_{i∈B} n_i``) ``g_A = m_A v_A``: ``a_A = √v_A N / Σ m_C √v_C`` and the
  value *is* svdb — the optimum over all strategies, certified by the bound.
- *Max variance* (§5): minimise ``max_B w_B var_B(a)`` over the same constraint, a small convex
  program in the ``a_A`` (cvxpy).
- GROUP BYs that do not return implicit ``other``/NULL parts (factor ``[I_k | 0]``) are
  answered by the same measurements: ``cells_B`` counts only the returned cells, so the sum
  objective weighs what the analyst sees (NOTES' worked example: 103.48 here, 103.55 for the
  plan optimised for full marginals, 97.09 the dense certified optimum).

Measurements: for each A in the closure, the rows ``√a_A (⊗_{i∈A} H_i ⊗_{i∉A} 1ᵀ/√n_i)``
(``H_i`` Helmert, orthonormal, orthogonal to 1): ``m_A`` rows computed from the marginal of x
on A alone, answered by :mod:`dpsql.inference.implicit`.

Privacy (sensitivity). One added or removed row moves x by ±e_j, so ``A x`` moves by column j
of the stacked rows, whose squared norm is ``Σ_A a_A ‖(⊗ …)e_j‖² = Σ_A a_A (P_A)_jj =
Σ_A a_A m_A / N`` — the same for every cell j. The weights are normalised so that this is 1:
L2 sensitivity 1 (:attr:`ResidualPlan.sensitivity` recomputes it), and Gaussian noise
calibrated for sensitivity 1 on every row makes the release (ε, δ)-DP; answers are
post-processing. The plan depends on the public sizes and workload only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import scipy.sparse as sp

from dpsql.errors import StrategyError
from dpsql.inference.implicit import residual_answer, residual_cell_variance, residual_coefficient
from dpsql.workload.blocks import (MAX_DENSE_ENTRIES, DomainTooLarge, UnionWorkload, apply_along,
                                   helmert, marginal)

#: most attribute sets a closure may hold (2^|B| subsets per workload set B)
MAX_CLOSURE = 1 << 16


def _key(B, d: int) -> tuple:
    B = tuple(sorted(int(i) for i in B))
    if len(set(B)) != len(B) or any(i < 0 or i >= d for i in B):
        raise StrategyError(f"marginal {B} must name distinct columns among 0..{d - 1}")
    return B


def closure(cliques) -> tuple:
    """Every subset of every workload set (the A with ``v_A > 0``), smallest first."""
    found = set()
    for B in cliques:
        B = tuple(sorted(B))
        if len(found) + (1 << len(B)) > 4 * MAX_CLOSURE:
            raise StrategyError(f"the marginal {B} has too many subsets for the residual plan")
        for mask in range(1 << len(B)):
            found.add(tuple(B[j] for j in range(len(B)) if mask >> j & 1))
    if len(found) > MAX_CLOSURE:
        raise StrategyError(f"the residual plan supports at most {MAX_CLOSURE} attribute sets; "
                            f"this workload's closure has {len(found)}. Split the batch")
    return tuple(sorted(found, key=lambda A: (len(A), A)))


def multiplicity(sizes, A) -> int:
    """``m_A = Π_{i∈A} (n_i − 1)``: the rank of ``P_A``."""
    return math.prod(int(sizes[i]) - 1 for i in A)


def eigenvalues(sizes, weights: dict) -> dict:
    """``v_A = Σ_{B⊇A} w_B Π_{i∉B} n_i`` for A in the closure (eigenvalue of V on ``P_A``)."""
    N = math.prod(sizes)
    out = {A: 0.0 for A in closure(weights)}
    for B, w in weights.items():
        outside = N // math.prod(sizes[i] for i in B)
        for A in _subsets(B):
            out[A] += w * outside
    return out


def _subsets(B: tuple):
    for mask in range(1 << len(B)):
        yield tuple(B[j] for j in range(len(B)) if mask >> j & 1)


def svdb_marginals(sizes, weights: dict) -> float:
    """The singular value bound ``(Σ_A m_A √v_A)² / N`` of a weighted marginal workload."""
    sizes = tuple(int(n) for n in sizes)
    weights = {_key(B, len(sizes)): float(w) for B, w in weights.items()}
    v = eigenvalues(sizes, weights)
    return sum(multiplicity(sizes, A) * math.sqrt(v[A]) for A in v) ** 2 / math.prod(sizes)


@dataclass(frozen=True, eq=False)
class ResidualPlan:
    """Residual weights ``a_A`` for a marginal workload, with errors and measurements."""

    sizes: tuple
    weights: dict        # B -> Gram weight w_B
    cells: dict          # B -> number of B's cells the analyst sees (Π n_i unless restricted)
    a: dict              # A -> a_A (closure; 1.0 where m_A = 0: nothing is measured)
    objective: str       # "sum" or "max"
    svdb: float | None   # the lower bound, for full marginals (None when restricted)

    @property
    def N(self) -> int:
        return math.prod(self.sizes)

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity ``√(Σ_A a_A m_A / N)`` of the real-valued rows (every column has
        this norm), summed exactly over the float ``a_A`` and rounded up: never below it."""
        total = sum(Fraction(self.a[A]) * multiplicity(self.sizes, A) for A in self.a
                    if multiplicity(self.sizes, A)) / self.N
        root = math.sqrt(float(total))
        while Fraction(root) ** 2 < total:
            root = math.nextafter(root, math.inf)
        return root

    @property
    def n_measurements(self) -> int:
        return sum(multiplicity(self.sizes, A) for A in self.a)

    def variance(self, B) -> float:
        """Per-cell variance of marginal B (σ = 1 per unit of sensitivity)."""
        return residual_cell_variance(self.sizes, self.a, _key(B, len(self.sizes)))

    @property
    def total_error(self) -> float:
        """Σ_B w_B · cells_B · var_B: total squared error of the returned answers (σ = 1)."""
        return sum(w * self.cells[B] * self.variance(B) for B, w in self.weights.items())

    @property
    def max_variance(self) -> float:
        return max(w * self.variance(B) for B, w in self.weights.items())

    def factors(self, A) -> list:
        """Per-column factors of A's rows (without ``√a_A``): H_i on A, 1ᵀ/√n_i elsewhere."""
        A = set(A)
        return [helmert(n) if i in A else np.full((1, n), 1 / math.sqrt(n))
                for i, n in enumerate(self.sizes)]

    def measure(self, A, marginal_A) -> np.ndarray:
        """Noise-free ``y_A`` from the marginal of x on A (a tensor, ``n_i − 1`` per axis)."""
        A = tuple(A)
        T = np.asarray(marginal_A, dtype=float)
        for axis, i in enumerate(A):
            T = apply_along(T, helmert(self.sizes[i]), axis)
        outside = math.prod(n for i, n in enumerate(self.sizes) if i not in A)
        return T * math.sqrt(self.a[A] / outside)

    def measure_all(self, data) -> dict:
        """Noise-free measurements of every A, from a full x (small) or a dict of marginals."""
        return {A: self.measure(A, marginal(data, A, self.sizes)) for A in self.a}

    def answer(self, y: dict, B) -> np.ndarray:
        """Marginal B (an array shaped by B's sizes) from the measurements ``y``."""
        return residual_answer(self.sizes, self.a, y, _key(B, len(self.sizes)))

    def dense_rows(self) -> np.ndarray:
        """The explicit stacked rows (small domains only; tests and the kernel's exactness)."""
        if self.n_measurements * self.N > MAX_DENSE_ENTRIES:
            raise DomainTooLarge(f"the residual plan's dense rows would have "
                                 f"{self.n_measurements} x {self.N} entries")
        rows = []
        for A in self.a:
            if multiplicity(self.sizes, A):
                M = np.ones((1, 1))
                for F in self.factors(A):
                    M = np.kron(M, F)
                rows.append(math.sqrt(self.a[A]) * M)
        return np.vstack(rows)


def _coefficients(sizes, weights, cells, subsets):
    """``g_A`` (sum objective) and the sparse ``C[B, A] = w_B c(B, A)``, A ⊆ B (max objective)."""
    index = {A: j for j, A in enumerate(subsets)}
    rows, cols, vals = [], [], []
    for k, (B, w) in enumerate(weights.items()):
        for A in _subsets(B):
            if A in index:
                rows.append(k)
                cols.append(index[A])
                vals.append(w * residual_coefficient(sizes, B, A))
    C = sp.csr_matrix((vals, (rows, cols)), shape=(len(weights), len(subsets)))
    g = np.asarray(C.T @ np.array([float(cells[B]) for B in weights])).reshape(-1)
    return g, C


def _sum_optimum(g: np.ndarray, m: np.ndarray, N: int) -> np.ndarray:
    root = np.sqrt(g * m)
    return N * np.sqrt(g / m) / root.sum()


def _max_optimum(C: np.ndarray, m: np.ndarray, N: int) -> np.ndarray:
    """min_b max_B Σ_A C[B,A] m_A / (N b_A)  s.t. Σ b_A = 1, b >= 0 (b_A = a_A m_A / N)."""
    import cvxpy as cp

    K = sp.csr_matrix(C @ sp.diags(m / N))
    scale = float(K.max())
    b = cp.Variable(m.size, pos=True)
    problem = cp.Problem(cp.Minimize(cp.max((K / scale) @ cp.inv_pos(b))), [cp.sum(b) <= 1])
    try:
        problem.solve(solver=cp.CLARABEL)
    except cp.error.SolverError as exc:
        raise StrategyError("the max-variance residual program failed; use objective='sum'") \
            from exc
    if b.value is None or problem.status not in ("optimal", "optimal_inaccurate"):
        raise StrategyError(f"the max-variance residual program ended {problem.status!r}; use "
                            "objective='sum'")
    bv = np.maximum(np.asarray(b.value, dtype=float), 1e-12)
    return N * bv / m


def residual_plan(sizes, weights: dict, cells: dict | None = None,
                  objective: str = "sum") -> ResidualPlan:
    """The optimal residual weights for marginals ``weights`` (B -> w_B > 0).

    ``cells`` (B -> returned cells, default ``Π_{i∈B} n_i``) restricts the sum objective to
    the cells a GROUP BY returns. ``objective``: ``"sum"`` (closed form) or ``"max"``.
    """
    sizes = tuple(int(n) for n in sizes)
    if not sizes or min(sizes) < 1:
        raise StrategyError(f"column sizes must be >= 1, got {sizes}")
    d = len(sizes)
    weights = {_key(B, d): float(w) for B, w in weights.items()}
    if not weights or not all(math.isfinite(w) and w > 0 for w in weights.values()):
        raise StrategyError("the residual plan needs marginals with finite weights > 0")
    full = {B: math.prod(sizes[i] for i in B) for B in weights}
    cells = dict(full) if cells is None else {_key(B, d): int(c) for B, c in cells.items()}
    if set(cells) != set(weights) or any(not 1 <= cells[B] <= full[B] for B in weights):
        raise StrategyError("cells must give, for every marginal, 1..(its cell count) cells")
    if objective not in ("sum", "max"):
        raise StrategyError(f"objective must be 'sum' or 'max', got {objective!r}")
    every = closure(weights)
    subsets = [A for A in every if multiplicity(sizes, A) > 0]
    m = np.array([multiplicity(sizes, A) for A in subsets], dtype=float)
    g, C = _coefficients(sizes, weights, cells, subsets)
    N = math.prod(sizes)
    values = _sum_optimum(g, m, N) if objective == "sum" else _max_optimum(C, m, N)
    values = values / (float(values @ m) / N)        # Σ a_A m_A / N = 1 exactly up to rounding
    a = {A: 1.0 for A in every}
    a.update({A: float(v) for A, v in zip(subsets, values)})
    bound = float(np.sqrt(g * m).sum()) ** 2 / N if cells == full else None   # g_A = m_A v_A
    return ResidualPlan(sizes, weights, cells, a, objective, bound)


def from_union(union: UnionWorkload, objective: str = "sum") -> ResidualPlan:
    """The residual plan for a union whose blocks are marginals, possibly grouped ``[I_k|0]``.

    Each used factor must be the identity or ``[I_k | 0]`` (returned parts first); blocks on
    the same attribute set are merged (weights add, returned cells weighted by them)."""
    weights, returned = {}, {}
    for k, block in enumerate(union.blocks):
        B, cells = block.used, 1
        for i in B:
            F = block.factors[i]
            r = F.shape[0]
            if F.shape[1] != union.sizes[i] or not np.array_equal(F[:, :r], np.eye(r)) \
                    or np.any(F[:, r:]):
                raise StrategyError(f"block {k} is not a marginal on column "
                                    f"{union.columns[i]!r}; the residual plan needs GROUP BY "
                                    "factors (identity or [I | 0])")
            cells *= r
        if returned.setdefault(B, cells) != cells:
            raise StrategyError(f"blocks on columns {[union.columns[i] for i in B]} return "
                                "different cells; merge their GROUP BYs or split the batch")
        weights[B] = weights.get(B, 0.0) + block.weight
    return residual_plan(union.sizes, weights, returned, objective)


def _block_traces(block, sizes) -> list:
    """Per used column i of a block: ``(tr(F P0 Fᵀ), tr(F P1 Fᵀ))`` with ``P0 = 11ᵀ/n``."""
    out = []
    for i in block.used:
        F = block.factors[i]
        ones = float(np.square(F.sum(axis=1)).sum()) / sizes[i]
        out.append((ones, max(float(np.square(F).sum()) - ones, 0.0)))
    return out


def blocks_plan(union: UnionWorkload) -> ResidualPlan:
    """The residual plan minimising the exact total variance of any union of Kronecker blocks.

    A block ``√w ⊗_i F_i`` on the clique B has total variance ``σ² Σ_{A⊆B} g_{b,A} / a_A``
    with ``g_{b,A} = w Π_{i∉B} n_i Π_{i∈B} tr(F_i P_{i,A} F_iᵀ)`` (``P_{i,A}`` = P1 if
    i ∈ A else P0; :func:`dpsql.inference.implicit.residual_block_answers`), so the sum over
    blocks is ``Σ_A g_A / a_A`` and the closed form of :func:`residual_plan` minimises it
    under ``Σ_A a_A m_A / N = 1``. For full marginals ``g_A = m_A v_A`` (the plan is then
    svdb's); for ``[I | 0]`` factors it is the restricted objective; predicate rows and
    ranges weigh each residual by what the block actually reads. An A with ``g_A = 0`` is not
    measured (``a_A = 0``): every block over it annihilates that residual.
    """
    sizes = union.sizes
    cliques = {b.used for b in union.blocks}
    try:
        every = closure(cliques)
    except StrategyError as exc:
        big = sorted(cliques, key=len, reverse=True)[:3]
        raise StrategyError(
            f"{exc}: the largest blocks read the columns "
            + "; ".join(", ".join(union.columns[i] for i in B) for B in big)
            + " — split the batch so that each request reads fewer columns together") \
            from None
    subsets = [A for A in every if multiplicity(sizes, A) > 0]
    index = {A: j for j, A in enumerate(subsets)}
    g = np.zeros(len(subsets))
    N = math.prod(sizes)
    for block in union.blocks:
        B = block.used
        outside = N // math.prod(sizes[i] for i in B)
        traces = _block_traces(block, sizes)
        for A in _subsets(B):
            if A in index:
                g[index[A]] += block.weight * outside * math.prod(
                    t[1] if i in A else t[0] for i, t in zip(B, traces))
    if not np.any(g > 0):
        raise StrategyError("every answer of this batch is a constant; nothing to measure")
    m = np.array([multiplicity(sizes, A) for A in subsets], dtype=float)
    values = _sum_optimum(g, m, N)
    values = values / (float(values @ m) / N)
    a = {A: 1.0 for A in every}
    a.update({A: float(v) for A, v in zip(subsets, values)})
    weights = {B: 1.0 for B in cliques}
    cells = {B: math.prod(sizes[i] for i in B) for B in cliques}
    plan = ResidualPlan(sizes, weights, cells, a, "sum", None)
    object.__setattr__(plan, "total_variance", float(np.sqrt(g * m).sum()) ** 2 / N)
    return plan


def as_marginal_plan(plan: ResidualPlan, name: str = "residual"):
    """The plan's measurements as the kernel releases them (:mod:`dpsql.workload.marginals`):
    for each measured A, ``√(a_A / Π_{i∉A} n_i) · ⊗_{i∈A} H_i`` on the marginal of A."""
    from dpsql.workload import marginals

    N = plan.N
    out = []
    for A, value in plan.a.items():
        if multiplicity(plan.sizes, A) == 0 or value <= 0:
            continue
        outside = N // math.prod(plan.sizes[i] for i in A)
        out.append(marginals.MarginalMeasurement(A, tuple(helmert(plan.sizes[i]) for i in A),
                                                 math.sqrt(value / outside)))
    return marginals.make(name, plan.sizes, out)

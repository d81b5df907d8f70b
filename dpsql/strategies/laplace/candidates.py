"""Pure ε-DP strategies: the matrix mechanism with Laplace noise and L1 sensitivity.

Mechanism (Li & Miklau, *Eigen-Design*, §2 and §3.5). Neighbours add or remove one row, so
``A x`` moves by one column of ``A``; the L1 sensitivity is ``Δ₁ = max_j Σᵢ |A[i, j]|``
(``Plan.l1_sensitivity``, exact on the 2**-20 grid). ``y = A x + Lap(b)ᵖ`` with ``b = Δ₁/ε`` is
ε-DP; least squares ``x̂ = A⁺ y`` and ``W x̂`` are post-processing. Each measurement has
variance ``2b²``, so the answers' covariance is ``2b² W (AᵀA)⁺ Wᵀ`` — the Gaussian path's
error factors with ``σ²`` replaced by ``2b²`` — and the expected total squared error is
``2 (Δ₁/ε)² tr(V (AᵀA)⁺)``. A strategy for this family minimises ``Δ₁² tr(V (AᵀA)⁺)``, which
is scale-free (:func:`l1_error_factor`).

Registry :data:`L1_REGISTRY` (same interface as ``REGISTRY``):

- ``identity``, ``workload``, ``wavelet``, ``fourier``: the Gaussian strategies' plans,
  unchanged (their plans already carry the exact ``l1_sensitivity``). Wavelet's Haar matrix
  has ``h + 1`` entries ±1 per column, so ``Δ₁ = Π (h_c + 1)`` over the used columns.
- ``hierarchical``: the b-ary trees of :mod:`dpsql.strategies.hierarchical`, branching chosen
  for L1 (:mod:`dpsql.strategies.laplace.hierarchical`): ``Δ₁ = Π L_c``, ``L_c`` the levels
  of column ``c``.
- ``eigen``: §3.5's ε-DP variant — weights for a fixed basis under L1 sensitivity (below),
  over several bases, keeping the best.

Weighted basis (the L1 program). Rows ``b_i`` of an orthogonal basis, written ``b_i = ‖b_i‖
q_i`` with ``q_i`` orthonormal (rows of ``Q``); the strategy ``A = diag(u) Q`` (any row scale
is absorbed in ``u``). Then ``AᵀA = Qᵀ diag(u²) Q`` and, for the rows kept (those the workload
sees), ``(AᵀA)⁺ = Qᵀ diag(u⁻²) Q``, so ``tr(V (AᵀA)⁺) = Σᵢ cᵢ / uᵢ²`` with
``cᵢ = q_iᵀ V q_i = b_iᵀ V b_i / ‖b_i‖²`` per unit-norm row — in terms of the unnormalised
row and its own weight ``ũᵢ = uᵢ / ‖b_i‖`` this is ``b_iᵀ V b_i / (ũᵢ² ‖b_i‖⁴)``. The column L1
norms are ``Σᵢ uᵢ |Q[i, j]|``. Hence, with ``M = |Q|``::

    minimise  Σᵢ cᵢ / uᵢ²   subject to   Mᵀu <= 1 (every column's L1 norm),   u >= 0,

convex (``1/u²`` is convex on ``u > 0``, the constraints are linear). Rows with
``cᵢ <= 1e-12 · max c`` are orthogonal to the workload and dropped (eigen-queries: §4.1's
cutoff, :func:`.eigen.eigen_queries`).

Dual and certificate (:func:`solve_l1_program`). The Lagrangian minimised over ``u`` gives
``uᵢ = (2cᵢ / sᵢ)^(1/3)`` with ``s = M w`` (``w >= 0`` the column multipliers) and the dual
``g(w) = 3·2^(-2/3) Σᵢ (cᵢ sᵢ²)^(1/3) − Σⱼ wⱼ``; optimising the scale of ``w`` shows that the
optimum equals ``max over the simplex of h(w)³``, ``h(w) = Σᵢ cᵢ^(1/3) sᵢ^(2/3)`` (concave,
homogeneous of degree 2/3). For ``w`` in the simplex, weak duality makes ``h(w)³`` a lower
bound on the optimum, and ``uᵢ = (cᵢ/sᵢ)^(1/3) / h`` has ``Σⱼ wⱼ (Mᵀu)ⱼ = 1`` and objective
``h³``, so ``u / max_j (Mᵀu)_j`` is feasible with objective ``h³ · max_j (Mᵀu)_j²``: the
certified relative gap is ``max_j (Mᵀu)_j² − 1``. We maximise the scale-free concave form
``G(w) = 3 h(w) − 2 Σⱼ wⱼ`` (maximum ``max h³`` at scale ``Σw = h³``; gradient
``2 Mᵀ(c/s)^(1/3) − 2``) by L-BFGS-B with bounds ``w >= 0``, certifying every evaluation,
with multiplicative steps ``wⱼ ← wⱼ (Mᵀu)ⱼ`` (the fixed point of the optimality
conditions: ``(Mᵀu)ⱼ = 1`` where ``wⱼ > 0``) when L-BFGS-B stalls.
:func:`solve_l1_program_cvxpy` is the reference.

Column completion (Program 2 steps 4–5, L1 form): after scaling the largest column L1 norm of
``diag(u) Q`` to 1, append ``(1 − ‖A[:, j]‖₁) e_jᵀ`` for every shorter column. Every column
norm becomes 1, so ``Δ₁`` is unchanged, and ``AᵀA`` only grows (PSD order): the error can
only fall (``tests/test_l1_strategies.py`` measures by how much).

Bases for ``eigen`` (each gives a designed error ``Δ₁² tr(V (AᵀA)⁺)``; the smallest wins):

- ``eigen``: the eigen-queries of ``V`` (Program 2's design queries). Under L1 they are
  often poor — their dense rows have large L1 norms (§3.5: "there does not seem to be a
  universally good design set");
- ``haar``: the orthonormal Haar basis (Kronecker over the columns; only when every column
  size is a power of two, where its rows are orthogonal);
- ``fourier``: the orthonormal Walsh–Hadamard / DCT product basis of :mod:`.fourier`;
- ``tree``: the hierarchical basis with one weight per level. Its rows are not orthogonal,
  so the separable program does not apply; instead each column gets a nested chain of block
  sizes ``1 = s₀ < s₁ < …`` (each a multiple of the last, or the whole column) with level
  weights ``u_l``: every column of the chain's matrix has L1 norm ``Σ u_l``, and
  ``tr(M X⁻¹)`` for ``X = Σ_l u_l² Σ_blocks 1 1ᵀ`` follows bottom-up by Sherman–Morrison, as
  in :mod:`dpsql.strategies.hierarchical`, with weights (:func:`weighted_tree_error`; every
  vector of the recursion is constant on the blocks of ``s₁``, so it needs only ``M``'s block sums:
  ``O(k²/s₁)`` per evaluation). The level weights make the problem non-convex (the set
  ``Σ u_l <= 1`` in ``v = u²`` is not convex, and optima are sparse: few levels), so the
  search is a greedy heuristic (:func:`best_chain`): every chain ``[1, s]`` (``s`` a power
  ``b^i``, ``b = 2 … 16``, or the whole column) by a bounded scalar search, then one more
  level at a time around the best chains, up to :data:`MAX_CHAIN_LEVELS` levels. Several
  columns: coordinate descent on the Kronecker error, as in
  :mod:`dpsql.strategies.hierarchical`;
- ``identity``: ``Q = I`` has the trivial optimum ``u = 1``, i.e. the identity strategy.

Refinement (``refine`` steps, default 30). A weighted tree contains the leaves, so it is a
*p-Identity* strategy ``A = [I; Θ] D⁻¹`` with ``D = diag(1 + 1ᵀΘ)`` (every column L1 norm
1), the parametrisation HDMM optimises for ε-DP (McKenna, Miklau, Hay & Machanavajjhala,
VLDB 2018; the idea only, no code taken). :func:`refine_p_identity` runs L-BFGS-B on
``Θ >= 0`` from the tree's ``Θ`` (its non-leaf rows over the leaves' weight), with the exact
error and gradient through Woodbury (``O(p n²)`` per step, :func:`p_identity_error`), and
keeps the end point only if it is better (``Θ`` may become dense: the plan is then a dense
``(n + p) x n`` matrix). On all ranges over 256 cells the tree (leaves + blocks of 16)
gives RMSE 17.77 at ε = 0.5 and the refinement 16.21; over 1024 cells 25.16 and 22.29.

Privacy needs nothing from any of this: every plan goes through :func:`~.base.make_plan`,
whose exact ``l1_sensitivity`` of the rounded matrix is what the Laplace noise is
calibrated to, and every strategy here is a function of the workload (public), never of data.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dpsql.errors import StrategyError
from dpsql.inference.least_squares import LeastSquares
from dpsql.strategies import REGISTRY
from dpsql.workload.matrix import Plan, WorkloadInfo, make_plan
from dpsql.strategies.gaussian.eigen import MAX_CELLS, eigen_queries
from dpsql.strategies.fourier import coefficient_energies, orthonormal_basis
from dpsql.strategies.kron import check_size, kron_all
from dpsql.strategies.laplace.hierarchical import L1HierarchicalStrategy
from dpsql.strategies.laplace.program import complete_columns_l1, solve_l1_program, solve_l1_program_cvxpy
from dpsql.strategies.laplace.trees import chain_matrix, choose_chains, refine_tree
from dpsql.strategies.wavelet import haar_matrix

#: basis rows whose workload cost c_i is at or below this fraction of the largest are dropped
ZERO_COST = 1e-12
#: a completable design whose uncompleted error is within this factor of the best is
#: completed and evaluated exactly before the choice (completion gained up to 49 % in tests)
RECHECK_FACTOR = 2.0
#: L-BFGS-B steps of the p-Identity refinement of the tree design (0: none)
REFINE_ITERATIONS = 30
#: bases the ``eigen`` strategy compares (ties: the earlier one)
BASES = ("eigen", "haar", "fourier", "tree", "identity")


# --- error of a plan under Laplace noise ----------------------------------------------------

def l1_error_factor(plan: Plan, V: np.ndarray) -> float:
    """``Δ₁² tr(V (AᵀA)⁺)``: the expected total squared error divided by ``2/ε²``."""
    return plan.l1_sensitivity ** 2 * LeastSquares(plan).total_error_factor(V)


def l1_expected_rmse(plan: Plan, W, epsilon: float) -> float:
    """Expected RMSE of the workload's answers under Laplace noise ``b = Δ₁/ε`` per measurement.

    ``W``: the workload's rows (dense or sparse ``m x n``), or a :class:`WorkloadInfo`
    (its rows when it has them, else its Gram matrix ``V`` and ``m``). The per-answer
    variance is ``2b²`` times the least-squares error factor (``LeastSquares.error_factors``).
    This is the ideal scale; the kernel's sampler adds a small grid slack
    (``dpsql.noise.laplace.laplace_scale``).
    """
    if not epsilon > 0:
        raise ValueError(f"epsilon must be positive, got {epsilon!r}")
    b = plan.l1_sensitivity / float(epsilon)
    ls = LeastSquares(plan)
    if isinstance(W, WorkloadInfo):
        if W.W is None:
            return math.sqrt(2.0 * b * b * ls.total_error_factor(W.V) / max(1, W.m))
        W = W.W
    factors = ls.error_factors(W)
    return math.sqrt(2.0 * b * b * float(np.sum(factors)) / max(1, len(factors)))


# --- bases for the L1 eigen strategy --------------------------------------------------------

def _power_of_two(k: int) -> bool:
    return k >= 1 and k & (k - 1) == 0


def _program_basis(Q, c) -> tuple:
    """Drop the rows the workload does not see; return ``(Q, c, M = |Q|)``."""
    keep = np.flatnonzero(c > ZERO_COST * float(c.max()))
    Q = Q[keep]
    return Q, c[keep], abs(Q)


def basis_rows(name: str, workload: WorkloadInfo, max_cells: int = MAX_CELLS) -> tuple:
    """``(Q, c)``: orthonormal rows of basis ``name`` and the workload's cost on each row."""
    shape, n = workload.shape, workload.n
    if name == "eigen":
        lam, Q = eigen_queries(workload, max_cells=max_cells)
        return Q, lam
    if name == "haar":
        if not all(_power_of_two(k) for k in shape):
            raise StrategyError("the Haar basis is orthogonal only when every column size is "
                                "a power of two")
        mats = []
        for k in shape:
            H = haar_matrix(k)
            norms = np.sqrt(np.asarray(H.multiply(H).sum(axis=1)).reshape(-1))
            mats.append(sp.diags(1.0 / norms) @ H)
        Q = kron_all(mats)
        c = np.asarray(Q.multiply(Q @ workload.V).sum(axis=1)).reshape(-1)
        return Q, c
    if name == "fourier":
        if n > max_cells:
            raise StrategyError(f"the Fourier basis is dense; at most {max_cells} cells")
        Q = np.ones((1, 1))
        for k in shape:
            Q = np.kron(Q, orthonormal_basis(k))
        c = np.diag(coefficient_energies(workload.V, shape)).copy()
        return Q, c
    raise ValueError(f"unknown basis {name!r}")


@dataclass(frozen=True)
class BasisDesign:
    """One basis's weighted design: its matrix (before completion) and designed error."""

    basis: str
    A: object               # rows scaled so the largest column L1 norm is 1 (None: identity)
    error: float            # Δ₁² tr(V (AᵀA)⁺) of A (before completion and rounding)
    how: str
    completable: bool       # columns may fall short of L1 norm 1
    chains: tuple = ()      # tree: the per-column (sizes, u)


def design_basis(name: str, workload: WorkloadInfo, tol: float = 1e-6, solver: str = "fast",
                 max_cells: int = MAX_CELLS) -> BasisDesign:
    """The weighted design of one basis (see the module docstring)."""
    if name == "identity":
        return BasisDesign(name, None, float(np.trace(workload.V)), "identity (u = 1)", False)
    if name == "tree":
        check_size("eigen", workload)
        chains, error = choose_chains(workload.V, workload.shape)
        A = kron_all([chain_matrix(k, sizes, u) for k, (sizes, u) in
                      zip(workload.shape, chains)])
        A = A * (1.0 / float(np.asarray(abs(A).sum(axis=0)).max()))
        shown = ", ".join("/".join(str(s) for s, w in zip(sizes, u / u.sum()) if w > 0) +
                          " (weights " + "/".join(f"{w:.3g}" for w in u / u.sum() if w > 0) + ")"
                          for sizes, u in chains)
        return BasisDesign(name, A, error, f"weighted tree levels per column: {shown}", False,
                           tuple(chains))
    Q, c = basis_rows(name, workload, max_cells)
    Q, c, M = _program_basis(Q, c)
    res = solve_l1_program_cvxpy(c, M) if solver == "cvxpy" else \
        solve_l1_program(c, M, tol=tol)
    A = (sp.diags(res.u) @ Q).tocsr() if sp.issparse(Q) else res.u[:, None] * Q
    return BasisDesign(name, A, res.objective,
                       f"L1 program over {c.size} {name} rows ({res.describe()})", True)


class L1EigenDesign:
    """§3.5's ε-DP variant: the best weighted basis under L1 sensitivity.

    ``bases``: which of :data:`BASES` to compare (the smallest designed error wins; ties: the
    earlier). ``complete``: append the L1 completion rows (never raises the error).
    ``solver``: ``"fast"`` (certified dual L-BFGS-B) or ``"cvxpy"`` (reference, small).
    ``tol``: certified relative gap of each L1 program. ``refine``: at most this many
    L-BFGS-B steps refining the tree design as a p-Identity strategy (:func:`refine_tree`;
    0: off). The designed error of each basis is exact for its unrounded, uncompleted matrix
    (orthonormal bases, weighted trees, refined trees); completion can only lower it, so a
    completable design within :data:`RECHECK_FACTOR` of the best is completed and evaluated
    exactly (``O(n³)``) before the choice; rounding to the grid changes errors negligibly.
    """

    name = "eigen"
    cacheable = True   # seconds at n in the thousands; cached under the Laplace model

    def __init__(self, bases: tuple = BASES, complete: bool = True, solver: str = "fast",
                 tol: float = 1e-6, refine: int = REFINE_ITERATIONS,
                 max_cells: int = MAX_CELLS):
        bases = tuple(bases)
        if not bases or any(b not in BASES for b in bases) or len(set(bases)) != len(bases):
            raise ValueError(f"bases must be distinct names from {BASES}, got {bases!r}")
        if solver not in ("fast", "cvxpy"):
            raise ValueError(f"solver must be 'fast' or 'cvxpy', got {solver!r}")
        if not 0 < tol < 1:
            raise ValueError(f"tol must lie in (0, 1), got {tol!r}")
        if isinstance(refine, bool) or int(refine) != refine or refine < 0:
            raise ValueError(f"refine must be a non-negative integer, got {refine!r}")
        self.refine = int(refine)
        self.bases = bases
        self.complete = bool(complete)
        self.solver = solver
        self.tol = float(tol)
        self.max_cells = int(max_cells)

    def estimated_seconds(self, workload) -> float:
        """About 1.5 s at n = 1024 (one BLAS thread; eigendecomposition, tree search and
        refinement: ~n³ and n²)."""
        return 2.0 * (workload.n / 1024.0) ** 3 + 0.5 * (workload.n / 1024.0) ** 2

    def _refined(self, d: BasisDesign, workload: WorkloadInfo) -> BasisDesign:
        """The tree design refined as a p-Identity strategy (:func:`refine_tree`)."""
        out = refine_tree(workload, d.A, d.chains, self.refine)
        if out is None or not out[1] < d.error:
            return d
        A, error, p = out
        return dataclasses.replace(
            d, A=A, error=error,
            how=f"{d.how}; refined as a p-Identity strategy (p = {p}, at most "
                f"{self.refine} L-BFGS-B steps): {d.error:.6g} -> {error:.6g}")

    def designs(self, workload: WorkloadInfo) -> list:
        """Every applicable basis's design (bases that do not apply are skipped)."""
        out, reasons = [], []
        for name in self.bases:
            try:
                out.append(design_basis(name, workload, self.tol, self.solver, self.max_cells))
            except StrategyError as exc:
                reasons.append(f"{name}: {exc}")
        if not out:
            raise StrategyError("no basis applies to this batch: " + "; ".join(reasons))
        return out

    def plan(self, workload: WorkloadInfo) -> Plan:
        if workload.n > self.max_cells:
            raise StrategyError(
                f"strategy 'eigen' works with dense {workload.n} x {workload.n} matrices; it "
                f"supports at most {self.max_cells} cells. Use strategy='identity' or "
                "coarser predicates (fewer cells)")
        if not float(np.trace(workload.V)) > 0:
            raise StrategyError("eigen cannot design for a batch whose queries select no cell "
                                "(every answer is 0 whatever the data); use "
                                "strategy='identity'")
        designs = self.designs(workload)
        floor = min(d.error for d in designs)
        if self.refine:
            designs = [self._refined(d, workload) if d.basis == "tree" and
                       d.error <= RECHECK_FACTOR * floor else d for d in designs]
            floor = min(d.error for d in designs)
        scored = []
        for i, d in enumerate(designs):
            plan = None
            if self.complete and d.completable and d.error <= RECHECK_FACTOR * floor:
                plan = make_plan(self.name, complete_columns_l1(d.A))
                scored.append((l1_error_factor(plan, workload.V), i, d, plan))
            else:
                scored.append((d.error, i, d, plan))
        error, _, best, plan = min(scored, key=lambda t: (t[0], t[1]))
        compared = ", ".join(f"{d.basis} {e:.6g}" for e, _, d, _ in scored)
        notes = (f"basis {best.basis}: {best.how}",
                 f"total squared error (2/epsilon^2) per basis, completed where it could "
                 f"win: {compared}")
        if best.A is None:
            return Plan(self.name, workload.n, None, 1.0, integral=True, notes=notes,
                        l1_sensitivity=1.0)
        if plan is None:
            A = complete_columns_l1(best.A) if self.complete and best.completable else best.A
            plan = make_plan(self.name, A)
        return dataclasses.replace(plan, notes=notes)


L1_REGISTRY: dict = {
    "identity": REGISTRY["identity"],
    "workload": REGISTRY["workload"],
    "hierarchical": L1HierarchicalStrategy(),
    "wavelet": REGISTRY["wavelet"],
    "fourier": REGISTRY["fourier"],
    "eigen": L1EigenDesign(),
}

#: candidates ``auto`` compares under pure ε-DP, in order of preference on ties
L1_AUTO_CANDIDATES = ("identity", "workload", "hierarchical", "wavelet", "fourier", "eigen")

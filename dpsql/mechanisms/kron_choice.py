"""A Kronecker strategy per clique for batches compiled to blocks (issue 20 item 3).

The residual plan (:mod:`dpsql.strategies.residual`) is optimal for marginals but measures
each column through a fixed basis, so a range or a CDF over an ordered column (a quantile's
prefix counts ``col < e``) sums many noisy cells: its variance grows with the range's length.
This candidate measures each maximal clique C with one Kronecker strategy ``⊗_{i∈C} A_i``
optimised for the blocks answered there (HDMM's OPT⊗ for unions, McKenna et al. VLDB 2018
§4–5, as :func:`dpsql.strategies.kronecker.union_kron` implements it; no HDMM code): an
ordered column used by ranges gets a range-aware 1-D factor (the certified 1-D optimum of its
weighted Gram), a GROUP BY column the identity. The cliques share the budget as
:func:`~dpsql.strategies.kronecker.separate_kron` does: measurement C is scaled by ``c_C``
with ``c_C² ∝ √E_C`` (``E_C`` its blocks' total variance at unit sensitivity), so the stack's
squared L2 sensitivity is ``Σ c_C² = 1`` up to rounding; the kernel recomputes it from the
factors (:func:`dpsql.workload.marginals.computed_l2_sensitivity`). Gaussian noise (δ > 0).

Each block is answered by least squares on its *home* clique (the smallest measured clique
holding its columns): ``(⊗ W_i A_i⁺) y_C / c_C``, with the exact per-answer variance
``σ²/c_C² ⊗ diag(W_i (A_iᵀA_i)⁺ W_iᵀ)`` (as :func:`dpsql.inference.implicit.kron_variances`,
with each clique's pseudo-inverses computed once).
Blocks on one home clique are answered from one least-squares estimate, so their answers
are consistent (a quantile's ``F_k + U_k = N`` holds exactly). Public inputs only.
"""

from __future__ import annotations

import math

import numpy as np

from dpsql.errors import StrategyError
from dpsql.inference.implicit import gram_pinv
from dpsql.noise.gaussian import calibrate_with_rounding
from dpsql.store.results import Z95
from dpsql.strategies.gaussian.dual import blas_threads
from dpsql.strategies.kronecker import union_kron
from dpsql.workload import marginals
from dpsql.workload.blocks import KronBlock, UnionWorkload, apply_along

#: rounds of the per-column cycling of union_kron (each round: one 1-D solve per column)
ROUNDS = 2


def _maximal(cliques) -> tuple:
    return tuple(C for C in cliques if not any(set(C) < set(D) for D in cliques))


def has_ranges(workload) -> bool:
    """Whether some block row sums several parts of a column without being all of it (a
    range, an IN list, a CDF): where a range-aware factor beats the residual basis."""
    for block in workload.union.blocks:
        for i in block.used:
            F = block.factors[i]
            nnz = (F != 0).sum(axis=1)
            if np.any((nnz > 1) & (nnz < F.shape[1])):
                return True
    return False


class KronChoice:
    """One Kronecker strategy per maximal clique, the budget split across cliques."""

    mechanism = "gaussian"

    def __init__(self, workload):
        union = workload.union
        self.workload = workload
        sizes = union.sizes
        cliques = _maximal(union.cliques())
        self.home = [min((C for C in cliques if set(b.used) <= set(C)),
                         key=lambda C: (math.prod(sizes[i] for i in C), C))
                     for b in union.blocks]
        strategies = {}
        for C in cliques:
            mine = [KronBlock(tuple(b.factors[i] for i in C) or (np.ones((1, 1)),), b.weight)
                    for b, h in zip(union.blocks, self.home) if h == C]
            cols = tuple(union.columns[i] for i in C) or ("total",)
            with blas_threads():       # one BLAS thread: see strategies/gaussian/dual.py
                strategies[C] = union_kron(UnionWorkload(cols, mine[0].sizes, tuple(mine)),
                                           max_rounds=ROUNDS)
        root = {C: math.sqrt(max(s.error, 1e-300)) for C, s in strategies.items()}
        total = sum(root.values())
        self.scales = {C: math.sqrt(root[C] / total) for C in cliques}
        self.factors = {C: strategies[C].factors for C in cliques}
        self.plan = marginals.make("kron", sizes, [
            marginals.MarginalMeasurement(C, self.factors[C], self.scales[C])
            for C in cliques if C])
        if any(not C for C in cliques):
            raise StrategyError("a batch of totals only: the other candidates serve it")
        self._var = self._g = None

    @property
    def sensitivity(self) -> float:
        return self.plan.sensitivity

    @property
    def n_measurements(self) -> int:
        """(read with the sensitivity when a script pre-checks the charge's ρ)"""
        return self.plan.n_measurements

    def scale(self, eps, dlt, calibration: str) -> float:
        return calibrate_with_rounding(eps, dlt, self.sensitivity, self.plan.n_measurements,
                                       calibration)

    def _pinvs(self) -> dict:
        """Per clique, per column: ``(A_iᵀA_i)⁺`` and ``A_i⁺`` (one eigendecomposition each)."""
        if self._g is None:
            with blas_threads():
                self._g = {C: [(G, G @ A.T) for G, A in
                               ((gram_pinv(A), A) for A in factors)]
                           for C, factors in self.factors.items()}
        return self._g

    def _block_factors(self, b, C) -> list:
        """The block's factors on its home clique, each checked to lie in the row space of
        the clique's factor (so its answers are estimable: least squares is exact on them)."""
        out = []
        for i, (G, _), A in zip(C, self._pinvs()[C], self.factors[C]):
            W = b.factors[i]
            if np.abs(W - W @ G @ (A.T @ A)).max(initial=0.0) > 1e-8 * max(np.abs(W).max(), 1):
                raise StrategyError("internal error: a block is not estimable from its "
                                    "clique's Kronecker strategy")
            out.append(W)
        return out

    def _variances(self) -> np.ndarray:
        """Every answer's variance at σ = 1, in row order: ``w/c_C² ⊗ diag(W_i G_i W_iᵀ)``."""
        if self._var is None:
            per_block = []
            for b, C in zip(self.workload.union.blocks, self.home):
                v = np.ones(1)
                for W, (G, _) in zip(self._block_factors(b, C), self._pinvs()[C]):
                    v = np.kron(v, np.einsum("ij,jk,ik->i", W, G, W))
                per_block.append(b.weight * v / self.scales[C] ** 2)
            self._var = self.workload.assemble(per_block)
        return self._var

    def stderr(self, sigma: float) -> np.ndarray:
        return sigma * np.sqrt(self._variances())

    def halfwidth(self, sigma: float) -> np.ndarray:
        return Z95 * self.stderr(sigma)

    def answers(self, y: np.ndarray) -> np.ndarray:
        """The batch's answers from the cliques' measurements ``y`` (kernel order): per
        block ``√w (⊗ W_i A_i⁺) y_C / c_C``."""
        tensors, start = {}, 0
        for m in self.plan.measurements:
            shape = tuple(F.shape[0] for F in m.factors)
            tensors[m.columns] = np.asarray(y[start:start + m.size]).reshape(shape) / m.scale
            start += m.size
        if start != len(y):
            raise StrategyError(f"internal error: expected {start} measurements, got {len(y)}")
        per_block = []
        for b, C in zip(self.workload.union.blocks, self.home):
            T = tensors[C]
            for axis, (W, (_, pinv)) in enumerate(zip(self._block_factors(b, C),
                                                     self._pinvs()[C])):
                T = apply_along(T, W @ pinv, axis)
            per_block.append(math.sqrt(b.weight) * T.reshape(-1))
        return self.workload.assemble(per_block)

def candidates(workload) -> list:
    """``[KronChoice]`` for a batch with ranges inside its blocks (none otherwise: on
    GROUP BYs alone the residual plan is optimal and this one would only cost time)."""
    if not has_ranges(workload):
        return []
    try:
        return [KronChoice(workload)]
    except StrategyError:        # no Kronecker strategy answers every block of a clique
        return []

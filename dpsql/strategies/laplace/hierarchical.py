"""Pure ε-DP hierarchical strategy: b-ary trees per column, branching chosen for L1.

The ``hierarchical`` entry of :data:`.candidates.L1_REGISTRY` (the family and its error are
derived in :mod:`.candidates`): the b-ary trees of :mod:`dpsql.strategies.hierarchical`,
branching chosen for L1. Every cell lies in one node per level, so a column has ``L`` ones:
``Δ₁ = L`` (``Δ₂ = √L``), and the error to minimise is ``L² tr(V X⁻¹)`` instead of
``L tr(V X⁻¹)``; over several columns (Kronecker product) ``Δ₁ = Π L_c`` (each column of
``⊗ A_c`` is a Kronecker product of columns, whose L1 norm is the product of theirs).

Public inputs only; the plan goes through :func:`~dpsql.workload.matrix.make_plan`, whose
exact ``l1_sensitivity`` of the rounded matrix is what the Laplace noise is calibrated to.
"""

from __future__ import annotations

import math

import numpy as np

from dpsql.workload.matrix import Plan, WorkloadInfo
from dpsql.strategies.hierarchical import (candidates, level_sizes, tree_error, tree_gram_inverse,
                                          tree_plan)
from dpsql.strategies.kron import check_size, contract
from dpsql.strategies.laplace.trees import MAX_SWEEPS


def _best_branching_l1(M: np.ndarray, k: int) -> tuple:
    """``(L² · tr(M X⁻¹), b)`` of the best uniform tree on one column (ties: the earlier)."""
    return min(((len(level_sizes(k, b)) ** 2 * tree_error(M, b), i, b)
                for i, b in enumerate(candidates(k))), key=lambda t: (t[0], t[1]))[::2]


def choose_branching_l1(V: np.ndarray, shape: tuple) -> tuple:
    """Per-column branching factors minimising ``(Π L_c)² · tr(V (AᵀA)⁻¹)`` (L1 sensitivity).

    Same search as :func:`.hierarchical.choose_branching` (exact on one column; coordinate
    descent from the leaves and from a total on every column otherwise) with the L1 cost
    ``L²`` per column in place of ``L``. Returns ``(branchings, error)``.
    """
    V = np.asarray(V, dtype=float)
    if len(shape) == 1:
        error, b = _best_branching_l1(V, shape[0])
        return (b,), float(error)

    def descend(choice):
        choice = list(choice)
        inverse = {c: tree_gram_inverse(k, b) for c, (k, b) in enumerate(zip(shape, choice))}
        error = math.inf
        for _ in range(MAX_SWEEPS):
            changed = False
            for c, k in enumerate(shape):
                M = contract(V, shape, {o: inverse[o] for o in range(len(shape)) if o != c})
                others = math.prod(len(level_sizes(shape[o], choice[o])) ** 2
                                   for o in range(len(shape)) if o != c)
                value, b = _best_branching_l1(M, k)
                error = others * value
                if b != choice[c]:
                    choice[c], inverse[c], changed = b, tree_gram_inverse(k, b), True
            if not changed:
                break
        return float(error), tuple(choice)

    starts = ([None] * len(shape), [k if k > 1 else None for k in shape])
    error, choice = min((descend(s) for s in starts), key=lambda t: t[0])
    return choice, error


class L1HierarchicalStrategy:
    """Uniform b-ary trees per column, branching chosen for the L1 error (``Δ₁ = Π L_c``)."""

    name = "hierarchical"

    def plan(self, workload: WorkloadInfo) -> Plan:
        check_size(self.name, workload)
        branching, error = choose_branching_l1(workload.V, workload.shape)
        return tree_plan(self.name, workload.shape, branching, error, l1=True)

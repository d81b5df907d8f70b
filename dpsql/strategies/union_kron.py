"""``kron``: a union of Kronecker strategies for blocks with ranges inside, measured through
marginals (HDMM's OPT⊗ and OPT₊ on dpsql's own 1-D solvers; issue 16).

McKenna, Miklau, Hay, Machanavajjhala, *Optimizing error of high-dimensional statistical
queries under differential privacy* (HDMM), VLDB 2018: §4 (OPT⊗: a Kronecker product of
per-column strategies), §5 (OPT₊: a union of Kronecker products, one per group of workload
blocks, weighted). The algebra is in NOTES ("Kronecker blocks", "Marginals in the residual
basis"); no code is taken from HDMM (AGPL).

Columns split in two kinds. A *general* column is one some block reads through rows summing
several (not all) of its parts — ranges, IN lists; every other column is read only through
GROUP BY rows, one-part conditions or totals, which the residual basis serves optimally
(:mod:`dpsql.strategies.residual`). Blocks are grouped by the general columns they use, Γ.
Group g is measured by ``c_g · (⊗_{i∈Γ} A_i) ⊗ R_g``:

- ``A_i`` — one strategy per general column, from dpsql's 1-D solvers (L2: the certified
  optimum :func:`dpsql.strategies.gaussian.optimal.solve`; L1: the L1 design,
  :func:`dpsql.strategies.kronecker.one_dimensional`), scaled to column norm 1;
- ``R_g`` over the other columns — L2: the residual plan for the group's blocks (each
  measured residual set A read from the marginal on Γ ∪ A); L1: each maximal clique C of
  the group's other columns measured directly (identity factors).

Errors are products (``tr((⊗W)ᵀ(⊗W) (⊗AᵀA)⁺) = Π tr(W_iᵀW_i (A_iᵀA_i)⁺)``), so the group's
total error ``E_g = Σ_k w_k Π_{i∈Γ} tr(V_{k,i} X_i⁺) · r_k`` (``r_k`` the block's error under
R_g) is minimised by cycling: the residual weights for blocks weighted by their general
factors' errors (:func:`dpsql.strategies.residual.blocks_plan`), then each ``A_i`` for the
Gram ``Σ_k w_k r_k Π_{j≠i} tr(V_{k,j} X_j⁺) V_{k,i}`` — a step is kept only when it lowers
``E_g``. OPT₊ weights the groups: Gaussian sensitivities add in squares, so ``c_g² ∝ √E_g``
(total ``(Σ √E_g)²``); Laplace's add, so each L1 measurement ``j`` gets ``u_j ∝ E_j^{1/3}``
(total ``(Σ E_j^{1/3})³``).

Privacy: every measurement is ``scale · ⊗ factors`` on a marginal
(:class:`dpsql.workload.marginals.MarginalPlan`): the kernel derives the plan's L2 or L1
sensitivity itself from the factors and scales (exact rationals plus the float evaluation
bound) and checks the noise scale against it; the weights above make it 1 up to rounding,
which only the reported expected error relies on. Public inputs only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dpsql.errors import StrategyError
from dpsql.inference.implicit import gram_pinv
from dpsql.inference.union_kron import home
from dpsql.strategies import residual
from dpsql.strategies.kronecker import one_dimensional
from dpsql.workload.blocks import KronBlock, UnionWorkload, helmert

#: stop cycling when a round lowers a group's error by less than this fraction
TOL = 1e-4
MAX_ROUNDS = 8


def general_columns(union: UnionWorkload) -> tuple:
    """Columns some block reads through a row summing several, not all, of its parts."""
    out = []
    for i, n in enumerate(union.sizes):
        for b in union.blocks:
            F = b.factors[i]
            nnz = (F != 0).sum(axis=1)
            if (F.shape[0] > 1 and np.any(nnz > 1)) or (F.shape[0] == 1 and 1 < nnz[0] < n):
                out.append(i)
                break
    return tuple(out)


@dataclass
class Group:
    """The blocks using general columns ``gamma``, and their strategy."""

    gamma: tuple                      # general columns (sorted)
    blocks: tuple                     # indices into the union's blocks
    A: dict = field(default_factory=dict)       # general column -> A_i
    pinv: dict = field(default_factory=dict)    # general column -> (A_iᵀA_i)⁺
    rest: tuple = ()                  # the other columns (sorted)
    a: dict = field(default_factory=dict)       # L2: residual weights (sets of rest columns)
    cliques: tuple = ()               # L1: maximal cliques of rest columns measured
    error: float = math.nan           # E_g at unit sensitivity (σ = 1, or b = 1 / 2)
    parts: dict = field(default_factory=dict)   # L1: clique -> its blocks' error
    scale: float = 1.0                # c_g (L2)


@dataclass
class UnionKron:
    """The plan: groups, their weights, and the total error at unit sensitivity."""

    union: UnionWorkload
    norm: str
    groups: tuple
    total: float
    shares: dict                      # L1: (group index, clique) -> u_j


def _trace(V: np.ndarray, G: np.ndarray) -> float:
    return float(np.sum(V * G))


def _rest_union(union: UnionWorkload, group: Group, e: np.ndarray) -> UnionWorkload:
    """The group's blocks on its other columns, weighted by their general factors' error."""
    rest = group.rest
    blocks = [KronBlock(tuple(union.blocks[k].factors[i] for i in rest),
                        union.blocks[k].weight * float(e[j]))
              for j, k in enumerate(group.blocks)]
    return UnionWorkload(tuple(union.columns[i] for i in rest),
                         tuple(union.sizes[i] for i in rest), tuple(blocks))


def _rest_errors_l2(sub: UnionWorkload, a: dict) -> np.ndarray:
    """Each block's total variance under residual weights ``a``, per unit block weight."""
    from dpsql.inference.implicit import residual_block_stderr

    return np.array([float(np.sum(residual_block_stderr(sub.sizes, a, b) ** 2)) / b.weight
                     for b in sub.blocks])


def _rest_errors_l1(sub: UnionWorkload, cliques: tuple) -> np.ndarray:
    """Each block's total variance (per unit block weight, b = 1, halved) when its clique's
    marginal is measured directly: Σ rows² · Π_{C∖B} n."""
    out = []
    for b in sub.blocks:
        C = home(cliques, b.used, sub.sizes)
        total = float(math.prod(sub.sizes[i] for i in C if i not in b.used))
        for i in b.used:
            total *= float(np.square(b.factors[i]).sum())
        out.append(total)
    return np.array(out)


def _maximal(sets) -> tuple:
    sets = set(sets)
    return tuple(sorted((s for s in sets if not any(set(s) < set(t) for t in sets)),
                        key=lambda s: (-len(s), s)))


def _general_errors(union, group: Group) -> np.ndarray:
    """``E[j, t] = tr(V_{k,i} (A_iᵀA_i)⁺)`` for block j of the group, general column t."""
    return np.array([[_trace(union.blocks[k].factors[i].T @ union.blocks[k].factors[i],
                             group.pinv[i]) for i in group.gamma] for k in group.blocks])


def _set_factor(group: Group, i: int, A: np.ndarray) -> None:
    group.A[i] = A
    group.pinv[i] = gram_pinv(A)


def _rest_plan(union, group: Group, e: np.ndarray, norm: str) -> np.ndarray:
    """Fit the other columns' strategy for general errors ``e``; each block's rest error."""
    sub = _rest_union(union, group, e)
    if norm == "l2":
        plan = residual.blocks_plan(sub)
        group.a = plan.a
        return _rest_errors_l2(sub, plan.a)
    group.cliques = _maximal(b.used for b in sub.blocks)
    return _rest_errors_l1(sub, group.cliques)


def _fit_group(union: UnionWorkload, group: Group, norm: str) -> None:
    """Cycle between the other columns' plan and each general factor (module docstring)."""
    w = np.array([union.blocks[k].weight for k in group.blocks])
    grams = {i: [union.blocks[k].factors[i].T @ union.blocks[k].factors[i]
                 for k in group.blocks] for i in group.gamma}
    for i in group.gamma:
        _set_factor(group, i, one_dimensional(sum(wk * V for wk, V in zip(w, grams[i])), norm))
    E = _general_errors(union, group)
    r = _rest_plan(union, group, np.prod(E, axis=1), norm)
    total = float(w @ (np.prod(E, axis=1) * r))
    for _ in range(MAX_ROUNDS):
        before = total
        for t, i in enumerate(group.gamma):
            others = w * r * np.prod(np.delete(E, t, axis=1), axis=1)
            A = one_dimensional(sum(c * V for c, V in zip(others, grams[i])), norm)
            G = gram_pinv(A)
            column = np.array([_trace(V, G) for V in grams[i]])
            if float(others @ column) < total * (1 - 1e-12):
                group.A[i], group.pinv[i], E[:, t] = A, G, column
                total = float(others @ column)
        if group.gamma and norm == "l2":
            r = _rest_plan(union, group, np.prod(E, axis=1), norm)
            total = min(total, float(w @ (np.prod(E, axis=1) * r)))
        if before - total <= TOL * total:
            break
    group.error = float(w @ (np.prod(E, axis=1) * r))
    if norm == "l1":
        sub_sizes = tuple(union.sizes[i] for i in group.rest)
        group.parts = {}
        for j, k in enumerate(group.blocks):
            used = tuple(group.rest.index(i) for i in union.blocks[k].used if i in group.rest)
            C = home(group.cliques, used, sub_sizes)
            group.parts[C] = group.parts.get(C, 0.0) + float(w[j] * np.prod(E[j]) * r[j])


def plan(union: UnionWorkload, norm: str = "l2") -> UnionKron:
    """The union-of-Kronecker plan (module docstring); StrategyError when it cannot serve."""
    if norm not in ("l2", "l1"):
        raise StrategyError(f"norm must be 'l2' or 'l1', got {norm!r}")
    general = set(general_columns(union))
    if not general:
        raise StrategyError("no block has ranges or IN lists inside: the residual plan serves")
    by_gamma: dict = {}
    for k, b in enumerate(union.blocks):
        by_gamma.setdefault(tuple(i for i in b.used if i in general), []).append(k)
    groups = []
    for gamma, blocks in sorted(by_gamma.items()):
        g = Group(gamma, tuple(blocks),
                  rest=tuple(i for i in range(len(union.sizes)) if i not in general))
        _fit_group(union, g, norm)
        groups.append(g)
    if norm == "l2":
        roots = np.sqrt([g.error for g in groups])
        for g, root in zip(groups, roots):
            g.scale = math.sqrt(root / roots.sum())
        return UnionKron(union, norm, tuple(groups), float(roots.sum() ** 2), {})
    errors = {(j, C): e for j, g in enumerate(groups) for C, e in g.parts.items()}
    cubes = {key: e ** (1.0 / 3.0) for key, e in errors.items()}
    total = sum(cubes.values())
    shares = {key: c / total for key, c in cubes.items()}
    return UnionKron(union, norm, tuple(groups), float(total ** 3), shares)


def measurements(p: UnionKron) -> list:
    """The plan as the kernel releases it: ``(group index, rest set, MarginalMeasurement)``,
    in release order."""
    from dpsql.workload import marginals

    sizes = p.union.sizes
    out = []
    for j, g in enumerate(p.groups):
        rest_sizes = tuple(sizes[i] for i in g.rest)
        N_rest = math.prod(rest_sizes)
        if p.norm == "l2":
            sets = [(A, p_a) for A, p_a in g.a.items()
                    if p_a > 0 and residual.multiplicity(rest_sizes, A) > 0]
        else:
            sets = [(C, p.shares[(j, C)]) for C in g.cliques]
        for A, weight in sets:
            cols = tuple(sorted(g.gamma + tuple(g.rest[t] for t in A)))
            factors = tuple(g.A[i] if i in g.gamma else
                            (helmert(sizes[i]) if p.norm == "l2" else np.eye(sizes[i]))
                            for i in cols)
            if p.norm == "l2":
                outside = N_rest // math.prod(rest_sizes[t] for t in A)
                scale = g.scale * math.sqrt(weight / outside)
            else:
                scale = weight
            out.append((j, A, marginals.MarginalMeasurement(cols, factors, scale)))
    return out

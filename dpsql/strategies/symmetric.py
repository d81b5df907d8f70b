"""The lower bound of GROUP BY workloads that do not return ``other``/NULL, without the product.

NOTES, "Cells a GROUP BY does not return". A column with ``k`` returned (declared) parts and
``e`` excluded ones (``other``, NULL; the last ``e`` parts) splits ``R^(k+e)`` into

- ``U = span{1_k/√k, e_c for each excluded c}`` (dimension ``1 + e``) and
- its complement ``C`` (vectors on the declared parts orthogonal to ``1_k``, dimension ``k − 1``).

Every column factor of a marginal-type workload is invariant under permuting the declared
parts, so its Gram acts on ``C`` as a scalar and on ``U`` as a small matrix:

- grouped ``[I_k | 0]``: ``diag(1, 0, …, 0)`` on U, 1 on C;
- identity (all ``k + e`` parts returned): ``I`` on U, 1 on C;
- a row of ones (column not used): ``v vᵀ`` on U with ``v = (√k, 1, …, 1)``, 0 on C.

Hence ``V = Σ_k w_k ⊗_i V_{k,i}`` is block diagonal: for each set S of columns taking the C
part, one block ``Σ_k w_k Π_{i∈S} c_{k,i} ⊗_{i∉S} U_{k,i}`` of size ``Π_{i∉S} (1 + e_i)``,
repeated ``Π_{i∈S} (k_i − 1)`` times. Only S inside some block's used columns (the closure)
can be nonzero. The singular value bound (Li & Miklau; :mod:`dpsql.strategies.bounds`)
``svdb = (Σ √λ)² / N`` then needs the eigenvalues of these small blocks only. With no
excluded parts (``e_i = 0``) this is the residual basis and the bound is
:func:`dpsql.strategies.residual.svdb_marginals`. Public inputs only.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy import optimize

from dpsql.errors import StrategyError
from dpsql.strategies.residual import closure
from dpsql.workload.blocks import UnionWorkload

#: largest invariant block (rows) whose eigenvalues are computed
MAX_BLOCK = 4096


def _kind(F: np.ndarray, n: int) -> tuple[str, int]:
    """('ones' | 'grouped', returned parts) for a marginal-type factor, else refuse."""
    if F.shape == (1, n) and np.all(F == 1.0):
        return "ones", 0
    r = F.shape[0]
    if F.shape[1] == n and r <= n and np.array_equal(F[:, :r], np.eye(r)) and not np.any(F[:, r:]):
        return "grouped", r
    raise StrategyError("the invariant-block bound needs GROUP BY factors (identity or [I | 0]) "
                        "or unused columns; this batch has a predicate factor")


def column_parts(union: UnionWorkload) -> tuple:
    """Per column: (returned parts k_i, the factor kind of every block on that column)."""
    out = []
    for i, n in enumerate(union.sizes):
        kinds = [_kind(b.factors[i], n) for b in union.blocks]
        partial = {r for kind, r in kinds if kind == "grouped" and r < n}
        if len(partial) > 1:
            raise StrategyError(f"column {union.columns[i]!r} is grouped with different "
                                "returned parts in different blocks; split the batch")
        out.append((partial.pop() if partial else n, kinds))
    return tuple(out)


def _u_factor(kind: str, r: int, k: int, n: int) -> tuple[np.ndarray, float]:
    """(the factor's Gram on U, its scalar on C) for a column with k returned of n parts."""
    e = n - k
    if kind == "ones":
        v = np.concatenate([[math.sqrt(k)], np.ones(e)])
        return np.outer(v, v), 0.0
    if r == n:                                    # identity on every part
        return np.eye(1 + e), 1.0
    return np.diag(np.concatenate([[1.0], np.zeros(e)])), 1.0


def invariant_blocks(union: UnionWorkload):
    """Yield ``(S, multiplicity, block)``: the Gram restricted to the invariant subspaces."""
    parts = column_parts(union)
    factors = [[_u_factor(kind, r, parts[i][0], n) for kind, r in parts[i][1]]
               for i, n in enumerate(union.sizes)]
    d = len(union.sizes)
    for S in closure([b.used for b in union.blocks]):
        size = math.prod(1 + union.sizes[i] - parts[i][0] for i in range(d) if i not in S)
        if size > MAX_BLOCK:
            raise StrategyError(f"an invariant block has {size} rows (at most {MAX_BLOCK}); "
                                "too many columns with excluded parts for this bound")
        mult = math.prod(parts[i][0] - 1 for i in S)
        if mult == 0:
            continue
        block = np.zeros((size, size))
        for k, b in enumerate(union.blocks):
            scalar = b.weight * math.prod(factors[i][k][1] for i in S)
            if scalar == 0:
                continue
            M = np.ones((1, 1))
            for i in range(d):
                if i not in S:
                    M = np.kron(M, factors[i][k][0])
            block += scalar * M
        yield S, mult, block


def restricted_svdb(union: UnionWorkload) -> float:
    """``(Σ √λ(V))² / N`` from the invariant blocks (never the full product)."""
    total = 0.0
    for _, mult, block in invariant_blocks(union):
        lam = np.clip(np.linalg.eigvalsh((block + block.T) / 2), 0.0, None)
        total += mult * float(np.sqrt(lam).sum())
    return total ** 2 / union.N


# --- the optimum's dual on the invariant blocks ---------------------------------------------
#
# The COA dual (NOTES "COA"; dpsql.strategies.gaussian.optimal) is concave, and the workload is
# invariant, so some optimal dual weight is constant on the cells of one *pattern* (per column:
# declared, or which excluded part). With D = diag(w) invariant, its S-block is
# diag(w_{p(q, S)}) (p(q, S): declared on S, q elsewhere), so h(w) = Σ_S mult_S tr(K_S^½) with
# K_S = F_Sᵀ D_S F_S (V_S = F_S F_Sᵀ), and the diagonal of X(w) = F K^-½ Fᵀ / h at a cell of
# pattern p is Σ_{S ⊆ declared(p)} Π_{i∈S} (k_i − 1)/k_i · Π_{declared(p)∖S} 1/k_i · X_S[q, q].


@dataclass(frozen=True)
class DualBound:
    """Certified bounds on the least total squared error (σ = 1 per unit of L2 sensitivity)."""

    lower: float          # no strategy does better (dual value h(w)² at the best w)
    upper: float          # the error of the feasible primal X(w) / max x at the best w
    evaluations: int


class _InvariantDual:
    def __init__(self, union: UnionWorkload):
        parts = column_parts(union)
        d = len(union.sizes)
        k = [p[0] for p in parts]
        e = [n - k[i] for i, n in enumerate(union.sizes)]
        self.patterns = list(itertools.product(*[range(1 + e[i]) for i in range(d)]))
        index = {p: j for j, p in enumerate(self.patterns)}
        self.count = np.array([math.prod(k[i] for i in range(d) if p[i] == 0)
                               for p in self.patterns], dtype=float)
        counted = [[kind == "ones" or r == union.sizes[i] for kind, r in parts[i][1]]
                   for i in range(d)]        # block b counts every part of column i
        self.support = np.flatnonzero([
            any(all(counted[i][b] or p[i] == 0 for i in range(d))
                for b in range(len(union.blocks))) for p in self.patterns])
        self.blocks, rows, cols, vals, offset = [], [], [], [], 0
        for S, mult, V in invariant_blocks(union):
            rest = [i for i in range(d) if i not in S]
            qs = {q: j for j, q in enumerate(itertools.product(*[range(1 + e[i]) for i in rest]))}
            pat = np.array([index[tuple(0 if i in S else q[rest.index(i)] for i in range(d))]
                            for q in qs])
            for j, p in enumerate(self.patterns):
                if all(p[i] == 0 for i in S):
                    rows.append(j)
                    cols.append(offset + qs[tuple(p[i] for i in rest)])
                    vals.append(math.prod((k[i] - 1) / k[i] for i in S)
                                * math.prod(1 / k[i] for i in rest if p[i] == 0))
            lam, U = np.linalg.eigh((V + V.T) / 2)
            keep = lam > 1e-12 * max(float(lam.max()), 1e-300)
            self.blocks.append((mult, U[:, keep] * np.sqrt(lam[keep]), pat))
            offset += len(qs)
        self.R = sp.csr_matrix((vals, (rows, cols)), shape=(len(self.patterns), offset))

    def evaluate(self, w: np.ndarray) -> tuple[float, float, np.ndarray]:
        """(Σ√μ⁺ unfloored: h² is a lower bound, h with floored roots, diag X(w) per pattern)."""
        low = h = 0.0
        diags = []
        for mult, F, pat in self.blocks:
            mu, P = np.linalg.eigh(F.T @ (F * w[pat][:, None]))
            top = max(float(mu.max(initial=0.0)), 1e-300)
            r = np.sqrt(np.maximum(mu, 1e-24 * top))
            low += mult * float(np.sqrt(np.maximum(mu, 0.0)).sum())
            h += mult * float(r.sum())
            g = F @ P
            diags.append(np.square(g) @ (1 / r))
        return low, h, self.R @ np.concatenate(diags) / h


def restricted_optimum(union: UnionWorkload, tol: float = 1e-6,
                       max_evaluations: int = 1000) -> DualBound:
    """Bounds on the optimum of a GROUP BY workload with excluded parts (see above).

    L-BFGS-B ascends the concave form ``Φ(w) = 2 h(w) − Σ_c w_c`` over the pattern weights
    (as :class:`dpsql.strategies.gaussian.dual.FactoredForm` does on cells), then the
    multiplicative fixed point ``w_p <- w_p x_p`` tightens the primal. Every evaluation's
    ``h²`` at normalised weights is a valid lower bound; the upper bound is feasible."""
    dual = _InvariantDual(union)
    sup, count = dual.support, dual.count
    full = np.zeros(count.size)

    def negative(v):
        full[sup] = v
        _, h, x = dual.evaluate(full)
        return float(count[sup] @ v - 2 * h), count[sup] * (1 - h * x[sup])

    v0 = 1.0 / (count[sup] * sup.size)
    full[sup] = v0
    h0 = dual.evaluate(full)[1]
    res = optimize.minimize(negative, v0 * h0 * h0, jac=True, method="L-BFGS-B",
                            bounds=[(0, None)] * sup.size,
                            options=dict(maxfun=max_evaluations, maxiter=max_evaluations,
                                         maxcor=20, ftol=0.0, gtol=1e-13))
    v = np.maximum(np.asarray(res.x, dtype=float), 0.0)
    v = v + 1e-6 * float(count[sup] @ v) / float(count[sup].sum())   # revive zero weights
    lower, upper, evaluations = 0.0, math.inf, int(res.nfev) + 1
    for _ in range(max_evaluations):
        v = v / float(count[sup] @ v)
        full[:] = 0.0
        full[sup] = v
        low, h, x = dual.evaluate(full)
        evaluations += 1
        lower, upper = max(lower, low * low), min(upper, h * h * float(x[sup].max()))
        if upper <= lower * (1 + tol):
            break
        v = v * np.maximum(x[sup], 1e-300)
    return DualBound(lower, upper, evaluations)


# --- blocks with ranges inside: the bound when they share their range factors -------------
#
# A column some block reads through a predicate (a range, an IN list, one part) is not
# permutation-invariant. When every block's factors on those columns have the same Grams up
# to a scalar (each block's ranges on age the same list, say), V = G ⊗ M with G = ⊗ G_i on
# those columns and M = Σ_k w_k c_k ⊗ (the other columns' Grams): the eigenvalues multiply,
# so Σ √λ(V) = Π_i tr √G_i · Σ √λ(M), and M is a GROUP BY workload of the invariant kind.


def predicate_columns(union: UnionWorkload) -> tuple:
    """Columns some block reads through a factor that is not GROUP BY or unused."""
    out = []
    for i, n in enumerate(union.sizes):
        try:
            for b in union.blocks:
                _kind(b.factors[i], n)
        except StrategyError:
            out.append(i)
    return tuple(out)


def split_for_bound(union: UnionWorkload):
    """``(predicate columns, their Grams G_i, the other columns' union M or None, Σ w_k c_k)``
    when V = (⊗ G_i) ⊗ M; StrategyError naming the problem otherwise."""
    general = predicate_columns(union)
    first = union.blocks[0]
    base = [first.factors[i].T @ first.factors[i] for i in general]
    scales = []
    for b in union.blocks:
        c = 1.0
        for i, G0 in zip(general, base):
            G = b.factors[i].T @ b.factors[i]
            t = float(np.sum(G * G0) / np.sum(G0 * G0))
            if not np.allclose(G, t * G0, rtol=1e-9, atol=1e-12 * float(np.abs(G0).max())):
                raise StrategyError(
                    f"no lower bound computed: the blocks read column {union.columns[i]!r} "
                    "through different conditions (the bound needs the same ranges or "
                    "values in every block that reads it)")
            c *= t
        scales.append(c * b.weight)
    rest = [i for i in range(len(union.sizes)) if i not in general]
    if not rest:
        return general, base, None, float(sum(scales))
    from dpsql.workload.blocks import KronBlock

    blocks = tuple(KronBlock(tuple(b.factors[i] for i in rest), s)
                   for b, s in zip(union.blocks, scales) if s > 0)
    sub = UnionWorkload(tuple(union.columns[i] for i in rest),
                        tuple(union.sizes[i] for i in rest), blocks)
    return general, base, sub, 1.0


def union_svdb(union: UnionWorkload) -> float:
    """svdb of a union whose blocks share their predicate columns' Grams (module note);
    :func:`restricted_svdb` when there are none. Never the full product."""
    general, grams, sub, total = split_for_bound(union)
    if not general:
        return restricted_svdb(union)
    value = restricted_svdb(sub) if sub is not None else total
    for i, G in zip(general, grams):
        lam = np.clip(np.linalg.eigvalsh((G + G.T) / 2), 0.0, None)
        value *= float(np.sqrt(lam).sum()) ** 2 / union.sizes[i]
    return value

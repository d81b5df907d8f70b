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

import math

import numpy as np

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

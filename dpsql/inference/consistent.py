"""The consistent subspace of region tables and the projection onto it (the algebra of
:mod:`dpsql.inference.pgm`, whose docstring derives it): per-column orthonormal bases
``Q_i = [1ᵀ/√n_i; H_i]`` applied in O(cells) by cumulative sums, and the closed-form
projection that shares each set S's coefficient among the regions holding S. Public inputs
only.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dpsql.workload.blocks import helmert


@functools.lru_cache(maxsize=256)
def _basis(n: int) -> np.ndarray:
    """``Q = [1ᵀ/√n; H]``: an orthogonal ``n x n`` matrix (rows). Read-only (cached)."""
    Q = np.vstack([np.full((1, n), 1.0 / math.sqrt(n)), helmert(n)])
    Q.setflags(write=False)
    return Q


@functools.lru_cache(maxsize=256)
def _helmert_weights(n: int) -> tuple:
    """``(k, 1/√(k(k+1)))`` for k = 1..n-1, and ``1/√n`` (read-only; cached)."""
    k = np.arange(1, n, dtype=float)
    scale = 1.0 / np.sqrt(k * (k + 1.0))
    k.setflags(write=False)
    scale.setflags(write=False)
    return k, scale, 1.0 / math.sqrt(n)


def _shaped(v: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    return v.reshape((1,) * axis + (-1,) + (1,) * (ndim - axis - 1))


def _along(axis: int, ndim: int, part) -> tuple:
    return (slice(None),) * axis + (part,) + (slice(None),) * (ndim - axis - 1)


def _forward(T: np.ndarray, axis: int) -> np.ndarray:
    """``T ×_axis Q`` in O(cells) by cumulative sums: row 0 is ``Σx/√n``, row k of the
    Helmert part is ``(Σ_{j<k} x_j − k x_k)/√(k(k+1))`` (:func:`_basis`)."""
    n, d = T.shape[axis], T.ndim
    if n == 1:
        return T.copy()
    k, scale, root = _helmert_weights(n)
    cs = np.cumsum(T, axis=axis)
    out = np.empty_like(T)
    out[_along(axis, d, slice(0, 1))] = cs[_along(axis, d, slice(n - 1, n))] * root
    out[_along(axis, d, slice(1, None))] = (
        cs[_along(axis, d, slice(0, n - 1))] - _shaped(k, d, axis)
        * T[_along(axis, d, slice(1, None))]) * _shaped(scale, d, axis)
    return out


def _inverse(C: np.ndarray, axis: int) -> np.ndarray:
    """``C ×_axis Qᵀ`` in O(cells): ``x_j = c_0/√n − j d_j + Σ_{k>j} d_k``,
    ``d_k = c_k/√(k(k+1))``."""
    n, d = C.shape[axis], C.ndim
    if n == 1:
        return C.copy()
    k, scale, root = _helmert_weights(n)
    dk = C[_along(axis, d, slice(1, None))] * _shaped(scale, d, axis)
    tail = np.flip(np.cumsum(np.flip(dk, axis=axis), axis=axis), axis=axis)  # Σ_{k>j}
    out = np.empty_like(C)
    out[...] = C[_along(axis, d, slice(0, 1))] * root
    out[_along(axis, d, slice(0, n - 1))] += tail
    out[_along(axis, d, slice(1, None))] -= dk * _shaped(k, d, axis)
    return out


def _transform(T: np.ndarray, R: tuple, sizes, inverse: bool = False) -> np.ndarray:
    """``(⊗_{i∈R} Q_i) T`` (or its transpose) on the region's table."""
    for axis in range(len(R)):
        T = _inverse(T, axis) if inverse else _forward(T, axis)
    return T


class Subspace:
    """The consistent subspace V of the regions' tables, and the projection onto it in the
    metric ``Σ_R w_R ‖μ_R‖²`` (``weights``: R -> w_R > 0; the module docstring's formula
    with ``w_R`` in both sums)."""

    def __init__(self, regions: tuple, sizes: tuple, weights: dict | None = None):
        self.sizes, self.parts = sizes, {}
        total: dict = {}
        for R in regions:
            w = 1.0 if weights is None else float(weights[R])
            parts = []
            for mask in range(1 << len(R)):
                S = tuple(R[j] for j in range(len(R)) if mask >> j & 1)
                p = math.prod(sizes[i] for i in R if i not in S)
                where = tuple(slice(1, None) if i in S else slice(0, 1) for i in R)
                parts.append((S, where, w / math.sqrt(p), 1.0 / math.sqrt(p)))
                total[S] = total.get(S, 0.0) + w / p
            self.parts[R] = parts
        self.inverse_total = {S: 1.0 / t for S, t in total.items()}

    def project(self, x: dict) -> dict:
        coords = {R: _transform(T, R, self.sizes) for R, T in x.items()}
        shared: dict = {}
        for R, T in coords.items():
            for S, where, gather, _ in self.parts[R]:
                part = T[where].reshape(tuple(self.sizes[i] - 1 for i in S)) * gather
                shared[S] = part + shared[S] if S in shared else part
        out = {}
        for R, T in coords.items():
            new = np.empty_like(T)
            for S, where, _, spread in self.parts[R]:
                new[where] = (shared[S] * (self.inverse_total[S] * spread)).reshape(
                    new[where].shape)
            out[R] = _transform(new, R, self.sizes, inverse=True)
        return out


def project(x: dict, sizes, weights: dict | None = None) -> dict:
    """The projection of the region tables ``x`` onto the consistent subspace V (Euclidean,
    or in the metric ``Σ_R w_R ‖μ_R‖²``)."""
    sizes = tuple(int(n) for n in sizes)
    return Subspace(tuple(x), sizes, weights).project(x)

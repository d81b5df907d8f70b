"""Candidate groups of MWEM's selection step, stored flat so tens of thousands of candidates
stay fast (used by :mod:`dpsql.mechanisms.mwem.core` and by the kernel's oracle). Public structure only."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import scipy.sparse as sp


class CandidateGroups(Sequence):
    """Candidate groups of one block: group ``g`` is rows ``starts[g]:stops[g]`` of ``W``.

    Behaves as the ``Sequence[csr_matrix]`` the oracle protocol asks for; an oracle facing
    tens of thousands of single-row candidates should use the vectorised helpers instead:
    ``row_index`` / ``offsets`` (the candidate rows stacked, group ``g`` at
    ``offsets[g]:offsets[g+1]``), :meth:`stacked`, :meth:`sensitivity` and :meth:`scores`.
    """

    def __init__(self, W: sp.csr_matrix, starts: np.ndarray, stops: np.ndarray,
                 group_sensitivity: np.ndarray | None = None):
        self.W = W
        self.starts = np.asarray(starts, dtype=np.int64)
        self.stops = np.asarray(stops, dtype=np.int64)
        lengths = self.stops - self.starts
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        total = int(self.offsets[-1])
        self.row_index = (np.repeat(self.starts - self.offsets[:-1], lengths)
                          + np.arange(total, dtype=np.int64))
        self._stacked = None
        self._group_sensitivity = group_sensitivity

    def __len__(self) -> int:
        return int(self.starts.size)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.W[int(self.starts[i]):int(self.stops[i])]

    def stacked(self) -> sp.csr_matrix:
        """All candidate rows, group after group (``W[row_index]``)."""
        if self._stacked is None:
            self._stacked = self.W[self.row_index]
        return self._stacked

    def group_sensitivity(self) -> np.ndarray:
        """Each group's largest column L1 norm."""
        if self._group_sensitivity is None:
            self._group_sensitivity = group_sensitivities(self.W, self.starts, self.stops)
        return self._group_sensitivity

    def sensitivity(self) -> float:
        """Max over groups of the group's largest column L1 norm (the EM score sensitivity)."""
        sens = self.group_sensitivity()
        return float(sens.max()) if sens.size else 0.0

    def scores(self, estimates: GroupValues, answers: np.ndarray,
               penalties: np.ndarray) -> np.ndarray:
        """``Σ_r |estimate − answer| − penalty`` per group; ``answers`` = true answers of
        :meth:`stacked`'s rows (computed by the kernel, e.g. ``(W @ x)[row_index]``)."""
        values = estimates.values if isinstance(estimates, GroupValues) \
            else np.concatenate([np.asarray(e, dtype=float).reshape(-1) for e in estimates])
        diff = np.abs(values - np.asarray(answers, dtype=float).reshape(-1))
        return np.add.reduceat(diff, self.offsets[:-1]) - np.asarray(penalties, dtype=float)


def group_sensitivities(W: sp.csr_matrix, starts, stops) -> np.ndarray:
    """Largest column L1 norm of each row group ``W[start:stop]`` (vectorised)."""
    starts = np.asarray(starts, dtype=np.int64)
    stops = np.asarray(stops, dtype=np.int64)
    W = sp.csr_matrix(W)
    if starts.size == 0:
        return np.zeros(0)
    if np.all(stops - starts == 1):
        row_max = np.zeros(W.shape[0])
        nonempty = np.diff(W.indptr) > 0
        if W.nnz:
            row_max[nonempty] = np.maximum.reduceat(np.abs(W.data),
                                                    W.indptr[:-1][nonempty])
        return row_max[starts]
    lengths = stops - starts
    row_index = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) \
        + np.arange(int(lengths.sum()))
    group_of_row = np.repeat(np.arange(starts.size), lengths)
    G = sp.csr_matrix((np.ones(row_index.size), (group_of_row, row_index)),
                      shape=(starts.size, W.shape[0]))
    sums = sp.csr_matrix(G @ abs(W))
    return np.asarray(sums.max(axis=1).todense(), dtype=float).reshape(-1)


class GroupValues(Sequence):
    """Per-group vectors stored flat: group ``g`` is ``values[offsets[g]:offsets[g+1]]``."""

    def __init__(self, values: np.ndarray, offsets: np.ndarray):
        self.values = np.asarray(values, dtype=float)
        self.values.setflags(write=False)
        self.offsets = offsets

    def __len__(self) -> int:
        return int(self.offsets.size - 1)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        g = range(len(self))[i]
        return self.values[self.offsets[g]:self.offsets[g + 1]]


# ---------------------------------------------------------------------------------------
# The implicit candidate set of every range over one ordered column


def interval_index(n: int, lo: int, hi: int) -> int:
    """Row of the range ``[lo, hi]`` (cells, inclusive) among all ranges over ``n`` cells,
    ordered by ``lo`` then ``hi``: ``lo·n − lo(lo−1)/2 + (hi − lo)``."""
    return int(lo) * int(n) - int(lo) * (int(lo) - 1) // 2 + (int(hi) - int(lo))


def interval_answers(prefix: np.ndarray) -> np.ndarray:
    """Every range's answer from prefix sums ``P`` (``n + 1`` values, ``P[0] = 0``): row
    :func:`interval_index` ``(n, lo, hi)`` is ``P[hi + 1] − P[lo]``."""
    P = np.asarray(prefix, dtype=float).reshape(-1)
    n = P.size - 1
    out = np.empty(n * (n + 1) // 2)
    r = 0
    for lo in range(n):
        out[r:r + n - lo] = P[lo + 1:] - P[lo]
        r += n - lo
    return out


class AllIntervals:
    """Candidates of an implicit range block: every range ``[lo, hi]`` over ``n`` cells
    except ``excluded`` (a set of ``(lo, hi)``; the ranges measured so far). Public.

    A range is a pair of distinct *positions* ``0 <= k < l <= n`` of the prefix sums
    (``[lo, hi] = [k, l − 1]``). With the estimates' prefix sums ``E`` and the data's ``P``
    (kernel side) the score of the range is ``|D[l] − D[k]|``, ``D = E − P``: sensitivity
    1 (one row moves ``P[j]`` by 1 for every ``j`` past its cell, so a range's count by at
    most 1).

    :meth:`sample` draws from the exponential mechanism over these ``n(n+1)/2`` ranges
    without listing them, in ``O(n log n + |excluded| n)``, by two calls of an exponential-
    mechanism sampler at the same ``ε`` and sensitivity 1 whose product is exactly the one
    draw (probabilities ∝ ``exp(ε·score/2)``):

    1. a position ``l`` with probability ∝ ``w_l = Σ_{k allowed with l} exp(c|D_l − D_k|)``,
       ``c = ε/2`` — i.e. scores ``g_l = ln(w_l)/c``. For positions no excluded range
       touches, ``w_l`` comes from one sort of ``D`` (below ``l``: ``e^{c D_l} Σ e^{−c D_k}``,
       above: ``e^{−c D_l} Σ e^{c D_k}``, both cumulative log-sum-exps); positions of an
       excluded range get their sum directly, without the excluded partners;
    2. a partner ``k`` of ``l`` with probability ∝ ``exp(c|D_l − D_k|)``: scores
       ``|D_l − D_k|`` over ``l``'s allowed partners.

    ``P(l, k) = exp(c|D_l − D_k|) / Σ_l w_l``; each range is drawn as ``(l, k)`` or
    ``(k, l)``, so ``P({k, l}) = 2 exp(c·score) / Σ_l w_l = exp(c·score) / Σ_ranges
    exp(c·score)``: the exponential mechanism with budget ``ε`` (exact, up to floating-point
    rounding of the scores, as for any scored selection).
    """

    def __init__(self, n: int, excluded=()):
        self.n = int(n)
        self.excluded = set(excluded)

    def __len__(self) -> int:
        return self.n * (self.n + 1) // 2 - len(self.excluded)

    def allowed(self, lo: int, hi: int) -> bool:
        return 0 <= lo <= hi < self.n and (lo, hi) not in self.excluded

    def _partners(self) -> dict:
        out: dict = {}
        for lo, hi in self.excluded:
            out.setdefault(lo, set()).add(hi + 1)
            out.setdefault(hi + 1, set()).add(lo)
        return out

    def sample(self, estimates: np.ndarray, answers: np.ndarray, epsilon,
               exponential) -> tuple[int, int]:
        """One exponential-mechanism draw ``(lo, hi)``; ``estimates`` and ``answers`` are
        prefix sums (``n + 1`` values); ``exponential(scores, epsilon, sensitivity=1.0)``
        is the oracle's sampler (index ∝ ``exp(epsilon·score/2)``)."""
        D = np.asarray(estimates, dtype=float).reshape(-1) - \
            np.asarray(answers, dtype=float).reshape(-1)
        if D.size != self.n + 1 or len(self) <= 0:
            raise ValueError("AllIntervals.sample needs n + 1 prefix sums and a candidate")
        c = float(epsilon) / 2.0
        order = np.argsort(D, kind="stable")
        a = c * D[order]
        below = np.concatenate([[-np.inf], np.logaddexp.accumulate(-a)[:-1]])
        above = np.concatenate([np.logaddexp.accumulate(a[::-1])[::-1][1:], [-np.inf]])
        logw = np.empty(D.size)
        logw[order] = np.logaddexp(a + below, -a + above)
        partners = self._partners()
        for l, ks in partners.items():
            mask = np.ones(D.size, dtype=bool)
            mask[l] = False
            mask[list(ks)] = False
            logw[l] = (np.logaddexp.reduce(c * np.abs(D[l] - D[mask])) if mask.any()
                       else -np.inf)
        positions = np.flatnonzero(np.isfinite(logw))
        l = int(positions[exponential(logw[positions] / c, epsilon, sensitivity=1.0)])
        mask = np.ones(D.size, dtype=bool)
        mask[l] = False
        mask[list(partners.get(l, ()))] = False
        others = np.flatnonzero(mask)
        k = int(others[exponential(np.abs(D[l] - D[others]), epsilon, sensitivity=1.0)])
        return min(k, l), max(k, l) - 1

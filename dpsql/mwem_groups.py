"""Candidate groups of MWEM's selection step, stored flat so tens of thousands of candidates
stay fast (used by :mod:`dpsql.mwem` and by the kernel's oracle). Public structure only."""

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

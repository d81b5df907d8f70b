"""MWEM's per-block state: the multiplicative-weights distribution and its measurements.

Used by :mod:`dpsql.mechanisms.mwem.core` (see its docstring for the algorithm). Public only: the state is
built from the blocks (public structure) and updated from released measurements; it never
sees the data vector.

Two kinds of block state share the weight machinery of :class:`WeightState`:

- :class:`BlockState`: an explicit block (:class:`~dpsql.mechanisms.mwem.options.Block`, rows ``W``);
- :class:`RangeState`: the implicit block of *every* range query over one ordered column
  (:class:`~dpsql.mechanisms.mwem.options.RangeBlock`): ``n(n+1)/2`` queries that are never stored.
  Estimates are prefix sums of ``A``; the selection step goes to the oracle's
  ``select_interval`` with the candidate set :class:`~dpsql.mechanisms.mwem.groups.AllIntervals`.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import scipy.sparse as sp

from dpsql.mechanisms.mwem.groups import AllIntervals, CandidateGroups, GroupValues, group_sensitivities
from dpsql.mechanisms.mwem.groups import interval_answers, interval_index
from dpsql.mechanisms.mwem.options import Block, RangeBlock

#: rescale the cached weights when the largest log weight drifts this far from the shift
_RESCALE = 200.0


class Measured:
    """A released measurement of some rows, prepared for O(nnz) MW updates."""

    def __init__(self, rows: sp.csr_matrix, noisy: np.ndarray):
        self.noisy = noisy
        self.single = rows.shape[0] == 1
        self.values = rows.data
        self.row_of_nz = np.repeat(np.arange(rows.shape[0]), np.diff(rows.indptr))
        # the distinct cells touched, and where each nonzero lands among them
        self.cells, self.slot = np.unique(rows.indices, return_inverse=True)
        self.cells = self.cells.astype(np.intp)
        self.indices = rows.indices.astype(np.intp)
        self.k = rows.shape[0]
        #: one row of ones on a box of cells (a range, or a rectangle in C order: equal
        #: runs at a constant stride): one scalar step on a strided view, no gathers
        self.box = _box(rows) if self.single else None
        self.views = None       # the box's views of its state's w and logw (set on use)
        if self.single and self.indices.size and \
                self.indices[-1] - self.indices[0] + 1 == self.indices.size:
            # a contiguous run of cells: slices, not gathers
            self.indices = slice(int(self.indices[0]), int(self.indices[-1]) + 1)


def _box(rows: sp.csr_matrix):
    """``(start, runs, length, stride)`` when the single row is 1 on ``runs`` runs of
    ``length`` cells, ``stride`` apart (a range: one run); else None."""
    idx = rows.indices
    if idx.size == 0 or not np.all(rows.data == 1):
        return None
    breaks = np.flatnonzero(np.diff(idx) != 1)
    starts = idx[np.concatenate([[0], breaks + 1])]
    ends = idx[np.concatenate([breaks, [idx.size - 1]])] + 1
    length = int(ends[0] - starts[0])
    if not np.all(ends - starts == length):
        return None
    if starts.size == 1:
        return int(starts[0]), 1, length, length
    stride = int(starts[1] - starts[0])
    if stride < length or not np.all(np.diff(starts) == stride):
        return None                     # also refuses unsorted or repeated cells
    return int(starts[0]), int(starts.size), length, stride


def _view(a: np.ndarray, box) -> np.ndarray:
    """The cells of ``box`` as a (writable) view of ``a``."""
    start, runs, length, stride = box
    if runs == 1:
        return a[start:start + length]
    return np.lib.stride_tricks.as_strided(a[start:], shape=(runs, length),
                                           strides=(stride * a.itemsize, a.itemsize))


class WeightState:
    """One block's MW distribution over ``n`` cells and its measurement history.

    The state is the vector of log weights ``logw`` (exact MW in log space: an update adds
    ``q (m − q·A)/(2N)``; nothing ever overflows or is lost to underflow there). For speed
    we also cache ``w = exp(logw − shift)`` and ``S = Σ w``, so ``p = w / S`` and one
    update touches only the measured rows' nonzeros; ``S`` is recomputed exactly after
    every round and every replay pass, and ``shift`` is reset whenever a log weight may
    have drifted more than ``_RESCALE`` above it (``top`` bounds that drift from above) or
    ``S`` leaves a safe range. ``logw`` and ``w`` are rewritten in place, never replaced,
    so a measurement's views of its cells stay valid.
    """

    def __init__(self, n: int):
        self.n = int(n)
        self.history: list[Measured] = []
        self.sum_p = np.zeros(self.n)
        self.rounds = 0
        self.logw = np.zeros(self.n)
        self.w = np.ones(self.n)
        self.renormalise()

    def set_log_weights(self, logw: np.ndarray) -> None:
        self.logw[:] = np.asarray(logw, dtype=float).reshape(-1)
        self.renormalise()

    def renormalise(self) -> None:
        self.shift = float(self.logw.max())
        np.subtract(self.logw, self.shift, out=self.w)
        np.exp(self.w, out=self.w)
        self.S = float(self.w.sum())
        self.top = 0.0          # upper bound on max(logw) − shift

    @property
    def p(self) -> np.ndarray:
        return self.w / self.S

    def update(self, meas: Measured, total: float) -> None:
        """One MW step: log w += Rᵀ (m − R A) / (2N), A = N w / S, touching R's cells only."""
        rate = 2.0 * max(total, 1.0)
        scale = total / self.S
        if meas.box is not None:
            # a range or a rectangle: one scalar step on views (w *= e^s; no exp per cell)
            if meas.views is None:
                meas.views = (_view(self.w, meas.box), _view(self.logw, meas.box))
            w, logw = meas.views
            old_sum = float(w.sum())
            s = (float(meas.noisy[0]) - scale * old_sum) / rate
            logw += s
            self.top += max(s, 0.0)
            if self.top > _RESCALE:
                self.renormalise()
                return
            w *= math.exp(s)
            self.S += old_sum * math.expm1(s)
            if not 1e-100 < self.S < 1e100:
                self.renormalise()
            return
        if meas.single:
            cells = meas.indices
            old = self.w[cells]
            est = scale * float(meas.values @ old)
            step = meas.values * ((float(meas.noisy[0]) - est) / rate)
        else:
            cells = meas.cells
            old = self.w[cells]
            est = scale * np.bincount(meas.row_of_nz, weights=meas.values * old[meas.slot],
                                      minlength=meas.k)
            delta = (meas.noisy - est) / rate
            step = np.bincount(meas.slot, weights=meas.values * delta[meas.row_of_nz],
                               minlength=cells.size)
        logw = self.logw[cells]
        logw += step
        self.logw[cells] = logw
        drift = float(logw.max(initial=-math.inf)) - self.shift
        if drift > _RESCALE:
            self.renormalise()
            return
        self.top = max(self.top, drift)
        old_sum = float(old.sum())      # before the write: `old` may be a view (a slice)
        new = np.exp(logw - self.shift)
        self.w[cells] = new
        self.S += float(new.sum()) - old_sum
        if not 1e-100 < self.S < 1e100:
            self.renormalise()


class BlockState(WeightState):
    """An explicit block: rows ``W``, candidates = single rows or whole output groups."""

    def __init__(self, block: Block, cuboids: bool):
        self.W = block.W
        m = block.n_queries
        if cuboids and block.groups:
            covered = np.zeros(m, dtype=bool)
            for start, stop in block.groups:
                covered[start:stop] = True
            single = np.flatnonzero(~covered)
            starts = np.concatenate([[s for s, _ in block.groups], single])
            stops = np.concatenate([[e for _, e in block.groups], single + 1])
        else:
            starts = np.arange(m)
            stops = starts + 1
        self.starts = starts.astype(np.int64)
        self.stops = stops.astype(np.int64)
        self.penalties = ((self.stops - self.starts).astype(float) if cuboids
                          else np.zeros(self.starts.size))
        self.sensitivity = group_sensitivities(self.W, self.starts, self.stops)
        self.measured = np.zeros(self.starts.size, dtype=bool)
        self.intervals = interval_rows(self.W)
        self.shape = block.shape or (block.n_cells,)
        super().__init__(block.n_cells)

    def estimates(self, total: float) -> np.ndarray:
        """``W @ A``: by prefix sums when every row is a 0/1 interval of cells (ranges)."""
        if self.intervals is not None:
            lo, hi = self.intervals
            c = np.concatenate([[0.0], np.cumsum(self.p)])
            return total * (c[hi] - c[lo])
        return total * (self.W @ self.p)

    def candidates(self) -> tuple[np.ndarray, CandidateGroups]:
        if self.measured.all():
            self.measured[:] = False
        ids = np.flatnonzero(~self.measured)
        return ids, CandidateGroups(self.W, self.starts[ids], self.stops[ids],
                                    self.sensitivity[ids])

    def select(self, spender, g: int, epsilon, total: float):
        """Select a candidate (spends ``epsilon``); ``(start, stop, rows, estimates)``."""
        ids, cands = self.candidates()
        est_all = self.estimates(total)
        estimates = GroupValues(est_all[cands.row_index], cands.offsets)
        k = spender.select(g, cands, estimates, self.penalties[ids], epsilon)
        self.measured[ids[k]] = True
        start, stop = int(cands.starts[k]), int(cands.stops[k])
        return start, stop, self.W[start:stop], est_all[start:stop]

    def answers(self, A: np.ndarray) -> np.ndarray:
        return np.asarray(self.W @ A, dtype=float).reshape(-1)


class RangeState(WeightState):
    """The implicit block of every range ``[lo, hi]`` over ``n`` ordered cells.

    Query ``r`` is :func:`~dpsql.mechanisms.mwem.groups.interval_index` ``(n, lo, hi)`` (by ``lo``,
    then ``hi``). Each round hands the oracle the estimates as prefix sums of ``A``
    (``n + 1`` numbers: the estimate of ``[lo, hi]`` is ``P[hi + 1] − P[lo]``) and the
    intervals measured so far (not offered again until every interval has been measured).
    """

    def __init__(self, block: RangeBlock):
        self.measured: set = set()
        self.n_queries = block.n_queries
        self.penalties = np.zeros(0)
        self.shape = (block.n_cells,)
        super().__init__(block.n_cells)

    def prefix(self, total: float) -> np.ndarray:
        return total * np.concatenate([[0.0], np.cumsum(self.p)])

    def select(self, spender, g: int, epsilon, total: float):
        if len(self.measured) >= self.n_queries:
            self.measured.clear()
        prefix = self.prefix(total)
        lo, hi = spender.select_interval(g, AllIntervals(self.n, self.measured), prefix,
                                         epsilon)
        self.measured.add((lo, hi))
        r = interval_index(self.n, lo, hi)
        rows = sp.csr_matrix((np.ones(hi - lo + 1), np.arange(lo, hi + 1),
                              [0, hi - lo + 1]), shape=(1, self.n))
        return r, r + 1, rows, np.array([prefix[hi + 1] - prefix[lo]])

    def answers(self, A: np.ndarray) -> np.ndarray:
        return interval_answers(np.concatenate([[0.0], np.cumsum(A)]))


def interval_rows(W: sp.csr_matrix):
    """``(lo, hi)`` with row r = 1 on cells ``lo[r]:hi[r]`` and 0 elsewhere, else None."""
    nnz = np.diff(W.indptr)
    if W.nnz == 0 or not np.all(W.data == 1):
        return None
    lo = np.zeros(W.shape[0], dtype=np.int64)
    hi = np.zeros(W.shape[0], dtype=np.int64)
    rows = nnz > 0
    lo[rows] = W.indices[W.indptr[:-1][rows]]
    hi[rows] = W.indices[W.indptr[1:][rows] - 1] + 1
    if not np.array_equal(hi - lo, nnz):
        return None
    return lo, hi


#: the most pieces a box's partition may have (3^k for k axes: up to 4 axes); above, the
#: box is measured alone (each piece is a separate update in every replay pass)
MAX_PIECES = 81


def box_partition(rows: sp.csr_matrix, shape) -> sp.csr_matrix | None:
    """The partition of the cell grid that a box query induces, the box first; else None.

    ``rows`` is one 0/1 row over the cells of ``shape`` (C order). When its cells form a
    box ``Π_j [lo_j, hi_j]``, each axis splits into below / inside / above the box, and the
    products of the nonempty segments are disjoint boxes covering every cell: at most
    ``3^k`` rows, the first being the query itself. Every cell lies in exactly one piece, so
    the pieces' L1 sensitivity is 1, the same as the query alone's. Otherwise (not a box,
    not 0/1, or a shape whose ``3^k`` exceeds :data:`MAX_PIECES`) None.
    """
    if rows.shape[0] != 1 or rows.nnz == 0 or not np.all(rows.data == 1):
        return None
    shape = tuple(int(d) for d in shape)
    if 3 ** len(shape) > MAX_PIECES:
        return None
    coords = np.unravel_index(rows.indices, shape)
    lo = [int(c.min()) for c in coords]
    hi = [int(c.max()) + 1 for c in coords]
    if rows.nnz != math.prod(h - l for l, h in zip(lo, hi)):
        return None
    segments = [[(a, b) for a, b in ((lo_j, hi_j), (0, lo_j), (hi_j, n_j)) if b > a]
                for lo_j, hi_j, n_j in zip(lo, hi, shape)]
    grid = np.arange(math.prod(shape)).reshape(shape)
    pieces = []
    for combo in itertools.product(*segments):
        cells = grid[tuple(slice(a, b) for a, b in combo)].reshape(-1)
        pieces.append(cells)
    indptr = np.concatenate([[0], np.cumsum([c.size for c in pieces])])
    return sp.csr_matrix((np.ones(int(indptr[-1])), np.concatenate(pieces), indptr),
                         shape=(len(pieces), rows.shape[1]))


def make_state(block, cuboids: bool) -> WeightState:
    return RangeState(block) if isinstance(block, RangeBlock) else BlockState(block, cuboids)

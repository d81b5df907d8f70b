"""Past (and new) measurements combined by generalised least squares, over the common
refinement of their partitions (public inputs only).

Cells differ between releases (each batch is compiled onto the parts its predicates need, see
:mod:`dpsql.sql.compile`), but all are unions of the units of the table's declared domains.
Over the *common refinement* of the releases' partitions (per column: the units grouped by the
tuple of parts they fall in), release ``r``'s measurements are ``y_r = A_r P_r x + e_r`` with
``P_r`` the 0/1 matrix summing refined cells into ``r``'s cells, and independent noise of
known variance ``v_r`` (Gaussian σ², Laplace 2b²). The generalised least-squares estimate
(Aitken 1935; the matrix mechanism's inference, Li & Miklau, *Eigen-Design* §2, with
weights) is ``x̂ = F⁺ b`` with ``F = Σ_r M_rᵀ V_r⁻¹ M_r``, ``b = Σ_r M_rᵀ V_r⁻¹ y_r``,
``M_r = A_r P_r``. A query ``w`` is answerable (estimable) iff ``w`` lies in the range of
``F``; then ``w x̂`` is unbiased with variance ``w F⁺ wᵀ``, the smallest of any linear
unbiased estimate from these measurements (Gauss–Markov).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp

from dpsql import cancel
from dpsql.mechanisms.reuse.records import Record
from dpsql.store.results import Z95
from dpsql.workload import limits as planning

#: the largest common refinement (cells) over which past releases are combined
MAX_REFINED_CELLS = 4_000_000
#: the most measurements (old and new) combined at once (an m x m eigendecomposition)
MAX_MEASUREMENTS = 2048
#: the reuse analysis may take at most this fraction of the planning memory limit: beyond
#: it the batch is planned afresh (as with no past releases; explain says why), so the
#: analysis stays a small part of selection whatever the past releases are
MAX_SHARE = 1 / 8


def predicted_bytes(n_refined: int, n_columns: int, n_terms: int, m: int) -> int:
    """Memory of the analysis: per term an aggregation over the refined cells (its index
    grid, one int64 per column, and a CSR matrix: ~8·(columns + 4) bytes per cell), plus
    the whitened measurements' Gram and its eigendecomposition (3·m² doubles)."""
    return 8 * n_refined * (n_columns + 4) * (n_terms + 1) + 24 * m * m


def decomposition_seconds(sizes, entries) -> float:
    """Predicted seconds of :meth:`Pool._pseudo_inverse` for terms of ``sizes``
    measurements whose matrices ``A_i`` store ``entries`` values: the Gram's blocks (``A_i``
    times a dense block of ``m_j`` columns: ``2·entries_i·m_j`` flops), the
    eigendecomposition (about ``9·m³``) and ``G⁺`` from it (up to ``2·m³``), at the dense
    rate :data:`~dpsql.workload.limits.FLOPS`."""
    m = float(sum(sizes))
    blocks = sum(2.0 * entries[i] * sizes[j]
                 for i in range(len(sizes)) for j in range(i, len(sizes)))
    return (11.0 * m ** 3 + blocks) / planning.FLOPS


class Refinement:
    """The common refinement of several partitions of the table's columns.

    ``columns`` in table declaration order; per column, ``unit_to_cell`` maps each unit to its
    refined part. The refined cells are the C-order product of the columns' parts."""

    def __init__(self, policy, partition_sets):
        used = {c for parts in partition_sets for c, _ in parts}
        self.columns = [c for c in policy.column_names if c in used]
        self.parts = {}
        for c in self.columns:
            rows = [u for parts in partition_sets for col, u in parts if col == c]
            _, inverse = np.unique(np.stack(rows, axis=1), axis=0, return_inverse=True)
            self.parts[c] = np.asarray(inverse, dtype=np.int64).reshape(-1)
        self.shape = tuple(int(self.parts[c].max()) + 1 for c in self.columns)
        self.n = int(np.prod(self.shape, dtype=np.int64)) if self.columns else 1

    def aggregation(self, partitions) -> sp.csr_matrix:
        """``P``: refined cells -> the cells of ``partitions`` (a 0/1 matrix, one 1 per column)."""
        grid = np.unravel_index(np.arange(self.n), self.shape) if self.columns else ()
        pos = {c: i for i, c in enumerate(self.columns)}
        idx = np.zeros(self.n, dtype=np.int64)
        n_target = 1
        for c, u in partitions:
            k = int(u.max()) + 1
            # each refined part lies inside exactly one of this partition's parts
            ref_to_part = np.zeros(self.shape[pos[c]], dtype=np.int64)
            ref_to_part[self.parts[c]] = u
            idx = idx * k + ref_to_part[grid[pos[c]]]
            n_target *= k
        return sp.csr_matrix((np.ones(self.n), (idx, np.arange(self.n))),
                             shape=(n_target, self.n))


@dataclass(frozen=True)
class Analysis:
    """What a pool of measurements says about a batch's rows (public)."""

    estimable: np.ndarray      # per row of W
    variance: np.ndarray       # per row (inf where not estimable)


class Pool:
    """Past (and new) measurements combined by generalised least squares.

    Computed in *measurement space*, so the refinement may be large (marginals over a wide
    product of columns) while only the number of measurements ``m`` is bounded: with the
    stacked, whitened measurements ``M̃ = V^{-1/2} M`` (``m x N``, sparse) and
    ``G = M̃ M̃ᵀ``, the GLS estimate of a query ``w`` is ``c ỹ`` with ``c = w M̃ᵀ G⁺`` (as
    ``M̃⁺ = M̃ᵀ G⁺``), its variance ``‖c‖²``, and ``w`` is estimable iff it lies in the row
    space of ``M̃``: ``‖w‖² = w M̃ᵀ G⁺ M̃ wᵀ`` (the squared norm of its projection)."""

    def __init__(self, policy, workload, records: list[Record], room: float | None = None,
                 spare: int = MAX_MEASUREMENTS // 2):
        """Takes the newest records first while the refinement and the number of
        measurements stay within their limits; ``self.records`` are those used,
        ``self.skipped`` the ids of the others. ``room``: the bytes the analysis may take
        (default :data:`MAX_SHARE` of the planning memory limit) with ``spare`` more
        measurements to come (the new ones); ``self.need`` is its predicted memory."""
        self.policy = policy
        base = [tuple((p.column, np.asarray(p.unit_to_part)) for p in workload.partitions)]
        kept: list[Record] = []
        self.skipped: list[int] = []
        m = 0
        used = {p.column for p in workload.partitions}
        for rec in cancel.checked(reversed(records)):
            if used and rec.partitions and not used & {c for c, _ in rec.partitions}:
                continue      # on other columns only: it could inform the total at most
            trial = Refinement(policy, base + [r.partitions for r in kept] + [rec.partitions])
            fits = trial.n <= MAX_REFINED_CELLS and m + rec.A.shape[0] <= MAX_MEASUREMENTS
            if fits:
                kept.append(rec)
                m += rec.A.shape[0]
            else:
                self.skipped.append(rec.release_id)
        self.records = sorted(kept, key=lambda r: r.release_id)
        self.refinement = Refinement(policy, base + [r.partitions for r in self.records])
        self.too_costly = self._over_share(m + spare, room)
        if self.too_costly:
            self.records, self._terms = [], []
            return
        self.P_new = self.refinement.aggregation(base[0])
        # per term: its record and P (its cells <- refined cells); M = A P is never formed
        self._terms = [(r, self.refinement.aggregation(r.partitions)) for r in self.records]
        self._counts = np.asarray(self.P_new.sum(axis=1)).reshape(-1)   # refined per cell
        self._gram = None

    def _over_share(self, m: int, room: float | None = None) -> str:
        """Why the analysis is skipped (its predicted memory over ``room``, by default
        :data:`MAX_SHARE` of the planning limit), or ''."""
        need = self.need = predicted_bytes(self.refinement.n, len(self.refinement.columns),
                                           len(self.records), m)
        if room is None:
            room = planning.current().max_memory * MAX_SHARE
        if not self.records or need <= room:
            return ""
        return (f"skipped: combining {len(self.records)} past releases would need about "
                f"{planning.show_bytes(need)} ({self.refinement.n:,} refined cells), over "
                f"{MAX_SHARE:.3g} of the planning memory limit; the batch is planned afresh "
                "(the same answers, only none free)")

    @property
    def release_ids(self) -> tuple:
        """The past releases combined (a release kept as pieces counts once)."""
        return tuple(sorted({r.release_id for r in self.records}))

    def can_add(self, record: Record) -> bool:
        """Whether a new measurement over the batch's cells fits the limits."""
        m = sum(rec.A.shape[0] for rec, _ in self._terms) + record.A.shape[0]
        return m <= MAX_MEASUREMENTS

    def add(self, record: Record, own: bool = False) -> int:
        """A measurement over the batch's own cells (the new part, planned), or, ``own``,
        over its record's partitions (a piece over some of the batch's columns, which the
        refinement already refines); its term index."""
        P = self.refinement.aggregation(record.partitions) if own else self.P_new
        self._terms.append((record, P))
        self._gram = None
        return len(self._terms) - 1

    def trial(self, record: Record, W) -> Analysis:
        """:meth:`analyse` with ``record`` added as the new measurement, then taken out
        again (the accuracy-first search tries several noise scales)."""
        term = self.add(record)
        try:
            return self.analyse(W)
        finally:
            del self._terms[term]
            self._gram = None

    def set_y(self, term: int, y: np.ndarray) -> None:
        """The measured values of a planned term (the variances, hence the errors, are
        unchanged: they never depended on ``y``)."""
        from dataclasses import replace

        rec, P = self._terms[term]
        y = np.asarray(y, dtype=float).reshape(-1)
        if y.shape != rec.y.shape:
            raise ValueError("internal error: measured values do not match the plan")
        self._terms[term] = (replace(rec, y=y), P)

    def refined(self, W) -> sp.csr_matrix:
        """The batch's rows over the refined cells."""
        return sp.csr_matrix(sp.csr_matrix(W) @ self.P_new)

    def _whitened(self) -> sp.csr_matrix:
        """``M̃`` over the refined cells (formed only for constrained post-processing)."""
        return sp.vstack([sp.csr_matrix(rec.A @ P) / math.sqrt(rec.variance)
                          for rec, P in self._terms]).tocsr()

    def _through(self, P_left, j: int):
        """``P_left P_jᵀ A_jᵀ / √v_j``: rows of ``P_left``'s cells against term j's
        measurements, without expanding to the refined cells (``P_left P_jᵀ`` is the small
        overlap matrix of the two partitions)."""
        rec, P = self._terms[j]
        C = sp.csr_matrix(P_left @ P.T)
        out = C @ (rec.A.T if sp.issparse(rec.A) else np.asarray(rec.A).T)
        out = out.toarray() if sp.issparse(out) else np.asarray(out)
        return out / math.sqrt(rec.variance)

    def _decomposition(self):
        """``G⁺`` for ``G = M̃ M̃ᵀ`` (:meth:`_pseudo_inverse`), computed once per set of
        terms: in a killable worker (:func:`dpsql.cancel.run_cancellable`) when predicted to
        take long (:func:`decomposition_seconds`), so a cancel never waits for LAPACK."""
        if self._gram is None:
            sizes = [rec.A.shape[0] for rec, _ in self._terms]
            entries = [rec.A.nnz if sp.issparse(rec.A) else np.size(rec.A)
                       for rec, _ in self._terms]
            self._gram = cancel.run_cancellable(self._pseudo_inverse,
                                                seconds=decomposition_seconds(sizes, entries))
        return self._gram

    def _pseudo_inverse(self) -> np.ndarray:
        """``G⁺``, block by block: ``G_ij = A_i (P_i P_jᵀ) A_jᵀ / √(v_i v_j)`` (a symmetric
        eigendecomposition of the m x m ``G``)."""
        sizes = [rec.A.shape[0] for rec, _ in self._terms]
        G = np.zeros((sum(sizes), sum(sizes)))
        starts = np.concatenate([[0], np.cumsum(sizes)])
        for i, (rec_i, P_i) in enumerate(cancel.checked(self._terms)):
            for j in cancel.checked(range(i, len(self._terms))):
                block = rec_i.A @ self._through(P_i, j) / math.sqrt(rec_i.variance)
                block = np.asarray(block)
                G[starts[i]:starts[i + 1], starts[j]:starts[j + 1]] = block
                G[starts[j]:starts[j + 1], starts[i]:starts[i + 1]] = block.T
        try:
            lam, V = la.eigh(G, check_finite=False)
        except la.LinAlgError:
            # LAPACK's syevr (scipy's default driver) has been seen to fail ("Internal
            # Error") on a G with many eigenvalues at rounding level, under the one-thread
            # planning BLAS, where divide and conquer (syevd) succeeds on the same matrix
            lam, V = la.eigh(G, check_finite=False, driver="evd")
        tol = max(float(lam.max(initial=0.0)), 0.0) * G.shape[0] * 1e-12
        keep = lam > tol
        return (V[:, keep] / lam[keep]) @ V[:, keep].T

    def _weights(self, W) -> tuple[np.ndarray, np.ndarray]:
        """(``c`` per row, estimable per row)."""
        W = sp.csr_matrix(W)
        if not self._terms:
            q = W.shape[0]
            return np.zeros((q, 0)), np.zeros(q, bool)
        Gp = self._decomposition()
        # rows of W M̃ᵀ: W (P_new P_jᵀ) A_jᵀ / √v_j, term by term
        B = np.hstack([np.asarray(W @ self._through(self.P_new, j))
                       for j in range(len(self._terms))])
        C = B @ Gp
        norm2 = np.asarray(W.multiply(W) @ self._counts).reshape(-1)    # ‖w P_new‖²
        proj2 = np.einsum("ij,ij->i", C, B)
        ok = norm2 - proj2 <= 1e-8 * np.maximum(norm2, 1.0)
        return C, ok

    def analyse(self, W) -> Analysis:
        """Which rows of ``W`` (over the batch's cells) the pool answers, and their variances."""
        C, ok = self._weights(W)
        return Analysis(ok, np.where(ok, (C ** 2).sum(axis=1), np.inf))

    def coefficients(self, W) -> list[np.ndarray]:
        """Per term, each answer's weights on that term's ``y``."""
        C, _ = self._weights(W)
        out, start = [], 0
        for rec, _ in self._terms:
            stop = start + rec.A.shape[0]
            out.append(C[:, start:stop] / math.sqrt(rec.variance))
            start = stop
        return out

    def answers(self, W) -> np.ndarray:
        return sum((C @ rec.y for C, (rec, _) in zip(self.coefficients(W), self._terms)),
                   np.zeros(sp.csr_matrix(W).shape[0]))

    def halfwidths(self, W, variance: np.ndarray, level: float = 0.95) -> np.ndarray:
        """95% interval half-widths. Gaussian terms only: ``z·stderr``. Laplace terms only:
        the bound on a weighted Laplace sum (:func:`dpsql.inference.intervals.laplace_interval_halfwidth`).
        Both: by the union bound, ``z_{1−α/4}·s_G + h_L(1−α/2)``, each part missing with
        probability at most α/2."""
        from scipy.special import ndtri   # the normal quantile (norm.ppf), without the
                                          # 0.6 s CPU import of scipy.stats
        from dpsql.inference.intervals import laplace_interval_halfwidth

        lap = [i for i, (rec, _) in enumerate(self._terms) if rec.noise == "laplace"]
        if not lap:
            return Z95 * np.sqrt(variance)
        coef = self.coefficients(W)
        C = np.hstack([coef[i] * self._terms[i][0].scale for i in lap])
        gauss = [i for i in range(len(self._terms)) if i not in lap]
        if not gauss:
            return laplace_interval_halfwidth(C, 1.0, level)
        s_g = np.sqrt(sum(((coef[i] ** 2).sum(axis=1) * self._terms[i][0].variance
                           for i in gauss), np.zeros(C.shape[0])))
        alpha = 1.0 - level
        return (float(ndtri(1 - alpha / 4)) * s_g
                + laplace_interval_halfwidth(C, 1.0, 1 - alpha / 2))

    def stacked(self, W):
        """(whitened stacked matrix, whitened y, W over refined cells) for constrained
        post-processing (:func:`dpsql.inference.least_squares.consistent`)."""
        ys = [rec.y / math.sqrt(rec.variance) for rec, _ in self._terms]
        return self._whitened(), np.concatenate(ys), self.refined(W)

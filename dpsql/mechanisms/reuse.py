"""Free answers from past releases: generalised least squares over stored measurements.

Every matrix-mechanism release keeps what it published: its noisy measurements ``y``, its
strategy ``A`` over its cells, and the noise (family and scale). All of it is the output of a
release that was already charged, so using it again is post-processing (Dwork & Roth 2014,
Prop. 2.1): a later batch whose queries are linear combinations of what was measured is
answered from it at **no privacy cost**, and a batch that needs new measurements pays only
for those and combines old and new optimally.

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

Everything here reads public inputs only: stored releases (already public) and the compiled
batch. Which queries are free depends on what was released before, never on the data.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp

from dpsql.store.database import engine_errors
from dpsql.store.results import Z95, Explanation as _Explanation

#: the largest common refinement (cells) over which past releases are combined
MAX_REFINED_CELLS = 4_000_000
#: the most measurements (old and new) combined at once (an m x m eigendecomposition)
MAX_MEASUREMENTS = 2048
#: a release whose strategy has more non-zeros than this is not kept for reuse (32 MB)
MAX_STORED_NONZEROS = 4_000_000

@dataclass(frozen=True)
class Record:
    """One past release's measurements: ``y = A x_r + noise`` over its own cells ``x_r``."""

    release_id: int
    partitions: tuple          # ((column, unit_to_part ndarray), ...) in the release's cell order
    A: sp.csr_matrix           # measurements x release cells
    y: np.ndarray
    noise: str                 # gaussian | laplace
    scale: float               # σ (gaussian) or b (laplace)

    @property
    def variance(self) -> float:
        return self.scale ** 2 if self.noise == "gaussian" else 2.0 * self.scale ** 2


def domain_fingerprint(policy, epoch: str | None = None) -> str:
    """A hash of the table's declared domains and its data epoch: releases over other domains,
    or made before the owner last (re-)protected the table (e.g. after reloading its data),
    are not reused."""
    doc = json.dumps({"table": policy.table, "epoch": epoch,
                      "columns": [[c, d.describe()] for c, d in policy.columns]},
                     sort_keys=True, default=str)
    return hashlib.sha256(doc.encode()).hexdigest()


def _epoch(con, policy) -> str | None:
    """The table's data epoch (public: set by the owner's protect, never by the data)."""
    row = con.execute("SELECT data_epoch FROM dpsql.policies WHERE table_name = ?",
                      [policy.table]).fetchone()
    return None if row is None else row[0]


def record_of(release_id: int, workload, A, y, noise: str, scale: float,
              limit: bool = True) -> Record | None:
    """The record of a release just measured (``A`` None: the identity on its cells), or None
    when the strategy is too large to keep (``limit``) or its noise is not of a known kind."""
    n = workload.n_cells
    if noise not in ("gaussian", "laplace"):
        return None
    if A is None:
        M = sp.identity(n, format="csr")
    elif sp.issparse(A):
        M = sp.csr_matrix(A)
    else:
        if limit and np.count_nonzero(A) > MAX_STORED_NONZEROS:
            return None
        M = sp.csr_matrix(A)
    if limit and M.nnz > MAX_STORED_NONZEROS:
        return None
    parts = tuple((p.column, np.asarray(p.unit_to_part, dtype=np.int64))
                  for p in workload.partitions)
    return Record(int(release_id), parts, M, np.asarray(y, dtype=float).copy(), noise,
                  float(scale))


def store(con, policy, record: Record, private: bool) -> None:
    """Write a record (inside the caller's transaction: with the release's result tables)."""
    buf = io.BytesIO()
    sp.save_npz(buf, record.A, compressed=False)   # written by every release: kept fast
    parts = json.dumps([[c, u.tolist()] for c, u in record.partitions])
    with engine_errors("storing the release's measurements"):   # table: dpsql.store.schema
        con.execute("INSERT INTO dpsql.measurements VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [record.release_id, policy.table,
                     domain_fingerprint(policy, _epoch(con, policy)),
                     bool(private), parts, record.noise, record.scale, buf.getvalue(),
                     record.y.astype("<f8").tobytes()])


def load(con, policy, private: bool) -> list[Record]:
    """The released measurements of ``policy``'s table over the same declared domains, from
    releases of the same kind (private sampler or test sampler), oldest first. A row that does
    not decode consistently is skipped (it can only lose a free answer, never make one up)."""
    with engine_errors("reading stored measurements"):
        exists = con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'dpsql' "
            "AND table_name = 'measurements'").fetchone()[0]
        if not exists:
            return []
        rows = con.execute(
            "SELECT m.release_id, m.partitions, m.noise, m.scale, m.strategy, m.y "
            "FROM dpsql.measurements m JOIN dpsql.ledger l USING (release_id) "
            "WHERE m.table_name = ? AND m.domain_fingerprint = ? AND m.private = ? "
            "AND l.status = 'released' ORDER BY m.release_id",
            [policy.table, domain_fingerprint(policy, _epoch(con, policy)),
             bool(private)]).fetchall()
    out = []
    for rid, parts, noise, scale, blob, yb in rows:
        try:
            partitions = tuple((c, np.asarray(u, dtype=np.int64)) for c, u in json.loads(parts))
            A = sp.load_npz(io.BytesIO(bytes(blob))).tocsr()
            y = np.frombuffer(bytes(yb), dtype="<f8").astype(float)
            n = int(np.prod([int(u.max()) + 1 for _, u in partitions], dtype=np.int64))
            if (A.shape != (y.size, n) or noise not in ("gaussian", "laplace")
                    or not (math.isfinite(scale) and scale > 0)
                    or not np.all(np.isfinite(y)) or not np.all(np.isfinite(A.data))):
                continue
            for c, u in partitions:
                if u.ndim != 1 or u.min() < 0 or u.size != policy.column(c).n_units:
                    raise ValueError(c)
        except Exception:   # noqa: BLE001 — a damaged row is ignored, never trusted
            continue
        out.append(Record(int(rid), partitions, A, y, noise, float(scale)))
    return out


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

    def __init__(self, policy, workload, records: list[Record]):
        """Takes the newest records first while the refinement and the number of
        measurements stay within their limits; ``self.records`` are those used,
        ``self.skipped`` the ids of the others."""
        self.policy = policy
        base = [tuple((p.column, np.asarray(p.unit_to_part)) for p in workload.partitions)]
        kept: list[Record] = []
        self.skipped: list[int] = []
        m = 0
        used = {p.column for p in workload.partitions}
        for rec in reversed(records):
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
        self.P_new = self.refinement.aggregation(base[0])
        # per term: its record and P (its cells <- refined cells); M = A P is never formed
        self._terms = [(r, self.refinement.aggregation(r.partitions)) for r in self.records]
        self._counts = np.asarray(self.P_new.sum(axis=1)).reshape(-1)   # refined per cell
        self._gram = None

    @property
    def release_ids(self) -> tuple:
        return tuple(r.release_id for r in self.records)

    def can_add(self, record: Record) -> bool:
        """Whether a new measurement over the batch's cells fits the limits."""
        m = sum(rec.A.shape[0] for rec, _ in self._terms) + record.A.shape[0]
        return m <= MAX_MEASUREMENTS

    def add(self, record: Record) -> int:
        """A measurement over the batch's own cells (the new part, planned); its term index."""
        self._terms.append((record, self.P_new))
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
        """``G⁺`` for ``G = M̃ M̃ᵀ``, block by block: ``G_ij = A_i (P_i P_jᵀ) A_jᵀ / √(v_i v_j)``
        (a symmetric eigendecomposition of the m x m ``G``)."""
        if self._gram is None:
            sizes = [rec.A.shape[0] for rec, _ in self._terms]
            G = np.zeros((sum(sizes), sum(sizes)))
            starts = np.concatenate([[0], np.cumsum(sizes)])
            for i, (rec_i, P_i) in enumerate(self._terms):
                for j in range(i, len(self._terms)):
                    block = rec_i.A @ self._through(P_i, j) / math.sqrt(rec_i.variance)
                    block = np.asarray(block)
                    G[starts[i]:starts[i + 1], starts[j]:starts[j + 1]] = block
                    G[starts[j]:starts[j + 1], starts[i]:starts[i + 1]] = block.T
            lam, V = la.eigh(G, check_finite=False)
            tol = max(float(lam.max(initial=0.0)), 0.0) * G.shape[0] * 1e-12
            keep = lam > tol
            self._gram = (V[:, keep] / lam[keep]) @ V[:, keep].T
        return self._gram

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
        from scipy.stats import norm

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
        return (float(norm.ppf(1 - alpha / 4)) * s_g
                + laplace_interval_halfwidth(C, 1.0, 1 - alpha / 2))

    def stacked(self, W):
        """(whitened stacked matrix, whitened y, W over refined cells) for constrained
        post-processing (:func:`dpsql.inference.least_squares.consistent`)."""
        ys = [rec.y / math.sqrt(rec.variance) for rec, _ in self._terms]
        return self._whitened(), np.concatenate(ys), self.refined(W)


@dataclass
class Decision:
    """How a batch is answered: ``new`` is the selection for the rows measured now (None when
    every row is free); ``expl`` what the user is shown (combined errors)."""

    expl: object
    new: object
    epsilon: object              # what the new part costs (0 when every row is free)
    pool: Pool | None
    free: np.ndarray
    planned: int | None = None   # the pool term of the new measurement


def sub_workload(workload, rows: np.ndarray):
    """The batch restricted to ``rows`` (same cells); what the new part measures."""
    from dpsql.sql.compile import Workload

    return Workload(workload.table, workload.partitions,
                    sp.csr_matrix(workload.W)[np.flatnonzero(rows)], ())


def decide(con, policy, workload, records, eps, dlt, strategy, calibration,
           objective: str = "rmse", target: float | None = None) -> Decision:
    """Which rows are free, what the rest costs, and every answer's error (public inputs).

    A row is free when the past releases answer it *and* no less accurately than this
    request would: its GLS standard error is at most the one the full batch would get at this
    ε (or, for an accuracy-first request, at most the target). The other rows are selected
    for and measured as a batch of their own (at the requested ε, or the smallest ε meeting
    the target); every answer then combines old and new measurements."""
    from dataclasses import replace

    from dpsql.mechanisms import selection
    from dpsql.mechanisms import tight
    from dpsql.mechanisms.target import smallest_epsilon

    def fresh(wl):
        if target is None:
            return Fraction(eps), selection.select(con, policy, wl, eps, dlt, strategy,
                                                   calibration, objective)
        return smallest_epsilon(con, policy, wl, dlt, strategy, calibration, target,
                                objective)

    pool = Pool(policy, workload, records) if records else None
    if pool is None or not pool.records:
        cost, expl = fresh(workload)
        return Decision(expl, expl, cost, None, np.zeros(workload.n_queries, bool))
    old = pool.analyse(workload.W)
    se_old = np.sqrt(old.variance)
    full = None
    if target is None:
        cost, full = fresh(workload)
        free = old.estimable & (se_old <= full.stderr * (1 + 1e-9))
    else:
        free = old.estimable & (se_old <= target)
        if objective == "rmse" and old.estimable.all() and len(se_old) \
                and math.sqrt(float(np.mean(old.variance))) <= target:
            free[:] = True     # the RMSE target is the batch's: past releases meet it
    statements = tuple((o.query.index, o.start, o.stop) for o in workload.outputs)
    if free.all():
        rmse = float(np.sqrt(np.mean(old.variance))) if len(se_old) else 0.0
        expl = _Explanation(policy.table, 0.0, 0.0, "reuse", math.nan, rmse, se_old,
                            workload.n_queries, workload.n_cells, (), statements,
                            mechanism="reuse", free=tuple(range(len(se_old))),
                            reused_from=pool.release_ids)
        return Decision(expl, None, Fraction(0), pool, free)
    if free.any() or full is None:
        rest = sub_workload(workload, ~free)
        cost, new = fresh(rest)
        if target is not None:      # the smallest ε meeting the target *combined*
            cost, new = tight.combined_epsilon(
                pool, workload, new, cost, dlt, calibration, target, objective,
                lambda e: selection.select(con, policy, rest, e, dlt, strategy,
                                           calibration, objective),
                lambda c, scale: record_of(0, workload, c.plan.A,
                                           np.zeros(c.plan.n_measurements), c.mechanism,
                                           scale, limit=False))
    else:
        new = full
    best = next(c for c in new.candidates
                if c.strategy == new.strategy and c.mechanism == new.mechanism)
    m = best.plan.n_measurements
    rec = record_of(0, workload, best.plan.A, np.zeros(m), new.mechanism, new.sigma,
                    limit=False)
    if not pool.can_add(rec):
        # too many measurements to combine (e.g. identity on a very wide product): the batch
        # is measured afresh, as without reuse
        return decide(con, policy, workload, [], eps, dlt, strategy, calibration, objective,
                      target)
    planned = pool.add(rec)
    stderr = np.sqrt(pool.analyse(workload.W).variance)
    expl = replace(new, stderr=stderr, rmse=float(np.sqrt(np.mean(stderr ** 2))),
                   n_queries=workload.n_queries, statements=statements,
                   free=tuple(int(k) for k in np.flatnonzero(free)),
                   reused_from=pool.release_ids)
    return Decision(expl, new, cost, pool, free, planned)

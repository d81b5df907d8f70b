"""A past release's measurements as stored in ``dpsql.measurements``: the record, writing and
reading it, and the domain fingerprint that keeps releases over other declared domains (or
older data) from being combined.

A batch compiled to Kronecker blocks (issue 16) is measured through its cliques' marginals:
measurement ``k`` reads ``y_k = scale_k (⊗_{i∈C_k} F_{k,i}) m_{C_k} + noise`` on the marginal
``m_{C_k}`` of its columns ``C_k`` only (:mod:`dpsql.workload.marginals`). Its release is kept
as one record per measurement (:func:`marginal_records`): a :class:`Record` whose
``partitions`` are those of ``C_k`` alone, so that ``A = scale_k ⊗ F_{k,i}`` is over the
marginal's cells, never the full product. A record over fewer columns than a batch is a
measurement of the batch's marginal on them; the GLS pool (:mod:`~dpsql.mechanisms.reuse.pool`)
reads both kinds the same way. One row of ``dpsql.measurements`` holds a release: its
``pieces`` (columns and rows of each measurement; NULL for one over all its cells) and the
pieces' matrices block-diagonally. The pieces' noises are independent (the kernel draws every
entry of ``y`` independently at one scale), so they are independent measurements.

Only the output of releases already charged and released is kept or read (public).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dpsql.store.database import engine_errors

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


def marginal_records(release_id: int, workload, plan, y, noise: str,
                     scale: float) -> list[Record]:
    """One record per measurement of a :class:`~dpsql.workload.marginals.MarginalPlan`
    released on ``workload`` (its columns are indices into ``workload.partitions``), each over
    its own columns' cells. Measurements whose matrix has more than
    :data:`MAX_STORED_NONZEROS` non-zeros, or past that many in all, are not kept (later
    batches only lose the free answers they could have given)."""
    if noise not in ("gaussian", "laplace"):
        return []
    out, start, budget = [], 0, MAX_STORED_NONZEROS
    y = np.asarray(y, dtype=float).reshape(-1)
    for meas in plan.measurements:
        stop = start + meas.size
        nnz = math.prod(int(np.count_nonzero(F)) for F in meas.factors)
        if 0 < nnz <= budget:
            A = sp.csr_matrix(np.ones((1, 1)) * meas.scale)
            for F in meas.factors:
                A = sp.kron(A, sp.csr_matrix(F), format="csr")
            parts = tuple((workload.partitions[i].column,
                           np.asarray(workload.partitions[i].unit_to_part, dtype=np.int64))
                          for i in meas.columns)
            out.append(Record(int(release_id), parts, A, y[start:stop].copy(), noise,
                              float(scale)))
            budget -= nnz
        start = stop
    return out


def _pieces(records) -> tuple[str, list, sp.csr_matrix, np.ndarray, str | None]:
    """(partitions JSON, the release's records, A, y, pieces JSON) of what one row keeps: a
    record over all the release's cells as it is, or a release's pieces block-diagonally."""
    if isinstance(records, Record):
        parts = json.dumps([[c, u.tolist()] for c, u in records.partitions])
        return parts, [records], records.A, records.y, None
    columns: dict = {}
    for rec in records:
        for c, u in rec.partitions:
            columns.setdefault(c, u)
    parts = json.dumps([[c, u.tolist()] for c, u in columns.items()])
    pieces = json.dumps([[[c for c, _ in rec.partitions], int(rec.A.shape[0])]
                         for rec in records])
    A = sp.block_diag([rec.A for rec in records], format="csr")
    return parts, list(records), A, np.concatenate([rec.y for rec in records]), pieces


def store(con, policy, record, private: bool) -> None:
    """Write a release's record, or its pieces (a list of records over subsets of its
    columns, :func:`marginal_records`), as one row (inside the caller's transaction: with
    the release's result tables)."""
    parts, recs, A, y, pieces = _pieces(record)
    if not recs or len({(r.release_id, r.noise, r.scale) for r in recs}) != 1:
        return          # nothing kept, or not one release's: never stored
    buf = io.BytesIO()
    sp.save_npz(buf, A, compressed=False)   # written by every release: kept fast
    with engine_errors("storing the release's measurements"):   # table: dpsql.store.schema
        con.execute("INSERT INTO dpsql.measurements (release_id, table_name, "
                    "domain_fingerprint, private, partitions, noise, scale, strategy, y, "
                    "pieces) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [recs[0].release_id, policy.table,
                     domain_fingerprint(policy, _epoch(con, policy)),
                     bool(private), parts, recs[0].noise, recs[0].scale, buf.getvalue(),
                     y.astype("<f8").tobytes(), pieces])


#: the stored measurements read for one request may take at most this fraction of the
#: planning memory limit (newest releases first; older ones beyond it are not read, which can
#: only lose free answers)
MAX_LOADED_SHARE = 1 / 16


def load(con, policy, private: bool, releases: frozenset | None = None) -> list[Record]:
    """The released measurements of ``policy``'s table over the same declared domains, from
    releases of the same kind (private sampler or test sampler), oldest first (a release
    kept as pieces gives one record per piece); only those of ``releases`` when given (the
    server: the releases one analyst paid for). The newest are read first, within
    :data:`MAX_LOADED_SHARE` of ``max_memory`` (their stored sizes, read before the rows). A
    row that does not decode consistently is skipped (it can only lose a free answer, never
    make one up)."""
    from dpsql.workload import limits as planning

    where = ("FROM dpsql.measurements m JOIN dpsql.ledger l USING (release_id) "
             "WHERE m.table_name = ? AND m.domain_fingerprint = ? AND m.private = ? "
             "AND l.status = 'released'")
    with engine_errors("reading stored measurements"):
        exists = con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'dpsql' "
            "AND table_name = 'measurements'").fetchone()[0]
        if not exists:
            return []
        key = [policy.table, domain_fingerprint(policy, _epoch(con, policy)), bool(private)]
        sizes = con.execute("SELECT m.release_id, octet_length(m.strategy) + octet_length(m.y) "
                            f"{where} ORDER BY m.release_id DESC", key).fetchall()
        room, chosen = planning.current().max_memory * MAX_LOADED_SHARE, []
        for rid, size in sizes:
            if (releases is None or int(rid) in releases) and size <= room:
                chosen.append(rid)
                room -= size
        rows = [con.execute("SELECT m.release_id, m.partitions, m.noise, m.scale, "
                            f"m.strategy, m.y, m.pieces {where} AND m.release_id = ?",
                            key + [rid]).fetchone() for rid in sorted(chosen)]
    out = []
    for rid, parts, noise, scale, blob, yb, pieces in rows:
        try:
            out.extend(_decoded(policy, int(rid), parts, noise, scale, blob, yb, pieces))
        except Exception:   # noqa: BLE001 — a damaged row is ignored, never trusted
            continue
    return out


def _decoded(policy, rid: int, parts, noise, scale, blob, yb, pieces) -> list[Record]:
    """A stored row's records (one, or one per piece); raises on anything inconsistent."""
    partitions = tuple((c, np.asarray(u, dtype=np.int64)) for c, u in json.loads(parts))
    A = sp.load_npz(io.BytesIO(bytes(blob))).tocsr()
    y = np.frombuffer(bytes(yb), dtype="<f8").astype(float)
    if (noise not in ("gaussian", "laplace") or not (math.isfinite(scale) and scale > 0)
            or not np.all(np.isfinite(y)) or not np.all(np.isfinite(A.data))):
        raise ValueError("damaged")
    for c, u in partitions:
        if u.ndim != 1 or u.min() < 0 or u.size != policy.column(c).n_units:
            raise ValueError(c)
    layout = [([c for c, _ in partitions], y.size)] if pieces is None else json.loads(pieces)
    by_column = dict(partitions)
    shapes = [(int(rows), [(c, by_column[c]) for c in cols]) for cols, rows in layout]
    widths = [int(np.prod([int(u.max()) + 1 for _, u in p], dtype=np.int64))
              for _, p in shapes]
    if A.shape != (y.size, sum(widths)) or sum(r for r, _ in shapes) != y.size:
        raise ValueError("shape")
    out, r0, c0 = [], 0, 0
    for (rows, piece), width in zip(shapes, widths):
        out.append(Record(rid, tuple(piece), A[r0:r0 + rows, c0:c0 + width].tocsr(),
                          y[r0:r0 + rows].copy(), noise, float(scale)))
        r0, c0 = r0 + rows, c0 + width
    return out

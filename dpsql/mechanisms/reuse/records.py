"""A past release's measurements as stored in ``dpsql.measurements``: the record, writing and
reading it, and the domain fingerprint that keeps releases over other declared domains (or
older data) from being combined.

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


def load(con, policy, private: bool, releases: frozenset | None = None) -> list[Record]:
    """The released measurements of ``policy``'s table over the same declared domains, from
    releases of the same kind (private sampler or test sampler), oldest first; only those of
    ``releases`` when given (the server: the releases one analyst paid for). A row that does
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
        if releases is not None and int(rid) not in releases:
            continue
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

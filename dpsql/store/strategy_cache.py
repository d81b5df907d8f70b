"""A persistent cache of selected strategies, in the database's ``dpsql`` schema.

Selecting an optimised strategy (Eigen-Design, COA, ...) costs seconds to minutes for large
domains; the strategy depends only on public inputs, so it is stored and reused by later
requests for the same workload, giving the identical plan.

Key (:func:`fingerprint`): SHA-256 of the strategy's name and options, the privacy model
(Gaussian noise and L2 sensitivity, or Laplace noise and L1), the domain shape, and the
workload's Gram matrix ``V = WᵀW`` (every strategy here depends on the workload only through
``V``, in the canonical cell order the compiler produces), or its rows ``W`` for the
strategies that read them (``relative=True``). Plans of the cheap strategies that a request
chose are stored too, under :func:`rows_fingerprint` (the selection cache,
:mod:`dpsql.store.selection_cache`, names them). Value: the plan's matrix as int32 numerators of
its 2**-20 grid, dense (row-major), or sparse (CSR: ``indptr`` and ``indices`` as int64).

Table ``dpsql.strategy_cache`` is created and migrated by :mod:`dpsql.store.schema` (caches of
dense plans written before sparse plans gain the ``indptr`` and ``indices`` columns there).

Nothing here is trusted for privacy: on load the matrix is checked to be on the grid and
well formed, and its sensitivities are recomputed exactly (a modified cache can change
accuracy, never the guarantee).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import scipy.sparse as sp

from dpsql.store import schema
from dpsql.store.database import engine_errors
from dpsql.sql.compile import workload_hash
from dpsql.workload.matrix import (QUANTUM_BITS, Plan, WorkloadInfo, exact_l1_sensitivity,
                              exact_l2_sensitivity)

MODEL = "gaussian-l2"


def _model(family: str) -> str:
    return MODEL if family == "gaussian" else "laplace-l1"


def fingerprint(name: str, strategy, info: WorkloadInfo, family: str = "gaussian") -> str:
    """The cache key: strategy, privacy model (noise family), options, shape and ``V``
    (and the rows ``W`` for a strategy that reads them)."""
    h = hashlib.sha256()
    options = getattr(strategy, "options", None)
    h.update(json.dumps([name, _model(family), repr(options), list(info.shape), info.n,
                         info.m], sort_keys=True).encode())
    h.update(memoryview(np.ascontiguousarray(info.V, dtype=np.float64)).cast("B"))
    if getattr(strategy, "relative", False) and info.W is not None:
        h.update(b"rows:" + workload_hash(info.W).encode())
    return h.hexdigest()


def rows_fingerprint(name: str, strategy, w_hash: str, shape: tuple,
                     family: str = "gaussian") -> str:
    """The key of a cheap strategy's plan stored for the selection cache: the strategy,
    privacy model and options, the shape and the exact rows of ``W`` (:func:`workload_hash`)."""
    options = getattr(strategy, "options", None)
    text = json.dumps(["rows", name, _model(family), repr(options), list(shape), w_hash])
    return "w-" + hashlib.sha256(text.encode()).hexdigest()


def load(con, key: str) -> Plan | None:
    """The cached plan for ``key``, re-verified, or None (absent or malformed)."""
    found = load_entry(con, key)
    return None if found is None else found[0]


def load_entry(con, key: str) -> tuple[Plan, str] | None:
    """``(plan, digest)``: the cached plan for ``key``, re-verified, and :func:`digest` of
    its stored matrix; or None (absent or malformed)."""
    with engine_errors("reading the strategy cache"):
        schema.ensure(con)
        row = con.execute("SELECT strategy, n, rows, matrix, notes, indptr, indices "
                          "FROM dpsql.strategy_cache WHERE fingerprint = ?", [key]).fetchone()
    if row is None:
        return None
    try:
        plan = _decode(*row)
    except (ValueError, TypeError):
        plan = None
    if plan is None:
        return None  # not a matrix this cache wrote: select afresh
    return plan, _digest(row[2], row[3], row[5], row[6])


def _decode(name, n, rows, blob, notes, indptr, indices) -> Plan | None:
    n, rows = int(n), int(rows)
    if n < 1 or rows < 1 or len(blob) % 4:
        return None
    numerators = np.frombuffer(blob, dtype=np.int32)
    if numerators.size and (numerators.min() < -2 ** QUANTUM_BITS
                            or numerators.max() > 2 ** QUANTUM_BITS):
        return None
    values = numerators.astype(np.float64) / float(2 ** QUANTUM_BITS)
    if indptr is None:
        if numerators.size != rows * n:
            return None
        A = values.reshape(rows, n)
    else:
        if indices is None or len(indptr) % 8 or len(indices) % 8:
            return None
        ptr = np.frombuffer(indptr, dtype=np.int64)
        idx = np.frombuffer(indices, dtype=np.int64)
        if (ptr.size != rows + 1 or ptr[0] != 0 or np.any(np.diff(ptr) < 0)
                or ptr[-1] != idx.size or idx.size != values.size
                or (idx.size and (idx.min() < 0 or idx.max() >= n))):
            return None
        A = sp.csr_matrix((values, idx.copy(), ptr.copy()), shape=(rows, n))
        if not A.has_canonical_format:
            return None
    parsed = json.loads(notes)
    if not isinstance(parsed, list):
        return None
    return Plan(name, n, A, exact_l2_sensitivity(A), integral=True,
                l1_sensitivity=exact_l1_sensitivity(A),
                notes=tuple(tuple(x) if isinstance(x, list) else x for x in parsed))


def has(con, key: str) -> bool:
    """Whether an entry is stored under ``key`` (not verified)."""
    with engine_errors("reading the strategy cache"):
        schema.ensure(con)
        return con.execute("SELECT 1 FROM dpsql.strategy_cache WHERE fingerprint = ?",
                           [key]).fetchone() is not None


def _encode(plan: Plan):
    """``(rows, numerators, indptr, indices)`` as stored: int32 numerators of the 2**-20
    grid, row-major (dense) or with int64 CSR arrays (sparse, canonical form)."""
    q = float(2 ** QUANTUM_BITS)
    if sp.issparse(plan.A):
        A = sp.csr_matrix(plan.A)
        if not A.has_canonical_format:
            A = A.copy()
            A.sum_duplicates()
        return (A.shape[0], np.rint(A.data * q).astype(np.int32).tobytes(),
                A.indptr.astype(np.int64).tobytes(), A.indices.astype(np.int64).tobytes())
    A = np.asarray(plan.A)
    return A.shape[0], np.rint(A * q).astype(np.int32).tobytes(), None, None


def _digest(rows, matrix: bytes, indptr, indices) -> str:
    h = hashlib.sha256(f"{int(rows)}|".encode())
    for part in (matrix, indptr or b"", indices or b""):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def digest(plan: Plan) -> str | None:
    """SHA-256 of a plan's matrix in its stored encoding (None for the identity): names
    exactly the matrix, for what is derived from it (solver factors, interval widths)."""
    if plan.A is None:
        return None
    rows, matrix, indptr, indices = _encode(plan)
    return _digest(rows, matrix, indptr, indices)


def store(con, key: str, plan: Plan, seconds: float) -> str | None:
    """Remember a plan (the identity, ``A = None``, is free and not stored). Sparse plans
    are stored in CSR form, dense ones row-major. Returns the matrix's :func:`digest`."""
    if plan.A is None:
        return None
    rows, matrix, indptr, indices = _encode(plan)
    notes = json.dumps([list(x) if isinstance(x, tuple) else x for x in plan.notes],
                       default=float)
    with engine_errors("writing the strategy cache"):
        schema.ensure(con)
        schema.replace_row(con, "dpsql.strategy_cache", dict(
            fingerprint=key, strategy=plan.strategy, n=plan.n, rows=rows, matrix=matrix,
            notes=notes, seconds=float(seconds), indptr=indptr, indices=indices))
    return _digest(rows, matrix, indptr, indices)

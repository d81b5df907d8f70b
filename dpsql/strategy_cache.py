"""A persistent cache of selected strategies, in the database's ``dpsql`` schema.

Selecting an optimised strategy (Eigen-Design, COA, ...) costs seconds to minutes for large
domains; the strategy depends only on public inputs, so it is stored and reused by later
requests for the same workload, giving the identical plan.

Key: SHA-256 of the strategy's name and options, the privacy model (Gaussian noise, L2
sensitivity), the domain shape, and the workload's Gram matrix ``V = WᵀW`` (every strategy
here depends on the workload only through ``V``, in the canonical cell order the compiler
produces). Value: the plan's matrix as int32 numerators of its 2**-20 grid.

Nothing here is trusted for privacy: on load the matrix is checked to be on the grid and its
sensitivity is recomputed exactly (a modified cache can change accuracy, never the
guarantee).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from .engine import engine_errors
from .strategies.base import (QUANTUM_BITS, Plan, WorkloadInfo, exact_l1_sensitivity,
                              exact_l2_sensitivity)

SCHEMA_SQL = """CREATE TABLE IF NOT EXISTS dpsql.strategy_cache (
    fingerprint VARCHAR PRIMARY KEY,
    strategy VARCHAR NOT NULL,
    n BIGINT NOT NULL,
    rows BIGINT NOT NULL,
    matrix BLOB NOT NULL,
    notes VARCHAR NOT NULL,
    seconds DOUBLE NOT NULL,
    created_at TIMESTAMP NOT NULL DEFAULT current_timestamp)"""

MODEL = "gaussian-l2"


def fingerprint(name: str, strategy, info: WorkloadInfo, family: str = "gaussian") -> str:
    """The cache key: strategy, privacy model (noise family), options, shape and ``V``."""
    h = hashlib.sha256()
    options = getattr(strategy, "options", None)
    model = MODEL if family == "gaussian" else "laplace-l1"
    h.update(json.dumps([name, model, repr(options), list(info.shape), info.n, info.m],
                        sort_keys=True).encode())
    h.update(np.ascontiguousarray(info.V, dtype=np.float64).tobytes())
    return h.hexdigest()


def load(con, key: str) -> Plan | None:
    """The cached plan for ``key``, re-verified, or None."""
    with engine_errors("reading the strategy cache"):
        con.execute("CREATE SCHEMA IF NOT EXISTS dpsql")
        con.execute(SCHEMA_SQL)
        row = con.execute("SELECT strategy, n, rows, matrix, notes FROM dpsql.strategy_cache "
                          "WHERE fingerprint = ?", [key]).fetchone()
    if row is None:
        return None
    name, n, rows, blob, notes = row
    numerators = np.frombuffer(blob, dtype=np.int32)
    if numerators.size != rows * n or np.abs(numerators).max(initial=0) > 2 ** QUANTUM_BITS:
        return None  # not a matrix this cache wrote: select afresh
    A = numerators.reshape(rows, n).astype(np.float64) / float(2 ** QUANTUM_BITS)
    return Plan(name, int(n), A, exact_l2_sensitivity(A), integral=True,
                l1_sensitivity=exact_l1_sensitivity(A), notes=tuple(tuple(x) if isinstance(x, list) else x
                            for x in json.loads(notes)))


def store(con, key: str, plan: Plan, seconds: float) -> None:
    """Remember a dense plan (identity-like plans are cheap and not cached)."""
    if plan.A is None:
        return
    A = plan.A.toarray() if hasattr(plan.A, "toarray") else np.asarray(plan.A)
    numerators = np.rint(A * float(2 ** QUANTUM_BITS)).astype(np.int32)
    notes = json.dumps([list(x) if isinstance(x, tuple) else x for x in plan.notes],
                       default=float)
    with engine_errors("writing the strategy cache"):
        con.execute("CREATE SCHEMA IF NOT EXISTS dpsql")
        con.execute(SCHEMA_SQL)
        con.execute("INSERT OR REPLACE INTO dpsql.strategy_cache (fingerprint, strategy, n, "
                    "rows, matrix, notes, seconds) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [key, plan.strategy, plan.n, A.shape[0], numerators.tobytes(), notes,
                     float(seconds)])

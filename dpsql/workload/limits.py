"""Planning limits: each request's memory and time, predicted from its size before the work.

A batch's planning cost follows from its size alone (public: the policy and the query text):
``n`` cells, ``m`` queries (rows of ``W``), ``nnz`` non-zeros of ``W`` and, per candidate
strategy, the dense matrices it builds (``m·n·8`` bytes for a dense ``W``, ``n²·8`` for a
Gram matrix ``V = WᵀW`` or a Cholesky factor) and its flops (an eigendecomposition ~``n³``).
:func:`bound_cost` and :func:`candidate_cost` predict them; :mod:`dpsql.mechanisms.matrix`
skips a candidate (or the singular value bound) whose prediction exceeds the limits, and
refuses the batch (:class:`~dpsql.errors.BatchTooLarge`) only when no candidate fits.
:func:`compile_seconds` predicts the compile step's per-column work, which
:mod:`dpsql.sql.compile` checks and :mod:`dpsql.policy.policy` uses to refuse domains no
request could use (:func:`max_column_units`). ``benchmarks/limits.py`` compares the
predictions with measured peaks (``benchmarks/results/limits.txt``).

The limits are :class:`Limits` values; the current one is a context variable, set by
:func:`applied` (the DB-API connection's ``max_memory`` / ``time_limit``, declared in
:data:`dpsql.request.CONNECTION_SETTINGS`) and read by the planning code with
:func:`current`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from dpsql.errors import BatchTooLarge, PrivacyParameterError

GIB = 1024 ** 3


def _physical_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


#: default memory limit of one request's planning: 4 GiB, or half the machine's memory
DEFAULT_MAX_MEMORY = min(4 * GIB, (_physical_memory() or 8 * GIB) // 2)
#: default time limit of one request's planning, in seconds
DEFAULT_TIME_LIMIT = 60.0
#: flops per second of dense LAPACK/BLAS level-3 work (eigendecompositions, Cholesky,
#: triangular solves with many right-hand sides) on 2 shared cores (benchmarks/limits.py)
FLOPS = 3e10
#: seconds per entry of a dense m x n array a dense candidate builds and passes over
#: (densifying W, rounding and exact sensitivities of A, squaring the solved factors)
DENSE_SECONDS_PER_ENTRY = 1.5e-7
#: seconds per multiply-add of a sparse matrix product (scipy)
SPARSE_SECONDS_PER_OP = 2.2e-9
#: seconds per unit x part of the compile step's per-column grouping (numpy compares)
COMPILE_SECONDS_PER_PAIR = 1.5e-9


@dataclass(frozen=True)
class Limits:
    """The memory (bytes) and time (seconds) one request's planning may use."""

    max_memory: int = DEFAULT_MAX_MEMORY
    time_limit: float = DEFAULT_TIME_LIMIT

    def describe(self) -> str:
        return f"max_memory = {show_bytes(self.max_memory)}, time_limit = {self.time_limit:g} s"


_CURRENT: ContextVar[Limits] = ContextVar("dpsql_planning_limits", default=Limits())


def current() -> Limits:
    """The limits of the request being planned."""
    return _CURRENT.get()


@contextlib.contextmanager
def applied(max_memory=None, time_limit=None):
    """Plan with these limits inside the block (None keeps the current value)."""
    now = current()
    for name, value in (("max_memory", max_memory), ("time_limit", time_limit)):
        if value is not None and (isinstance(value, bool) or not value > 0):
            raise PrivacyParameterError(f"{name} must be a positive number, got {value!r}")
    token = _CURRENT.set(Limits(
        int(now.max_memory if max_memory is None else max_memory),
        float(now.time_limit if time_limit is None else time_limit)))
    try:
        yield current()
    finally:
        _CURRENT.reset(token)


def show_bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} bytes"


@dataclass(frozen=True)
class Cost:
    """A predicted peak of memory (bytes) and time (seconds)."""

    memory: float
    seconds: float

    def over(self, limits: Limits) -> str | None:
        """Which limit this cost exceeds, as words for a message (None when it fits)."""
        if self.memory > limits.max_memory:
            return (f"needs about {show_bytes(self.memory)}, over max_memory = "
                    f"{show_bytes(limits.max_memory)}")
        if self.seconds > limits.time_limit:
            return (f"needs about {self.seconds:.3g} s, over time_limit = "
                    f"{limits.time_limit:g} s")
        return None


def bound_cost(n: int, m: int, nnz: int, gram_ops: float = 0.0) -> Cost:
    """The singular value bound: eigenvalues of the smaller of ``W Wᵀ`` (m × m) and
    ``V = WᵀW`` (n × n), dense. The sparse product is formed first: copies of ``W``
    (``12·nnz`` bytes), ``gram_ops`` multiply-adds (``Σ nnz(row)²`` over the side summed;
    :func:`gram_ops`) and up to ``k²`` stored entries."""
    k = min(m, n)
    memory = 24.0 * k * k + 12.0 * nnz
    return Cost(memory, 0.01 + 4.0 * k ** 3 / FLOPS + SPARSE_SECONDS_PER_OP * gram_ops)


def gram_ops(W) -> float:
    """Multiply-adds of the sparse Gram product the bound forms: ``Σ nnz(row)²`` for
    ``WᵀW`` (m ≥ n), ``Σ nnz(column)²`` for ``W Wᵀ``."""
    m, n = W.shape
    counts = (np.diff(W.indptr) if m >= n else np.bincount(W.indices, minlength=n))
    return float(np.square(counts.astype(np.float64)).sum())


#: per strategy: (dense n x n matrices held at the peak, dense measurement rows per cell,
#: n³ flops multiplier (eigendecompositions, solves), m·n² multiplier (the error factors'
#: triangular solves and the strategy's own passes over W), fixed seconds (solver set-up))
_SHAPES = {
    "identity": (0, 0.0, 0.0, 0.0, 0.0),
    "workload": (3, 0.0, 1.0, 2.0, 0.0),
    "hierarchical": (3, 2.0, 1.0, 2.0, 0.0),
    "wavelet": (3, 1.0, 1.0, 2.0, 0.0),
    "fourier": (3, 1.0, 1.0, 2.0, 0.0),
    "eigen": (6, 1.0, 8.0, 6.0, 0.5),
    "eigen/laplace": (6, 1.0, 8.0, 8.0, 1.5),
    "optimal": (6, 1.0, 12.0, 4.0, 0.2),
    "coa": (6, 1.0, 30.0, 4.0, 0.5),
}


def candidate_cost(name: str, n: int, m: int, nnz: int, estimated_seconds: float = 0.0) -> Cost:
    """A candidate's plan and least-squares error factors: the strategy's dense matrices
    (``A`` p × n, Gram and Cholesky factor n × n), the dense ``W`` (m × n) solved against the
    factor and its result (``2·m·n·8`` bytes, ``m·n²`` flops). The identity needs only the
    row norms of the sparse ``W``. ``name``: the strategy, ``eigen/laplace`` for the L1
    Eigen-Design. ``estimated_seconds``: the strategy's own estimate, when it has one (used
    when larger)."""
    square, rows, cube, solves, fixed = _SHAPES.get(name, (6, 2.0, 12.0, 4.0, 0.5))
    if square == 0:
        return Cost(24.0 * nnz + 8.0 * (m + n), 2e-8 * nnz)
    workload_rows = m if name == "workload" else 0
    memory = 8.0 * (square * n * n + (rows * n + workload_rows) * n + 2.0 * m * n)
    seconds = (fixed + (cube * n ** 3 + solves * m * n * n + 2.0 * rows * n ** 3) / FLOPS
               + DENSE_SECONDS_PER_ENTRY * float(m) * n)
    return Cost(memory, max(seconds, float(estimated_seconds)))


def compile_seconds(units: int, parts: int) -> float:
    """The compile step's grouping of one column's units into parts (``units × parts``)."""
    return COMPILE_SECONDS_PER_PAIR * float(units) * float(parts)


def max_column_units(limits: Limits | None = None) -> int:
    """The most units a declared column may have: a GROUP BY over it alone (one part per
    unit) must compile within ``time_limit`` (:func:`compile_seconds`)."""
    limits = current() if limits is None else limits
    return int(math.sqrt(limits.time_limit / COMPILE_SECONDS_PER_PAIR))


def check_grouping(column: str, n_units: int, n_parts: int) -> None:
    """Compile groups a column's units into parts (``units × parts`` compares): refused,
    with the column named, when that cannot finish within the time limit."""
    seconds = compile_seconds(n_units, n_parts)
    limit = current()
    if seconds > limit.time_limit:
        raise BatchTooLarge(
            f"this batch is too large to compile within {limit.describe()}: column "
            f"{column!r} has {n_units:,} units in {n_parts:,} parts (about {seconds:.3g} s to "
            "group); nothing was charged; group by or condition on this column more coarsely, "
            "or split the batch")


def refuse_out_of_memory(build):
    """Decorate a compile step: a failed allocation (numpy's MemoryError) is the
    batch-too-large refusal, never an internal error (nothing has been charged yet)."""
    @functools.wraps(build)
    def guarded(*args, **kwargs):
        try:
            return build(*args, **kwargs)
        except MemoryError:
            raise BatchTooLarge(
                f"this batch is too large to compile within {current().describe()}: an "
                "allocation failed (out of memory); nothing was charged; split the batch "
                "(fewer statements, or statements over fewer columns, per batch)") from None
    return guarded

"""Planning limits: each request's memory and time, predicted from its size before the work.

A batch's planning cost follows from its size alone (public: the policy and the query text):
``n`` cells, ``m`` queries (rows of ``W``), ``nnz`` non-zeros of ``W`` and, per candidate
strategy, the dense matrices it builds (``m·n·8`` bytes for a dense ``W``, ``n²·8`` for a
Gram matrix ``V = WᵀW`` or a Cholesky factor) and its flops (an eigendecomposition ~``n³``).
:func:`bound_cost` and :func:`candidate_cost` predict them; :mod:`dpsql.mechanisms.selection`
skips a candidate (or the singular value bound) whose prediction exceeds the limits, and
refuses the batch (:class:`~dpsql.errors.BatchTooLarge`) only when no candidate fits.
:func:`compile_seconds` predicts the compile step's per-column work, which
:mod:`dpsql.sql.compile` checks and :mod:`dpsql.policy.policy` uses to refuse domains no
request could use (:func:`max_column_units`). ``benchmarks/limits.py`` compares the
predictions with measured peaks (``benchmarks/results/limits.txt``).

The limits are :class:`Limits` values; the current one is a context variable, set by
:func:`applied` (the DB-API connection's ``max_memory`` / ``time_limit``, declared in
:data:`dpsql.request.declared.CONNECTION_SETTINGS`) and read by the planning code with
:func:`current`.

numpy and :mod:`dpsql.workload.matrix` are imported inside the two functions that count
a matrix's products (:func:`gram_ops`, :func:`row_gram_ops`), not at the top: the defaults
and the limits' context are read by the settings' declaration
(:mod:`dpsql.request.declared`), from which ``dpsql --help`` builds its options without
loading numpy or scipy (``tests/interfaces/test_cli_startup.py``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from contextvars import ContextVar
from dataclasses import dataclass

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
#: seconds per exact noise draw (OpenDP's samplers: discrete Gaussian ~12 µs, discrete
#: Laplace ~8 µs per value, measured on 10^3..5·10^4 draws)
NOISE_SECONDS_PER_DRAW = 1.2e-5
#: seconds per answer of the result tables (columns built in Python, one INSERT ... unnest,
#: the ledger's release_tables row) and of the least-squares answers
WRITE_SECONDS_PER_ANSWER = 2e-5
#: seconds per row of the protected table scanned for the data vector (one GROUP BY)
SCAN_SECONDS_PER_ROW = 2e-7
#: fixed seconds of a release: the charge's and the results' transactions, the scan's set-up
RELEASE_FIXED_SECONDS = 0.1


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


def time_features(k3: float, nnz_n: float, mn: float, nnz: float) -> tuple:
    """What a step's time is fitted on: (1, the cubic term n³ or k³, nnz·n (the sparse W
    against a dense n x n factor) or the Gram's multiply-adds, m·n, nnz)."""
    return (1.0, float(k3), float(nnz_n), float(mn), float(nnz))


def _fitted(key: str, seconds: float, features: tuple, fitted: bool) -> float:
    """A step's time: the calibrated coefficients of :data:`TIME_FIT` on ``features`` when
    there are some (and ``fitted``), else the model's own ``seconds``."""
    if not fitted or key not in TIME_FIT:
        return seconds
    return sum(c * f for c, f in zip(TIME_FIT[key], features))


def bound_cost(n: int, m: int, nnz: int, gram_ops: float = 0.0, fitted: bool = True) -> Cost:
    """The singular value bound: eigenvalues of the smaller of ``W Wᵀ`` (m × m) and
    ``V = WᵀW`` (n × n), dense. The sparse product is formed first: copies of ``W``
    (``12·nnz`` bytes), ``gram_ops`` multiply-adds (``Σ nnz(row)²`` over the side summed;
    :func:`gram_ops`) and up to ``k²`` stored entries."""
    k = min(m, n)
    memory = 24.0 * k * k + 12.0 * nnz
    return Cost(memory, _fitted("svdb", 0.01 + 4.0 * k ** 3 / FLOPS
                                + SPARSE_SECONDS_PER_OP * gram_ops,
                                time_features(k ** 3, gram_ops, m * n, nnz), fitted))


def gram_ops(W) -> float:
    """Multiply-adds of the Gram product the bound forms: ``V = WᵀW`` (m ≥ n) by the route
    :func:`dpsql.workload.matrix.gram` takes (:func:`row_gram_ops`), ``Σ nnz(column)²`` for
    ``W Wᵀ``."""
    import numpy as np      # here, not at the top: see the module's last paragraph

    m, n = W.shape
    if m >= n:
        return row_gram_ops(W)
    return float(np.square(np.bincount(W.indices, minlength=n).astype(np.float64)).sum())


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


#: per step, the seconds per unit of each of :func:`time_features` (fixed, n³, nnz·n — or
#: ``Σ nnz(row)²`` for :data:`ROW_GRAM_STEPS` —, m·n, nnz): fitted by ``python
#: benchmarks/limits.py --fit`` (:mod:`benchmarks.limits_fit`: non-negative least squares on
#: the relative error of process CPU time, forked planning workers included, one BLAS
#: thread) over random batches: twenty-seven of 24..1,600 cells and 24..1,600 queries of
#: mixed intervals and scattered sets, and marginals over 3-5 made-up columns of 2..12 values
#: (18..1,512 cells); eigen, optimal and eigen/laplace were refitted on 2026-11-28
#: (``--fit --only eigen,optimal,eigen/laplace``, load average ~6 on the 2 cores) with ten
#: more: five of long random intervals (96..320 cells, 1,500..15,000 rows, a third of the
#: cells per row on average) and every marginal over 4-5 made-up columns (400..756 cells) —
#: never the CUBE and all-range batches the benchmark reports; a step not listed keeps the
#: model's own constants. svdb, workload, hierarchical, wavelet, fourier, eigen and
#: eigen/laplace were refitted on 2026-11-29 (``--fit --only ...``, load average ~3.5) with
#: four larger batches more (random intervals of 384 and 480 cells with 40,000 and 70,000
#: rows; every marginal of made-up 5-column CUBEs of 2,160 and 2,520 cells): the earlier fit
#: saw at most 1,600 cells and 15,000 rows, and under-predicted the all-range batches of
#: 256-512 cells 2-3.4x and the 3,888-cell CUBE's bound 2.9-3.2x. eigen, optimal and
#: eigen/laplace were refitted again on 2026-11-29 (same command, load average ~8) once their
#: third feature priced the Gram route :func:`row_gram_ops` takes (column differences for
#: integer rows) and ``optimal`` took a float32 first step; then svdb (whose :func:`gram_ops`
#: prices that route too), hierarchical and fourier (moved to :data:`ROW_GRAM_STEPS`): with
#: ``V`` cheap by differences they were over-predicted 4-30x on all ranges over 256-512 cells.
#: Formula:
#: ``Σ TIME_FIT[step][i] · time_features(...)[i]`` (plus the wavelet's Gram term, and at least a strategy's own estimate: :func:`candidate_cost`)
TIME_FIT: dict[str, tuple[float, ...]] = {   # the fit's worst ratio on its own batches
    "svdb": (0.00144, 1.23e-10, 5.25e-09, 9.37e-09, 7.31e-09),            # 2.01
    "identity": (0.00028, 0, 0, 0, 4.25e-09),                             # 2.00
    "workload": (0.0028, 5.8e-11, 2.33e-09, 2.42e-08, 2.08e-07),            # 10.4
    "hierarchical": (0.00722, 1.69e-10, 9.37e-09, 5.13e-08, 0),           # 1.97
    "wavelet": (0.00477, 9.38e-11, 0, 4.84e-08, 0),                      # 2.77
    "fourier": (0.00268, 2.47e-10, 7.36e-09, 2.82e-08, 3.24e-08),         # 1.95
    "eigen": (0.00501, 3.14e-10, 2.09e-08, 8.22e-08, 0),                  # 2.99
    "optimal": (0.0118, 6.04e-10, 3.37e-08, 0, 1.85e-07),         # 126: iterative, uneven
    "eigen/laplace": (0.174, 1.08e-09, 2.45e-08, 1.33e-07, 0),            # 2.08
}


#: per step, seconds per n³ at the least (its dense n x n work: the Gram's eigendecomposition,
#: forming ``A``, its Gram and factor): on made-up CUBEs of 1,000-3,888 cells eigen took
#: 5.3-6.8e-10 s per n³ (2026-11-29, one BLAS thread, load ~3), while its fitted cubic
#: coefficient — a compromise with batches where the other terms dominate — under-predicted
#: the benchmark's 3,888-cell CUBE 2.4-5x. Rounded up: a refusal depends on it
CUBIC_FLOOR = {"eigen": 8e-10}


#: the steps whose third time feature is the Gram product's multiply-adds (they form
#: ``V = WᵀW`` from the sparse ``W``: :func:`row_gram_ops`), not ``nnz·n``: on all-range
#: batches ``nnz·n`` is ~10⁴ times the product by differences (512 cells), on marginals
#: 30-100x the direct one
ROW_GRAM_STEPS = frozenset({"eigen", "optimal", "eigen/laplace", "hierarchical", "fourier"})


def row_gram_ops(W) -> float:
    """The multiply-adds of ``WᵀW`` by the route :func:`dpsql.workload.matrix.gram` takes:
    ``Σ nnz(row)²`` of ``W`` directly, or for integer rows that are short in column
    differences (ranges, points) ``Σ nnz(diff row)² + 4n²`` (on all ranges over 512 cells
    2.9·10⁶ instead of 4.5·10⁹)."""
    from dpsql.workload.matrix import gram_route    # numpy, scipy: the last paragraph above

    return gram_route(W)[1]


def candidate_cost(name: str, n: int, m: int, nnz: int, estimated_seconds: float = 0.0,
                   fitted: bool = True, gram: float = 0.0,
                   row_gram: float | None = None) -> Cost:
    """A candidate's plan and least-squares error factors: the strategy's dense matrices
    (``A`` p × n, Gram and Cholesky factor n × n), the dense ``W`` (m × n) solved against the
    factor and its result (``2·m·n·8`` bytes, ``m·n²`` flops). The identity needs only the
    row norms of the sparse ``W``. ``name``: the strategy, ``eigen/laplace`` for the L1
    Eigen-Design. ``estimated_seconds``: the strategy's own estimate, when it has one (used
    when larger). ``gram``: multiply-adds of the sparse Gram product ``AᵀA`` of the
    strategy's ``A`` (:func:`dpsql.mechanisms.fit.strategy_gram_ops`), a term the size
    features miss: a Kronecker ``A`` over several columns is far denser than any one-column
    ``A`` of the same ``n``. ``row_gram``: ``Σ nnz(row)²`` of ``W`` (:func:`row_gram_ops`),
    the third time feature of :data:`ROW_GRAM_STEPS` (``nnz·n``, an upper bound, without
    it)."""
    square, rows, cube, solves, fixed = _SHAPES.get(name, (6, 2.0, 12.0, 4.0, 0.5))
    if square == 0:
        return Cost(24.0 * nnz + 8.0 * (m + n),
                    _fitted(name, 2e-8 * nnz, time_features(0, 0, 0, nnz), fitted))
    workload_rows = m if name == "workload" else 0
    memory = 8.0 * (square * n * n + (rows * n + workload_rows) * n + 2.0 * m * n)
    seconds = (fixed + (cube * n ** 3 + solves * m * n * n + 2.0 * rows * n ** 3) / FLOPS
               + DENSE_SECONDS_PER_ENTRY * float(m) * n)
    third = float(nnz) * n
    if name in ROW_GRAM_STEPS:
        third = third if row_gram is None else float(row_gram)
    features = time_features(float(n) ** 3, third, float(m) * n, nnz)
    modelled = _fitted(name, seconds, features, fitted)
    if fitted:
        modelled = max(modelled, CUBIC_FLOOR.get(name, 0.0) * float(n) ** 3)
    return Cost(memory, max(modelled + SPARSE_SECONDS_PER_OP * gram, float(estimated_seconds)))


def release_cost(n: int, m: int, rows: int | None = None) -> Cost:
    """The release after planning: the kernel (the data vector, ``A x`` and up to
    ``2·max(n, m)`` exact noise draws: the measurements of any candidate), the least-squares
    answers (``m``) and the result tables' write. The data-vector scan grows with the table's
    rows, which are private unless the policy declares them (``rows``): a refusal before the
    charge may depend on public inputs only, so without ``rows`` only the per-cell part is
    predicted (the scan of a table that fits in memory is seconds per 10^7 rows)."""
    p = 2.0 * max(n, m)
    memory = 8.0 * (4.0 * n + 3.0 * p + 6.0 * m)
    seconds = (RELEASE_FIXED_SECONDS + NOISE_SECONDS_PER_DRAW * p
               + WRITE_SECONDS_PER_ANSWER * m + 2.0 * (p * n + m * n) / FLOPS
               + (SCAN_SECONDS_PER_ROW * rows if rows else 0.0))
    return Cost(memory, seconds)


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

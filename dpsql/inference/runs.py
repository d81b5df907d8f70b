"""Error factors of count queries from prefix sums of the inverse Cholesky factor.

The error factors are ``diag(W (AᵀA)⁻¹ Wᵀ)``: with ``AᵀA = L Lᵀ``, the squared norms of
``L⁻¹ wᵢ`` for each row ``wᵢ`` of ``W``. Solving ``L B = Wᵀ`` costs ``m·n²`` flops (0.11 s for
2,524 queries on 1,024 cells). But a counting query's row is a few *runs*, equal values on
consecutive cells (a range is one run, a point a run of one cell, a range on one column of
a product a run per value of the other columns), and ``L⁻¹`` is linear:
``L⁻¹ wᵢ = Σ_runs c·(P[b+1] − P[a])`` where ``P[k] = Σ_{j<k} L⁻¹[:, j]`` (prefix sums of the
columns of ``L⁻¹``) and a run of one cell is the column itself. One triangular inverse
(``n³/3`` flops) and a prefix sum make each run ``O(n)``.

The factors equal the solve's to rounding: a prefix sum's rounding error is bounded by
``n·ε`` times the sum of the absolute values it adds, so a row whose bound (over its runs)
exceeds :data:`TOLERANCE` of its own norm — a difference of two large prefix sums that
nearly cancel — is solved directly instead, as is every row with more than
``n / RUNS_PER_CELL`` runs (a dense row costs the solve no more). A batch with fewer such
rows than ``n · MIN_ROWS_PER_CELL`` is solved directly whole: the inverse would cost more
than it saves. Public inputs only.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp

#: a row is solved directly when its prefix-sum error bound exceeds this fraction of its norm
TOLERANCE = 1e-10
#: rows with more than ``n / RUNS_PER_CELL`` runs are solved directly
RUNS_PER_CELL = 16
#: the prefix sums pay off from this many run-wise rows per cell (the inverse's ``n³/3``)
MIN_ROWS_PER_CELL = 0.5
#: gathered prefix-sum differences per chunk: about this many float64 values (8 MB)
CHUNK_VALUES = 1 << 20


def error_factors(c: np.ndarray, lower: bool, W) -> np.ndarray:
    """Squared norms of the columns of ``L⁻¹ Wᵀ`` for the Cholesky factor ``c`` of ``AᵀA``
    (``lower``: ``c``'s lower triangle is ``L``; else its upper triangle is ``Lᵀ``)."""
    W = _canonical(W)
    m, n = W.shape
    row, start, stop, value = runs(W)
    counts = np.bincount(row, minlength=m)
    cheap = counts <= max(1, n // RUNS_PER_CELL)
    if n == 0 or np.count_nonzero(cheap) < MIN_ROWS_PER_CELL * n:
        return solved(c, lower, W)
    columns = _inverse_columns(c, lower)                 # columns[j] = L⁻¹[:, j]
    out = np.zeros(m)
    point = (counts[row] == 1) & (start == stop)         # one cell: c²·‖L⁻¹[:, j]‖²
    out[row[point]] = value[point] ** 2 * np.einsum("ij,ij->i", columns, columns)[
        start[point]]
    rest = cheap[row] & ~point
    row, start, stop, value = row[rest], start[rest], stop[rest], value[rest]
    unsure = ~cheap
    if row.size:
        rows = np.unique(row)                            # each with counts[rows] runs
        out[rows], unsure[rows] = _summed(columns, counts[rows], start, stop, value)
    if unsure.any():
        out[unsure] = solved(c, lower, W[np.flatnonzero(unsure)])
    return out


def _summed(columns, counts, start, stop, value) -> tuple:
    """``(‖Σ_runs c·L⁻¹ w_run‖², whether its rounding bound is over TOLERANCE)`` per row,
    for rows of ``counts`` runs each, the runs in row order."""
    n = columns.shape[0]
    prefix = np.empty((n + 1, n))
    prefix[0] = 0.0
    for j in range(n):     # row by row: 4x faster than cumsum along axis 0, the same sums
        np.add(prefix[j], columns[j], out=prefix[j + 1])
    # a prefix sum of k terms errs by at most k·ε·Σ|terms| <= n·ε·‖Σ_j |L⁻¹[:, j]|‖ in
    # norm; a difference of two, a scaling and a sum of k runs add 2 + 2 + k such terms
    total = float(np.linalg.norm(np.abs(columns).sum(axis=0)))
    error = np.abs(value) * (2.0 * np.finfo(float).eps * total) * (
        n + 4 + np.repeat(counts, counts))
    heads = np.cumsum(counts) - counts                   # each row's first run
    step = max(1, CHUNK_VALUES // n)
    buffers = np.empty((2, min(start.size, max(step, int(counts.max()))), n))
    norms, unsure = np.empty(counts.size), np.empty(counts.size, dtype=bool)
    for lo, hi in _chunks(counts, step):
        a, b = heads[lo], heads[hi - 1] + counts[hi - 1]
        z = _sums(columns, prefix, buffers, start[a:b], stop[a:b], value[a:b],
                  heads[lo:hi] - a)
        norms[lo:hi] = np.einsum("ij,ij->i", z, z)
        bound = np.add.reduceat(error[a:b], heads[lo:hi] - a)
        unsure[lo:hi] = bound > TOLERANCE * np.sqrt(norms[lo:hi])
    return norms, unsure


def _chunks(counts, step):
    """``(first, end)`` row ranges of about ``step`` runs each (at least one row)."""
    ends = np.cumsum(counts)                             # runs up to each row
    at = 0
    while at < counts.size:
        begin = int(ends[at - 1]) if at else 0
        upto = max(at + 1, int(np.searchsorted(ends, begin + step, side="right")))
        yield at, upto
        at = upto


def _sums(columns, prefix, buffers, start, stop, value, heads) -> np.ndarray:
    """``Σ_runs c·L⁻¹ w_run`` per row, for consecutive rows whose runs are ``start``,
    ``stop`` and ``value`` and begin at ``heads`` (``buffers``: room for two gathers)."""
    d, other = buffers[0, :start.size], buffers[1, :start.size]
    np.take(prefix, stop + 1, axis=0, out=d)
    np.take(prefix, start, axis=0, out=other)
    d -= other
    single = np.flatnonzero(stop == start)
    if single.size:            # exactly the column, not a difference of two prefix sums
        d[single] = np.take(columns, start[single], axis=0)
    if np.any(value != 1.0):
        d *= value[:, None]
    return d if heads.size == d.shape[0] else np.add.reduceat(d, heads, axis=0)


def runs(W: sp.csr_matrix) -> tuple:
    """``(row, first cell, last cell, value)`` of every maximal run of equal non-zero values
    on consecutive cells of each row of a canonical CSR matrix, in row order."""
    nnz = int(W.indptr[-1])
    cells, values = W.indices[:nnz].astype(np.int64), W.data[:nnz]
    starts = np.ones(nnz, dtype=bool)
    if nnz:
        starts[1:] = (cells[1:] != cells[:-1] + 1) | (values[1:] != values[:-1])
        starts[W.indptr[:-1][np.diff(W.indptr) > 0]] = True    # each row's first value
    heads = np.flatnonzero(starts)
    ends = np.append(heads[1:], nnz)[:heads.size] - 1      # (none when W has no non-zero)
    row = np.searchsorted(W.indptr, heads, side="right") - 1
    return row, cells[heads], cells[ends], values[heads].astype(float)


def solved(c: np.ndarray, lower: bool, W) -> np.ndarray:
    """The same factors by one triangular solve of ``W``'s dense rows."""
    Wd = W.toarray() if sp.issparse(W) else np.asarray(W, dtype=float)
    # L B = Wᵀ; an upper factor holds Lᵀ, so it is solved transposed
    B = la.solve_triangular(c, Wd.T, lower=lower, trans=0 if lower else 1,
                            check_finite=False)
    return (B ** 2).sum(axis=0)


def _inverse_columns(c: np.ndarray, lower: bool) -> np.ndarray:
    """``(L⁻¹)ᵀ`` (upper triangular, C order: row ``j`` is column ``j`` of ``L⁻¹``), reading
    only the factor's triangle (the other holds what the factorisation left there)."""
    inverse, info = la.lapack.dtrtri(c, lower=int(lower))
    if info != 0:
        raise np.linalg.LinAlgError("singular Cholesky factor")
    return np.triu(inverse.T) if lower else np.triu(inverse)


def _canonical(W) -> sp.csr_matrix:
    W = sp.csr_matrix(W, dtype=float)
    if not W.has_canonical_format:
        W = W.copy()
        W.sum_duplicates()
    return W

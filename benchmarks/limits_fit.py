"""Calibrate the dense candidates' time model (``python benchmarks/limits.py --fit``).

:func:`calibrate` fits :data:`dpsql.workload.limits.TIME_FIT` on random batches made here
(:func:`synthetic`, :func:`marginals`, :func:`intervals`): never the CUBE and all-range
batches :mod:`benchmarks.limits` reports, nor any data.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from benchmarks.limits import _Policy, fresh, measured
from dpsql.mechanisms import halfwidths, matrix, selection
from dpsql.sql.compile import ColumnPartition, Output, Workload
from dpsql.workload import limits as planning
from types import SimpleNamespace


def synthetic(n: int, m: int, seed: int) -> Workload:
    """A random batch, unlike the benchmark's: m counting queries over n cells, each a
    random interval or a random scattered set (a predicate on an unordered column), mixed;
    every other batch has small sets only (up to 8 cells: marginal-like, sparse)."""
    rng = np.random.default_rng(seed)
    largest = max(2, n // 4) if seed % 2 == 0 else 9
    rows, cols = [], []
    for q in range(m):
        if q % 2 and largest > 9:
            a, b = sorted(rng.integers(0, n, 2))
            cells = np.arange(a, b + 1)
        else:
            cells = rng.choice(n, size=int(rng.integers(1, largest)), replace=False)
        rows.append(np.full(len(cells), q))
        cols.append(cells)
    W = sp.csr_matrix((np.ones(sum(map(len, rows))), (np.concatenate(rows),
                                                       np.concatenate(cols))), shape=(m, n))
    part = ColumnPartition("x", np.arange(n), n, tuple((u,) for u in range(n)))
    query = SimpleNamespace(index=0, where=None, grouping_sets=(("x",),), count_column=None)
    return Workload("synthetic", (part,), W, (Output(query, 0, m, (), (), (), None),))


def intervals(n: int, m: int, seed: int) -> Workload:
    """A random batch of long rows: m random intervals over n ordered cells (both ends
    uniform, a third of the cells on average: as dense as range batches, never all of
    them)."""
    rng = np.random.default_rng(seed)
    ends = np.sort(rng.integers(0, n, (m, 2)), axis=1)
    rows = np.repeat(np.arange(m), ends[:, 1] - ends[:, 0] + 1)
    cols = np.concatenate([np.arange(a, b + 1) for a, b in ends])
    W = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(m, n))
    part = ColumnPartition("x", np.arange(n), n, tuple((u,) for u in range(n)))
    query = SimpleNamespace(index=0, where=None, grouping_sets=(("x",),), count_column=None)
    return Workload("synthetic", (part,), W, (Output(query, 0, m, (), (), (), None),))


def marginals(dims, seed: int, full: bool = False) -> Workload:
    """A random batch of marginals: columns of the given sizes (random, not Adult's), the
    counts of every assignment of a random half of the column subsets (all of them for up to
    three columns, or ``full``), as a GROUP BY CUBE over made-up columns would ask."""
    import itertools

    rng = np.random.default_rng(seed)
    subsets = [c for r in range(len(dims) + 1) for c in itertools.combinations(
        range(len(dims)), r)]
    if len(dims) > 3 and not full:
        subsets = [subsets[i] for i in sorted(rng.choice(len(subsets), len(subsets) // 2,
                                                         replace=False))]
    blocks = []
    for subset in subsets:
        block = sp.csr_matrix(np.ones((1, 1)))
        for i, d in enumerate(dims):
            block = sp.kron(block, sp.identity(d) if i in subset else np.ones((1, d)),
                            format="csr")
        blocks.append(block)
    W = sp.vstack(blocks, format="csr")
    m, n = W.shape
    part = ColumnPartition("x", np.arange(n), n, tuple((u,) for u in range(n)))
    query = SimpleNamespace(index=0, where=None, grouping_sets=(("x",),), count_column=None)
    return Workload("synthetic", (part,), W, (Output(query, 0, m, (), (), (), None),))


def calibrate(sizes, only=None) -> None:
    """Fit each step's time on :func:`dpsql.workload.limits.time_features` (non-negative
    least squares on the relative error) over random batches (:func:`synthetic`,
    :func:`marginals`, :func:`intervals`), never the batches reported below; prints
    :data:`dpsql.workload.limits.TIME_FIT` (``only``: those steps)."""
    from scipy.optimize import nnls

    names = selection.requested(_Policy, 1e-6, "auto")
    samples: dict = {}
    for k, size in enumerate(sizes):
        w = (intervals(*size[1:], seed=k) if size[0] == "intervals" else
             marginals(size[1:], seed=k, full=True) if size[0] == "cube" else
             synthetic(*size, seed=k) if len(size) == 2 and size[0] > 16 else
             marginals(size, seed=k))
        (m, n) = w.W.shape
        fresh(w)
        kk = min(n, m)
        if only is None or "svdb" in only:
            _, t = measured(lambda: halfwidths.svdb(matrix.workload_info(w)), trace=False)
            samples.setdefault("svdb", []).append(
                (planning.time_features(kk ** 3, planning.gram_ops(w.W), m * n, w.W.nnz), t))
        seen = set()
        for family, name, strategy in names:
            key = "eigen/laplace" if family == "laplace" and name == "eigen" else name
            if only is not None and key not in only:
                continue
            if key in seen or family == "laplace" and name != "eigen":
                continue
            seen.add(key)
            fresh(w)
            _, t = measured(lambda: selection.evaluate(None, family, name, strategy, w, False),
                            trace=False)
            nnz = w.W.nnz
            features = (planning.time_features(0, 0, 0, nnz) if key == "identity" else
                        planning.time_features(n ** 3, planning.row_gram_ops(w.W)
                                               if key in planning.ROW_GRAM_STEPS else nnz * n,
                                               m * n, nnz))
            samples.setdefault(key, []).append((features, t))
        print(f"  calibration batch n = {n}, m = {m}, nnz = {w.W.nnz:,} done", flush=True)
    print("TIME_FIT = {")
    for key, pts in samples.items():
        F = np.array([f for f, _ in pts])
        y = np.array([max(t, 1e-4) for _, t in pts])
        scale = np.where(F.max(axis=0) > 0, F.max(axis=0), 1.0)
        coef, _ = nnls(F / scale / y[:, None], np.ones(len(y)))
        coef = coef / scale
        pred = F @ coef
        worst = max(max(p / t, t / p) for p, t in zip(pred, y))
        print(f"    {key!r}: ({', '.join(f'{c:.3g}' for c in coef)}),  # worst {worst:.2f}")
    print("}")


#: the calibration batches: (n, m) random intervals and sets, column sizes of random
#: marginals, ("intervals", n, m) long random intervals, ("cube", sizes...) every marginal
FIT_BATCHES = [(24, 24), (40, 120), (96, 96), (96, 384), (192, 48), (192, 192), (192, 768),
               (384, 96), (384, 384), (384, 1536), (640, 640), (800, 400), (800, 1600),
               (1000, 1000), (1600, 800), (2, 3, 3), (3, 2, 2, 3), (3, 4, 5), (2, 6, 8),
               (4, 5, 6, 3), (7, 3, 4, 5), (2, 3, 4, 5, 6), (8, 9, 12), (3, 3, 4, 5, 6),
               (10, 12, 11), (4, 6, 7, 9),
               ("intervals", 96, 1500), ("intervals", 160, 4000), ("intervals", 224, 9000),
               ("intervals", 320, 6000), ("intervals", 200, 15000),
               ("cube", 4, 5, 4, 5), ("cube", 3, 4, 5, 7), ("cube", 5, 5, 5, 4),
               ("cube", 3, 7, 4, 9), ("cube", 2, 4, 3, 5, 4),
               # 2026-11-29: larger ones, where the benchmark's CUBE of 5 columns (3,888
               # cells) and all-range batches of 256-512 cells (33k-131k rows) were
               # under-predicted 2-5x by a fit that saw at most 1,600 cells and 15,000 rows
               ("intervals", 384, 40000), ("intervals", 480, 70000),
               ("cube", 4, 5, 6, 7, 3), ("cube", 3, 4, 5, 6, 6)]

"""MWEM's optional noisy start (``init_share``): what it measures and the start it gives.

See :mod:`dpsql.mechanisms.mwem.core` (``init_share``, ``init``). Public only: the rows are
fixed by the block's public shape, the start is post-processing of released values.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def init_rows(block, init: str) -> tuple[sp.csr_matrix, tuple]:
    """The rows ``init_share`` measures and the axis sizes they cover.

    ``"histogram"``: the identity (one axis of ``n`` cells). ``"marginals"``: for each axis
    ``j`` of the block's ``shape`` (a RangeBlock or a block without a shape: one axis), one
    row per value ``v`` counting the cells whose ``j``-th coordinate is ``v``. Every cell
    lies in exactly one row per axis, so the stacked rows' L1 sensitivity is the number of
    axes (the oracle calibrates to it).
    """
    n = block.n_cells
    shape = getattr(block, "shape", None) or (n,)
    if init == "histogram" or len(shape) == 1:
        return sp.identity(n, format="csr"), (n,)
    coords = np.unravel_index(np.arange(n), shape)
    offsets = np.concatenate([[0], np.cumsum(shape)[:-1]])
    rows = np.concatenate([offsets[j] + coords[j] for j in range(len(shape))])
    cols = np.tile(np.arange(n), len(shape))
    R = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(int(sum(shape)), n))
    return R, tuple(shape)


def init_log_weights(noisy: np.ndarray, scale: float, axes: tuple) -> np.ndarray:
    """``log A₀`` up to a constant: per axis, the clipped noisy counts plus the Laplace scale
    ``b`` (no value starts at zero weight), multiplied over the axes (a product
    distribution; one axis: the mixed histogram of the module docstring)."""
    parts = np.split(np.log(np.maximum(noisy, 0.0) + scale), np.cumsum(axes)[:-1])
    logw = parts[0]
    for part in parts[1:]:
        logw = np.add.outer(logw, part).reshape(-1)
    return logw

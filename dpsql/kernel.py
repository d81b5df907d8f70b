"""The privacy boundary: the only code that reads the data.

``Kernel.release`` (DESIGN.md, step 4):

1. charges the ledger, atomically (check and insert in one transaction, committed);
2. asks the engine for the cell counts ``x`` (one GROUP BY);
3. computes ``A x`` and adds Gaussian noise from the secure sampler;
4. returns ``y`` and drops ``x``.

Nothing but ``y`` crosses this boundary: strategies, inference and result writing see only
``y``, ``W``, ``A`` and σ. If the charge is refused, nothing was read, released or charged.
Charging *before* the data is read means that whatever happens once the data is touched —
an answer, or an engine failure that some row might provoke — has been paid for: no outcome
that depends on the data is ever free. (The engine is also written so that no value can make
the count fail; this ordering is the backstop.) If anything fails after the charge, the
budget stays spent (never a free retry of fresh noise).

Exactness of ``A x``: the sampler rounds ``A x`` to its grid and adds exact lattice noise,
with the rounding charged in the sensitivity (see :mod:`dpsql.noise`). That argument needs
``A x`` computed exactly: plans carry entries on the 2**-20 grid with magnitude at most 1
(:func:`dpsql.strategies.base.make_plan`), which makes float64 products exact for tables
of fewer than 2**32 rows; the kernel refuses any other plan rather than risk a
floating-point leak.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from . import engine, ledger
from .errors import StrategyError
from .noise import SecureGaussianSampler
from .strategies.base import EXACT_ROWS, QUANTUM_BITS, Plan



def _on_grid(A) -> bool:
    """Entries are multiples of 2**-20 with magnitude <= 1 (None is the identity)."""
    if A is None:
        return True
    data = A.data if sp.issparse(A) else np.asarray(A)
    scaled = data * float(2 ** QUANTUM_BITS)
    return bool(np.all(np.abs(data) <= 1) and np.all(scaled == np.round(scaled)))


@dataclass(frozen=True)
class Measurement:
    release_id: int
    result_tables: list
    y: np.ndarray          # noisy measurements (public once released)
    sigma: float
    grid: float
    private: bool


class Kernel:
    """Reads data, charges, adds noise. Holds the sampler; tests may pass a seeded one."""

    def __init__(self, sampler=None):
        self.sampler = sampler if sampler is not None else SecureGaussianSampler()

    @property
    def private(self) -> bool:
        return bool(getattr(self.sampler, "private", False))

    def release(self, con, policy, workload, plan: Plan, sigma: float,
                request: ledger.Charge) -> Measurement:
        if not plan.integral or not _on_grid(plan.A):
            raise StrategyError(
                f"strategy {plan.strategy!r} is not on the exact 2**-20 grid; the kernel "
                "only releases plans whose products A x are computed exactly")
        if not (np.isfinite(sigma) and sigma > 0):
            raise StrategyError("internal error: the noise scale must be positive and finite")
        columns = [(p.column, policy.column(p.column), p.unit_to_part)
                   for p in workload.partitions]
        release_id, names = ledger.charge(con, policy, request)   # committed here
        x = engine.data_vector(con, policy.table, columns, workload.n_cells)
        if x.sum() >= EXACT_ROWS:
            raise StrategyError("the table is too large for exact products (2**32 rows or "
                                "more); this release was charged and nothing was released")
        values = plan.measure(x)
        del x
        y, grid = self.sampler.sample(values, sigma, sensitivity=plan.sensitivity)
        return Measurement(release_id, names, np.asarray(y, dtype=float), sigma, grid,
                           self.private)

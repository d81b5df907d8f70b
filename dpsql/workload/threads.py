"""One BLAS thread for the dense steps of planning (public inputs only).

OpenBLAS's threads wait for each other by spinning, and that spin is process CPU time: on
the 2 shared cores of issue 21's benchmark a 1,024-cell Cholesky factor cost 0.05 s of CPU
on two threads and 0.018 s on one, a triangular inverse 0.03-0.32 s against 0.016 s, the
singular value bound's eigenvalues 0.17 s against 0.10 s. The strategy solvers run their
eigendecompositions on one thread for the same reason (``strategies/gaussian/dual.py``).
A step runs inside :func:`one` for at most a few tenths of a second (longer steps are in a
worker whose result does not depend on the thread count); the numbers do not change with it
beyond rounding.
"""

from __future__ import annotations

import contextlib

#: BLAS threads inside :func:`one` (None: leave the process's setting alone)
THREADS: int | None = 1

_controller: list = []


def one():
    """A context limiting BLAS to :data:`THREADS` threads (threadpoolctl, when installed)."""
    if THREADS is None:
        return contextlib.nullcontext()
    if not _controller:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:                      # a dependency; absent only in odd installs
            return contextlib.nullcontext()
        _controller.append(ThreadpoolController())
    return _controller[0].limit(limits=THREADS, user_api="blas")

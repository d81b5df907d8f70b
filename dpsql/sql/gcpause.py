"""Young garbage collections only, while a large batch is read (issue 16).

Reading a batch makes millions of small objects that all stay alive until it is parsed
(sqlglot's tokens, then dpsql's IR). CPython's collector runs a *full* collection whenever
the objects that survived young collections grow by a quarter: each one walks everything
alive in the process, none of it garbage, and on a 25,000-statement text they were 70% of
tokenizing's CPU time and a quarter of parsing's (``benchmarks/parse_speed.py``).

:func:`young_only` turns the automatic collector off for the duration and collects the
youngest generation (what was made since the last call) every :data:`EVERY` units of
:func:`tick`, so the parse's own garbage — sqlglot trees, which hold reference cycles — is
still freed as it goes, and what survives waits in the middle generation, walked once more
when the collector is back on (a collection of generations 0 and 1), not once per quarter of
growth. Collecting the middle generation here instead would count towards a full collection
that then falls due the moment the collector is back: on a cancel, half a second of waiting
on a 2-core machine. The collector is process-wide, so the pause is counted: it is turned
back on when the last reader in the process leaves, and only if it was on when the first
came (a host that turned it off keeps it off).
"""

from __future__ import annotations

import contextlib
import gc
import threading

#: ticks (pieces read, statements parsed) between young collections
EVERY = 500

_lock = threading.Lock()
_state = {"readers": 0, "was_enabled": False, "ticks": 0}


@contextlib.contextmanager
def young_only():
    """Full collections paused while the block runs (see the module's doc)."""
    with _lock:
        if _state["readers"] == 0:
            _state["was_enabled"] = gc.isenabled()
            gc.disable()
        _state["readers"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["readers"] -= 1
            if _state["readers"] == 0 and _state["was_enabled"]:
                gc.enable()


def tick(weight: int = 1) -> None:
    """Count work done (``weight`` units); a youngest-generation collection every
    :data:`EVERY` units while a reader holds the pause (a no-op otherwise)."""
    if not _state["readers"]:
        return
    _state["ticks"] += weight
    if _state["ticks"] >= EVERY:
        _state["ticks"] = 0
        gc.collect(0)

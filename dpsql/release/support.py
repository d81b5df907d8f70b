"""Pieces every release path shares: what a request asked for, and how a charged release
survives Ctrl-C (it is always completed, never left half-written)."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
from fractions import Fraction

from dpsql.noise.accounting import fraction_to_text
from dpsql.store.results import Release


def request_matches(entry: dict, text: str, eps, dlt, strategy: str, calibration: str,
                    model: str, extra: dict | None = None) -> bool:
    """Whether a ledger entry was charged for this very request: the same SQL text and the
    same parameters as asked (ε, δ, strategy, calibration, model; recorded with the charge).
    Used for named releases, which are never re-noised."""
    if entry.get("request") is not None:
        return (entry["sql_text"] == text and json.loads(entry["request"])
                == _request_params(eps, dlt, strategy, calibration, model) | (extra or {}))
    gaussian = entry["mechanism"] == "gaussian"     # a row from before requests were recorded
    return (entry["sql_text"] == text and model == "dp"
            and Fraction(entry["epsilon"]) == Fraction(float(eps))
            and Fraction(entry["delta"]) == Fraction(float(dlt))
            and strategy in ("auto", entry["strategy"])
            and (not gaussian or calibration == entry["calibration"]))


def _flags(nonnegative: bool, integer: bool) -> dict:
    """Post-processing flags as recorded with a request (absent when off)."""
    return {"nonnegative": nonnegative, "integer": integer} if nonnegative or integer else {}


def _request_params(eps, dlt, strategy, calibration, model) -> dict:
    """What a request asked for, as recorded with its charge (exact ε and δ)."""
    return {"epsilon": fraction_to_text(eps), "delta": fraction_to_text(dlt),
            "strategy": strategy, "calibration": calibration, "model": model}


class InterruptedAfterRelease(KeyboardInterrupt):
    """Ctrl-C arrived while a charged release was being completed; it completed first."""

    def __init__(self, release: Release, signum: int | None = None):
        super().__init__(f"interrupted after release {release.release_id} was charged and "
                         f"written (tables: {', '.join(release.tables)})")
        self.release = release
        self.signum = signum          # the signal held during the release (SIGINT, SIGTERM)


@contextlib.contextmanager
def _completed_on_interrupt(done: list):
    """A Ctrl-C after the release was built (e.g. while the connection closes) is reported
    as :class:`InterruptedAfterRelease`, so callers learn the release completed."""
    try:
        yield
    except InterruptedAfterRelease:
        raise
    except KeyboardInterrupt:
        if done:
            raise InterruptedAfterRelease(done[0]) from None
        raise


@contextlib.contextmanager
def _interrupts_deferred():
    """Hold SIGINT and SIGTERM until the block ends (main thread only); yields a list,
    non-empty if one arrived. A charged release is then completed before the process stops
    (the caller raises :class:`InterruptedAfterRelease`)."""
    got: list = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.getsignal(s) for s in signals}
    for s in signals:
        signal.signal(s, lambda signum, frame: got.append(signum))
    try:
        yield got
    finally:
        for s in signals:
            signal.signal(s, previous[s])


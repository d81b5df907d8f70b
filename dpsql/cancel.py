"""Cancelling a request before its charge: a token, cooperative checks, killable numerics.

A request runs inside :func:`scope` with a :class:`Token`. Three things stop it before the
charge, each within a fraction of a second:

- **Ctrl-C** (SIGINT, main thread): Python raises ``KeyboardInterrupt`` at the next
  bytecode; a long numerical step runs in a worker process (below), so the main thread is
  waiting in ``select`` and the signal is seen at once.
- **SIGTERM**: the command-line interfaces turn it into :class:`~dpsql.errors.Terminated`
  (a ``KeyboardInterrupt``), the same way.
- **A token** (:meth:`Token.cancel`, thread-safe): ``Session.cancel()``, the DB-API's
  ``Connection.cancel()`` and the server's client-disconnect call it from another thread.
  :func:`check` raises :class:`~dpsql.errors.RequestCancelled` once it is set; it is called
  between steps (database statements, candidates, chunks), every :data:`POLL_SECONDS`
  while a worker runs, and inside the long pure-Python loops of planning (each statement
  parsed, compiled or expanded; each block, record, MWEM round): :func:`checked` wraps
  such a loop, checking every ``every`` items.

Long numerics (a strategy's solver, an eigendecomposition predicted to take more than
:data:`LONG_STEP_ALONE` seconds, or :data:`LONG_STEP` while another request runs in the
process) go through :func:`run`: a forked child computes them and sends the pickled result
back; a cancel kills the child (SIGKILL), which LAPACK cannot delay. The child never touches
the database (the caller released it first: :func:`pause`) and dies with its parent. Shorter
steps run inline: a Ctrl-C lands when the current native call returns, a token at the
step's next :func:`check`.

After the charge (:func:`committed`) nothing cancels: the release completes and is written.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import os
import pickle
import select
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Callable

from dpsql.errors import RequestCancelled, StrategyError

#: a step predicted to take longer than this (seconds) runs in a killable worker process
#: while another request is running in this process (the server's other connections):
#: LAPACK holds the GIL (scipy's eigh does), so a long inline step would stall them
LONG_STEP = 0.2
#: the same limit for a request alone in its process. Forking is not free: at n = 1,024
#: (a 300 MB process) the child's first touch of the solver's pages cost 16.7k page faults
#: (4k inline) and 0.15-0.2 s more CPU than the same 1-s solve inline, plus 0.04 s for the
#: fork itself, and the database is closed and reopened around it. Under this limit an
#: inline step's cancel latency is one native call (an eigendecomposition: 0.25-0.35 s at
#: n = 1,024) for Ctrl-C, and one solver iteration for a token (the solvers check between
#: iterations), so forking would cost a fifth of the step to save a fraction of a second
LONG_STEP_ALONE = 1.0
#: how often a waiting parent looks at its token (seconds)
POLL_SECONDS = 0.05


class Token:
    """One request's cancellation flag (thread-safe; set once, never cleared)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = "cancelled"

    def cancel(self, reason: str = "cancelled") -> None:
        if not self._event.is_set():
            self.reason = reason
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


@dataclass
class _Scope:
    token: Token
    pause: list = field(default_factory=list)     # callbacks: release the database


_CURRENT: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar(
    "dpsql_cancel_scope", default=None)
#: requests planning in this process now (:func:`scope`), with the lock guarding the count
_RUNNING = [0]
_RUNNING_LOCK = threading.Lock()


@contextlib.contextmanager
def scope(token: Token, pause: Callable[[], None] | None = None):
    """Run a request's planning under ``token``; ``pause`` releases what it holds (the
    database) before a long step."""
    outermost = _CURRENT.get() is None          # a request's nested scopes count once
    reset = _CURRENT.set(_Scope(token, [pause] if pause is not None else []))
    with _RUNNING_LOCK:
        _RUNNING[0] += outermost
    try:
        yield token
    finally:
        with _RUNNING_LOCK:
            _RUNNING[0] -= outermost
        _CURRENT.reset(reset)


def long_step() -> float:
    """The predicted seconds over which :func:`run` forks: :data:`LONG_STEP_ALONE` when this
    request is the only one planning in the process, :data:`LONG_STEP` otherwise."""
    return LONG_STEP_ALONE if _RUNNING[0] <= 1 else LONG_STEP


@contextlib.contextmanager
def committed():
    """The charge is about to be made: from here nothing cancels (the release completes)."""
    reset = _CURRENT.set(None)
    try:
        yield
    finally:
        _CURRENT.reset(reset)


def check() -> None:
    """Raise :class:`RequestCancelled` if the current request was cancelled."""
    s = _CURRENT.get()
    if s is not None and s.token.cancelled:
        raise RequestCancelled(f"{s.token.reason} before the charge; nothing was charged")


def checked(items, every: int = 1):
    """Yield ``items``, calling :func:`check` before the first and then every ``every``
    items: a token cancel lands inside a long pure-Python loop (a batch's statements), not
    only at its end. Cheap (a context-variable read and a flag); a no-op outside a request
    and after its charge, like :func:`check`."""
    if every <= 1:
        for item in items:
            check()
            yield item
        return
    for i, item in enumerate(items):
        if not i % every:
            check()
        yield item


def pause() -> None:
    """Release what the current request holds (its database connection) before a long step."""
    s = _CURRENT.get()
    if s is not None:
        for release in s.pause:
            release()


def active() -> bool:
    """Whether a cancellable request is running in this context."""
    return _CURRENT.get() is not None


def run(fn: Callable, *args, seconds: float = 0.0):
    """``fn(*args)``, in a killable worker process when ``seconds`` (the predicted time) is
    over :func:`long_step` and the platform can fork; inline otherwise. Checks the token
    before and after; a cancel or a signal while the worker runs kills it at once."""
    check()
    if seconds <= long_step() or not hasattr(os, "fork"):
        value = fn(*args)
        check()
        return value
    pause()
    try:
        return _in_worker(fn, args)
    except _WorkerLost:           # e.g. a crash in the forked copy: compute it here instead
        value = fn(*args)
        check()
        return value


def run_cancellable(fn: Callable, *args, seconds: float = 0.0):
    """:func:`run` inside a cancellable request; ``fn(*args)`` inline outside one (already in
    a worker, where a cancel kills the worker itself, or after the charge, when nothing
    cancels): for numerics reached both inside and outside a request's planning."""
    if not active():
        return fn(*args)
    return run(fn, *args, seconds=seconds)


class _WorkerLost(Exception):
    """The worker ended without a result, not killed by us nor for lack of memory."""


def _in_worker(fn: Callable, args: tuple):
    read_end, write_end = os.pipe()
    parent = os.getpid()
    lost: list = []
    pid, chunks, finished = None, [], False
    try:
        with _interrupts_kept(lost):
            pid = os.fork()
            if pid == 0:                              # the child: numerics only
                os.close(read_end)
                _child(write_end, parent, fn, args)
        os.close(write_end)
        write_end = None
        if lost:                  # Ctrl-C / SIGTERM during the fork itself
            raise lost[0]
        while True:
            check()
            ready, _, _ = select.select([read_end], [], [], POLL_SECONDS)
            if ready:
                data = os.read(read_end, 1 << 20)
                if not data:
                    finished = True
                    break
                chunks.append(data)
    finally:
        for fd in (read_end, write_end):
            if fd is not None:
                os.close(fd)
        if pid:
            if not finished:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
    return _result(b"".join(chunks), status)


@contextlib.contextmanager
def _interrupts_kept(lost: list):
    """Around ``os.fork()``: Python runs its at-fork callbacks there, and an exception a
    signal handler raises inside one is only printed as "unraisable" and dropped — a
    Ctrl-C or SIGTERM landing then would be lost. Catch such an interrupt into ``lost``
    (the caller re-raises it); hold SIGINT and SIGTERM in this thread meanwhile."""
    previous = sys.unraisablehook

    def keep(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            lost.append(unraisable.exc_value)
        else:
            previous(unraisable)

    held = {signal.SIGINT, signal.SIGTERM}
    sys.unraisablehook = keep
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        sys.unraisablehook = previous
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)   # a held signal arrives now


def _result(data: bytes, status: int):
    if not data:      # killed (the kernel's OOM killer), or died: say so, never a traceback
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
            raise MemoryError("the planning worker was killed (out of memory?)")
        raise _WorkerLost(status)
    try:
        ok, value = pickle.loads(data)
    except Exception:
        raise StrategyError("internal error: the planning worker's result could not be "
                            "read; please report it") from None
    if ok:
        return value
    raise value


def _child(write_end: int, parent: int, fn: Callable, args: tuple) -> None:
    """Compute ``fn(*args)``, write ``(ok, value or exception)`` pickled, exit. Never
    returns; never runs the parent's exit handlers or touches its database."""
    try:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        _die_with(parent)
        gc.disable()         # no finalizers of the parent's objects (DuckDB's) run here
        _CURRENT.set(None)
        try:
            out = (True, fn(*args))
        except BaseException as exc:               # the parent re-raises it
            out = (False, exc)
        try:
            data = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            data = pickle.dumps((False, StrategyError(
                f"internal error: a planning result ({type(out[1]).__name__}) could not be "
                "sent back; please report it")))
        view = memoryview(data)
        while view:
            view = view[os.write(write_end, view):]
    finally:
        os._exit(0)


def _die_with(parent: int) -> None:
    """Linux: the child gets SIGKILL when its parent dies (even by SIGKILL)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except Exception:
        pass
    if os.getppid() != parent:
        os._exit(0)

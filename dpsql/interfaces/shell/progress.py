"""A spinner with the elapsed time, shown when a request runs longer than a second.

The request itself runs in the *main* thread and the spinner in a helper thread: Python
delivers SIGINT to the main thread only, and :class:`dpsql.Session` defers Ctrl-C between
the charge and the written release only there. So Ctrl-C interrupts the request where it
is (nothing is charged before the kernel's charge) and the spinner just stops.
"""

from __future__ import annotations

import contextlib
import threading
import time

FRAMES = "|/-\\"


@contextlib.contextmanager
def progress(label: str, stream, *, enabled: bool = True, delay: float = 1.0,
             interval: float = 0.1):
    """Show ``label`` with a spinner and elapsed seconds on ``stream`` after ``delay`` s."""
    if not enabled:
        yield
        return
    stop = threading.Event()
    start = time.monotonic()
    width = [0]

    def spin() -> None:
        if stop.wait(delay):
            return
        frame = 0
        while not stop.is_set():
            line = (f"\r{FRAMES[frame % len(FRAMES)]} {label}... "
                    f"{time.monotonic() - start:.1f}s (Ctrl-C cancels)")
            width[0] = max(width[0], len(line))
            try:
                stream.write(line)
                stream.flush()
            except (OSError, ValueError):
                return
            frame += 1
            stop.wait(interval)

    worker = threading.Thread(target=spin, name="dpsql-progress", daemon=True)
    worker.start()
    try:
        yield
    finally:
        stop.set()
        worker.join()
        if width[0]:
            try:
                stream.write("\r" + " " * width[0] + "\r")
                stream.flush()
            except (OSError, ValueError):
                pass

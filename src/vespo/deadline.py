"""Signals in the main thread: one wall-clock deadline for work that may hang or run away (a grader, a third-party
generator: SIGALRM raises an exception of the caller's choice when the time is up), and SIGTERM read as Ctrl-C."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class DeadlineExceeded(BaseException):
    """The deadline's default exception: a BaseException, so no ``except Exception`` in third-party code swallows it."""


@contextlib.contextmanager
def deadline(seconds: float, error: type[BaseException] = DeadlineExceeded) -> Iterator[None]:
    """Raise `error` in this main thread once ``seconds`` have passed (SIGALRM; the previous handler is restored)."""

    def expire(signum, frame):
        raise error(f"took over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM (a scheduler's or `kill`'s stop) into KeyboardInterrupt in the main thread, so both unwind through
    the same shutdown path: workers stopped, what was kept said in one line. Elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

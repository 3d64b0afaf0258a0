"""One wall-clock deadline for work in the main thread that may hang or run away (a grader, a third-party generator):
SIGALRM raises an exception of the caller's choice when the time is up."""

from __future__ import annotations

import contextlib
import signal
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

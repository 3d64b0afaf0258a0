"""How tests bound time without asserting wall-clock speed, so that they pass on a busy machine: work that must be
linear is bounded in this process's CPU seconds (which another job on the box does not inflate), and a wait for
something that must happen gives up only after `HANG_GUARD_S` (a hang detector, not a speed limit). Deadlines inside
vespo are tested by what they change (a grade marked timed out, a run stopped before its end), not by the clock."""

from __future__ import annotations

import time

HANG_GUARD_S = 600.0
"""How long a test waits for something that must happen before it reports a hang."""


def cpu_seconds(fn, *args, **kwargs):
    """(fn's result, the CPU seconds this process spent in it)."""
    start = time.process_time()
    result = fn(*args, **kwargs)
    return result, time.process_time() - start

"""Process-level helpers of the training loops: phase timing (`clock`), handing freed heap pages back to the OS
(`release_free_memory`, which the sampler processes call too) and seeding every RNG stream (`seed_everything`)."""

from __future__ import annotations

import ctypes
import functools
import random
import sys
import time

import numpy as np
import torch


def clock(device: torch.device) -> float:
    """Wall-clock seconds once `device`'s queued work is done, for a step's phase times (`time/*_s`): on CUDA one
    synchronisation per phase per step, on CPU none."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


TRIM_MIN_FREE_BYTES = 256 * 2**20
"""`release_free_memory` trims only when the heap holds more free bytes than this: a trim makes the next
allocations fault their pages in again, which costs a small model's step ~20% and buys it nothing."""


def release_free_memory() -> None:
    """Hand the C heap's freed pages back to the OS when more than `TRIM_MIN_FREE_BYTES` lie free (glibc
    `mallinfo2` / `malloc_trim`; elsewhere a no-op). Generation's and the optimizer's short-lived CPU tensors leave
    freed holes that the process would otherwise keep resident: on SmolLM2-135M 1.4-1.8 GB lie free after an update
    (benchmarks/results/trl_real)."""
    libc = _libc()
    if libc is not None and libc.mallinfo2().fordblks > TRIM_MIN_FREE_BYTES:
        libc.malloc_trim(0)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]  # fmt: skip


@functools.cache
def _libc():
    """glibc (>= 2.33, for mallinfo2) with its signatures, or None (another OS or C library)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):  # musl, or an older glibc
        return None
    return libc


def seed_everything(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """Seed torch (every device), Python and NumPy; return a fresh generator on `device` for the sampling noise (its
    state is checkpointed)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    return torch.Generator(device=device).manual_seed(seed)

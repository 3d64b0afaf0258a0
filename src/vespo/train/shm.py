"""/dev/shm, where the async weight store lives: how much is free and the one check that it holds the store (used before
the claim by `vespo.train.host` and by `vespo.train.sampler.WeightStore` just before it allocates)."""

from __future__ import annotations

import os

from vespo.train.config import ConfigError

SAMPLER_PROCESS_BYTES = 300 << 20  # measured: peak RSS of a sampler's imports (torch, transformers), no policy yet
SHARED_MEMORY = "/dev/shm"
"""Where torch puts the async weight store (`vespo.train.sampler.WeightStore`, `share_memory_`) on Linux."""


def shared_memory_free() -> int | None:
    """Bytes free in `SHARED_MEMORY` for this user (statvfs); None where it does not exist (not Linux)."""
    try:
        st = os.statvfs(SHARED_MEMORY)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def check_shared_memory(store: int) -> None:
    """An async weight store of `store` bytes fits in /dev/shm (ConfigError saying how to give it more otherwise):
    checked before the claim on the policy's meta-device count (`check_host`), and again by `WeightStore` on the
    loaded policy just before it allocates (a Hub model's size is known only once it is downloaded)."""
    shm = shared_memory_free()
    if shm is not None and store > shm:
        size = -(-(store + SAMPLER_PROCESS_BYTES) // 2**30)  # GiB, rounded up, with room to spare
        raise ConfigError(
            f"mode=async shares the policy's float32 weights ({store / 2**20:.3g} MiB) with the samplers through "
            f"{SHARED_MEMORY}, which has {shm / 2**20:.3g} MiB free (Docker's default is 64 MB): give it more (e.g. "
            f"docker run --shm-size={size}g) or train with mode=sync (no --async)"
        )

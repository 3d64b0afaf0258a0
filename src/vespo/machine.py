"""What this machine offers a run's processes: its usable cores, the torch thread count `vespo train` and `vespo eval`
share for a model (`threads_for`), and a policy's weight bytes from its files (`policy_bytes`). Below the trainer and
the evaluator, so both use the one rule; `vespo.train.host` checks a run against it.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

EMBEDDED = "embedded"
"""The model (and dataset) name of vespo's built-in tiny model and task."""

THREADS_PER_CORE = 4
THREADS_REASON = f"at most {THREADS_PER_CORE} per core of this machine; more only contend, and 100000 crashed torch"
"""Why `num_threads` is bounded by the machine's cores (`os.cpu_count()`)."""


def usable_cores() -> int:
    """CPU cores this process may run on: its affinity mask, lowered by a cgroup v2 CPU quota (a container's
    `--cpus`)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        return max(1, min(cores, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):  # no cgroup v2 file, or "max" (no quota)
        return cores


SMALL_MODEL_BYTES = 400 << 20
"""Weights below this size (about 100M float32 parameters) gain little from more than `SMALL_MODEL_THREADS` threads:
their matrices are too small to split, and every extra thread contends with the other jobs on the machine."""
SMALL_MODEL_THREADS = 4


def threads_for(model: str, processes: int = 1) -> tuple[int, str]:
    """torch threads for each of `processes` processes running `model`, and why (one phrase for the start-up line):
    `vespo train`'s and `vespo eval`'s default, so evaluation generates at training's speed.

    The embedded model (~0.15M parameters) runs fastest on one thread: its matrices are 64 wide, so more threads only
    add synchronisation, and on a busy machine each one waits for a core (`vespo train --total-training-steps 10
    --eval-every 0` on 2 cores at load 5-6: 21-25 s wall on one thread, 63-67 s on torch's default of two). Other
    models get the free cores (usable cores minus the 1-minute load average, at least 1), at most
    `SMALL_MODEL_THREADS` below `SMALL_MODEL_BYTES` of weights, shared between the processes."""
    if model == EMBEDDED:
        return 1, "1 torch thread (the embedded model runs fastest on one)"
    usable = usable_cores()
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        load = 0.0
    free = max(1, usable - round(load))
    size = policy_bytes(model, "float32")
    cap = SMALL_MODEL_THREADS if 0 < size < SMALL_MODEL_BYTES else usable
    threads = max(1, min(free // processes, cap))
    where = f"{free} of {usable} usable cores free at load {load:.1f}" + (f", {processes} processes" * (processes > 1))
    small = f", a {size / 2**20:.0f} MB model" if cap == SMALL_MODEL_THREADS else ""
    return threads, f"{threads} torch thread{'s' * (threads > 1)} per process ({where}{small})"


_DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1}  # safetensors dtype names


def policy_bytes(model: str, dtype: str) -> int:
    """Bytes of one `dtype` copy of the policy, from its weight files (a model directory, or the Hub cache's copy) or
    a GGUF file's tensor table; 0 when they are not on this machine yet, or for the embedded model (a few hundred
    KB)."""
    if model == EMBEDDED:
        return 0
    folder = Path(model).expanduser()
    wanted = _DTYPE_BYTES[{"float32": "F32", "bfloat16": "BF16", "float16": "F16"}[dtype]]
    from vespo.models import check_gguf_file, gguf_file

    try:
        source = gguf_file(folder)
        if source is not None:
            return check_gguf_file(source) * wanted  # dequantised, each weight takes `wanted` bytes
    except (ValueError, ImportError):  # several GGUF files, a damaged one, or no gguf package: `_check_model` says so
        return 0
    if not folder.is_dir():
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(model, "config.json")
        except ValueError:  # not a valid Hub id: `_check_model` says so
            return 0
        if not isinstance(cached, str):
            return 0
        folder = Path(cached).parent
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    size = sum(f.stat().st_size for f in files)
    stored = _safetensors_dtype_bytes(files[0]) if files and files[0].suffix == ".safetensors" else None
    return size * wanted // stored if stored else size


def _safetensors_dtype_bytes(file: Path) -> int | None:
    """Bytes per weight of a safetensors file (the dtype of the first tensor in its JSON header); None if unknown."""
    try:
        with open(file, "rb") as f:
            header = json.loads(f.read(min(int.from_bytes(f.read(8), "little"), 1 << 24)))
        first = next(v for k, v in header.items() if k != "__metadata__")
        return _DTYPE_BYTES.get(first["dtype"])
    except (OSError, ValueError, StopIteration, KeyError, TypeError, AttributeError):
        return None


def cpu_signature() -> str:
    """What a float result on this CPU depends on beyond the code and the seed: the processor, the vector ISA torch
    dispatches its kernels to, and torch's version (the same run on another ISA sums in another order, so its
    sampled tokens drift apart within steps). Recorded beside numbers that are reproduced exactly."""
    import platform

    import torch

    name = platform.processor() or platform.machine()
    try:
        models = re.findall(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
        name = models[0].strip() if models else name
    except OSError:  # no /proc (not Linux)
        pass
    return f"{name}; {torch.backends.cpu.get_cpu_capability()}; torch {torch.__version__}"

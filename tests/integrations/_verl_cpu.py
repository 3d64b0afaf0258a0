"""Run veRL's own training workers on CPU: a CPU platform for veRL's platform registry (`verl.plugin.platform`).

veRL 0.9.1 ships CUDA, NPU and ROCm platforms only and registers its FSDP engine for "cuda" and "npu". `use_cpu()`
makes one process train on CPU through veRL's unmodified worker code: it registers `PlatformCPU` (torch.distributed
on gloo, no device memory or streams), selects it, registers veRL's own FSDP engine class for the "cpu" device,
and keeps veRL's optional TRL import away from TRL >= 1.0 (see `use_cpu`); `copy_snapshots_to_host` makes V1's
pi_old snapshot a copy on CPU, as it is from an accelerator. Everything here is process-wide, which is why the tests
run it in subprocesses. A test utility, not part of vespo: veRL on CPU is for debugging a config and for CI, not for
training.
"""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager

import torch


class _CPUDeviceModule(types.ModuleType):
    """`torch.cpu` plus the memory and RNG calls veRL makes on its device module, answered for host memory."""

    def __init__(self) -> None:
        super().__init__("vespo_test_cpu_device")

    def __getattr__(self, name: str):
        return getattr(torch.cpu, name)

    @staticmethod
    def empty_cache() -> None:
        """No device cache on CPU."""

    @staticmethod
    def ipc_collect() -> None:
        """No device IPC handles on CPU."""

    @staticmethod
    def memory_allocated(device=None) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def mem_get_info(device=None) -> tuple[int, int]:
        import psutil

        mem = psutil.virtual_memory()
        return mem.available, mem.total

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device=None) -> None:
        """Host memory is not partitioned."""

    @staticmethod
    def get_device_name(device=None) -> str:
        return "cpu"

    get_rng_state = staticmethod(torch.get_rng_state)
    set_rng_state = staticmethod(torch.set_rng_state)


def _platform_class():
    from verl.plugin.platform import PlatformBase, PlatformRegistry

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformBase):
        """veRL's platform interface answered for the host CPU: device "cpu", collectives on gloo, no profiler."""

        _module = _CPUDeviceModule()

        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: self._module)

        def is_available(self) -> bool:
            return True

        def current_device(self) -> str:
            return "cpu"  # veRL passes this to `.to(...)`; an int would mean an accelerator index

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            """A single host device."""

        def synchronize(self, device_index=None) -> None:
            """CPU kernels run synchronously."""

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        manual_seed_all = manual_seed

        def set_allocator_settings(self, settings: str) -> None:
            """The CUDA caching-allocator settings have no CPU counterpart."""

        def empty_cache(self) -> None:
            """No device cache on CPU."""

        def get_device_capability(self, device_index: int = 0):
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"  # read by veRL's Worker; unset on a CPU host

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            """No device profiler."""

        def profiler_stop(self) -> None:
            """No device profiler."""

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self):
            return None

    return PlatformCPU


def use_cpu() -> None:
    """Make this process's veRL train on CPU. Call before importing veRL's workers or engines.

    veRL's `apply_monkey_patch` imports `AutoModelForCausalLMWithValueHead` from TRL whenever TRL is importable;
    TRL 1.x removed that class, so the FSDP engine fails to build. A `None` entry in `sys.modules` is Python's way
    to mark a module as absent: veRL's `is_trl_available()` then returns False and the value-head patch is skipped
    (the actor never uses it).
    """
    from verl.plugin.platform import set_platform

    sys.modules["trl"] = None
    set_platform(_platform_class()())

    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    registry = EngineRegistry._engines["language_model"]
    if "cpu" not in registry.get("fsdp2", {}):
        EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(
            FSDPEngineWithLMHead
        )


def copy_snapshots_to_host() -> None:
    """Make veRL's FSDP2 pi_old snapshot a copy on CPU, as it is from an accelerator.

    `DetachActorWorker.save_model_to_cpu` (V1 separate_async, decoupled mode) keeps each parameter shard as
    `shard.detach().cpu()`: a device-to-host copy on a GPU, but the very same storage when the shard already lives
    in host memory, so the "snapshot" follows every later optimizer step. This wraps veRL's helper so that the
    saved shards are cloned, which is what `.cpu()` does for device tensors; tests/integrations/_verl_v1_job.py
    records the unwrapped helper's aliasing first.
    """
    from verl.utils import fsdp_utils

    save = fsdp_utils.fsdp2_sharded_save_to_cpu
    if getattr(save, "copies", False):
        return

    def save_copy(model):
        state, spec = save(model)
        return {name: (t.clone(), s) for name, (t, s) in state.items()}, spec

    save_copy.copies, save_copy.unwrapped = True, save
    fsdp_utils.fsdp2_sharded_save_to_cpu = save_copy

"""The machine a run starts on: what it has (usable cores and their load, memory, /dev/shm, devices, installed
packages) and whether a valid `TrainConfig` can run on it (`check_host`): the files it names exist, the devices and
packages it asks for are there, and its sampler processes fit in memory. A config is checked apart from the machine
(`TrainConfig` is valid once built), so a saved run's config stays valid on another machine. `vespo.train.launch.train`
calls `check_host` before any compute (a sweep, for every cell before its grid runs); `vespo.train.setup` takes the
thread count from here.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
from pathlib import Path

from vespo.data.reasoning_gym import is_reasoning_gym
from vespo.intervals import Interval
from vespo.train.checks import SAMPLERS_REASON, ConfigError, check_range
from vespo.train.config import EMBEDDED, TrainConfig
from vespo.train.fields import HardwareSettings
from vespo.train.shm import SAMPLER_PROCESS_BYTES, check_shared_memory


def check_host(cfg: TrainConfig) -> TrainConfig:
    """`cfg`, once this machine can run it (ConfigError naming the field otherwise): sampler processes within the
    usable cores, torch threads within its cores, a rollout step within memory, output directories writable, data
    files present, the device, the packages asked for (peft, wandb, trackio, vLLM with CUDA), memory and /dev/shm for
    the async samplers, the model, and the reward function."""
    check_range("num_samplers", cfg.async_.num_samplers, Interval(f"[1, {_usable_cores()}]", SAMPLERS_REASON))
    if cfg.run.num_threads is not None:
        threads = Interval(f"[1, {THREADS_PER_CORE * (os.cpu_count() or 1)}]", THREADS_REASON)
        check_range("num_threads", cfg.run.num_threads, threads)
    _check_rollout_memory(cfg)
    for name in ("run_dir", "cache_dir"):
        check_output_dir(name, getattr(cfg.run, name))
    for name in ("dataset", "eval_dataset"):
        _check_data_file(name, getattr(cfg.data, name))
    from vespo.models import resolve_device

    try:
        resolve_device(cfg.hardware.device)
    except ValueError as exc:
        raise ConfigError(f"device: {exc}") from None
    if cfg.hardware.use_peft and importlib.util.find_spec("peft") is None:
        raise ConfigError("use_peft needs peft installed (pip install peft)")
    for name, package in (("wandb_project", "wandb"), ("trackio_project", "trackio")):
        if getattr(cfg.run, name) and importlib.util.find_spec(package) is None:
            raise ConfigError(
                f"{name} needs {package} installed (pip install {package}); without it, drop --{name.replace('_', '-')}"
                " (metrics.jsonl and TensorBoard are always written)"
            )
    if cfg.async_.sampler_engine == "vllm":
        import torch

        if importlib.util.find_spec("vllm") is None or not torch.cuda.is_available():
            raise ConfigError("sampler_engine=vllm needs vLLM installed (pip install 'vespo[vllm]') and a CUDA device")
    if cfg.async_.mode == "async":
        _check_sampler_memory(cfg)
    _check_model(cfg.data.model)
    from vespo.rewards.batch import load_reward_fn

    try:
        load_reward_fn(cfg.data.reward_fn)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return cfg


def check_output_dir(name: str, value: str) -> Path:
    """`value` names a directory this command may create or write in: not empty, not a file, and its nearest existing
    ancestor a writable directory (ConfigError naming `name` otherwise). Nothing is created."""
    if not value.strip():
        raise ConfigError(f"{name} must be a directory path, got an empty string")
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{name} {path} is a file, not a directory")
    parent = next(p for p in (path, *path.parents) if p.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{name} {path} is not writable ({parent} is not a writable directory)")
    return path


def _check_data_file(name: str, value: str | None) -> None:
    """A local data file (.json / .jsonl / .parquet, or any existing path) must exist; other names are Hub ids, named
    sets or reasoning-gym specs (`TrainConfig` checks those)."""
    if value is None or value == EMBEDDED or is_reasoning_gym(value):
        return
    local = value.endswith((".json", ".jsonl", ".parquet"))
    if not local:
        from vespo.models import looks_local  # imports torch: a data file's name is answered without it

        local = looks_local(value)
    if local and not Path(value).expanduser().is_file():
        raise ConfigError(f"{name}: file not found: {value}")


def _check_model(value: str) -> None:
    """`model` is "embedded", an existing model directory, or a Hub id (`vespo.models.check_model_source`)."""
    if value == EMBEDDED:
        return
    from vespo.models import check_model_source

    try:
        check_model_source(value)
    except ValueError as exc:
        raise ConfigError(f"model: {exc}") from None


THREADS_PER_CORE = 4
THREADS_REASON = f"at most {THREADS_PER_CORE} per core of this machine; more only contend, and 100000 crashed torch"
"""Why `num_threads` is bounded by the machine's cores (`os.cpu_count()`)."""
ROLLOUT_BYTES_PER_TOKEN = 24
"""The least a rollout step keeps per response token: its id and attention mask (int64), its sampler and old
log-probs (float32); the generation's KV cache and the learner's logits come on top."""


def _check_rollout_memory(cfg: TrainConfig) -> None:
    """A rollout step's responses fit in memory: train_batch_size x rollout_n of max_response_length tokens, at
    `ROLLOUT_BYTES_PER_TOKEN` each (a lower bound), within the memory available now."""
    tokens = cfg.batch.train_batch_size * cfg.batch.rollout_n * cfg.rollout.max_response_length
    need, free = tokens * ROLLOUT_BYTES_PER_TOKEN, _available_memory()
    if free is not None and need > free:
        raise ConfigError(
            f"a rollout step of train_batch_size x rollout_n x max_response_length = {cfg.batch.train_batch_size} x "
            f"{cfg.batch.rollout_n} x {cfg.rollout.max_response_length} tokens needs at least {need / 2**30:.3g} GiB "
            f"({ROLLOUT_BYTES_PER_TOKEN} bytes a token) but {free / 2**30:.1f} GiB of memory is available: lower one "
            "of them"
        )


def _check_sampler_memory(cfg: TrainConfig) -> None:
    """The async samplers fit: each a process with torch and its own copy of the policy in memory (RAM, or the GPU
    for vLLM), and the learner's float32 weights, shared with them, in /dev/shm."""
    dtype, samplers = cfg.rollout.sampler_dtype, cfg.async_.num_samplers
    weights = _policy_bytes(cfg.data.model, dtype) if cfg.async_.sampler_engine == "hf" else 0  # vLLM: on the GPU
    per_sampler, free = SAMPLER_PROCESS_BYTES + weights, _available_memory()
    if free is not None and samplers * per_sampler > free:
        fit = f"at most {free // per_sampler} sampler(s) fit" if free >= per_sampler else "not even one sampler fits"
        raise ConfigError(
            f"num_samplers={samplers} needs about {samplers * per_sampler / 2**30:.1f} GiB "
            f"({per_sampler / 2**30:.2f} GiB per sampler: a process with torch and its {dtype} copy of the "
            f"policy) but {free / 2**30:.1f} GiB of memory is available: {fit}"
        )
    check_shared_memory(_shared_weight_bytes(cfg.data.model, cfg.hardware))  # the learner's weights, shared


def _shared_weight_bytes(name: str, hardware: HardwareSettings) -> int:
    """The /dev/shm the async weight store will take (`WeightStore.shared_bytes`), counted on the learner's policy
    (`name`: the `model` setting; with `hardware`'s LoRA)
    built on the meta device from its config, no weight read (the embedded model, a model directory, a Hub model in
    the cache; LoRA adapters added as the run adds them); for a policy whose config this cannot build (a GGUF file, a
    Hub model not downloaded yet) the float32 size of its weight files."""
    import torch

    from vespo.train.sampler import POOL_SHARED_BYTES, WeightStore

    try:
        with torch.device("meta"):
            model = _meta_policy(name, hardware)
    except Exception:  # noqa: BLE001 (a config only the real load can judge: it says what is wrong, one line)
        model = None
    if model is None:
        return _policy_bytes(name, "float32") + POOL_SHARED_BYTES
    return WeightStore.shared_bytes(model)


def _meta_policy(name: str, hardware: HardwareSettings):
    """The run's policy (`name`: the `model` setting) as `vespo.train.setup` builds it (float32, `hardware`'s LoRA
    when asked), under the caller's meta device; None when its config is not on this machine or it is a GGUF
    file."""
    import torch
    import transformers

    if name == EMBEDDED:
        from vespo.embedded.task import build_tiny_model, build_tokenizer

        model = build_tiny_model(build_tokenizer())
    else:
        from vespo.models import gguf_file

        folder = Path(name).expanduser()
        if gguf_file(folder) is not None:
            return None
        if not (folder / "config.json").is_file():
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(name, "config.json")
            if not isinstance(cached, str):
                return None
            folder = Path(cached).parent
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if hardware.use_peft:
        from vespo.models import add_lora

        model = add_lora(model, hardware)
    return model


def _usable_cores() -> int:
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


def default_num_threads(cfg: TrainConfig) -> tuple[int, str]:
    """torch threads per process of a run when `num_threads` is None, and why: `threads_for` its model, the learner
    and its async samplers sharing the free cores."""
    return threads_for(cfg.data.model, 1 + (cfg.async_.num_samplers if cfg.async_.mode == "async" else 0))


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
    usable = _usable_cores()
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        load = 0.0
    free = max(1, usable - round(load))
    size = _policy_bytes(model, "float32")
    cap = SMALL_MODEL_THREADS if 0 < size < SMALL_MODEL_BYTES else usable
    threads = max(1, min(free // processes, cap))
    where = f"{free} of {usable} usable cores free at load {load:.1f}" + (f", {processes} processes" * (processes > 1))
    small = f", a {size / 2**20:.0f} MB model" if cap == SMALL_MODEL_THREADS else ""
    return threads, f"{threads} torch thread{'s' * (threads > 1)} per process ({where}{small})"


_DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1}  # safetensors dtype names


def _policy_bytes(model: str, dtype: str) -> int:
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


_CGROUP_MEMORY = (("memory.max", "memory.current"), ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"))


def _available_memory() -> int | None:
    """Bytes of memory a new process can still get: Linux's MemAvailable, lowered by this container's cgroup limit
    (v2 or v1); None where /proc/meminfo does not exist."""
    try:
        free = int(re.search(r"MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text())[1]) << 10
    except (OSError, TypeError):
        return None
    for limit, usage in _CGROUP_MEMORY:
        try:
            cap = int(Path("/sys/fs/cgroup", limit).read_text()) - int(Path("/sys/fs/cgroup", usage).read_text())
        except (OSError, ValueError):  # no such cgroup file, or "max"
            continue
        free = min(free, max(cap, 0))
    return free

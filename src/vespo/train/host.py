"""The machine a run starts on: what it has (usable cores and their load, memory, /dev/shm, devices, installed
packages) and whether a valid `TrainConfig` can run on it (`check_host`): the files it names exist, the devices and
packages it asks for are there, and its sampler processes fit in memory. A config is checked apart from the machine
(`TrainConfig` is valid once built), so a saved run's config stays valid on another machine. `vespo.train.launch.train`
calls `check_host` before any compute (a sweep, for every cell before its grid runs); `vespo.train.setup` takes the
thread count from here.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from vespo.data.reasoning_gym import is_reasoning_gym
from vespo.intervals import Interval
from vespo.machine import THREADS_PER_CORE, THREADS_REASON, policy_bytes, threads_for, usable_cores
from vespo.train.checks import SAMPLERS_REASON, ConfigError, check_range
from vespo.train.config import EMBEDDED, TrainConfig
from vespo.train.fields import HardwareSettings
from vespo.train.shm import SAMPLER_PROCESS_BYTES, check_shared_memory


def check_host(cfg: TrainConfig) -> TrainConfig:
    """`cfg`, once this machine can run it (ConfigError naming the field otherwise): sampler processes within the
    usable cores, torch threads within its cores, a rollout step within memory, output directories writable, data
    files present, the device, the packages asked for (peft, wandb, trackio, vLLM with CUDA), memory and /dev/shm for
    the async samplers, the model, and the reward function."""
    check_range("num_samplers", cfg.async_.num_samplers, Interval(f"[1, {usable_cores()}]", SAMPLERS_REASON))
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
    weights = policy_bytes(cfg.data.model, dtype) if cfg.async_.sampler_engine == "hf" else 0  # vLLM: on the GPU
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
        return policy_bytes(name, "float32") + POOL_SHARED_BYTES
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


def default_num_threads(cfg: TrainConfig) -> tuple[int, str]:
    """torch threads per process of a run when `num_threads` is None, and why: `threads_for` its model, the learner
    and its async samplers sharing the free cores."""
    return threads_for(cfg.data.model, 1 + (cfg.async_.num_samplers if cfg.async_.mode == "async" else 0))


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

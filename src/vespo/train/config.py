"""Trainer configuration: one dataclass whose attribute docstrings are the `vespo train --help` text (tyro).

Keys follow veRL/TRL names where the concept is shared (train_batch_size, ppo_mini_batch_size, rollout_n,
loss_agg_mode, lr, max_response_length, temperature, kl_coef, entropy_coeff). A YAML file given with `--config` sets
defaults; command-line flags override it. `resolve` checks everything that can be checked before any compute, the
checks that need no heavy import (torch, transformers) first, so a bad flag is answered at once.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from vespo.data.reasoning_gym import is_reasoning_gym, parse_spec
from vespo.intervals import Interval

if typing.TYPE_CHECKING:
    from vespo.rollout.types import SamplingSettings

EMBEDDED = "embedded"
LossAggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


class ConfigError(ValueError):
    """A bad input found before any compute: `vespo train` prints its one-line message and exits with code 2."""


@dataclass
class TrainConfig:
    # --- policy, data, reward
    model: str = EMBEDDED
    """Hub id or local path of a causal LM; "embedded" builds the tiny local model with an SFT warm start."""
    dataset: str = EMBEDDED
    """Training records: a local .json/.jsonl file ({"prompt", "answer"} math or {"prompt", "tests"} code), a Hub id,
    a set vespo knows by name (DAPO-Math-17k's Hub id), or reasoning-gym tasks
    (``reasoning-gym:<task>[:key=value...][,<task>...]``, docs/models.md); "embedded" is the built-in arithmetic
    task."""
    eval_dataset: str | None = None
    """Held-out records (as `dataset`, or a benchmark name such as math500); None uses the embedded task's held-out
    split, the held-out split of a reasoning-gym `dataset`, or no evaluation otherwise."""
    dataset_split: str = "train"
    """Split of a Hub dataset."""
    prompt_key: str = "prompt"
    """Dataset field holding the prompt text."""
    answer_key: str = "answer"
    """Dataset field holding the ground-truth answer (math); code records carry `tests` instead."""
    skip_bad_records: bool = False
    """Skip dataset rows that cannot be graded (missing/null/list answer, empty prompt), with a count, instead of
    failing on the first one with its file and line."""
    apply_chat_template: bool = False
    """Wrap prompts in the tokenizer's chat template (instruct models); plain text otherwise."""
    reward_fn: str | None = None
    """`module:function` with TRL's reward signature fn(completions, **columns) -> list[float]; the record's other
    fields arrive as keyword lists (math: `answer`; code: `tests`, with `vespo.rewards:code_reward`). None: the
    task's own verifier for reasoning-gym datasets, Math-Verify (`vespo.rewards:math_reward`) otherwise."""

    # --- algorithm
    method: str = "vespo"
    """Policy-loss method from the registry (`vespo.available_methods()`)."""
    hparams: dict[str, float | int | str | None] = field(default_factory=dict)
    """Method hyperparameters passed to the loss, e.g. `--hparams c1_pos 2 length_norm sqrt` (paper defaults)."""
    loss_agg_mode: LossAggMode | None = None
    """How the per-token loss is normalised (`vespo.aggregation.agg_loss`); None = the method's default."""
    norm_adv_by_std: bool = True
    """Divide group-centred rewards by the group std (GRPO); False gives Dr. GRPO-style A = R - mean."""
    adv_estimator: Literal["grpo", "opob"] = "grpo"
    """Advantages (veRL's name): grpo (group-relative) | opob (VCPO's off-policy optimal baseline, recomputed per
    mini-batch at its weights; one extra backward per sequence; sync mode, shuffle off; docs/losses.md)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to the initial (reference) policy; 0 disables it and the reference model."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss); 0 disables it."""

    # --- batch geometry: staleness N = train_batch_size / ppo_mini_batch_size
    train_batch_size: int = 16
    """Prompts per rollout step (the paper's global batch size, in prompts)."""
    ppo_mini_batch_size: int = 16
    """Prompts per optimizer step; the rollout batch is consumed in N sequential mini-batches."""
    shuffle: bool = False
    """Shuffle the rollout batch's rows before cutting mini-batches (veRL's actor `shuffle`; TRL always shuffles), so
    an optimizer step mixes responses of several prompts instead of whole groups (docs/training.md, "vs TRL")."""
    staleness: int | None = None
    """Shortcut: if set, train_batch_size = staleness * ppo_mini_batch_size."""
    rollout_n: int = 8
    """Responses sampled per prompt (the GRPO group size; >= 2, since advantages are relative to the group)."""
    micro_batch_size: int = 64
    """Sequences per forward/backward pass (gradient accumulation; does not change the result)."""
    total_training_steps: int = 100
    """Rollout steps to run (each = 1 rollout batch and N optimizer steps)."""

    # --- optimisation
    optim: Literal["adamw_torch", "sgd"] = "adamw_torch"
    """Actor optimizer (TRL's names): adamw_torch | sgd (plain gradient steps, no momentum: the step follows the
    gradient's size, which Adam's normaliser does not; docs/results.md section 3)."""
    lr: float = 3e-4
    """Peak learning rate (see `lr_scheduler_type`)."""
    lr_scheduler_type: Literal["constant", "constant_with_warmup", "linear", "cosine"] = "constant"
    """Learning-rate schedule over the run's optimizer steps (TRL/transformers names; `transformers.get_scheduler`):
    warmup, then constant, linear decay to 0, or cosine decay to 0. "constant" ignores the warmup."""
    warmup_ratio: float = 0.0
    """Warmup as a fraction of all optimizer steps (total_training_steps x N); `warmup_steps` wins when > 0."""
    warmup_steps: int = 0
    """Warmup in optimizer steps (TRL's name); 0 uses `warmup_ratio`."""
    weight_decay: float = 0.0
    """Weight decay (decoupled for AdamW)."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon (TRL's name); a large value (e.g. 1e-2 with a ~100x lr) makes Adam's step follow the gradient."""
    grad_clip: float = 1.0
    """Max global grad norm per optimizer step."""
    step_scale: Literal["none", "mean_phi", "ess_sqrt"] = "none"
    """Step-size control for stale mini-batches (`vespo.step_control`): "mean_phi" scales each optimizer step by the
    mini-batch's mean VESPO weight Z = mean phi(W) (capped at 1; VESPO-family methods only, beyond the paper);
    "ess_sqrt" by sqrt(ESS/B) of its sequence weights pi/pi_sampler (VCPO's rule for AdamW; any method)."""
    target_kl: float | None = None
    """Trust region over stale mini-batches (PPO's name): skip the rest of a rollout's mini-batches once the k3
    estimate of KL(mu || pi) on the next one exceeds this; None = never."""
    ess_alarm: float = 0.1
    """Warn once (stderr) when the normalised ESS of the stalest mini-batch's importance weights W
    (`is/ess/last_mini_batch`) stays below this for `ess_alarm_patience` rollout steps, an early sign of collapse;
    0 disables it."""
    ess_alarm_patience: int = 3
    """Consecutive rollout steps below `ess_alarm` before the alarm fires."""
    stop_on_low_ess: bool = False
    """Stop the run (checkpointed, resumable) when the ESS alarm fires, instead of only warning."""
    log_update_norm: bool = False
    """Log actor/update_norm, the size of each optimizer step (costs one copy of the weights per mini-batch)."""
    probe_every: int = 0
    """Every this many rollout steps, run the gradient probe on the stalest mini-batch (`vespo.diagnostics`): the
    cosine of the method's policy gradient to GRPO's and to plain REINFORCE's on the same batch and weights, logged
    as `probe/*`; 0 = never. Costs one forward and up to three backward passes of one mini-batch; synchronous loop."""

    # --- rollout
    max_response_length: int = 16
    """Max new tokens per response."""
    temperature: float = 1.0
    """Sampling temperature (the trainer's log-probs use the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling mass. The learner's log-probs use the same truncated distribution (docs/losses.md)."""
    top_k: int = 0
    """Sample among the top_k most likely tokens (0: off); the learner's log-probs use the same truncation."""
    sampler_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Sampler weights dtype. Another dtype than the trainer's (float32) creates a real train-inference mismatch."""
    rollout_logit_noise: float = 0.0
    """Simulated train-inference mismatch: std of Gaussian noise added to the sampler's logits (0 = none)."""
    use_rollout_log_prob: bool = True
    """Pass the sampler's log-probs to the loss as rollout_log_prob (mismatch correction); False ignores them. In async
    mode the sampler's log-probs are the behaviour policy itself (old_log_prob) unless `use_decoupled_loss`, where
    this flag decides whether mu enters as rollout_log_prob (W = pi/pi_prox * pi_prox/mu) or not (W = pi/pi_prox)."""
    disable_dropout: bool = True
    """Set every dropout probability of the policy to 0 (TRL's name), so the update (train mode) and the old
    log-probs (eval mode) compute one policy and W == 1 on the first mini-batch."""

    # --- hardware, precision, parameter-efficient training (docs/training.md, "GPUs, precision and LoRA")
    device: str = "auto"
    """Where the policy, reference, rollouts and RNG live: auto (CUDA when present, else CPU) | cpu | cuda | cuda:i."""
    bf16: bool = False
    """bfloat16 autocast for the policy's forward passes (old log-probs and the update alike, so W == 1 at k = 0);
    master weights, optimizer state and all log-space loss math stay float32 (TRL's name)."""
    fp16: bool = False
    """float16 autocast with a dynamic loss scale (`torch.amp.GradScaler`; a step whose scaled gradient overflows is
    skipped); otherwise as `bf16` (TRL's name)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (`model.gradient_checkpointing_enable()`): less memory, slower."""
    torch_compile: bool = False
    """`torch.compile` the decoder body for the learner's log-prob passes (old, reference and update; generation stays
    eager), with dynamic shapes (TRL's name). Off by default: on CPU the compile costs 45 s (warm cache) to minutes
    and pays back only on long runs (benchmarks/results/torch_compile.md)."""
    torch_compile_backend: Literal["inductor", "aot_eager", "eager"] = "inductor"
    """The `torch.compile` backend (transformers' name); eager / aot_eager trace without generating kernels (debug)."""
    use_peft: bool = False
    """Train LoRA adapters (peft) instead of all weights; the KL reference is the base model with the adapters
    disabled, as in TRL, not a second copy (TRL's names: lora_r, lora_alpha, lora_dropout, lora_target_modules)."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA scaling numerator (the update is scaled by lora_alpha / lora_r)."""
    lora_dropout: float = 0.05
    """LoRA dropout (set to 0 by `disable_dropout`, like every dropout of the policy)."""
    lora_target_modules: tuple[str, ...] | None = None
    """Module names to adapt, e.g. `q_proj v_proj`, or `all-linear`; None uses peft's default for the architecture."""

    # --- asynchronous training (docs/training.md, "Asynchronous training")
    mode: Literal["sync", "async"] = "sync"
    """sync: generate, then train; async (`--async`): sampler processes generate while the learner trains."""
    max_staleness: int = 4
    """async: max optimizer steps a sample's policy version may lag the learner (TRL's max_staleness); staler samples
    are not generated (admission, as AReaL's max_head_offpolicyness) or, if late anyway, dropped."""
    sync_every: int = 1
    """async: publish the learner's weights to the samplers every this many optimizer steps (TRL weight_sync_steps)."""
    num_samplers: int = 1
    """async: sampler processes, each with its own copy of the policy."""
    use_decoupled_loss: bool = False
    """async: AReaL's decoupled objective W = (pi/pi_prox)(pi_prox/mu): the learner's weights at the update are
    old_log_prob (one extra forward) and mu enters as rollout_log_prob; otherwise mu is old_log_prob itself."""
    sampler_engine: Literal["hf", "vllm"] = "hf"
    """The generation engine, sync and async: hf (the trainer's KV-cached sampler) | vllm (CUDA; the learner's
    weights pushed into the engine every step; not run on CPU)."""

    # --- embedded task and SFT warm start (used when model/dataset == "embedded")
    task: Literal["arithmetic", "chain", "scratchpad"] = "arithmetic"
    """Embedded task: arithmetic (sums of num_operands numbers, ~11-token answers) | chain (num_operands steps of a
    lagged running sum mod 10, every step written out: responses of 3 * num_operands + 5 tokens) | scratchpad
    (free-length sums: running sums optional, the length is learned; needs max_response_length >= the full
    solution, e.g. 18 at num_operands 6)."""
    num_operands: int = 3
    """Embedded task: numbers per sum (chain: steps, the response-length knob, e.g. 20 -> 65 tokens, 84 -> 257)."""
    max_operand: int = 9
    """Embedded arithmetic task: largest operand (chain digits are 0-9)."""
    sft_steps: int | None = None
    """Embedded warm start: SFT steps (cached by config hash in cache_dir); None: 400 for arithmetic, 8000 for chain
    (at 4000 the chain's digits are 87% right and held-out accuracy is near chance; at 8000, 100% and 0.5)."""
    sft_lr: float = 3e-3
    """Embedded warm start: SFT learning rate."""
    sft_batch_size: int = 32
    """Embedded warm start: SFT batch size."""
    sft_label_noise: float = 0.5
    """Embedded warm start: fraction of demonstrations whose boxed answer is wrong (makes the policy uncertain)."""
    sft_seed: int = 0
    """Embedded warm start: seed (kept apart from `seed` so all RL seeds share one warm start)."""

    # --- run management
    seed: int = 0
    """Seed of prompt order, sampling and anything else random in RL."""
    run_dir: str | None = None
    """Output directory: config.yaml, metrics.jsonl, TensorBoard events, plots, checkpoints; None = runs/<method>.
    A directory left by a run that stopped before its first checkpoint is reused (the new run says so)."""
    overwrite_output_dir: bool = False
    """Replace the run already in run_dir (TRL's name): its config, metrics, events, checkpoints and final model are
    deleted when the new run starts; other files in run_dir are kept. Without it, a run dir with a checkpoint is
    refused (continue it with --resume, or choose another run_dir)."""
    cache_dir: str = "~/.cache/vespo"
    """Where warm-started embedded models are cached."""
    resume: bool = False
    """Continue from run_dir's last checkpoint (same result as an uninterrupted run); the config must match the saved
    run_dir/config.yaml except for bookkeeping fields (logging, progress, threads, save/eval frequency)."""
    allow_change: tuple[Literal["total_training_steps"], ...] = ()
    """On --resume, fields allowed to differ from the saved config; only total_training_steps (to train longer)."""
    save_every: int = 25
    """Checkpoint every this many rollout steps (and at the end)."""
    save_total_limit: int = 1
    """Checkpoints kept (TRL's name): 1 keeps run_dir/checkpoints/last.pt only; K > 1 also keeps the last K saves as
    checkpoints/step_<step>.pt (hard links where the file system allows, so the newest costs no extra space)."""
    eval_every: int = 20
    """Held-out evaluation every this many rollout steps (and at the start and end); 0 disables it."""
    eval_size: int = 200
    """Held-out prompts per evaluation, sampled at `temperature`: the first eval_size of `eval_dataset`, or of the
    embedded task's fixed held-out pool (500 sums for arithmetic, 1000 for chain/scratchpad; the training set and
    the warm start do not depend on it)."""
    eval_top_p: float | None = None
    """Nucleus mass of held-out sampling; None: the training `top_p`. The official VESPO evaluation samples at 0.7
    (its scripts' val_kwargs; docs/paper_regime.md)."""
    eval_n: int = 1
    """Samples per held-out prompt: the logged eval/accuracy is avg@eval_n, whose binomial SD is about
    sqrt(p (1 - p) / (eval_size * eval_n)) (0.011 at 500 prompts x 4 and p = 0.5; 0.035 at 200 x 1)."""
    num_threads: int | None = None
    """torch CPU threads per process; None chooses them at start (`default_num_threads`: 1 for the embedded model,
    else the free cores, at most 4 for a model under 400 MB) and says so on stderr."""
    tensorboard: bool = True
    """Write TensorBoard events to run_dir/tb."""
    wandb_project: str | None = None
    """Also log to Weights & Biases (if installed) under this project."""
    trackio_project: str | None = None
    """Also log to trackio (if installed) under this project."""
    progress: bool = True
    """Show progress bars on stderr: training (live reward and response length, and after the first step one line
    estimating the time the run still needs) and each held-out evaluation (problems done, time left)."""
    log_completions: bool = False
    """Log sampled completions (TRL's name): prompt, completion, reward and advantage of the first
    `num_completions_to_print` rows of every rollout step, to run_dir/completions.jsonl and a TensorBoard text table."""
    num_completions_to_print: int = 8
    """Rows per rollout step that `log_completions` writes."""

    @property
    def num_mini_batches(self) -> int:
        """The staleness ratio N = train_batch_size / ppo_mini_batch_size."""
        return self.train_batch_size // self.ppo_mini_batch_size

    @property
    def sampling(self) -> SamplingSettings:
        """What the generation engine gets of this config (training rollouts; held-out evaluation shares all but n
        and the logit noise)."""
        from vespo.rollout.types import SamplingSettings

        return SamplingSettings(
            n=self.rollout_n,
            max_new_tokens=self.max_response_length,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            logit_noise_std=self.rollout_logit_noise,
            dtype=self.sampler_dtype,
        )


FIELD_TYPES = typing.get_type_hints(TrainConfig, include_extras=False)


def default_reward_fn(dataset: str) -> str:
    """The reward `reward_fn: null` stands for: the task's own verifier for reasoning-gym, Math-Verify otherwise."""
    return f"vespo.rewards:{'reasoning_gym' if is_reasoning_gym(dataset) else 'math'}_reward"


def reward_spec(cfg: TrainConfig) -> str:
    """The `module:function` reward of a run (`reward_fn`, or the dataset's default when it is null)."""
    return cfg.reward_fn or default_reward_fn(cfg.dataset)


def resolve(cfg: TrainConfig) -> TrainConfig:
    """Check every field's type and range (`check_values`), apply the `staleness` shortcut and the default run dir,
    then check the whole (`check_consistency`): the one validation of a run config, before any compute."""
    check_values(cfg)
    if cfg.run_dir is None:
        cfg = dataclasses.replace(cfg, run_dir=f"runs/{cfg.method}")
    if cfg.reward_fn is None:
        cfg = dataclasses.replace(cfg, reward_fn=default_reward_fn(cfg.dataset))
    if cfg.staleness is not None:
        _check_range("staleness", cfg.staleness, "[1, inf)")
        implied = cfg.staleness * cfg.ppo_mini_batch_size
        if cfg.train_batch_size not in (implied, TrainConfig.train_batch_size):
            raise ConfigError(
                f"staleness={cfg.staleness} sets train_batch_size = staleness x ppo_mini_batch_size = {implied}, but "
                f"train_batch_size={cfg.train_batch_size} was also given: give one of the two"
            )
        cfg = dataclasses.replace(cfg, train_batch_size=cfg.staleness * cfg.ppo_mini_batch_size, staleness=None)
    check_consistency(cfg)
    return cfg


# ----------------------------------------------------------------------------------------------------------------
# Types: every field against its annotation (YAML values and API callers; tyro checks the command line itself)


def describe_type(hint: object) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return f"one of {list(args)}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else describe_type(a) for a in args)
    if origin is tuple:
        return "a list" if args[-1] is Ellipsis else f"a list of {len(args)} {describe_type(args[0])}s"
    if origin is dict:
        return "a mapping of names to values"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


def conforms(value: object, hint: object) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is tuple:
        if not isinstance(value, (tuple, list)):
            return False
        if args[-1] is Ellipsis:
            return all(conforms(v, args[0]) for v in value)
        return len(value) == len(args) and all(conforms(v, a) for v, a in zip(value, args, strict=True))
    if origin is dict:
        return isinstance(value, dict) and all(isinstance(k, str) and conforms(v, args[1]) for k, v in value.items())
    raise TypeError(f"no type check for {hint}")


def check_types(cfg: TrainConfig) -> None:
    """Raise ConfigError naming the first field whose value does not have its annotated type (a YAML "false" is a
    string, not a boolean)."""
    for name, hint in FIELD_TYPES.items():
        value = getattr(cfg, name)
        if not conforms(value, hint):
            raise ConfigError(f"{name} must be {describe_type(hint)}, got {short_repr(value)}")


# ----------------------------------------------------------------------------------------------------------------
# Values: ranges, registry hyperparameters, reward function, paths


def _check_range(name: str, value: float, interval: str | Interval) -> None:
    """`value` is finite and inside `interval` (`vespo.intervals.Interval`, as the loss registry writes ranges)."""
    message = (interval if isinstance(interval, Interval) else Interval(interval)).violation(name, value)
    if message is not None:
        raise ConfigError(message)


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
    """torch threads per process when `num_threads` is None, and why (one phrase for the start-up line).

    The embedded model (~0.15M parameters) runs fastest on one thread: its matrices are 64 wide, so more threads only
    add synchronisation, and on a busy machine each one waits for a core (`vespo train --total-training-steps 10
    --eval-every 0` on 2 cores at load 5-6: 21-25 s wall on one thread, 63-67 s on torch's default of two). Other
    models get the free cores (usable cores minus the 1-minute load average, at least 1), at most
    `SMALL_MODEL_THREADS` below `SMALL_MODEL_BYTES` of weights, shared between the learner and the async samplers."""
    if cfg.model == EMBEDDED:
        return 1, "1 torch thread (the embedded model runs fastest on one)"
    usable = _usable_cores()
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        load = 0.0
    free = max(1, usable - round(load))
    processes = 1 + (cfg.num_samplers if cfg.mode == "async" else 0)
    size = _policy_bytes(cfg.model, "float32")
    cap = SMALL_MODEL_THREADS if 0 < size < SMALL_MODEL_BYTES else usable
    threads = max(1, min(free // processes, cap))
    where = f"{free} of {usable} usable cores free at load {load:.1f}" + (f", {processes} processes" * (processes > 1))
    small = f", a {size / 2**20:.0f} MB model" if cap == SMALL_MODEL_THREADS else ""
    return threads, f"{threads} torch thread{'s' * (threads > 1)} per process ({where}{small})"


# accepted interval (`vespo.intervals.Interval`, or (interval, reason) where the bound is not the obvious one) ->
# the fields it applies to; None values are skipped. Reasons and measurements: docs/training.md, "Configuration".
# fmt: off
_RANGES_BY_INTERVAL: dict[str | tuple[str, str], tuple[str, ...]] = {
    "[0, inf)": ("warmup_steps", "top_k", "max_staleness", "sft_steps", "eval_every", "probe_every"),
    "[1, inf)": ("train_batch_size", "ppo_mini_batch_size", "micro_batch_size", "total_training_steps", "lora_r",
                 "ess_alarm_patience", "max_response_length", "sync_every", "max_operand", "sft_batch_size",
                 "save_every", "save_total_limit", "eval_size", "eval_n", "num_threads", "num_completions_to_print"),
    "(0, inf)": ("lora_alpha", "grad_clip", "target_kl"),
    "[0, 1]": ("warmup_ratio", "ess_alarm"),
    "[0, 1)": ("lora_dropout", "sft_label_noise"),
    "[2, inf)": ("num_operands",),
    ("(0, 1]", "an optimizer step moves each weight by about lr; near 1e38 Adam's step overflows float32"):
        ("lr", "sft_lr"),
    ("[0, 1]", "each step multiplies the weights by 1 - lr * weight_decay"): ("weight_decay",),
    ("[1.2e-38, inf)", "a smaller epsilon rounds to 0 in float32, and a weight with a zero gradient gets the update "
     "0/0 = NaN"): ("adam_epsilon",),
    ("[0, 1000]", "the policy-gradient term is O(1) per token, so 1000 trains the regulariser alone; from ~1e19 the "
     "gradient overflows float32 and every update is skipped"): ("kl_coef", "entropy_coeff"),
    ("[0.01, inf)", "vLLM raises lower temperatures to 0.01; below it float32 rounding of the logits grows into "
     "log-ratio errors above 0.01, and below ~1e-37 logits / temperature overflow"): ("temperature",),
    ("[1e-06, 1]", "a smaller nucleus is always the single most likely token, i.e. greedy decoding with identical "
     "responses per group; below ~1e-45 it rounds to 0 in float32 and the nucleus is empty"): ("top_p", "eval_top_p"),
    ("[0, 100]", "logits are of order 10, so std 100 already samples at random; near 1e37 the logits overflow "
     "float32"): ("rollout_logit_noise",),
    (f"[1, {_usable_cores()}]", "one sampler process per usable CPU core, each with its own copy of the policy"):
        ("num_samplers",),
}
# fmt: on
_RANGES = {
    name: Interval(*((key,) if isinstance(key, str) else key))
    for key, names in _RANGES_BY_INTERVAL.items()
    for name in names
}


def check_values(cfg: TrainConfig) -> None:
    """Types and numeric ranges of every field (no registry, file or import look-ups): also applied to a saved
    config.yaml on --resume."""
    check_types(cfg)
    for name, interval in _RANGES.items():
        if getattr(cfg, name) is not None:
            _check_range(name, getattr(cfg, name), interval)
    for i, beta in enumerate(cfg.betas):
        _check_range(f"betas[{i}]", beta, "[0, 1)")


BUILTIN_METHODS = ("aipo", "bapo", "cispo", "grpo", "gspo", "m2po", "opsm", "reinforce", "sapo", "topr", "vcpo",
                   "vespo", "vespo_ess", "vespo_moment", "vespo_schedule", "vespo_selfnorm")  # fmt: skip
"""The methods importing `vespo.losses` registers (tests/test_cli.py holds them equal to the registry's)."""


def known_methods() -> list[str]:
    """The registry's methods (`vespo.available_methods()`). Before `vespo.losses` is imported nothing can have
    registered another, so they are `BUILTIN_METHODS`: the command line refuses an unknown --method without torch."""
    if "vespo.losses" not in sys.modules:
        return sorted(BUILTIN_METHODS)
    from vespo.losses import available_methods

    return available_methods()


def check_consistency(cfg: TrainConfig) -> None:
    """What `check_values` cannot see field by field: batch geometry, the method, output paths and data sources
    first (no heavy import: a bad flag is answered at once), then the registry's hyperparameters, the task, hardware
    and async settings, the model and the reward (these import torch, as the run will)."""
    if cfg.rollout_n < 2:
        raise ConfigError(
            f"rollout_n must be >= 2, got {cfg.rollout_n}: advantages are relative to the group of responses to one "
            "prompt (R - mean R), so a group of 1 gives every advantage 0 and nothing is learned"
        )
    if cfg.train_batch_size % cfg.ppo_mini_batch_size:
        raise ConfigError(
            f"ppo_mini_batch_size={cfg.ppo_mini_batch_size} must divide "
            f"train_batch_size={cfg.train_batch_size} (staleness N = train_batch_size / mini-batch)"
        )
    if cfg.method not in known_methods():
        raise ConfigError(f"method: unknown method {cfg.method!r}; known methods: {known_methods()}")
    for name in ("run_dir", "cache_dir"):
        if getattr(cfg, name) is not None:  # run_dir None is filled in by `resolve`
            check_output_dir(name, getattr(cfg, name))
    if cfg.resume and cfg.overwrite_output_dir:
        raise ConfigError("resume and overwrite_output_dir exclude each other: continue the run, or replace it")
    for name in ("dataset", "eval_dataset"):
        check_dataset(name, getattr(cfg, name))
    from vespo.losses import rollout_correction, validate_hparams
    from vespo.rewards.batch import load_reward_fn

    try:
        validate_hparams(cfg.method, **cfg.hparams)
    except ValueError as exc:
        raise ConfigError(f"hparams: {exc}") from None
    if cfg.step_scale == "mean_phi" and rollout_correction(cfg.method) != "fold":
        raise ConfigError(
            f"step_scale=mean_phi needs a VESPO-family method (it scales by the mean phi(W)); {cfg.method!r} has none"
        )
    if cfg.adv_estimator == "opob" and (cfg.mode != "sync" or cfg.shuffle):
        raise ConfigError(
            "adv_estimator=opob recomputes each mini-batch's baseline from whole groups at its weights: it needs "
            f"mode=sync and shuffle=false, got mode={cfg.mode}, shuffle={cfg.shuffle}"
        )
    _validate_task(cfg)
    _validate_hardware(cfg)
    _validate_async(cfg)
    check_model(cfg.model)
    try:
        load_reward_fn(reward_spec(cfg))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


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


def check_model(value: str) -> None:
    """`model` is "embedded", an existing model directory, or a Hub id (`vespo.models.check_model_source`)."""
    if value == EMBEDDED:
        return
    from vespo.models import check_model_source

    try:
        check_model_source(value)
    except ValueError as exc:
        raise ConfigError(f"model: {exc}") from None


def check_dataset(name: str, value: str | None) -> None:
    """A local data file (.json / .jsonl / .parquet, or any existing path) must exist; other names are Hub ids or
    named sets; a reasoning-gym spec must name installed tasks and their config fields."""
    if value is None or value == EMBEDDED:
        return
    if is_reasoning_gym(value):
        try:
            parse_spec(value)
        except ValueError as exc:
            raise ConfigError(f"{name}: {exc}") from None
        return
    local = value.endswith((".json", ".jsonl", ".parquet"))
    if not local:
        from vespo.models import looks_local  # imports torch: a data file's name is answered without it

        local = looks_local(value)
    if local:
        if not Path(value).expanduser().is_file():
            raise ConfigError(f"{name}: file not found: {value}")


def _validate_task(cfg: TrainConfig) -> None:
    if cfg.dataset == EMBEDDED:  # the held-out set is the first eval_size of the task's fixed pool
        from vespo.embedded.task import check_eval_size

        shape = {"num_operands": cfg.num_operands, "max_operand": cfg.max_operand}
        try:
            check_eval_size(cfg.task, eval_size=cfg.eval_size, **shape)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if cfg.task == "scratchpad" and cfg.dataset == EMBEDDED:
        from vespo.embedded.task import scratchpad_response_tokens

        need = scratchpad_response_tokens(cfg.num_operands, cfg.max_operand)
        if cfg.max_response_length < need:
            raise ConfigError(
                f"task=scratchpad with num_operands={cfg.num_operands}, max_operand={cfg.max_operand} needs "
                f"max_response_length >= {need} (every running sum written out), got {cfg.max_response_length}"
            )
    if cfg.task == "chain" and cfg.dataset == EMBEDDED:
        from vespo.embedded.task import chain_response_tokens

        need = chain_response_tokens(cfg.num_operands)
        if cfg.num_operands < 2 or cfg.max_response_length < need:
            raise ConfigError(
                f"task=chain with num_operands={cfg.num_operands} needs num_operands >= 2 and "
                f"max_response_length >= {need} (3 * num_operands + 5), got {cfg.max_response_length}"
            )


def _validate_hardware(cfg: TrainConfig) -> None:
    from vespo.models import resolve_device

    try:
        resolve_device(cfg.device)
    except ValueError as exc:
        raise ConfigError(f"device: {exc}") from None
    if cfg.bf16 and cfg.fp16:
        raise ConfigError("bf16 and fp16 are exclusive: choose one autocast dtype")
    if cfg.use_peft and importlib.util.find_spec("peft") is None:
        raise ConfigError("use_peft needs peft installed (pip install peft)")
    for name, package in (("wandb_project", "wandb"), ("trackio_project", "trackio")):
        if getattr(cfg, name) and importlib.util.find_spec(package) is None:
            raise ConfigError(
                f"{name} needs {package} installed (pip install {package}); without it, drop --{name.replace('_', '-')}"
                " (metrics.jsonl and TensorBoard are always written)"
            )
    if cfg.use_peft and cfg.mode == "async":
        raise ConfigError("use_peft is not supported with mode=async yet (samplers load full weights): use mode=sync")


def _validate_async(cfg: TrainConfig) -> None:
    if cfg.sampler_engine == "vllm":
        import torch

        if importlib.util.find_spec("vllm") is None or not torch.cuda.is_available():
            raise ConfigError("sampler_engine=vllm needs vLLM installed (pip install 'vespo[vllm]') and a CUDA device")
        if cfg.rollout_logit_noise > 0:
            raise ConfigError("rollout_logit_noise needs sampler_engine=hf (vLLM's sampler takes no logit noise)")
    if cfg.mode == "sync":
        if cfg.use_decoupled_loss:
            raise ConfigError("use_decoupled_loss needs mode=async (in sync mode old_log_prob is already pi_prox)")
        return
    if cfg.probe_every:
        raise ConfigError("probe_every needs mode=sync (it probes the stalest of a rollout step's mini-batches)")
    need = cfg.num_mini_batches + cfg.sync_every - 2  # a batch of N mini-batches must fit in the window
    if cfg.max_staleness < need:
        raise ConfigError(
            f"max_staleness={cfg.max_staleness} is too small: a batch of N={cfg.num_mini_batches} mini-batches with "
            f"sync_every={cfg.sync_every} needs max_staleness >= N + sync_every - 2 = {need}"
        )
    weights = _policy_bytes(cfg.model, cfg.sampler_dtype) if cfg.sampler_engine == "hf" else 0  # vLLM: on the GPU
    per_sampler, free = _SAMPLER_PROCESS_BYTES + weights, _available_memory()
    if free is not None and cfg.num_samplers * per_sampler > free:
        fit = f"at most {free // per_sampler} sampler(s) fit" if free >= per_sampler else "not even one sampler fits"
        raise ConfigError(
            f"num_samplers={cfg.num_samplers} needs about {cfg.num_samplers * per_sampler / 2**30:.1f} GiB "
            f"({per_sampler / 2**30:.2f} GiB per sampler: a process with torch and its {cfg.sampler_dtype} copy of the "
            f"policy) but {free / 2**30:.1f} GiB of memory is available: {fit}"
        )
    store, shm = _policy_bytes(cfg.model, "float32"), _shared_memory_free()  # the learner's weights, shared
    if shm is not None and store > shm:
        size = -(-(store + _SAMPLER_PROCESS_BYTES) // 2**30)  # GiB, rounded up, with room for the queues
        raise ConfigError(
            f"mode=async shares the policy's float32 weights ({store / 2**20:.0f} MiB) with the samplers through "
            f"{SHARED_MEMORY}, which has {shm / 2**20:.0f} MiB free (Docker's default is 64 MB): give it more (e.g. "
            f"docker run --shm-size={size}g) or train with mode=sync (no --async)"
        )


_SAMPLER_PROCESS_BYTES = 300 << 20  # measured: peak RSS of a sampler's imports (torch, transformers), no policy yet
SHARED_MEMORY = "/dev/shm"
"""Where torch puts the async weight store (`vespo.train.sampler.WeightStore`, `share_memory_`) on Linux."""


def _shared_memory_free() -> int | None:
    """Bytes free in `SHARED_MEMORY` for this user (statvfs); None where it does not exist (not Linux)."""
    try:
        st = os.statvfs(SHARED_MEMORY)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


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
    except (ValueError, ImportError):  # several GGUF files, a damaged one, or no gguf package: `check_model` says so
        return 0
    if not folder.is_dir():
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(model, "config.json")
        except ValueError:  # not a valid Hub id: `check_model` says so
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


def short_repr(value: object, limit: int = 60) -> str:
    """repr of a user value, cut to `limit` characters so an error message stays one short line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

"""Trainer configuration: `TrainConfig`, the settings of a run (`vespo.train.fields`), valid once built.

Building one checks all that the config itself says (`TrainConfig.__post_init__`): every field's type and range,
then the whole, the checks that need no heavy import (torch, transformers) first so that a bad flag is answered at
once. What the machine must provide (files, packages, devices, memory) is checked when a run starts
(`vespo.train.host.check_host`). `vespo.train.config_io` reads a config from YAML and the command line.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from dataclasses import dataclass
from typing import Literal

from vespo.data.limits import short_repr
from vespo.data.reasoning_gym import is_reasoning_gym, parse_spec
from vespo.intervals import Interval
from vespo.train.fields import EMBEDDED, TrainFields

if typing.TYPE_CHECKING:
    from vespo.rollout.types import SamplingSettings


class ConfigError(ValueError):
    """A bad input found before any compute: `vespo train` prints its one-line message and exits with code 2."""


@dataclass(frozen=True)
class TrainConfig(TrainFields):
    """A run's settings, valid once built: every field has its type and range, and together they make one run (batch
    geometry, the method's hyperparameters, the task, sync/async settings); ConfigError naming the field otherwise.
    None stands for a default that is filled in (`filled`): `run_dir` runs/<method>, `reward_fn` the dataset's
    reward, and `train_batch_size` 16 or N x ppo_mini_batch_size for `staleness` (--num-mini-batches) N."""

    def __post_init__(self) -> None:
        _check_values(self)
        for name, value in filled(self).items():
            object.__setattr__(self, name, value)  # frozen: set once, while it is built
        _check_consistency(self)

    def flat(self) -> dict[str, object]:
        """The settings by their flat names (the command line's and YAML's), in field order: what config.yaml holds
        and what a sweep cell's identity hashes."""
        return dataclasses.asdict(self)

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


FIELD_TYPES = typing.get_type_hints(TrainFields, include_extras=False)


DEFAULT_TRAIN_BATCH_SIZE = 16
"""Prompts per rollout step when neither train_batch_size nor N (`staleness`) is given."""


def filled(fields: TrainFields) -> dict[str, object]:
    """The values `TrainConfig` fills in for None: run_dir runs/<method>, the dataset's reward, and the rollout batch
    train_batch_size = N x ppo_mini_batch_size from N (`staleness`, then None), else `DEFAULT_TRAIN_BATCH_SIZE`.
    N and train_batch_size are two spellings of one setting: both given and disagreeing is a ConfigError."""
    n, mini, batch = fields.staleness, fields.ppo_mini_batch_size, fields.train_batch_size
    if n is not None and batch is not None and batch != n * mini:
        raise ConfigError(
            f"staleness={n} (--num-mini-batches N) sets train_batch_size = N x ppo_mini_batch_size = {n * mini}, "
            f"but train_batch_size={batch} was also given: give one of the two"
        )
    return {
        "run_dir": f"runs/{fields.method}" if fields.run_dir is None else fields.run_dir,
        "reward_fn": default_reward_fn(fields.dataset) if fields.reward_fn is None else fields.reward_fn,
        "train_batch_size": batch if batch is not None else DEFAULT_TRAIN_BATCH_SIZE if n is None else n * mini,
        "staleness": None,
    }


def default_reward_fn(dataset: str) -> str:
    """The reward `reward_fn: null` stands for: the task's own verifier for reasoning-gym, Math-Verify otherwise."""
    return f"vespo.rewards:{'reasoning_gym' if is_reasoning_gym(dataset) else 'math'}_reward"


# ----------------------------------------------------------------------------------------------------------------
# Types: every field against its annotation (YAML values and API callers; tyro checks the command line itself)


def describe_type(hint: object) -> str:
    """An annotation in words, for an error message ("an integer", "one of ['sync', 'async']", "a list")."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return f"one of {list(args)}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else describe_type(a) for a in args)
    if origin is tuple:
        if args[-1] is Ellipsis:
            return f"a list (each item {describe_type(args[0])})"
        return f"a list of {len(args)} {describe_type(args[0])}s"
    if origin is dict:
        return "a mapping of names to values"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


def conforms(value: object, hint: object) -> bool:
    """Whether `value` has the type of annotation `hint` (a bool is not an int; a list is a tuple, as YAML has no
    tuples)."""
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


# ----------------------------------------------------------------------------------------------------------------
# Values: types and ranges field by field, then the whole


def check_range(name: str, value: float, interval: str | Interval) -> None:
    """`value` is finite and inside `interval` (`vespo.intervals.Interval`, as the loss registry writes ranges)."""
    message = (interval if isinstance(interval, Interval) else Interval(interval)).violation(name, value)
    if message is not None:
        raise ConfigError(message)


SAMPLERS_REASON = "one sampler process per usable CPU core, each with its own copy of the policy"
"""Why `num_samplers` is bounded (by the usable cores, `vespo.train.host`, where a run starts)."""


# accepted interval (`vespo.intervals.Interval`, or (interval, reason) where the bound is not the obvious one) ->
# the fields it applies to; None values are skipped. Reasons and measurements: docs/guides/trainer.md, "Configuration".
# fmt: off
_RANGES_BY_INTERVAL: dict[str | tuple[str, str], tuple[str, ...]] = {
    "[0, inf)": ("warmup_steps", "top_k", "max_staleness", "sft_steps", "eval_every", "probe_every"),
    "[1, inf)": ("train_batch_size", "ppo_mini_batch_size", "micro_batch_size", "total_training_steps", "lora_r",
                 "ess_alarm_patience", "max_response_length", "sync_every", "max_operand", "sft_batch_size",
                 "save_every", "save_total_limit", "eval_size", "eval_n", "num_threads", "num_completions_to_print",
                 "staleness"),
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
    ("[1, inf)", SAMPLERS_REASON): ("num_samplers",),
    ("[0, 4294967295]", "NumPy's seed range: np.random.seed takes 32 bits"): ("seed", "sft_seed"),
}
# fmt: on
INT64_END = 2**63
"""Integer settings stay below this: torch counts and indexes in int64."""
FLOAT32_MAX = 3.402823e38
"""Real settings stay within +-this (float32's largest finite value, rounded down): they reach float32 tensors."""


def _within_dtype(name: str, interval: Interval | None) -> Interval | None:
    """`interval` (the field's own range; None: any value) with the upper end of what the field's dtype holds
    (int64 for integers, float32 for reals: `INT64_END`, `FLOAT32_MAX`); `interval` itself where that is within."""
    hint = FIELD_TYPES[name]
    scalar = typing.get_origin(hint) in (None, typing.Union, types.UnionType)  # int, or int | None
    kinds = {t for t in typing.get_args(hint) or (hint,) if t in (int, float)} if scalar else set()
    if not kinds:
        return interval
    end, close, why = ((INT64_END, ")", "torch counts and indexes in int64") if kinds == {int} else
                       (FLOAT32_MAX, "]", "it reaches float32 tensors, where a larger value is inf"))  # fmt: skip
    low, high = interval.text.split(",") if interval is not None else (f"[{-end:.7g}", "inf)")
    if float(high.strip()[:-1]) <= end:
        return interval
    return Interval(f"{low}, {end:.7g}{close}" if kinds != {int} else f"{low}, {end}{close}", why)


_RANGES = {
    name: Interval(*((key,) if isinstance(key, str) else key))
    for key, names in _RANGES_BY_INTERVAL.items()
    for name in names
}
_DTYPE_RANGES = {name: _within_dtype(name, _RANGES.get(name)) for name in FIELD_TYPES}
_DTYPE_RANGES = {k: v for k, v in _DTYPE_RANGES.items() if v is not None and v is not _RANGES.get(k)}


def _check_values(cfg: TrainFields) -> None:
    """Types (a YAML "false" is a string, not a boolean) and numeric ranges of every field, field by field: each
    number within its own range and its dtype's (`_within_dtype`)."""
    for name, hint in FIELD_TYPES.items():
        if not conforms(getattr(cfg, name), hint):
            raise ConfigError(f"{name} must be {describe_type(hint)}, got {short_repr(getattr(cfg, name))}")
    for ranges in (_RANGES, _DTYPE_RANGES):  # its own range first: below it, the message names its own bound
        for name, interval in ranges.items():
            if getattr(cfg, name) is not None:
                check_range(name, getattr(cfg, name), interval)
    for i, beta in enumerate(cfg.betas):
        check_range(f"betas[{i}]", beta, "[0, 1)")


BUILTIN_METHODS = ("aipo", "bapo", "cispo", "dppo_kl", "dppo_tv", "grpo", "gspo", "luspo", "m2po", "opsm",
                   "reinforce", "sapo", "topr", "vcpo", "vespo", "vespo_ess", "vespo_moment", "vespo_schedule",
                   "vespo_selfnorm")  # fmt: skip
"""The methods importing `vespo.losses` registers (tests/test_cli.py holds them equal to the registry's)."""


def known_methods() -> list[str]:
    """The registry's methods (`vespo.available_methods()`). Before `vespo.losses` is imported nothing can have
    registered another, so they are `BUILTIN_METHODS`: the command line refuses an unknown --method without torch."""
    if "vespo.losses" not in sys.modules:
        return sorted(BUILTIN_METHODS)
    from vespo.losses import available_methods

    return available_methods()


def _check_consistency(cfg: TrainConfig) -> None:
    """What `_check_values` cannot see field by field: batch geometry, the method and the data sources' names first (no
    heavy import: a bad flag is answered at once), then the registry's hyperparameters, the task and the precision,
    LoRA and async settings (these import torch, as the run will)."""
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
    if cfg.resume and cfg.overwrite_output_dir:
        raise ConfigError("resume and overwrite_output_dir exclude each other: continue the run, or replace it")
    for name in ("dataset", "eval_dataset"):  # reasoning-gym: installed tasks and their config fields
        if getattr(cfg, name) is not None and is_reasoning_gym(getattr(cfg, name)):
            try:
                parse_spec(getattr(cfg, name))
            except ValueError as exc:
                raise ConfigError(f"{name}: {exc}") from None
    from vespo.embedded.task import check_task
    from vespo.losses import rollout_correction, validate_hparams

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
    if cfg.dataset == EMBEDDED:
        shape = {"num_operands": cfg.num_operands, "max_operand": cfg.max_operand}
        try:
            check_task(cfg.task, eval_size=cfg.eval_size, max_response_length=cfg.max_response_length, **shape)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if cfg.bf16 and cfg.fp16:
        raise ConfigError("bf16 and fp16 are exclusive: choose one autocast dtype")
    if cfg.use_peft and cfg.mode == "async":
        raise ConfigError("use_peft is not supported with mode=async yet (samplers load full weights): use mode=sync")
    _check_async(cfg)


def _check_async(cfg: TrainConfig) -> None:
    """The engine's and the async loop's settings (`vespo.train.host` checks that the machine can run them)."""
    if cfg.sampler_engine == "vllm" and cfg.rollout_logit_noise > 0:
        raise ConfigError("rollout_logit_noise needs sampler_engine=hf (vLLM's sampler takes no logit noise)")
    if cfg.bypass_mode and cfg.use_decoupled_loss:
        raise ConfigError(
            "bypass_mode and use_decoupled_loss are exclusive: bypass takes the sampler's log-probs as "
            "old_log_prob, the decoupled loss the learner's"
        )
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

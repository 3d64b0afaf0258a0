"""The field-by-field checks every settings section runs when it is built (`check_fields`): each field against its
annotation, then its numeric range and its dtype's; a bad value is a `ConfigError` naming the field by its flat name
(the command line's and YAML's). No heavy import: a bad flag is answered at once.
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Literal

from vespo.data.limits import short_repr
from vespo.intervals import Interval


class ConfigError(ValueError):
    """A bad input found before any compute: `vespo train` prints its one-line message and exits with code 2."""


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
    "[0, 1)": ("lora_dropout", "sft_label_noise", "betas"),
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
_RANGES = {
    name: Interval(*((key,) if isinstance(key, str) else key))
    for key, names in _RANGES_BY_INTERVAL.items()
    for name in names
}


def _within_dtype(hint: object, interval: Interval | None) -> Interval | None:
    """`interval` (the field's own range; None: any value) with the upper end of what the field's dtype (`hint`)
    holds (int64 for integers, float32 for reals: `INT64_END`, `FLOAT32_MAX`); None where `interval` is within."""
    scalar = typing.get_origin(hint) in (None, typing.Union, types.UnionType)  # int, or int | None
    kinds = {t for t in typing.get_args(hint) or (hint,) if t in (int, float)} if scalar else set()
    if not kinds:
        return None
    end, close, why = ((INT64_END, ")", "torch counts and indexes in int64") if kinds == {int} else
                       (FLOAT32_MAX, "]", "it reaches float32 tensors, where a larger value is inf"))  # fmt: skip
    low, high = interval.text.split(",") if interval is not None else (f"[{-end:.7g}", "inf)")
    if float(high.strip()[:-1]) <= end:
        return None
    return Interval(f"{low}, {end:.7g}{close}" if kinds != {int} else f"{low}, {end}{close}", why)


@functools.cache
def _checks(section: type) -> tuple[dict[str, object], dict[str, Interval], dict[str, Interval]]:
    """(annotation, own range, dtype range) of each field of a settings dataclass, by field name."""
    hints = typing.get_type_hints(section)
    own = {name: _RANGES[name] for name in hints if name in _RANGES}
    dtype = {name: _within_dtype(hint, own.get(name)) for name, hint in hints.items()}
    return hints, own, {name: interval for name, interval in dtype.items() if interval is not None}


def check_fields(section: object) -> None:
    """Types (a YAML "false" is a string, not a boolean) and numeric ranges of every field of a settings dataclass,
    field by field: each number within its own range and its dtype's; a tuple of numbers (betas) item by item."""
    hints, own, dtype = _checks(type(section))
    for name, hint in hints.items():
        if not conforms(getattr(section, name), hint):
            raise ConfigError(f"{name} must be {describe_type(hint)}, got {short_repr(getattr(section, name))}")
    for ranges in (own, dtype):  # its own range first: below it, the message names its own bound
        for name, interval in ranges.items():
            value = getattr(section, name)
            if isinstance(value, (tuple, list)):
                for i, item in enumerate(value):
                    check_range(f"{name}[{i}]", item, interval)
            elif value is not None:
                check_range(name, value, interval)


def fill(section: object, **values: object) -> None:
    """Set fields of a frozen settings dataclass while it is built (its `__post_init__`): the values its None
    defaults stand for."""
    for name, value in values.items():
        object.__setattr__(section, name, value)

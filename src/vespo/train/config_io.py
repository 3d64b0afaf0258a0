"""Reading and writing a `TrainConfig`: strict YAML (`--config`, a run's config.yaml) and the `vespo train` command
line, both by the flat field names, and through `vespo.train.dialects` veRL's nested keys and TRL's names. Each
reads into `TrainFields` and builds the `TrainConfig` once at the end, which checks it.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import yaml

from vespo.argv import UsageError, from_text, given_fields, nearest, parse_flags
from vespo.data.limits import short_repr
from vespo.train.config import FIELD_TYPES, ConfigError, TrainConfig, conforms, describe_type
from vespo.train.dialects import TRL_NAMES, TRL_REFUSED, from_trl, from_verl_keys, take_trl_flags
from vespo.train.fields import TrainFields


def to_yaml(cfg: TrainConfig, **changes: object) -> str:
    """The config as YAML (the run dir's config.yaml; loadable with `--config`), with `changes` to fields of it (what
    a run saves of itself: the thread count it chose, not the flags that only started it)."""
    data = cfg.flat() | changes
    data["betas"], data["allow_change"] = list(data["betas"]), list(data["allow_change"])
    return yaml.safe_dump(data, sort_keys=False)


_YAML_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")  # PyYAML reads `1e-3` (no dot) as a string
_YAML_MAX_BYTES = 1 << 20  # a config is a few KB; a larger file (or /dev/zero) is refused before parsing


class _AliasRefused(yaml.MarkedYAMLError):
    """A YAML alias, refused while the document is composed: a few hundred bytes of nested aliases ("billion laughs")
    would otherwise expand into gigabytes once walked, printed or type-checked."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases (`*name`) and a key given twice in one mapping (PyYAML silently keeps the
    last)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            alias = self.peek_event()
            problem = f"YAML aliases are not accepted (*{alias.anchor} repeats anchor &{alias.anchor}); write it out"
            raise _AliasRefused(problem=problem, problem_mark=alias.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, typing.Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            if isinstance(key, typing.Hashable):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path, label: str) -> object:
    """Parse a YAML file: UTF-8, at most 1 MiB, no aliases, no duplicate keys; any problem is a one-line ConfigError
    starting with `label` and the path (and line, for syntax errors and aliases)."""
    try:
        with open(Path(path).expanduser(), "rb") as f:
            raw = f.read(_YAML_MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read {path} ({exc.strerror or exc})") from None
    if len(raw) > _YAML_MAX_BYTES:
        raise ConfigError(f"{label} {path}: larger than {_YAML_MAX_BYTES >> 20} MiB; not a config file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{label} {path}: not UTF-8 text (byte {raw[exc.start]:#x} at offset {exc.start})") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        kind = "" if isinstance(exc, _AliasRefused) else " YAML syntax error:"
        raise ConfigError(f"{label} {path}:{where}{kind} {problem}") from None
    except RecursionError:
        raise ConfigError(f"{label} {path}: nested too deeply to be a config") from None


def load_yaml(path: str | Path, label: str = "--config") -> dict:
    """Read a YAML config: keys must be TrainConfig fields and values of the field's type (ConfigError otherwise).
    Lists become tuples, so the result can be passed to TrainConfig as is."""
    data = read_yaml(path, label)
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{label} {path}: expected a mapping of TrainConfig fields, got {type(data).__name__}")
    data = from_verl_keys(data, where=f"{label} {path}")
    unknown = sorted(set(data) - set(FIELD_TYPES), key=str)
    if unknown:
        near = [n for key in unknown for n in nearest(str(key), FIELD_TYPES)]
        hint = f"; nearest: {', '.join(dict.fromkeys(near))}" if near else ""
        raise ConfigError(f"{label} {path}: unknown config key(s) {unknown}{hint}")
    for name, value in data.items():
        hint = FIELD_TYPES[name]
        if isinstance(value, str) and _YAML_FLOAT.match(value):  # the one YAML string read as a value: a float
            value = data[name] = from_text(value, hint)
        if not conforms(value, hint):
            raise ConfigError(f"{label} {path}: {name} must be {describe_type(hint)}, got {short_repr(value)}")
        if isinstance(value, list):
            data[name] = tuple(value)
    return data


def parse_args(argv: list[str]) -> TrainConfig:
    """`[--config file.yaml] [flags]` -> TrainConfig (checked when built; `parse_fields`)."""
    return TrainConfig(**vars(parse_fields(argv)))


def parse_fields(argv: list[str]) -> TrainFields:
    """`[--config file.yaml] [flags]` -> the fields given, unchecked; flags override the YAML file. TRL's names
    (`TRL_NAMES`) are read as their vespo fields; any flag that cannot be read is a one-line ConfigError."""
    argv = [tok for a in argv for tok in (("--mode", "async") if a == "--async" else (a,))]  # `--async` shortcut
    defaults, yaml_keys = TrainFields(), set()
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise ConfigError("--config needs a YAML file path")
        fields = load_yaml(argv[i + 1])
        defaults, yaml_keys = TrainFields(**fields), set(fields)
        del argv[i : i + 2]
    argv, trl = take_trl_flags(argv)
    try:
        cfg = parse_flags(TrainFields, argv, default=defaults, prog="vespo train", description=_DESCRIPTION,
                          also=_READ_HERE)  # fmt: skip
    except UsageError as exc:
        raise ConfigError(str(exc)) from None
    flags = given_fields(TrainFields, argv)
    for flag, spelt in (("staleness", "train_batch_size"), ("train_batch_size", "staleness")):  # two spellings of N
        if flag in flags and spelt in yaml_keys - flags:  # the flag overrides the file's other spelling
            cfg, yaml_keys = dataclasses.replace(cfg, **{spelt: None}), yaml_keys - {spelt}
    given = yaml_keys | flags
    cfg = from_trl(cfg, trl, given)
    return dataclasses.replace(cfg, hparams=cfg.hparams | _typed_hparams(cfg.method, argv))


_READ_HERE = ("--config", "--async", *(f"--{name}" for name in (*TRL_NAMES, *TRL_REFUSED)))
"""Flags `parse_args` reads itself, before tyro (named in the nearest-flag hints of a typo)."""
_DESCRIPTION = (
    "RL-train a causal LM with any vespo policy loss (no arguments: the embedded task). --config FILE.yaml sets "
    "defaults that flags override (vespo's flat keys, or veRL's nested actor_rollout_ref.* / data.* / trainer.* "
    "keys); --async is short for --mode async. TRL's names are accepted: --output-dir (--run-dir), --num-generations "
    "(--rollout-n), --per-device-train-batch-size (completions per optimizer step: --ppo-mini-batch-size x "
    "rollout_n), --max-completion-length, --learning-rate, --beta (--kl-coef), --max-grad-norm, "
    "--steps-per-generation (--num-mini-batches), --max-steps (optimizer steps: --total-training-steps x N)."
)


def _typed_hparams(method: str, argv: list[str]) -> dict[str, object]:
    """`--hparams name value ...` typed by the method's own signature (`vespo.losses.parse_hparam`: `ratio_min None`
    is None), not by the command-line parser's guess; names the method does not have are left to validation."""
    if "--hparams" not in argv:
        return {}
    from vespo.losses import available_methods, method_hparams, parse_hparam

    if method not in available_methods():
        return {}
    values = argv[argv.index("--hparams") + 1 :]
    values = values[: next((i for i, v in enumerate(values) if v.startswith("--")), len(values))]
    pairs = dict(zip(values[::2], values[1::2], strict=False))
    known = method_hparams(method)
    return {k: parse_hparam(method, k, v) for k, v in pairs.items() if k in known}

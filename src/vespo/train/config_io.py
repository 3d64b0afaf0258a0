"""Reading and writing a `TrainConfig`: strict YAML (`--config`, a run's config.yaml), veRL's nested keys, and the
`vespo train` command line. Every path ends in `vespo.train.config.resolve`, the one validation, run once.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import tyro
import yaml

from vespo.losses import available_methods, method_hparams, parse_hparam
from vespo.train.config import FIELD_TYPES, ConfigError, TrainConfig, conforms, describe_type, resolve, short_repr


def to_yaml(cfg: TrainConfig) -> str:
    """The config as YAML (the run dir's config.yaml; loadable with `--config`)."""
    data = dataclasses.asdict(cfg)
    data["betas"], data["allow_change"] = list(cfg.betas), list(cfg.allow_change)
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
        raise ConfigError(f"{label} {path}: unknown config key(s) {unknown}")
    for name, value in data.items():
        hint = FIELD_TYPES[name]
        if isinstance(value, str) and _YAML_FLOAT.match(value) and conforms(1.0, hint):
            value = data[name] = float(value)
        if not conforms(value, hint):
            raise ConfigError(f"{label} {path}: {name} must be {describe_type(hint)}, got {short_repr(value)}")
        if isinstance(value, list):
            data[name] = tuple(value)
    return data


# veRL's config paths (ppo_trainer.yaml) -> vespo fields; a veRL user's YAML, nested or with dotted keys, works as is
VERL_KEYS = {
    "data.train_files": "dataset",
    "data.val_files": "eval_dataset",
    "data.prompt_key": "prompt_key",
    "data.train_batch_size": "train_batch_size",
    "data.max_response_length": "max_response_length",
    "actor_rollout_ref.model.path": "model",
    "actor_rollout_ref.model.enable_gradient_checkpointing": "gradient_checkpointing",
    "actor_rollout_ref.model.lora_rank": "lora_r",
    "actor_rollout_ref.model.lora_alpha": "lora_alpha",
    "actor_rollout_ref.model.target_modules": "lora_target_modules",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "micro_batch_size",
    "actor_rollout_ref.actor.loss_agg_mode": "loss_agg_mode",
    "actor_rollout_ref.actor.policy_loss.loss_mode": "method",
    "actor_rollout_ref.actor.entropy_coeff": "entropy_coeff",
    "actor_rollout_ref.actor.kl_loss_coef": "kl_coef",
    "actor_rollout_ref.actor.grad_clip": "grad_clip",
    "actor_rollout_ref.actor.shuffle": "shuffle",
    "actor_rollout_ref.actor.optim.lr": "lr",
    "actor_rollout_ref.actor.optim.weight_decay": "weight_decay",
    "actor_rollout_ref.actor.optim.lr_warmup_steps": "warmup_steps",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": "warmup_ratio",
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "lr_scheduler_type",
    "actor_rollout_ref.rollout.n": "rollout_n",
    "actor_rollout_ref.rollout.temperature": "temperature",
    "actor_rollout_ref.rollout.top_p": "top_p",
    "actor_rollout_ref.rollout.response_length": "max_response_length",
    "algorithm.norm_adv_by_std_in_grpo": "norm_adv_by_std",
    "trainer.total_training_steps": "total_training_steps",
    "trainer.save_freq": "save_every",
    "trainer.test_freq": "eval_every",
    "trainer.default_local_dir": "run_dir",
}
VERL_HPARAMS = {f"actor_rollout_ref.actor.{k}": k for k in ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c")}
_VERL_ROOTS = ("data", "actor_rollout_ref", "algorithm", "trainer")


def from_verl_keys(data: dict, *, where: str) -> dict:
    """Translate veRL's nested sections or dotted keys (`actor_rollout_ref.actor.ppo_mini_batch_size: 16`) into
    vespo fields (`VERL_KEYS`; clip ratios go to `hparams`, `use_kl_loss: false` zeroes `kl_coef`); flat vespo keys
    pass through. A veRL key vespo has no counterpart for is one clear error, not silently dropped."""
    flat: dict = {}

    def walk(prefix: str, node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}.{key}", value)
        else:
            flat[prefix] = node

    out: dict = {}
    for key, value in data.items():
        if isinstance(key, str) and key.split(".")[0] in _VERL_ROOTS:
            walk(key, value)
        else:
            out[key] = value
    use_kl = flat.pop("actor_rollout_ref.actor.use_kl_loss", True)
    for key, value in flat.items():
        if key in VERL_HPARAMS:
            out["hparams"] = {**out.get("hparams", {}), VERL_HPARAMS[key]: value}
            continue
        if key not in VERL_KEYS:
            raise ConfigError(f"{where}: veRL key {key} has no vespo counterpart; vespo reads {sorted(VERL_KEYS)}")
        name = VERL_KEYS[key]
        if name in out and out[name] != value:
            raise ConfigError(f"{where}: {key} sets {name}={value!r}, which is also set to {out[name]!r}")
        out[name] = value
        if name == "lora_r" and value:
            out["use_peft"] = True
    if use_kl is False:
        out["kl_coef"] = 0.0
    return out


def parse_args(argv: list[str]) -> TrainConfig:
    """`[--config file.yaml] [flags]` -> resolved, validated TrainConfig; flags override the YAML file."""
    argv = [tok for a in argv for tok in (("--mode", "async") if a == "--async" else (a,))]  # `--async` shortcut
    defaults = TrainConfig()
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise ConfigError("--config needs a YAML file path")
        defaults = TrainConfig(**load_yaml(argv[i + 1]))
        del argv[i : i + 2]
    cfg = tyro.cli(
        TrainConfig,
        args=argv,
        default=defaults,
        prog="vespo train",
        description=(
            "RL-train a causal LM with any vespo policy loss (no arguments: the embedded task). "
            "--config FILE.yaml sets defaults that flags override (vespo's flat keys, or veRL's nested "
            "actor_rollout_ref.* / data.* / trainer.* keys); --async is short for --mode async."
        ),
    )
    return resolve(dataclasses.replace(cfg, hparams=cfg.hparams | _typed_hparams(cfg.method, argv)))


def _typed_hparams(method: str, argv: list[str]) -> dict[str, object]:
    """`--hparams name value ...` typed by the method's own signature (`vespo.losses.parse_hparam`: `ratio_min None`
    is None), not by the command-line parser's guess; names the method does not have are left to validation."""
    if "--hparams" not in argv or method not in available_methods():
        return {}
    values = argv[argv.index("--hparams") + 1 :]
    values = values[: next((i for i, v in enumerate(values) if v.startswith("--")), len(values))]
    pairs = dict(zip(values[::2], values[1::2], strict=False))
    known = method_hparams(method)
    return {k: parse_hparam(method, k, v) for k, v in pairs.items() if k in known}

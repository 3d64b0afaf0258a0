"""A sweep's grid: its cells, validated before anything runs, each with the `vespo train` config it runs with and the
identity (`cell_key`) that names its run dir."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vespo.argv import from_text
from vespo.experiments.grid import settings_key
from vespo.experiments.presets import PRESET_REGIMES
from vespo.experiments.sweep.config import SWEEP_OWNED, Cell, SweepConfig, resolve, variants
from vespo.train.config import FIELD_TYPES, TrainConfig, conforms, describe_type
from vespo.train.host import check_host, check_output_dir

NOT_IDENTITY = ("run_dir", "cache_dir", "resume", "allow_change", "overwrite_output_dir", "progress")
"""TrainConfig fields left out of a cell's identity: where it is written, and bookkeeping that changes no number."""
LATER_FIELDS = {"adv_estimator": "grpo", "eval_top_p": None, "bypass_mode": False}
"""TrainConfig fields added after sweeps were run -> the value that reproduces those runs: left out of a cell's
identity at that value, so the cells run before the field existed keep their names (and are reused)."""


def cells(cfg: SweepConfig) -> list[Cell]:
    """All grid cells, validated (each cell's TrainConfig is resolved) before anything runs."""
    cfg = resolve(cfg)
    check_output_dir("out_dir", cfg.out_dir)
    axes = ("num_mini_batches", "seeds", "lr", "task") + (("methods",) if cfg.preset is None else ())
    for name in axes:  # grid axes: at least one value, none twice (two cells would share one run dir)
        values = getattr(cfg, name)
        if not values or len(set(values)) != len(values):
            raise ValueError(f"{name} must be one or more distinct values, got {list(values)}")
    for name, ok, accepted in (
        ("optimizer_steps", cfg.optimizer_steps >= 1, "an integer >= 1"),
        ("min_rollout_steps", cfg.min_rollout_steps >= 1, "an integer >= 1"),
        ("eval_points", cfg.eval_points >= 1, "an integer >= 1"),
        ("probes", cfg.probes >= 0, "an integer >= 0"),
        ("jobs", cfg.jobs >= 1, "an integer >= 1"),
        ("collapse_ratio", 0 <= cfg.collapse_ratio <= 1, "a number in [0, 1]"),
    ):
        if not ok:
            raise ValueError(f"{name} must be {accepted}, got {getattr(cfg, name)!r}")
    bad = [n for n in cfg.num_mini_batches if n < 1 or optimizer_steps(cfg, n) % n]
    if bad:
        raise ValueError(f"optimizer_steps={cfg.optimizer_steps} must be a multiple of every N; not of {bad}")
    bad_lr = [lr for lr in cfg.lr if not 0 < lr < float("inf")]
    if bad_lr or not cfg.lr:
        raise ValueError(f"lr must be one or more finite numbers > 0, got {list(cfg.lr)}")

    def label(variant: str, lr: float, task: str) -> str:  # lr and task axes are extra rows: tables stay 2-D
        return variant + ("" if len(cfg.lr) == 1 else f"@lr{lr:g}") + ("" if len(cfg.task) == 1 else f"@{task}")

    for key in cfg.extra:
        name = key.replace("-", "_")
        if name in SWEEP_OWNED:
            raise ValueError(f"extra: {key} is set by the sweep for every cell; use {SWEEP_OWNED[name]}")
        if name not in FIELD_TYPES:
            raise ValueError(f"extra: {key} is not a `vespo train` field")
    grid = [
        Cell(label(v, lr, task), m, h, n, s, lr, task, settings)
        for task in cfg.task
        for v, (m, h, settings) in variants(cfg).items()
        for lr in cfg.lr
        for n in cfg.num_mini_batches
        for s in cfg.seeds
    ]
    return [dataclasses.replace(c, key=cell_key(check_host(train_config(cfg, c)))) for c in grid]  # and this machine


def cell_key(tc: TrainConfig) -> str:
    """Identity of a cell: a hash of its resolved `vespo train` config, all but `NOT_IDENTITY` (and `LATER_FIELDS`
    at their earlier value)."""
    config = tc.flat()
    later = {k for k, v in LATER_FIELDS.items() if config[k] == v}
    return settings_key({k: v for k, v in config.items() if k not in NOT_IDENTITY and k not in later})


def optimizer_steps(cfg: SweepConfig, num_mini_batches: int) -> int:
    """A cell's optimizer steps: `optimizer_steps`, scaled up to `min_rollout_steps` rollout steps at large N."""
    return max(cfg.optimizer_steps, cfg.min_rollout_steps * num_mini_batches)


def train_config(cfg: SweepConfig, cell: Cell) -> TrainConfig:
    """The resolved TrainConfig a cell runs with: fixed mini-batch and optimizer steps, N mini-batches per rollout
    step; then the preset's regime, the variant's settings and the user's `extra`, each over the ones before."""
    cfg = resolve(cfg)
    rollout_steps = optimizer_steps(cfg, cell.num_mini_batches) // cell.num_mini_batches
    fields = {
        "method": cell.method,
        "hparams": dict(cell.hparams),
        "seed": cell.seed,
        "ppo_mini_batch_size": cfg.ppo_mini_batch_size,
        "train_batch_size": cfg.ppo_mini_batch_size * cell.num_mini_batches,
        "rollout_n": cfg.rollout_n,
        "total_training_steps": rollout_steps,
        "lr": cell.lr,
        "task": cell.task,
        "eval_every": max(1, rollout_steps // cfg.eval_points),
        "eval_size": cfg.eval_size,
        "eval_n": cfg.eval_n,
        "save_every": max(1, rollout_steps // 8),
        "probe_every": max(1, rollout_steps // cfg.probes) if cfg.probes else 0,
        "num_threads": 1,
        "run_dir": str(Path(cfg.out_dir) / "cells" / cell.name),
        "cache_dir": cfg.cache_dir,
        "progress": False,
    }
    if cell.task == "chain":
        from vespo.embedded.task import chain_response_tokens  # imports torch

        fields |= {"num_operands": cfg.num_operands, "max_response_length": chain_response_tokens(cfg.num_operands)}
    if cell.task == "scratchpad":
        from vespo.embedded.task import scratchpad_response_tokens

        longest = scratchpad_response_tokens(cfg.num_operands, 9)
        fields |= {"num_operands": cfg.num_operands, "max_response_length": longest + 4}  # room to run over
    train = PRESET_REGIMES[cfg.preset][1] if cfg.preset in PRESET_REGIMES else {}
    for settings in (train, cell.settings, _typed_extra(cfg.extra)):  # the preset's regime, the variant's, `extra`
        fields |= settings
    return TrainConfig(**fields)


def _typed_extra(extra: dict[str, object]) -> dict[str, object]:
    """`extra` as TrainConfig fields (hyphens read as underscores) with values of the field's type, as `vespo train`'s
    command line reads text (`vespo.argv.from_text`, the one text-to-value rule); a value that is not text (an API
    caller's) is kept. A value that fits no type of its field is a one-line
    ValueError."""
    typed = {}
    for key, value in extra.items():
        name = key.replace("-", "_")
        hint = FIELD_TYPES[name]
        if isinstance(value, str):
            value = from_text(value, hint)
        if not conforms(value, hint):
            raise ValueError(f"extra: {key} must be {describe_type(hint)}, got {value!r}")
        typed[name] = value
    return typed

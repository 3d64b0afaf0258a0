"""A run's checkpoints and its resume policy: where a run keeps its checkpoint (`CHECKPOINT`, and the last
`save_total_limit` ones), what it holds (`save_checkpoint`: the step, the learner's state, every RNG stream, the
loop's own entries), the one reader that checks it (`load_checkpoint`), which config changes a resume allows
(`check_resume`), what a run dir allows before any compute (`check_run`), and putting a checkpoint back (`restore`),
so a run killed at any point and resumed continues bit for bit."""

from __future__ import annotations

import dataclasses
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from vespo.outputs import write_atomic
from vespo.train.config import ConfigError, TrainConfig, default_reward_fn
from vespo.train.config_io import load_yaml
from vespo.train.host import check_output_dir

CHECKPOINT = "checkpoints/last.pt"
"""Path of a run's checkpoint inside its run dir (overwritten atomically at every save)."""


def rng_state(gen: torch.Generator) -> dict:
    """Every RNG stream the run draws from, as tensors and plain Python values (loadable with weights_only=True)."""
    np_name, np_key, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),  # (version, tuple of ints, None)
        "numpy": {"name": np_name, "key": torch.from_numpy(np_key.astype(np.int64)), "pos": int(np_pos)}
        | {"has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
        "sampler": gen.get_state(),
    }


def set_rng_state(state: dict, gen: torch.Generator) -> None:
    """Restore the streams saved by `rng_state`."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    gen.set_state(state["sampler"])


def save_checkpoint(
    run_dir: Path, step: int, learner, gen: torch.Generator, loop: dict | None = None, *, keep: int = 1
) -> None:
    """Atomically write everything needed to continue bit-for-bit: the step, the learner's state (weights, optimizer,
    scheduler, scaler: `Learner.state_dict`), all RNG states and the loop's own (`loop`: the async trainer's next
    batch id). Only tensors and plain containers: no pickled code. With `keep` > 1 (`save_total_limit`) the last
    `keep` saves are also kept as checkpoints/step_<step>.pt. The one writer of a checkpoint."""
    path = Path(run_dir) / CHECKPOINT
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"step": step, **learner.state_dict(), "rng": rng_state(gen)} | (loop or {})
    write_atomic(path, lambda f: torch.save(state, f))  # a crash leaves the old or the new file, never a torn one
    if keep > 1:
        numbered = path.parent / f"step_{step}.pt"
        numbered.unlink(missing_ok=True)
        try:
            os.link(path, numbered)  # the same file as last.pt: no second copy on disk (the next save replaces last.pt)
        except OSError:
            shutil.copyfile(path, numbered)
        saved = [p for p in path.parent.iterdir() if re.fullmatch(r"step_\d+\.pt", p.name)]
        for old in sorted(saved, key=lambda p: int(p.stem[5:]))[:-keep]:
            old.unlink()


_CKPT_KEYS = ("step", "model", "optimizer", "rng")
LOOP_KEYS = ("async",)
"""Checkpoint entries a loop owns (`save_checkpoint(loop=...)`): the async trainer's {"next_batch": int}."""


def load_checkpoint(run_dir: str | Path, path: str | Path | None = None, *, label: str = "resume") -> dict:
    """The run's last checkpoint (or the checkpoint file `path`), loaded with ``weights_only=True`` (a crafted pickle
    cannot run code) and checked field by field (`check_checkpoint`), so a damaged one is refused before the model
    loads. The one reader of checkpoints: `--resume` and `vespo export` (`label` names the flag in errors).

    Raises ConfigError naming the file when it is missing, truncated, not a torch file, or not a vespo checkpoint.
    """
    path = Path(run_dir) / CHECKPOINT if path is None else Path(path)
    if not path.is_file():
        hint = " (drop --resume to start a new run)" if label == "resume" else ""
        raise ConfigError(f"{label}: no checkpoint at {path}{hint}")
    try:
        ckpt = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # truncated zip, foreign format, or a pickle asking for globals weights_only refuses
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{label}: cannot load checkpoint {path}: {first}") from None
    if not isinstance(ckpt, dict) or any(k not in ckpt for k in _CKPT_KEYS):
        raise ConfigError(f"{label}: {path} is not a vespo checkpoint (needs keys {list(_CKPT_KEYS)})")
    problem = check_checkpoint(ckpt)
    if problem:
        raise ConfigError(f"{label}: {path} is damaged: {problem}")
    return ckpt


def _is_index(value: object, lo: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= lo


def check_checkpoint(ckpt: dict) -> str | None:
    """What is wrong with a loaded checkpoint's fields (None: nothing): step, the weights and optimizer containers,
    every RNG state (each tried on a throwaway generator, never on the global streams) and the async batch id.
    Shapes against the model are checked when it is restored (`restore`)."""
    if not _is_index(ckpt["step"], 1):
        return f"step must be an integer >= 1, got {ckpt['step']!r:.60}"
    model = ckpt["model"]
    if not isinstance(model, dict) or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in model.items()):
        return "model must be a mapping of parameter names to tensors"
    opt = ckpt["optimizer"]
    groups, state = (opt.get("param_groups"), opt.get("state")) if isinstance(opt, dict) else (None, None)
    if not (
        isinstance(groups, list)
        and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups)
        and isinstance(state, dict)
        and all(isinstance(v, dict) for v in state.values())
    ):
        return "optimizer must be a torch optimizer state ({'state': {...}, 'param_groups': [...]})"
    rng = ckpt["rng"]
    if not isinstance(rng, dict) or any(k not in rng for k in ("torch", "python", "numpy", "sampler")):
        return "rng must be a mapping with torch, python, numpy and sampler states"
    for name in ("torch", "sampler"):
        try:
            torch.Generator().set_state(rng[name])
        except (RuntimeError, TypeError, ValueError):
            return f"rng.{name} is not a torch CPU generator state"
    try:
        random.Random().setstate(rng["python"])
    except (TypeError, ValueError, OverflowError):
        return "rng.python is not a Python random state"
    n = rng["numpy"]
    try:
        np.random.RandomState().set_state(
            (n["name"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
        )
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError, OverflowError):
        return "rng.numpy is not a NumPy random state"
    for name in ("scheduler", "scaler"):
        if name in ckpt and not (isinstance(ckpt[name], dict) and all(isinstance(k, str) for k in ckpt[name])):
            return f"{name} must be a mapping of state names to values"
    if "async" in ckpt and not (isinstance(ckpt["async"], dict) and _is_index(ckpt["async"].get("next_batch"))):
        return "async.next_batch must be an integer >= 0"
    return None


RESUME_ALWAYS_OK = (
    "resume",
    "allow_change",
    "progress",
    "tensorboard",
    "wandb_project",
    "trackio_project",
    "num_threads",
    "save_every",
    "eval_every",
    "log_update_norm",
    "probe_every",
    "ess_alarm",
    "ess_alarm_patience",
    "stop_on_low_ess",
    "run_dir",
    "cache_dir",
    "overwrite_output_dir",
    "save_total_limit",
)
"""Fields that may differ on --resume: bookkeeping that does not change a trained number."""
RESUME_OVERRIDABLE = ("total_training_steps",)
"""Fields that may differ on --resume only when named in `--allow-change` (they extend, not alter, the run)."""


def check_resume(cfg: TrainConfig, saved: dict, step: int) -> None:
    """Refuse a resume whose config differs from the saved one in anything that changes the run (`cfg.allow_change`
    names only `RESUME_OVERRIDABLE` fields: its type says so)."""
    now = dataclasses.asdict(cfg)
    saved = {k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()}
    for side in (now, saved):  # `reward_fn: null` is the dataset's default reward
        if side.get("reward_fn", "") is None:
            side["reward_fn"] = default_reward_fn(side.get("dataset", TrainConfig.dataset))
    diff = [k for k in now if k not in RESUME_ALWAYS_OK and k in saved and now[k] != saved[k]]
    blocked = [k for k in diff if k not in RESUME_OVERRIDABLE]
    if blocked:
        changes = ", ".join(f"{k}: {saved[k]!r} -> {now[k]!r}" for k in blocked)
        raise ConfigError(
            f"resume: the config differs from the saved run in {changes}; these change the run, so resume with the "
            f"saved values (run_dir/config.yaml) or start a new run_dir"
        )
    unapproved = [k for k in diff if k not in cfg.allow_change]
    if unapproved:
        changes = ", ".join(f"{k}: {saved[k]!r} -> {now[k]!r}" for k in unapproved)
        raise ConfigError(f"resume: {changes} differs from the saved run; pass --allow-change {' '.join(unapproved)}")
    if cfg.total_training_steps < step:
        raise ConfigError(
            f"resume: total_training_steps={cfg.total_training_steps} is below the checkpoint's step {step}"
        )


def check_run(cfg: TrainConfig) -> dict | None:
    """Everything about `cfg.run_dir` that can fail, checked before any compute and without writing anything:
    the directory is writable, a fresh run does not replace a run with a checkpoint unless `overwrite_output_dir`
    (a run that left no checkpoint is replaced), and a resume has a loadable checkpoint and the same config as the
    saved run. Returns the checkpoint to resume from (None for a fresh run)."""
    run_dir = check_output_dir("run_dir", cfg.run_dir)
    existing = run_dir / "config.yaml"
    if not cfg.resume:
        if (run_dir / CHECKPOINT).exists() and not cfg.overwrite_output_dir:
            raise ConfigError(
                f"run_dir {run_dir} already holds a run with a checkpoint; pass --resume to continue it, "
                "--overwrite-output-dir to replace it, or choose another run_dir"
            )
        return None
    ckpt = load_checkpoint(run_dir)
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"run_dir {run_dir} is not writable")
    if not existing.is_file():
        raise ConfigError(f"resume: {existing} is missing, so the run's config cannot be checked")
    saved = load_yaml(existing, label="resume:")
    try:
        TrainConfig(**saved)  # built to be checked: a config.yaml edited by hand is refused here
    except ConfigError as exc:
        raise ConfigError(f"resume: {existing}: {exc}") from None
    if cfg.mode == "async" and "async" not in ckpt:
        raise ConfigError(f"resume: {run_dir / CHECKPOINT} has no async state (it was not saved by an async run)")
    check_resume(cfg, saved, ckpt["step"])
    return ckpt


def restore(ckpt: dict, learner, gen: torch.Generator) -> tuple[int, dict]:
    """Load a checkpoint into the learner (`Learner.load_state_dict`) and the RNG streams in place; return its step
    and the loop's own entries (`LOOP_KEYS`). A checkpoint that does not fit the learner (another model or geometry,
    no scheduler state for a run with one) is a ConfigError naming the first mismatch. The one reader of a
    checkpoint."""
    try:
        learner.load_state_dict(ckpt)
    except ValueError as exc:
        raise ConfigError(f"resume: the checkpoint does not fit the model: {exc}") from None
    set_rng_state(ckpt["rng"], gen)
    return ckpt["step"], {k: ckpt[k] for k in LOOP_KEYS if k in ckpt}

"""A run's checkpoints and its resume policy: where a run keeps its checkpoint (`CHECKPOINT`, and the last
`save_total_limit` ones), what a checkpoint holds (`save_checkpoint`: the step, the learner's state, every RNG stream,
the loop's own entries; schema and I/O in `vespo.checkpoints`), which config changes a resume allows
(`check_resume`: the whole config compared), the same command continuing its run (`continue_same_run`), what a run
dir allows before any compute (`check_run`), and putting a checkpoint back (`restore`), so a run killed at any point
and resumed continues bit for bit."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
import typing
from pathlib import Path

from vespo.outputs import open_regular, write_atomic
from vespo.train.config import ConfigError, TrainConfig, filled
from vespo.train.config_io import load_yaml
from vespo.train.fields import ADDED_FIELDS, TrainFields
from vespo.train.host import check_output_dir

if typing.TYPE_CHECKING:
    import torch

CHECKPOINT = "checkpoints/last.pt"
"""Path of a run's checkpoint inside its run dir (overwritten atomically at every save)."""
LOOP_KEYS = ("async",)
"""Checkpoint entries a loop owns (`save_checkpoint(loop=...)`): the async trainer's {NEXT_BATCH: int}
(`vespo.checkpoints.ASYNC`; torch, and so `vespo.checkpoints`, is imported only where a checkpoint is read or
written, so the run-dir checks answer at once)."""


def save_checkpoint(
    run_dir: Path, step: int, learner, gen: torch.Generator, loop: dict | None = None, *, keep: int = 1
) -> None:
    """Atomically write everything needed to continue bit-for-bit: the step, the learner's state (weights, optimizer,
    scheduler, scaler: `Learner.state_dict`), all RNG states and the loop's own (`loop`: the async trainer's next
    batch id). Only tensors and plain containers: no pickled code. With `keep` > 1 (`save_total_limit`) the last
    `keep` saves are also kept as checkpoints/step_<step>.pt. The one writer of a run's checkpoint."""
    from vespo.checkpoints import RNG, RUN, STEP, rng_state, save

    path = Path(run_dir) / CHECKPOINT
    save(path, RUN, {STEP: step, **learner.state_dict(), RNG: rng_state(gen)} | (loop or {}))
    if keep > 1:
        numbered = path.parent / f"step_{step}.pt"
        numbered.unlink(missing_ok=True)
        try:
            os.link(path, numbered)  # the same file as last.pt: no second copy on disk (the next save replaces last.pt)
        except OSError:  # a file system without hard links: a copy, written whole like every file
            with open(open_regular(path), "rb") as src:
                write_atomic(numbered, lambda f: shutil.copyfileobj(src, f))
        saved = [p for p in path.parent.iterdir() if re.fullmatch(r"step_\d+\.pt", p.name)]
        for old in sorted(saved, key=lambda p: int(p.stem[5:]))[:-keep]:
            old.unlink()


def load_checkpoint(run_dir: str | Path, path: str | Path | None = None, *, label: str = "resume") -> dict:
    """The run's last checkpoint (or the checkpoint file `path`), read by `vespo.checkpoints.load` (weights_only,
    every field checked) so a damaged one is refused before the model loads: `--resume` and `vespo export` (`label`
    names the flag in errors).

    Raises ConfigError naming the file when it is missing, truncated, not a torch file, or not a vespo checkpoint.
    """
    from vespo import checkpoints

    path = Path(run_dir) / CHECKPOINT if path is None else Path(path)
    if not path.is_file():
        hint = " (drop --resume to start a new run)" if label == "resume" else ""
        raise ConfigError(f"{label}: no checkpoint at {path}{hint}")
    try:
        return checkpoints.load(path, checkpoints.RUN, label=label)
    except checkpoints.CheckpointError as exc:
        raise ConfigError(str(exc)) from None


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


def check_resume(cfg: TrainFields, saved: dict, step: int | None = None) -> None:
    """Refuse a resume whose config differs from the saved one (`saved`: run_dir/config.yaml as read) in anything
    that changes the run (`resume_differences`); `cfg.allow_change` names only `RESUME_OVERRIDABLE` fields (its type
    says so). `step`: the checkpoint's (None: not read yet)."""
    lost, blocked, unapproved = resume_differences(cfg, saved)
    if lost:
        raise ConfigError(
            f"resume: the saved config.yaml lacks {', '.join(lost)}, so the run's settings cannot be checked: restore "
            "them in run_dir/config.yaml (as the run was started) or start a new run_dir"
        )
    if blocked:
        raise ConfigError(
            f"resume: the config differs from the saved run in {', '.join(blocked)}; these change the run, so resume "
            "with the saved values (run_dir/config.yaml) or start a new run_dir"
        )
    if unapproved:
        fields = " ".join(change.split(":")[0] for change in unapproved)
        raise ConfigError(f"resume: {', '.join(unapproved)} differs from the saved run; pass --allow-change {fields}")
    if step is not None and cfg.total_training_steps < step:
        raise ConfigError(
            f"resume: total_training_steps={cfg.total_training_steps} is below the checkpoint's step {step}"
        )


def resume_differences(cfg: TrainFields, saved: dict) -> tuple[list[str], list[str], list[str]]:
    """How `cfg` differs from the saved config (`saved`: run_dir/config.yaml as read), the whole resolved config
    compared, both sides filled alike (`resolved`), bookkeeping (`RESUME_ALWAYS_OK`) aside: (fields the saved file
    lacks, changes that alter the run as "field: saved -> now", changes of `RESUME_OVERRIDABLE` fields not in
    `cfg.allow_change`). A field missing from the file is a difference unless it was added since such files were
    written (`ADDED_FIELDS`), which reads as its default."""
    now, was = resolved(cfg), resolved(TrainFields(**saved))
    lost = [k for k in now if k not in saved and k not in RESUME_ALWAYS_OK and k not in ADDED_FIELDS]
    diff = [k for k in now if k not in RESUME_ALWAYS_OK and k not in lost and now[k] != was[k]]
    changes = {k: f"{k}: {was[k]!r}{' (default: not in config.yaml)' * (k not in saved)} -> {now[k]!r}" for k in diff}
    blocked = [changes[k] for k in diff if k not in RESUME_OVERRIDABLE]
    unapproved = [changes[k] for k in diff if k in RESUME_OVERRIDABLE and k not in cfg.allow_change]
    return lost, blocked, unapproved


def continue_same_run(fields: TrainFields) -> TrainFields:
    """The same `vespo train` command, run again, continues its run (as `vespo sweep` and `lab` do): a run dir that
    holds a checkpoint and the config.yaml of this config (`resume_differences`) is resumed, with one line on stderr
    saying so; one of another config is refused naming the differences. Reads no checkpoint and imports no torch, so
    it answers at once. `fields` as given when there is nothing to decide (no checkpoint, --resume,
    --overwrite-output-dir)."""
    run_dir = Path(filled(fields)["run_dir"]).expanduser()
    if fields.resume or fields.overwrite_output_dir or not (run_dir / CHECKPOINT).is_file():
        return fields
    again, existing = dataclasses.replace(fields, resume=True), run_dir / "config.yaml"
    replace = "pass --overwrite-output-dir to replace it, or choose another run_dir"
    if not existing.is_file():
        raise ConfigError(f"run_dir {run_dir} holds a checkpoint but no config.yaml to continue it by; {replace}")
    lost, blocked, unapproved = resume_differences(again, load_yaml(existing, label=f"run_dir {run_dir}:"))
    if lost or blocked or unapproved:
        why = f"its config.yaml lacks {', '.join(lost)}" if lost else ", ".join(blocked + unapproved)
        longer = " (longer: --resume --allow-change total_training_steps)" if unapproved and not blocked else ""
        raise ConfigError(
            f"run_dir {run_dir} holds another run with a checkpoint ({why}): run it with its own settings "
            f"({existing}) to continue it{longer}, {replace}"
        )
    print(f"vespo train: run_dir {run_dir} holds this run's checkpoint; continuing it (as --resume)", file=sys.stderr)
    return again


def resolved(fields: TrainFields) -> dict:
    """A config's fields with its defaults filled in as `TrainConfig` fills them (`filled`), lists as tuples: what
    two configs of one run hold alike."""
    data = {f.name: getattr(fields, f.name) for f in dataclasses.fields(TrainFields)}
    data = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    return data | filled(fields)


def check_run(cfg: TrainConfig) -> dict | None:
    """Everything about `cfg.run.run_dir` that can fail, checked before any compute and without writing anything:
    the directory is writable, a fresh run does not replace a run with a checkpoint unless `overwrite_output_dir`
    (a run that left no checkpoint is replaced), and a resume has a loadable checkpoint and the same config as the
    saved run. Returns the checkpoint to resume from (None for a fresh run)."""
    run_dir = check_output_dir("run_dir", cfg.run.run_dir)
    existing = run_dir / "config.yaml"
    if not cfg.run.resume:
        if (run_dir / CHECKPOINT).exists() and not cfg.run.overwrite_output_dir:
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
    if cfg.async_.mode == "async" and LOOP_KEYS[0] not in ckpt:
        raise ConfigError(f"resume: {run_dir / CHECKPOINT} has no async state (it was not saved by an async run)")
    check_resume(TrainFields(**cfg.flat()), saved, ckpt["step"])
    added = {k: getattr(TrainFields, k) for k in ADDED_FIELDS if k not in saved}
    if added:  # a run saved before these fields existed: it ran at their defaults, and resumes at them
        defaults = ", ".join(f"{k}={v!r}" for k, v in added.items())
        print(f"vespo train: resume: {existing} predates {len(added)} field(s), read at their defaults: {defaults}",
              file=sys.stderr)  # fmt: skip
    return ckpt


def restore(ckpt: dict, learner, gen: torch.Generator) -> tuple[int, dict]:
    """Load a checkpoint into the learner (`Learner.load_state_dict`) and the RNG streams in place; return its step
    and the loop's own entries (`LOOP_KEYS`). A checkpoint that does not fit the learner (another model or geometry,
    no scheduler state for a run with one) is a ConfigError naming the first mismatch."""
    from vespo.checkpoints import RNG, STEP, set_rng_state

    try:
        learner.load_state_dict(ckpt)
    except ValueError as exc:
        raise ConfigError(f"resume: the checkpoint does not fit the model: {exc}") from None
    set_rng_state(ckpt[RNG], gen)
    return ckpt[STEP], {k: ckpt[k] for k in LOOP_KEYS if k in ckpt}

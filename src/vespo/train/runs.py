"""Run management around the training loop: the run directory, checkpoints with every RNG state, the metrics log
(JSONL + TensorBoard, wandb/trackio when asked), the reward plot, the progress bar and the embedded warm-start cache.

`vespo.train.sync` (and the async learner) keep the loop; everything here is bookkeeping that must not change a number
of the run, so a run killed at any point and resumed from its last checkpoint continues bit for bit.
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import functools
import importlib
import json
import os
import random
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from vespo.outputs import OutputError, OwnedDir, atomic_dir, claim, open_append, read_regular, write_atomic
from vespo.train.config import ConfigError, TrainConfig, default_reward_fn
from vespo.train.config_io import load_yaml, to_yaml
from vespo.train.host import check_output_dir

CHECKPOINT = "checkpoints/last.pt"
"""Path of a run's checkpoint inside its run dir (overwritten atomically at every save)."""
RUN_OUTPUTS = (
    "config.yaml", "metrics.jsonl", "completions.jsonl", "tb", "checkpoints", "final", "reward.png",
    "async_summary.json",
)  # fmt: skip
"""Everything a run writes in its run dir: the manifest of its marker (`vespo.outputs`), and all that replacing a run
(a dead one, or with --overwrite-output-dir) deletes. Any other file in the run dir is left alone."""


# ----------------------------------------------------------------------------------------------------------------
# RNG state and checkpoints


def clock(device: torch.device) -> float:
    """Wall-clock seconds once `device`'s queued work is done, for a step's phase times (`time/*_s`): on CUDA one
    synchronisation per phase per step, on CPU none."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


TRIM_MIN_FREE_BYTES = 256 * 2**20
"""`release_free_memory` trims only when the heap holds more free bytes than this: a trim makes the next
allocations fault their pages in again, which costs a small model's step ~20% and buys it nothing."""


def release_free_memory() -> None:
    """Hand the C heap's freed pages back to the OS when more than `TRIM_MIN_FREE_BYTES` lie free (glibc
    `mallinfo2` / `malloc_trim`; elsewhere a no-op). Generation's and the optimizer's short-lived CPU tensors leave
    freed holes that the process would otherwise keep resident: on SmolLM2-135M 1.4-1.8 GB lie free after an update
    (benchmarks/results/trl_real)."""
    libc = _libc()
    if libc is not None and libc.mallinfo2().fordblks > TRIM_MIN_FREE_BYTES:
        libc.malloc_trim(0)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]  # fmt: skip


@functools.cache
def _libc():
    """glibc (>= 2.33, for mallinfo2) with its signatures, or None (another OS or C library)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):  # musl, or an older glibc
        return None
    return libc


def seed_everything(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """Seed torch (every device), Python and NumPy; return a fresh generator on `device` for the sampling noise (its
    state is checkpointed)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    return torch.Generator(device=device).manual_seed(seed)


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


def claim_run_dir(cfg: TrainConfig) -> OwnedDir:
    """Lock `cfg.run_dir` for this run and make sure it is vespo's (`vespo.outputs.claim`): new or empty, marked by an
    earlier vespo run, or a run of a vespo version before the marker (its config.yaml says so). ConfigError otherwise,
    and while another process holds it."""
    try:
        return claim(cfg.run_dir, "train", RUN_OUTPUTS, label="run_dir", overwrite=cfg.overwrite_output_dir,
                     legacy=_is_legacy_run)  # fmt: skip
    except OutputError as exc:
        raise ConfigError(str(exc)) from None


def _is_legacy_run(run_dir: Path) -> bool:
    """Whether `run_dir` is a run of a vespo before the marker: a config.yaml of TrainConfig fields (method, run_dir)
    beside a vespo checkpoint."""
    path = run_dir / "config.yaml"
    try:
        saved = load_yaml(path) if path.is_file() else {}
    except ConfigError:
        return False
    return {"method", "run_dir"} <= set(saved) and (run_dir / CHECKPOINT).is_file()


def start_run(cfg: TrainConfig, out: OwnedDir, num_threads: int | None = None) -> Path:
    """Write config.yaml into the claimed run dir (after `check_run`, once the inputs have loaded), with the thread
    count the run uses (`num_threads`; None: `cfg`'s). A fresh run in a dir that holds a run (one that stopped before
    its first checkpoint, or any with `overwrite_output_dir`) first deletes that run's outputs, the names in the
    marker's manifest and nothing else, saying so on stderr."""
    old = [] if cfg.resume else out.existing()
    if old:
        why = "replacing the run there" if (out.path / CHECKPOINT).exists() else "it holds no checkpoint; starting over"
        print(f"vespo train: run_dir {out.path}: {why} (deleting its {', '.join(old)})", file=sys.stderr)
        out.clear()
    # what the run is, not how this command started it: fed back with --config it starts the same run again
    threads = cfg.num_threads if num_threads is None else num_threads
    saved = to_yaml(cfg, resume=False, overwrite_output_dir=False, allow_change=(), num_threads=threads)
    write_atomic(out.path / "config.yaml", saved)
    return out.path


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


# ----------------------------------------------------------------------------------------------------------------
# Logging, metrics, plots, progress


class Logger:
    """metrics.jsonl (always), TensorBoard, and wandb / trackio when asked for and installed."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, start_step: int):
        self.path = Path(run_dir) / "metrics.jsonl"
        # on resume, drop lines logged after the checkpoint by a run that was killed, so history is not duplicated
        rows = truncate_log(self.path, start_step)
        truncate_log(self.path.parent / "completions.jsonl", start_step)
        self.last = {k: v for k, v in rows[-1].items() if k != "step"} if rows else {}
        """The last logged step's metrics kept on resume (empty for a fresh run, or when none survived)."""
        self.sinks: list[Callable[[dict, int], None]] = []
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            tb = SummaryWriter(str(Path(run_dir) / "tb"), purge_step=start_step + 1)
            self.sinks.append(lambda m, s: [tb.add_scalar(k, v, s) for k, v in m.items()])
            self._tb = tb
            _tb_hparams(tb, Path(run_dir) / "config.yaml")
        for name, project in (("wandb", cfg.wandb_project), ("trackio", cfg.trackio_project)):
            if project:
                lib = importlib.import_module(name)  # ImportError here is the clear message we want
                saved = load_yaml(Path(run_dir) / "config.yaml")  # what the run is (`start_run`)
                lib.init(project=project, config=saved, resume="allow" if name == "wandb" else None)
                self.sinks.append(lambda m, s, lib=lib: lib.log(m, step=s))

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Append one step's scalars to every sink."""
        with open_append(self.path) as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        for sink in self.sinks:
            sink(metrics, step)

    def log_completions(self, rows: list[dict], step: int) -> None:
        """Sampled completions of one step: appended to completions.jsonl, and a text table in TensorBoard."""
        with open_append(self.path.parent / "completions.jsonl") as f:
            f.writelines(json.dumps({"step": step, **row}) + "\n" for row in rows)
        if hasattr(self, "_tb"):
            cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
            table = ["| prompt | completion | reward | advantage |", "|---|---|---|---|"]
            table += [f"| {cell(r['prompt'])} | {cell(r['completion'])} | {r['reward']:.3f} | {r['advantage']:.3f} |"
                      for r in rows]  # fmt: skip
            self._tb.add_text("completions", "\n".join(table), step)

    def close(self) -> None:
        """Flush and close TensorBoard."""
        if hasattr(self, "_tb"):
            self._tb.close()


def _tb_hparams(tb, path: Path) -> None:
    """The run's config.yaml (`path`, written by `start_run`) in TensorBoard: the HParams tab (scalar fields, against
    reward and held-out accuracy) and the file as text."""
    from torch.utils.tensorboard.summary import hparams

    flat = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in load_yaml(path).items()}
    for summary in hparams(flat, {"reward/mean": 0.0, "eval/accuracy": 0.0}):
        tb._get_file_writer().add_summary(summary)
    tb.add_text("config", "```yaml\n" + path.read_text() + "```", 0)


def truncate_log(path: Path, step: int) -> list[dict]:
    """Keep the rows of JSONL log `path` up to rollout step `step` (what the checkpoint continues from) and return
    them. A missing file, or lines that are not step rows (damaged by a crash or by hand), cost only their history:
    one stderr line says what was lost, and the run continues from its checkpoint."""
    rows, bad = [], []
    if os.path.lexists(path):
        lines = read_regular(path).decode(errors="replace").splitlines()
        for i, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                row = None
            if isinstance(row, dict) and _is_index(row.get("step")):
                if row["step"] <= step:
                    rows.append(row)
            elif line.strip() and i < len(lines):  # a torn last line is a write the kill interrupted: redone anyway
                bad.append(i)
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
    elif step > 0 and path.name == "metrics.jsonl":
        print(f"vespo train: resume: {path} is missing; the history of steps 1-{step} is lost, training continues "
              f"from the checkpoint at step {step}", file=sys.stderr)  # fmt: skip
    if bad:
        print(f"vespo train: resume: {path}: dropped {len(bad)} damaged line(s) (line {bad[0]}"
              f"{' and later' if len(bad) > 1 else ''}); training continues from the checkpoint at step {step}",
              file=sys.stderr)  # fmt: skip
    return rows


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The run's metrics.jsonl as a list of dicts; a torn last line (a run killed mid-write) is ignored."""
    path = Path(run_dir) / "metrics.jsonl"
    lines = read_regular(path).decode().splitlines()
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except ValueError:
            if i == len(lines) - 1:  # the write of the last step was interrupted; that step is redone on resume
                break
            raise ValueError(f"{path}:{i + 1}: not a JSON metrics line") from None
    return rows


def run_title(run_dir: str | Path) -> str:
    """What a run is, from its config.yaml: method, staleness N, lr, task or model, seed."""
    try:
        c = load_yaml(Path(run_dir) / "config.yaml")
        n = int(c["train_batch_size"]) // int(c["ppo_mini_batch_size"])
        data = c["task"] if c.get("model") == "embedded" else Path(str(c["model"])).name
        return f"{c['method']}, N={n}, lr={c['lr']:g}, {data}, seed {c['seed']}"
    except (KeyError, TypeError, ValueError):  # ConfigError is a ValueError: an unreadable config.yaml
        return Path(run_dir).name


def plot_run(run_dir: str | Path) -> Path:
    """reward.png: training reward per step and held-out accuracy at the evaluation steps."""
    from vespo.plots import Panel, Series, panel_figure, save_figure

    rows = read_metrics(run_dir)
    panel = Panel(run_title(run_dir), "rollout step", "reward / accuracy", bounds=(0.0, 1.0))
    train = [(r["step"], r["reward/mean"]) for r in rows if "reward/mean" in r]
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    if train:
        panel.series["training reward"] = Series(*zip(*train, strict=True))
    if evals:
        panel.series["held-out accuracy"] = Series(*zip(*evals, strict=True), style={"marker": "o"})
    return save_figure(panel_figure([[panel]], panel_size=(6, 3.5)), Path(run_dir) / "reward.png", dpi=120)


def warn_skipped_updates(step: int, metrics: dict[str, float]) -> None:
    """One stderr line when a step skipped updates with a non-finite gradient (veRL skips them too, silently)."""
    if metrics["actor/nonfinite_grad"] > 0:
        skipped = round(metrics["actor/nonfinite_grad"] * metrics["actor/num_mini_batches"])
        print(f"vespo train: step {step}: skipped {skipped} update(s) with a non-finite gradient", file=sys.stderr)


class EssAlarm:
    """Watches the normalised ESS of the stalest mini-batch's importance weights W (`is/ess/last_mini_batch`, the
    Kish ESS of the sequence weights whatever the method does with them): after `patience` consecutive rollout steps
    below `threshold` it warns once (and, with `stop`, tells the loop to stop). Low ESS of stale mini-batches is a
    documented early sign of collapse (paper Sec. 4.3; veRL's rollout-correction guidance)."""

    KEYS = ("is/ess/last_mini_batch", "is/ess")

    def __init__(self, threshold: float, patience: int, stop: bool):
        self.threshold, self.patience, self.stop = threshold, patience, stop
        self.below, self.fired = 0, False

    def update(self, step: int, metrics: dict[str, float]) -> bool:
        """Count this step; True when the loop should stop now (the alarm fired with `stop`)."""
        ess = next((metrics[k] for k in self.KEYS if k in metrics), None)
        if self.threshold <= 0 or ess is None:
            return False
        self.below = self.below + 1 if ess < self.threshold else 0
        if self.below < self.patience or self.fired:
            return False
        self.fired = True
        action = "stopping (--stop-on-low-ess; --resume continues)" if self.stop else "training continues"
        print(
            f"vespo train: step {step}: ESS of the stalest mini-batch's importance weights below "
            f"{self.threshold:g} for {self.patience} steps (now {ess:.3g}): the stale updates carry little signal, "
            f"an early sign of collapse; consider a smaller staleness, lr or a trust region (target_kl); {action}",
            file=sys.stderr,
        )
        return self.stop


class Run:
    """One run's bookkeeping as a loop sees it: the claimed run dir, its logs (metrics, completions, TensorBoard), the
    held-out evaluations when due, the ESS alarm, checkpoints and the progress bar. Nothing here changes a number."""

    def __init__(self, cfg: TrainConfig, out: OwnedDir, start: int, evaluate: Callable[[], dict] | None):
        self.cfg, self.dir, self.start = cfg, out.path, start
        self.logger = Logger(cfg, out.path, start)
        self.alarm = EssAlarm(cfg.ess_alarm, cfg.ess_alarm_patience, cfg.stop_on_low_ess)
        self.evaluate = evaluate if cfg.eval_every > 0 else None
        self.bar = None
        self.began = self.eval_s = None  # when the first step began; how long one evaluation took (`time_estimate`)

    def begin(self) -> None:
        """Log a fresh run's initial held-out evaluation (step 0), then show the progress bar."""
        if self.evaluate is not None and self.start == 0:
            self.logger.log(self._timed_evaluation(), 0)
        self.bar = progress_bar(self.cfg, self.start)
        self.began = time.perf_counter()

    def _timed_evaluation(self) -> dict:
        t0 = time.perf_counter()
        metrics = self.evaluate()
        self.eval_s = time.perf_counter() - t0 if self.eval_s is None else self.eval_s
        return metrics

    def end_step(self, step: int, metrics: dict[str, float], learner, gen, *, show: str, loop: dict | None = None):
        """The end of a rollout step in every loop: held-out evaluation when due, log, warn on skipped updates, watch
        the ESS, checkpoint when due (or when stopping; `loop`: the loop's own checkpoint entries), advance the bar
        (reward and metric `show`). Returns True when the ESS alarm stops the run."""
        cfg, step_s = self.cfg, time.perf_counter() - self.began
        if self.evaluate is not None and (step % cfg.eval_every == 0 or step == cfg.total_training_steps):
            metrics |= self._timed_evaluation()
        self.logger.log(metrics, step)
        warn_skipped_updates(step, metrics)
        stop = self.alarm.update(step, metrics)
        if step % cfg.save_every == 0 or step == cfg.total_training_steps or stop:
            save_checkpoint(self.dir, step, learner, gen, loop, keep=cfg.save_total_limit)
        if self.bar is not None:
            self.bar.update(1)
            shown = {"reward": f"{metrics['reward/mean']:.3f}", show.split("/")[-1]: f"{metrics[show]:.1f}"}
            self.bar.set_postfix(shown)
        if self.bar is not None and step == self.start + 1:  # this process's first step: the run's time is known
            estimate = time_estimate(cfg, step, step_s, self.eval_s if self.evaluate is not None else 0.0)
            if estimate is not None:
                self.bar.write(estimate, file=sys.stderr)
        return stop

    def finish(self, model, tokenizer) -> None:
        """Close the bar and the logs, draw reward.png and save the final policy to run_dir/final (`save_policy`)."""
        if self.bar is not None:
            self.bar.close()
        self.logger.close()
        plot_run(self.dir)
        save_policy(model, tokenizer, self.dir / "final")


def save_policy(model, tokenizer, folder: Path) -> None:
    """A policy as a Hugging Face model directory that `from_pretrained` and `vespo eval --model` load: a LoRA policy
    (peft) is saved merged (base weights + adapters, on a copy: `model` keeps its adapters), its adapters alone in
    `folder`/adapter for peft users. Written whole (`atomic_dir`): a kill leaves the earlier folder or none, never a
    part; an earlier `folder` is replaced (callers pass only folders vespo writes: a run's final/, a checked --out)."""
    with atomic_dir(folder, replace=True) as tmp:
        if hasattr(model, "merge_and_unload"):  # a peft model
            model.save_pretrained(tmp / "adapter")
            model = copy.deepcopy(model).merge_and_unload()
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)


def time_estimate(cfg: TrainConfig, step: int, step_s: float, eval_s: float | None) -> str | None:
    """One line: the time the run still needs after rollout step `step`, for any model, from that step's time `step_s`
    and one held-out evaluation's `eval_s` (0: none are run; None: not timed yet, left out and said so); None when no
    step is left."""
    left, total = cfg.total_training_steps - step, cfg.total_training_steps
    if left <= 0:
        return None
    evals = 0 if eval_s == 0 else sum(s % cfg.eval_every == 0 or s == total for s in range(step + 1, total + 1))
    seconds = left * step_s + evals * (eval_s or 0.0)
    parts = f"{left} more step{'s' * (left > 1)} x {_duration(step_s)}"
    if evals:
        each = "not timed yet" if eval_s is None else f"x {_duration(eval_s)}"
        parts += f" + {evals} evaluation{'s' * (evals > 1)} {each}"
    done = time.strftime("%H:%M", time.localtime(time.time() + seconds))
    return f"vespo train: step {step} took {_duration(step_s)}, about {_duration(seconds)} left ({parts}), done ~{done}"


def _duration(seconds: float) -> str:
    """12.3 s, 4.5 min, 3.2 h."""
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


def progress_bar(cfg: TrainConfig, start: int):
    """A tqdm bar over rollout steps (None when `cfg.progress` is off)."""
    if not cfg.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=cfg.total_training_steps, initial=start, desc=f"vespo train [{cfg.method}]", unit="step")

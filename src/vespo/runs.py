"""Run management around the training loop: the run directory, checkpoints with every RNG state, the metrics log
(JSONL + TensorBoard, wandb/trackio when asked), the reward plot, the progress bar and the embedded warm-start cache.

`vespo.trainer` (and the async learner) keep the loop; everything here is bookkeeping that must not change a number
of the run, so a run killed at any point and resumed from its last checkpoint continues bit for bit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from vespo.config import TrainConfig, to_yaml
from vespo.task import Problem, build_tiny_model, build_tokenizer, sft_warm_start

CHECKPOINT = "checkpoints/last.pt"
"""Path of a run's checkpoint inside its run dir (overwritten atomically at every save)."""


# ----------------------------------------------------------------------------------------------------------------
# Embedded warm start (cached by config hash)


def _sft_cache_key(cfg: TrainConfig) -> str:
    """Hash of everything the embedded warm start depends on (so sweeps over methods/N/seeds reuse one)."""
    keys = (
        "num_operands",
        "max_operand",
        "sft_steps",
        "sft_lr",
        "sft_batch_size",
        "sft_seed",
        "sft_label_noise",
        "eval_size",
    )
    task = {} if cfg.task == "arithmetic" else {"task": cfg.task}  # arithmetic keeps its existing cache entries
    blob = json.dumps({k: getattr(cfg, k) for k in keys} | task | {"v": 1}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def embedded_policy_path(cfg: TrainConfig, train_set: list[Problem]) -> Path:
    """Build (once) and cache the SFT-warm-started tiny model + tokenizer; return its directory."""
    path = Path(cfg.cache_dir).expanduser() / f"embedded-{_sft_cache_key(cfg)}"
    if (path / "config.json").is_file():
        return path
    tokenizer = build_tokenizer()
    positions = max(256, 2 * (4 * cfg.num_operands + 16))  # the chain task's prompt + response grow with it
    model = build_tiny_model(tokenizer, seed=cfg.sft_seed, max_position_embeddings=positions)
    with torch.random.fork_rng(devices=[]):
        sft_warm_start(
            model,
            tokenizer,
            train_set,
            steps=cfg.sft_steps,
            lr=cfg.sft_lr,
            batch_size=cfg.sft_batch_size,
            seed=cfg.sft_seed,
            label_noise=cfg.sft_label_noise,
        )
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:  # atomic publish; a concurrent process may have won the race, which is fine (same content)
        tmp.rename(path)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


# ----------------------------------------------------------------------------------------------------------------
# RNG state and checkpoints


def seed_everything(seed: int) -> torch.Generator:
    """Seed torch, Python and NumPy; return a fresh generator for the sampling noise (its state is checkpointed)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    return torch.Generator().manual_seed(seed)


def rng_state(gen: torch.Generator) -> dict:
    """Every RNG stream the run draws from."""
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "sampler": gen.get_state(),
    }


def set_rng_state(state: dict, gen: torch.Generator) -> None:
    """Restore the streams saved by `rng_state`."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    gen.set_state(state["sampler"])


def save_checkpoint(
    run_dir: Path, step: int, model, optimizer, gen: torch.Generator, extra: dict | None = None
) -> None:
    """Atomically write everything needed to continue bit-for-bit: weights, optimizer, step, all RNG states (and
    `extra` entries, e.g. the async trainer's next batch id)."""
    path = Path(run_dir) / CHECKPOINT
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng_state(gen)}
    torch.save(state | (extra or {}), tmp)
    os.replace(tmp, path)


def load_checkpoint(run_dir: Path) -> dict:
    """The run's last checkpoint as saved by `save_checkpoint`."""
    return torch.load(Path(run_dir) / CHECKPOINT, weights_only=False)


def open_run(cfg: TrainConfig) -> dict | None:
    """Prepare `cfg.run_dir` and return the checkpoint to resume from (None for a fresh run); writes config.yaml.

    Called before any model is loaded, so a run dir that cannot be used fails first.
    """
    run_dir = Path(cfg.run_dir)
    exists = (run_dir / CHECKPOINT).exists()
    if not cfg.resume and exists:
        raise ValueError(f"{run_dir} already holds a run; pass --resume to continue it or choose another run_dir")
    ckpt = load_checkpoint(run_dir) if cfg.resume and exists else None
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    return ckpt


def restore(ckpt: dict, model, optimizer, gen: torch.Generator) -> int:
    """Load a checkpoint's weights, optimizer and RNG states in place; return its step."""
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    set_rng_state(ckpt["rng"], gen)
    return ckpt["step"]


# ----------------------------------------------------------------------------------------------------------------
# Logging, metrics, plots, progress


class Logger:
    """metrics.jsonl (always), TensorBoard, and wandb / trackio when asked for and installed."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, start_step: int):
        self.path = Path(run_dir) / "metrics.jsonl"
        # on resume, drop lines logged after the checkpoint by a run that was killed, so history is not duplicated
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        kept = [ln for ln in lines if json.loads(ln)["step"] <= start_step]
        self.path.write_text("".join(ln + "\n" for ln in kept))
        self.sinks: list[Callable[[dict, int], None]] = []
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            tb = SummaryWriter(str(Path(run_dir) / "tb"), purge_step=start_step + 1)
            self.sinks.append(lambda m, s: [tb.add_scalar(k, v, s) for k, v in m.items()])
            self._tb = tb
        for name, project in (("wandb", cfg.wandb_project), ("trackio", cfg.trackio_project)):
            if project:
                lib = importlib.import_module(name)  # ImportError here is the clear message we want
                lib.init(project=project, config=dataclasses.asdict(cfg), resume="allow" if name == "wandb" else None)
                self.sinks.append(lambda m, s, lib=lib: lib.log(m, step=s))

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Append one step's scalars to every sink."""
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        for sink in self.sinks:
            sink(metrics, step)

    def close(self) -> None:
        """Flush and close TensorBoard."""
        if hasattr(self, "_tb"):
            self._tb.close()


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The run's metrics.jsonl as a list of dicts."""
    return [json.loads(ln) for ln in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def plot_run(run_dir: str | Path) -> Path:
    """reward.png: training reward per step and held-out accuracy at the evaluation steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    train = [(r["step"], r["reward/mean"]) for r in rows if "reward/mean" in r]
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    if train:
        ax.plot(*zip(*train, strict=True), label="training reward")
    if evals:
        ax.plot(*zip(*evals, strict=True), "o-", label="held-out accuracy")
    ax.set(xlabel="rollout step", ylabel="reward / accuracy", ylim=(0, 1), title=Path(run_dir).name)
    ax.legend()
    ax.grid(alpha=0.3)
    out = Path(run_dir) / "reward.png"
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def progress_bar(cfg: TrainConfig, start: int):
    """A tqdm bar over rollout steps (None when `cfg.progress` is off)."""
    if not cfg.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=cfg.total_training_steps, initial=start, desc=f"vespo train [{cfg.method}]", unit="step")

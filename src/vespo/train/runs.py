"""Run management around the training loop: the run directory (claimed, its config.yaml written, outputs replaced
only when they are a run's) and `Run`, the bookkeeping a loop calls at the end of every step: held-out evaluation,
logs (`vespo.train.logs`), warnings and the ESS alarm (`vespo.train.alarms`), checkpoints (`vespo.train.resume`), the
progress bar (`vespo.train.progress`) and, at the end, reward.png and the final policy.

`vespo.train.sync` (and the async learner) keep the loop; everything here is bookkeeping that must not change a number
of the run, so a run killed at any point and resumed from its last checkpoint continues bit for bit.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable
from pathlib import Path

from vespo.outputs import OutputError, OwnedDir, atomic_dir, claim, write_atomic
from vespo.train.alarms import EssAlarm, warn_skipped_updates
from vespo.train.config import ConfigError, TrainConfig
from vespo.train.config_io import load_yaml, to_yaml
from vespo.train.fields import RunSettings
from vespo.train.logs import Logger
from vespo.train.progress import progress_bar, time_estimate
from vespo.train.resume import CHECKPOINT, save_checkpoint
from vespo.train.reward_plot import plot_run

RUN_OUTPUTS = (
    "config.yaml", "metrics.jsonl", "completions.jsonl", "tb", "checkpoints", "final", "reward.png",
    "async_summary.json",
)  # fmt: skip
"""Everything a run writes in its run dir: the manifest of its marker (`vespo.outputs`), and all that replacing a run
(a dead one, or with --overwrite-output-dir) deletes. Any other file in the run dir is left alone."""


def claim_run_dir(cfg: RunSettings) -> OwnedDir:
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
    old = [] if cfg.run.resume else out.existing()
    if old:
        why = "replacing the run there" if (out.path / CHECKPOINT).exists() else "it holds no checkpoint; starting over"
        print(f"vespo train: run_dir {out.path}: {why} (deleting its {', '.join(old)})", file=sys.stderr)
        out.clear()
    # what the run is, not how this command started it: fed back with --config it starts the same run again
    threads = cfg.run.num_threads if num_threads is None else num_threads
    saved = to_yaml(cfg, resume=False, overwrite_output_dir=False, allow_change=(), num_threads=threads)
    write_atomic(out.path / "config.yaml", saved)
    return out.path


class Run:
    """One run's bookkeeping as a loop sees it: the claimed run dir, its logs (metrics, completions, TensorBoard), the
    held-out evaluations when due, the ESS alarm, checkpoints and the progress bar. Nothing here changes a number."""

    def __init__(self, cfg: RunSettings, out: OwnedDir, start: int, evaluate: Callable[[], dict] | None, *,
                 total: int, alarm: EssAlarm, label: str):  # fmt: skip
        """`cfg`: the run's settings; `total` rollout steps; `alarm`: the ESS alarm; `label`: the bar's (the
        method)."""
        self.cfg, self.dir, self.start, self.total, self.label = cfg, out.path, start, total, label
        self.logger = Logger(cfg, out.path, start)
        self.alarm = alarm
        self.evaluate = evaluate if cfg.eval_every > 0 else None
        self.bar = None
        self.began = self.eval_s = None  # when the first step began; how long one evaluation took (`time_estimate`)

    def begin(self) -> None:
        """Log a fresh run's initial held-out evaluation (step 0), then show the progress bar."""
        if self.evaluate is not None and self.start == 0:
            self.logger.log(self._timed_evaluation(), 0)
        self.bar = progress_bar(self.total, self.start, self.label) if self.cfg.progress else None
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
        if self.evaluate is not None and (step % cfg.eval_every == 0 or step == self.total):
            metrics |= self._timed_evaluation()
        self.logger.log(metrics, step)
        warn_skipped_updates(step, metrics)
        stop = self.alarm.update(step, metrics)
        if step % cfg.save_every == 0 or step == self.total or stop:
            save_checkpoint(self.dir, step, learner, gen, loop, keep=cfg.save_total_limit)
        if self.bar is not None:
            self.bar.update(1)
            shown = {"reward": f"{metrics['reward/mean']:.3f}", show.split("/")[-1]: f"{metrics[show]:.1f}"}
            self.bar.set_postfix(shown)
        if self.bar is not None and step == self.start + 1:  # this process's first step: the run's time is known
            eval_s = self.eval_s if self.evaluate is not None else 0.0
            estimate = time_estimate(self.total, cfg.eval_every, step, step_s, eval_s)
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

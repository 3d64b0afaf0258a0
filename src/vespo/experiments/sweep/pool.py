"""Running a sweep's grid: every cell a `vespo train` process on its own config file, in a pool of `jobs` threads,
resumable and stoppable (Ctrl-C keeps every finished cell and each running one's last checkpoint)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from vespo.experiments.grid import GridInterrupted, claim_grid_dir
from vespo.experiments.presets import gate
from vespo.experiments.sweep.cells import cells, train_config
from vespo.experiments.sweep.config import Cell, SweepConfig, resolve
from vespo.experiments.sweep.plots import plot
from vespo.experiments.sweep.report import read_summary, summarize, write_tables
from vespo.outputs import open_append, write_atomic
from vespo.train.config import TrainConfig
from vespo.train.config_io import to_yaml  # torch, scipy, matplotlib: imported where a grid runs or is drawn


def write_cell_config(tc: TrainConfig) -> list[str]:
    """Write a cell's config beside its run dir (`<key>.yaml`, headed by the command that runs it by hand) and return
    the command the sweep runs it with: `vespo train --config <key>.yaml` in a process of its own."""
    run_dir = Path(tc.run.run_dir)
    path = run_dir.parent / f"{run_dir.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    where = "" if path.is_absolute() else " from the directory the sweep ran in"
    header = (f"# a `vespo sweep` cell; run it{where} (--resume: continue its checkpoint) with\n"
              f"#   vespo train --config {shlex.quote(str(path))}\n")  # fmt: skip
    write_atomic(path, header + to_yaml(tc))
    return [sys.executable, "-m", "vespo", "train", "--config", str(path)]


def run_cell(cfg: SweepConfig, cell: Cell, warm_start: str = "") -> dict:
    """Run one cell in a `vespo train` process on its config file (`write_cell_config`), resuming a half-finished one;
    returns its summary (also saved as summary.json), with `warm_start`, the fingerprint of the build it started
    from, when it runs now (a finished cell keeps what it recorded). Nothing is deleted: the cell's run dir is its
    own (named by `cell_key`). A finished cell whose summary.json is damaged (a crash of an older vespo that wrote it
    in place) is summarised again from its metrics, saying so."""
    from vespo.train.logs import read_metrics
    from vespo.train.resume import CHECKPOINT

    tc = train_config(cfg, cell)
    run_dir = Path(tc.run.run_dir)
    done = run_dir / "summary.json"
    if os.path.lexists(done):  # finished: summarised afresh from its metrics when present (newer summaries say more)
        saved = read_summary(done)
        has_metrics = (run_dir / "metrics.jsonl").is_file()
        if saved is not None and not has_metrics:
            return saved
        if has_metrics:
            summary = _gated(cfg, cell, summarize(cell, read_metrics(run_dir), cfg.collapse_ratio))
            if saved is None:
                print(f"vespo sweep: cell {cell.name}: {done} is damaged; summarised again from its metrics.jsonl",
                      file=sys.stderr)  # fmt: skip
                write_atomic(done, json.dumps(summary | {"wall_s": float("nan")}))
            kept = {k: saved[k] for k in ("wall_s", "warm_start") if saved and k in saved}
            return summary | {"wall_s": float("nan")} | kept
        print(f"vespo sweep: cell {cell.name}: {done} is damaged and the cell has no metrics.jsonl; running it again",
              file=sys.stderr)  # fmt: skip
        done.unlink()
    resume = (run_dir / CHECKPOINT).is_file()  # else a fresh run; one killed before its checkpoint is started over
    argv = write_cell_config(tc)
    log = run_dir.parent / f"{run_dir.name}.log"
    t0 = time.perf_counter()
    with open_append(log) as f:
        returncode = _CELLS.run([*argv, *(["--resume"] if resume else [])], stdout=f, stderr=subprocess.STDOUT)
    if returncode is None:  # the sweep is stopping: the cell was never started, or stopped
        return {}
    if returncode != 0:
        raise RuntimeError(f"cell {cell.name} failed (exit {returncode}); see {log}")
    summary = summarize(cell, read_metrics(run_dir), cfg.collapse_ratio)
    summary = _gated(cfg, cell, summary) | {"wall_s": time.perf_counter() - t0}
    summary |= {"warm_start": warm_start} if warm_start else {}
    write_atomic(done, json.dumps(summary))
    return summary


def _gated(cfg: SweepConfig, cell: Cell, summary: dict) -> dict:
    """The summary with its regime gate (`gate`) where the preset has one."""
    verdict = gate(cfg.preset, cell.method, cell.num_mini_batches, summary)
    return summary | ({"gate": verdict} if verdict else {})


class _Cells:
    """The `vespo train` processes of the running cells: started only while the sweep is not stopping, and all
    stopped at once by `stop` (Ctrl-C), whichever thread runs them."""

    STOP_WAIT_S = 10.0
    """How long a cell may take to exit after its SIGTERM before it is killed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen] = set()
        self.stopping = False

    def run(self, argv: list[str], **popen) -> int | None:
        """Run `argv` to the end and return its exit code; None when the sweep is stopping."""
        with self._lock:
            if self.stopping:
                return None
            proc = subprocess.Popen(argv, **popen)
            self._procs.add(proc)
        try:
            code = proc.wait()
        finally:
            with self._lock:
                self._procs.discard(proc)
        return None if self.stopping else code

    def stop(self) -> int:
        """Start no more cells; SIGTERM every running one (`vespo train` stops on it as on Ctrl-C: its last checkpoint
        stays), kill any still alive after `STOP_WAIT_S`. Returns how many were running. Not SIGINT: a sweep started
        in the background (`cmd &`) hands its cells SIGINT ignored, so they would run on until killed, and a killed
        cell leaves its forkserver behind."""
        with self._lock:
            self.stopping = True
            procs = list(self._procs)
        deadline = time.monotonic() + 1.0  # a terminal's Ctrl-C reached them too: let them stop on their own first
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.poll() is None:  # only the sweep was signalled (kill -INT or -TERM): pass it on
                with contextlib.suppress(OSError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.STOP_WAIT_S
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return len(procs)


_CELLS = _Cells()


SWEEP_OUTPUTS = ("cells", "results.csv", "results.md", "fig3_training_reward.png", "fig4_dynamics.png",
                 "fig_lr_robustness.png")  # fmt: skip
"""What a sweep writes in its out_dir (the manifest of its marker, `vespo.outputs`)."""


def sweep(cfg: SweepConfig) -> list[dict]:
    """Run (or finish) the grid in its claimed out_dir, then write the tables and figures. Returns the per-cell
    summaries."""
    cfg = resolve(cfg)
    grid = cells(cfg)
    columns = {"variant", "method", "N", "seed", "final_eval_acc"}  # `summarize`'s, in every vespo version
    with claim_grid_dir("sweep", cfg.out_dir, SWEEP_OUTPUTS, overwrite=cfg.overwrite_output_dir, columns=columns):
        return _run_grid(cfg, grid)


def _run_grid(cfg: SweepConfig, grid: list[Cell]) -> list[dict]:
    from tqdm.auto import tqdm

    from vespo.embedded.warm_start import WarmStartSpec, embedded_policy_path, fingerprint

    out_dir = Path(cfg.out_dir)

    global _CELLS
    _CELLS = _Cells()  # a fresh set per sweep (an API caller may run several)
    pool = ThreadPoolExecutor(max_workers=cfg.jobs)
    try:
        warm = {}  # warm start once per task, before the parallel cells race for it
        for task in cfg.task:
            path = embedded_policy_path(WarmStartSpec.of(train_config(cfg, next(c for c in grid if c.task == task))))
            warm[task] = fingerprint(path)
        with tqdm(total=len(grid), desc="vespo sweep") as bar:
            futures = [pool.submit(run_cell, cfg, c, warm[c.task]) for c in grid]
            summaries = []
            for fut in futures:
                summaries.append(fut.result())
                bar.update(1)
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        running = _CELLS.stop()
        pool.shutdown(wait=True)
        raise GridInterrupted(_kept(cfg, grid, running)) from None
    pool.shutdown()
    write_tables(out_dir, summaries, eval_prompts=cfg.eval_size * cfg.eval_n)
    plot(cfg, grid)
    return summaries


def _kept(cfg: SweepConfig, grid: list[Cell], running: int) -> str:
    """What an interrupted sweep leaves, in one phrase."""
    done = sum((Path(cfg.out_dir) / "cells" / c.name / "summary.json").is_file() for c in grid)
    text = f"{done} of {len(grid)} cells finished and kept in {Path(cfg.out_dir) / 'cells'}"
    if running:
        text += f"; the {running} running cell(s) stopped at their last checkpoint"
    partial = [p for task in cfg.task if (p := _unfinished_warm_start(cfg, grid, task)) is not None]
    if partial:
        text += f"; the warm start's progress is kept in {partial[0]}"
    return text + "; the same command continues the sweep"


def _unfinished_warm_start(cfg: SweepConfig, grid: list[Cell], task: str) -> Path | None:
    from vespo.embedded.warm_start import WarmStartSpec, unfinished

    return unfinished(WarmStartSpec.of(train_config(cfg, next(c for c in grid if c.task == task))))

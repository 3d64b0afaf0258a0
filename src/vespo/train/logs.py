"""A run's logs: metrics.jsonl (always), completions.jsonl, TensorBoard, and wandb / trackio when asked for
(`Logger`); on resume both JSONL logs are cut back to the checkpoint's step (`truncate_log`), so history is never
duplicated; `read_metrics` reads metrics.jsonl back."""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from vespo.outputs import open_append, read_regular, write_atomic
from vespo.train.config import TrainConfig
from vespo.train.config_io import load_yaml


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
            if isinstance(row, dict) and type(row.get("step")) is int and row["step"] >= 0:  # bool is no step
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

"""A run's logs: metrics.jsonl (always), completions.jsonl, TensorBoard, and wandb / trackio when asked for
(`Logger`); on resume both JSONL logs are cut back to the checkpoint's step (`truncate_log`), so history is never
duplicated; `read_metrics` reads metrics.jsonl back."""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from vespo.outputs import open_append, open_regular, read_regular, write_atomic
from vespo.train.config_io import load_yaml
from vespo.train.fields import RunSettings


class Logger:
    """metrics.jsonl (always), TensorBoard, and wandb / trackio when asked for and installed."""

    def __init__(self, cfg: RunSettings, run_dir: Path, start_step: int):
        self.path = Path(run_dir) / "metrics.jsonl"
        # on resume, drop lines logged after the checkpoint by a run that was killed, so history is not duplicated
        last = truncate_log(self.path, start_step)
        truncate_log(self.path.parent / "completions.jsonl", start_step)
        self.last = {k: v for k, v in last.items() if k != "step"} if last else {}
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


MAX_LOG_LINE_BYTES = 64 << 20
"""Longest line of a JSONL log `truncate_log` keeps: a completions row holds a prompt (at most `MAX_PROMPT_CHARS`)
and a response; a longer line is no row vespo wrote, and is dropped as damaged."""


def truncate_log(path: Path, step: int) -> dict | None:
    """Keep the rows of JSONL log `path` up to rollout step `step` (what the checkpoint continues from) and return the
    last one kept (None: none). The file is streamed line by line, never read whole (a long run's completions.jsonl
    holds gigabytes), and kept lines are copied as they are. A missing file, or lines that are not step rows (damaged
    by a crash or by hand, or longer than `MAX_LOG_LINE_BYTES`), cost only their history: one stderr line says what
    was lost, and the run continues from its checkpoint."""
    last, bad = None, []
    if os.path.lexists(path):
        with open(open_regular(path), "rb") as src:

            def keep(dst) -> None:
                nonlocal last
                lines = _log_lines(src)
                line, number = next(lines, None), 1
                while line is not None:
                    following = next(lines, None)
                    row = _step_row(line)
                    if row is not None:
                        if row["step"] <= step:
                            dst.write(line if line.endswith(b"\n") else line + b"\n")
                            last = row
                    elif line.strip() and following is not None:  # a torn last line: the write a kill cut, redone
                        bad.append(number)
                    line, number = following, number + 1

            write_atomic(path, keep)
    elif step > 0 and path.name == "metrics.jsonl":
        print(f"vespo train: resume: {path} is missing; the history of steps 1-{step} is lost, training continues "
              f"from the checkpoint at step {step}", file=sys.stderr)  # fmt: skip
    if bad:
        print(f"vespo train: resume: {path}: dropped {len(bad)} damaged line(s) (line {bad[0]}"
              f"{' and later' if len(bad) > 1 else ''}); training continues from the checkpoint at step {step}",
              file=sys.stderr)  # fmt: skip
    return last


def _log_lines(src) -> Iterator[bytes]:
    """The lines of binary file `src`, each read with at most `MAX_LOG_LINE_BYTES` + 1 bytes in memory; a longer one
    is skipped to its end and stands as b"\\0" (a damaged line)."""
    while line := src.readline(MAX_LOG_LINE_BYTES + 1):
        if len(line) > MAX_LOG_LINE_BYTES and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):
                line = src.readline(MAX_LOG_LINE_BYTES + 1)
            line = b"\0"
        yield line


def _step_row(line: bytes) -> dict | None:
    """A JSONL log line as its row, when it is one: an object with an integer `step` >= 0 (a bool is no step)."""
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return row if isinstance(row, dict) and type(row.get("step")) is int and row["step"] >= 0 else None


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

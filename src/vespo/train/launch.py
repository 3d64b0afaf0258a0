"""`vespo train`: parse and validate the config, then run the loop it names (sync or async). The loops never import
each other; this is the one place that picks one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vespo.models import quiet_hf_progress
from vespo.rewards.batch import GraderHostError
from vespo.train.config import ConfigError, TrainConfig, resolve
from vespo.train.config_io import parse_args
from vespo.train.runs import CHECKPOINT, claim_run_dir


def train(cfg: TrainConfig) -> dict[str, float]:
    """Run RL training per `cfg` (sync or async, per `cfg.mode`); returns the last step's metrics. Everything is
    validated before any compute."""
    return _run(resolve(cfg))


def _run(cfg: TrainConfig) -> dict[str, float]:
    """`train` on a resolved config (`parse_args` resolves it once)."""
    if not cfg.progress:
        quiet_hf_progress()
    if cfg.mode == "async":
        from vespo.train.async_ import train_async as loop
    else:
        from vespo.train.sync import train_sync as loop
    with claim_run_dir(cfg) as out:  # the run dir is vespo's and this process's until the run ends
        return loop(cfg, out)


def _interrupted(cfg: TrainConfig | None) -> str:
    """What an interrupted run leaves: a checkpoint to resume from, or a run dir a new run will reuse."""
    if cfg is None:
        return "nothing was started"
    run_dir = Path(cfg.run_dir).expanduser()
    if (run_dir / CHECKPOINT).is_file():
        return f"the last checkpoint in {run_dir} is kept (--resume continues from it)"
    return (
        f"no checkpoint was saved yet (the first is at step {cfg.save_every}); running again starts over in {run_dir}"
    )


def cli(argv: list[str]) -> int:
    """`vespo train [--config file.yaml] [flags]`."""
    cfg = None
    try:
        cfg = parse_args(argv)  # resolved
        last = _run(cfg)
    except ConfigError as exc:  # bad input, found before any compute
        print(f"vespo train: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"vespo train: interrupted; {_interrupted(cfg)}", file=sys.stderr)
        return 130
    except GraderHostError as exc:  # never scored as wrong answers: the run stops before it trains on them
        print(f"vespo train: grading failed on this host: {exc}; {_interrupted(cfg)}", file=sys.stderr)
        return 1
    print(json.dumps({k: round(v, 4) for k, v in last.items() if k.startswith(("reward/", "eval/"))}))
    print(f"run dir: {cfg.run_dir}")
    return 0

"""Training: `config` (TrainConfig, YAML, validation), `setup` (run state), `learner` (log-probs and the N
mini-batch update), the loops `sync` and `async_` (+ its `sampler` processes), `runs` (run dir, checkpoints, logs)
and `launch`, which picks the loop."""

from vespo.train.config import ConfigError, TrainConfig
from vespo.train.config_io import parse_args
from vespo.train.launch import train

__all__ = ["ConfigError", "TrainConfig", "parse_args", "train"]

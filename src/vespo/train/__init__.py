"""Training: `config` (TrainConfig, valid once built: the sections of `fields`, each checked by `checks`; read from
YAML and flags by `config_io`, veRL's and TRL's names by `dialects`), `host` (what the machine must provide, with
`shm` for /dev/shm), `setup` (run state), `produce` (the one batch producer), `learner` (log-probs and the N
mini-batch update; beside it `probe`, the gradient probe, `opob`, VCPO's baseline, and `step_metrics`, the step's
metrics), the loops `sync` and `async_` (+ its `sampler` processes and their `forkserver`), `runs` (the run dir and
`Run`, which calls `logs`, `alarms`, `resume`, `progress` and `reward_plot`), `system` (clock, heap trim, seeding)
and `launch`, which picks the loop. Names load on first use (the `vespo` command starts light)."""

import importlib

_LAZY = {
    "ConfigError": "vespo.train.config",
    "TrainConfig": "vespo.train.config",
    "parse_args": "vespo.train.config_io",
    "train": "vespo.train.launch",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'vespo.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value

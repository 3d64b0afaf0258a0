"""Shared test helpers."""

from vespo.train.learner import ppo_update, to_floats
from vespo.train.setup import update_settings


def run_update(model, optimizer, rollout, advantages, old_log_prob, cfg, **kw):
    """The learner's N-mini-batch update with the settings of a TrainConfig; per mini-batch metrics as floats."""
    settings = update_settings(cfg, num_mini_batches=cfg.num_mini_batches, shuffle=cfg.shuffle)
    return [to_floats(h) for h in ppo_update(model, optimizer, rollout, advantages, old_log_prob, settings, **kw)]

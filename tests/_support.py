"""Shared test helpers."""

from pathlib import Path

from vespo.train.learner import Learner, UpdateBatch, ppo_update
from vespo.train.setup import update_settings
from vespo.train.step_metrics import to_floats


def run_update(model, optimizer, rollout, advantages, old_log_prob, cfg, **kw):
    """The learner's N-mini-batch update with the settings of a TrainConfig; per mini-batch metrics as floats. `kw`:
    the batch's other inputs (`UpdateBatch`)."""
    settings = update_settings(cfg, num_mini_batches=cfg.batch.num_mini_batches, shuffle=cfg.batch.shuffle)
    history, _ = ppo_update(Learner(model, optimizer, settings), UpdateBatch(rollout, advantages, old_log_prob, **kw))
    return [to_floats(h) for h in history]


def warm_tiny_model(root: Path) -> tuple[Path, list, list]:
    """A 1-layer tiny model briefly warm-started (40 SFT steps) on the 2-operand arithmetic task, saved with its
    tokenizer to root/model; returns that path and the task's (train, held-out of 20) split."""
    from vespo.embedded.task import arithmetic_split, build_tiny_model, build_tokenizer
    from vespo.embedded.warm_start import sft_warm_start

    tok = build_tokenizer()
    model = build_tiny_model(tok, num_hidden_layers=1)
    train_set, eval_set = arithmetic_split(num_operands=2, max_operand=9, eval_size=20)
    sft_warm_start(model, tok, train_set, steps=40, lr=3e-3, batch_size=32, seed=0)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    return root / "model", train_set, eval_set

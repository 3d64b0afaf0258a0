"""The numbers a run keeps: the first checkpoint an interrupt names, the logged prompts, a resumed run's
config.yaml, the split the docs state."""

import pytest
import torch
from _commands import ROOT, vespo

from vespo.embedded.task import build_tokenizer


def test_interrupt_message_names_the_first_checkpoint_this_run_would_save(tmp_path):
    from vespo.train.config import TrainConfig
    from vespo.train.launch import _interrupted

    cfg = TrainConfig(run_dir=str(tmp_path / "r"), total_training_steps=3, model=str(tmp_path))
    assert "the first is at step 3)" in _interrupted(cfg)
    assert "the first is at step 25)" in _interrupted(cfg.replace(total_training_steps=100))


def test_logged_prompts_are_what_the_model_read_special_tokens_included():
    from vespo.rollout import Rollout
    from vespo.train.setup import completion_rows

    tok = build_tokenizer()
    ids = tok(["1+2=", "10+20="], padding=True, return_tensors="pt")  # left-padded, with <bos>
    response = torch.full((2, 3), tok.eos_token_id)
    rollout = Rollout(torch.cat([ids.input_ids, response], 1), torch.cat([ids.attention_mask, torch.ones(2, 3)], 1),
                      torch.ones(2, 3), torch.zeros(2, 3))  # fmt: skip
    rows = completion_rows(tok, rollout, torch.ones(2), torch.zeros(2), 2)
    assert [r["prompt"] for r in rows] == ["<bos>1+2=", "<bos>10+20="]  # no padding, the BOS the model saw kept


@pytest.mark.slow
def test_a_resumed_runs_config_yaml_feeds_back_with_config(random_model, tmp_path):
    from vespo.train.config_io import load_yaml, parse_args

    run = tmp_path / "r"
    argv = ["train", "--model", str(random_model), "--num-operands", "2", "--eval-size", "8", "--train-batch-size",
            "2", "--ppo-mini-batch-size", "2", "--rollout-n", "2", "--max-response-length", "4", "--eval-every", "0",
            "--no-tensorboard", "--no-progress", "--run-dir", str(run)]  # fmt: skip
    assert vespo(*argv, "--total-training-steps", "1").returncode == 0
    done = vespo(*argv, "--total-training-steps", "2", "--resume", "--allow-change", "total_training_steps")
    assert done.returncode == 0, done.stderr[-2000:]
    saved = load_yaml(run / "config.yaml")
    assert saved["resume"] is False and saved["allow_change"] == () and saved["total_training_steps"] == 2
    cfg = parse_args(["--config", str(run / "config.yaml"), "--run-dir", str(tmp_path / "again")])
    assert cfg.batch.total_training_steps == 2 and not cfg.run.resume


def test_docs_state_the_split_the_code_uses():
    from vespo.embedded.task import embedded_split, held_out_pool

    train, held_out = embedded_split("arithmetic", num_operands=3, max_operand=9, eval_size=200)
    pool = held_out_pool("arithmetic", num_operands=3, max_operand=9)
    text = " ".join((ROOT / "docs" / "guides" / "trainer.md").read_text().split())
    assert (len(train), pool, len(held_out)) == (500, 500, 200)
    assert "800 train" not in text and f"{len(train)} training problems and a held-out pool of {pool}" in text

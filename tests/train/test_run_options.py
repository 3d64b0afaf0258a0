"""Options a first run meets: quiet under --no-progress, no deprecation noise from vespo's own calls, one
vocabulary across commands, conflicting flags refused, veRL-style nested YAML keys accepted."""

import subprocess
import sys

import pytest


def _train(model, *flags):
    argv = ["--model", str(model), "--num-operands", "2", "--eval-size", "8", "--train-batch-size", "2",
            "--ppo-mini-batch-size", "2", "--rollout-n", "2", "--max-response-length", "4", "--eval-every", "1",
            "--total-training-steps", "1", "--no-tensorboard", *flags]  # fmt: skip
    return subprocess.run([sys.executable, "-m", "vespo", "train", *argv], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_no_progress_means_no_bars_and_no_deprecation_noise(random_model, tmp_path):
    """--no-progress silences Hugging Face's loading/saving bars too, and vespo's sampler calls the model with the
    installed transformers' current cache argument (no FutureWarning of our making)."""
    done = _train(random_model, "--no-progress", "--run-dir", str(tmp_path / "run"))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-2000:]
    for noise in ("Loading weights", "Writing model shards", "it/s]", "deprecated", "FutureWarning"):
        assert noise not in out, (noise, out[-2000:])


def test_verl_nested_and_dotted_yaml_keys(tmp_path):
    """A veRL user's YAML works as is: nested sections and dotted keys map to vespo's fields; clip ratios become
    hparams; veRL keys that would change the run are refused together in one line naming each."""
    from vespo.train.config import ConfigError
    from vespo.train.config_io import load_yaml

    (tmp_path / "verl.yaml").write_text(
        "data:\n  train_batch_size: 64\n  max_response_length: 32\n"
        "actor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 8\n    clip_ratio_high: 0.28\n"
        "    use_kl_loss: false\n    kl_loss_coef: 0.01\n    policy_loss:\n      loss_mode: vespo\n"
        "    optim:\n      lr: 1.0e-6\n  rollout:\n    n: 4\n    temperature: 0.9\n"
        "trainer:\n  total_training_steps: 7\n"
        "actor_rollout_ref.model.lora_rank: 8\nseed: 3\n"
    )
    got = load_yaml(tmp_path / "verl.yaml")
    assert got == {
        "train_batch_size": 64, "max_response_length": 32, "ppo_mini_batch_size": 8,
        "hparams": {"clip_ratio_high": 0.28}, "kl_coef": 0.0, "method": "vespo", "lr": 1e-6, "rollout_n": 4,
        "temperature": 0.9, "total_training_steps": 7, "lora_r": 8, "use_peft": True, "seed": 3,
        # veRL's defaults where vespo's differ (VERL_DEFAULTS): its LoRA of lora_rank 8, the AdamW of its optim section
        "lora_alpha": 16, "lora_target_modules": ("all-linear",), "weight_decay": 0.01, "betas": (0.9, 0.999),
        "lr_scheduler_type": "constant",
    }  # fmt: skip
    (tmp_path / "bad.yaml").write_text("actor_rollout_ref:\n  actor:\n    ppo_epochs: 2\n    loss_scale_factor: 3\n")
    with pytest.raises(ConfigError, match=r"ppo_epochs=2 .*; actor_rollout_ref.actor.loss_scale_factor \(no vespo"):
        load_yaml(tmp_path / "bad.yaml")  # both refused settings named in one line
    (tmp_path / "clash.yaml").write_text("data:\n  train_batch_size: 64\ntrain_batch_size: 32\n")
    with pytest.raises(ConfigError, match="train_batch_size"):
        load_yaml(tmp_path / "clash.yaml")


@pytest.mark.parametrize("batch", ["8", "16"])  # 16 is train_batch_size's old default, once dropped silently
def test_staleness_and_an_explicit_train_batch_size_conflict(capsys, batch):
    from vespo.cli import main

    assert main(["train", "--num-mini-batches", "4", "--train-batch-size", batch, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "staleness=4" in err[0] and f"train_batch_size={batch}" in err[0] and "give one" in err[0]
    assert main(["train", "--staleness", "4", "--num-mini-batches", "4", "--no-progress"]) == 2  # two names of N
    assert capsys.readouterr().err.splitlines() == [
        "vespo train: error: --staleness and --num-mini-batches are two names of one setting: give one of them"
    ]


@pytest.mark.slow
def test_log_completions_and_hparams_in_tensorboard(random_model, tmp_path):
    """--log-completions writes prompt / completion / reward / advantage rows per step (what was graded), and the
    config reaches TensorBoard's HParams and text tabs."""
    import json

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "logged"
    argv = ["--no-progress", "--tensorboard", "--run-dir", str(run), "--log-completions", "--num-completions-to-print"]
    done = _train(random_model, *argv, "3")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["step"] == 1 for r in rows)
    assert all(r["prompt"].endswith("=") and isinstance(r["completion"], str) for r in rows)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(r["reward"] in (0.0, 1.0) for r in rows) and abs(sum(r["advantage"] for r in rows[:2])) < 1e-5
    assert metrics[-1]["step"] == 1
    acc = EventAccumulator(str(run / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    assert "completions/text_summary" in tags["tensors"] and "config/text_summary" in tags["tensors"]
    assert "_hparams_/experiment" in str(acc.PluginTagToContent("hparams"))


def test_one_vocabulary_across_commands_and_the_old_names_still_work():
    """train, sweep and lab share the names (ppo_mini_batch_size, rollout_n, optim, adam_epsilon, rollout_logit_noise,
    num_operands); the old spellings stay as aliases; train's help names --config and --async."""
    import tyro

    from vespo.experiments.lab import LabConfig
    from vespo.experiments.sweep import SweepConfig
    from vespo.train.config import FIELD_TYPES

    train = set(FIELD_TYPES)
    assert {"ppo_mini_batch_size", "rollout_n", "num_operands"} <= set(SweepConfig.__dataclass_fields__) & train
    assert {"rollout_n", "optim", "adam_epsilon", "rollout_logit_noise"} <= set(LabConfig.__dataclass_fields__) & train
    old = ["--mini-batch-size", "2", "--chain-operands", "7"]
    assert (lambda c: (c.ppo_mini_batch_size, c.num_operands))(tyro.cli(SweepConfig, args=old)) == (2, 7)
    old = ["--group-size", "4", "--optimizer", "sgd", "--adam-eps", "0.01", "--mismatch-std", "0.5"]
    cfg = tyro.cli(LabConfig, args=old)
    assert (cfg.rollout_n, cfg.optim, cfg.adam_epsilon, cfg.rollout_logit_noise) == (4, "sgd", 0.01, 0.5)
    done = subprocess.run([sys.executable, "-m", "vespo", "train", "--help"], capture_output=True, text=True)
    assert "--config" in done.stdout and "--async" in done.stdout


@pytest.mark.parametrize("flag", ["--dataset", "--model"])
def test_unreachable_hub_fails_fast_in_one_line(tmp_path, flag):
    """A Hub id while the Hub cannot be reached (here: an endpoint nothing listens on) and nothing is cached: one line
    naming it, in seconds, instead of a long traceback after retries."""
    import os

    from _clock import HANG_GUARD_S

    env = os.environ | {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    argv = ["train", flag, "someorg/not-cached", "--run-dir", str(tmp_path / "run"), "--no-progress"]
    done = subprocess.run([sys.executable, "-m", "vespo", *argv], capture_output=True, text=True, env=env,
                          timeout=HANG_GUARD_S)  # fmt: skip
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-1500:]
    assert "someorg/not-cached" in errors[0] and "cached" in errors[0]


def test_clip_frac_counts_responses_cut_at_max_response_length():
    """response/clip_frac is the share of responses that hit max_response_length (not the batch's longest): none
    here is cut although lengths differ, then one of three is."""
    import torch

    from vespo.rollout import Rollout
    from vespo.train.step_metrics import rollout_metrics

    def rollout(lengths, width=6):
        mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
        ids = torch.ones(len(lengths), 2 + width, dtype=torch.long)
        return Rollout(ids, torch.cat([torch.ones(len(lengths), 2, dtype=torch.long), mask], 1), mask, -mask.float())

    rewards = torch.tensor([1.0, 0.0, 1.0])
    assert float(rollout_metrics(rewards, rollout([2, 5, 3]), 8)["response/clip_frac"]) == 0.0
    cut = rollout_metrics(rewards, rollout([2, 6, 3]), 6)["response/clip_frac"]
    assert float(cut) == pytest.approx(1 / 3)


def test_a_yaml_key_typo_names_the_nearest_keys_as_a_flag_typo_does(tmp_path):
    """Issue 55 item 10: `ppo_mini_batch_sise` in a --config file got no hint (a misspelt flag gets the nearest
    names); a flat key is matched against vespo's fields, a veRL key against the veRL keys vespo reads."""
    from vespo.train.config import ConfigError
    from vespo.train.config_io import load_yaml

    path = tmp_path / "typo.yaml"
    path.write_text("ppo_mini_batch_sise: 4\n")
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) \['ppo_mini_batch_sise'\]; nearest: "
                                          r"ppo_mini_batch_size(,|$)"):  # fmt: skip
        load_yaml(path)
    path.write_text("actor_rollout_ref:\n  actor:\n    ppo_mini_batch_sise: 4\n")
    with pytest.raises(ConfigError, match=r"ppo_mini_batch_sise \(no vespo counterpart; nearest: "
                                          r"actor_rollout_ref.actor.ppo_mini_batch_size[,)]"):  # fmt: skip
        load_yaml(path)
    path.write_text("zzz: 4\n")
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) \['zzz'\]$"):  # nothing near: no hint
        load_yaml(path)


def test_a_flag_for_n_overrides_the_config_files_other_spelling_of_it(tmp_path):
    """Flags override --config: `--num-mini-batches 4` over a file's `train_batch_size: 32` (or `--train-batch-size`
    over its `staleness`) is the flag's N, not a clash; both spellings in one file or one command line still are."""
    from vespo.train.config import ConfigError
    from vespo.train.config_io import parse_args

    (tmp_path / "batch.yaml").write_text("train_batch_size: 32\nppo_mini_batch_size: 4\n")
    (tmp_path / "n.yaml").write_text("staleness: 2\nppo_mini_batch_size: 4\n")
    (tmp_path / "both.yaml").write_text("staleness: 2\ntrain_batch_size: 32\nppo_mini_batch_size: 4\n")
    assert (
        parse_args(["--config", str(tmp_path / "batch.yaml"), "--num-mini-batches", "4"]).batch.train_batch_size == 16
    )
    assert parse_args(["--config", str(tmp_path / "batch.yaml")]).batch.num_mini_batches == 8
    assert parse_args(["--config", str(tmp_path / "n.yaml"), "--train-batch-size", "12"]).batch.num_mini_batches == 3
    with pytest.raises(ConfigError, match="staleness=2 .* train_batch_size=32 was also given"):
        parse_args(["--config", str(tmp_path / "both.yaml")])


def test_a_bools_on_and_off_forms_are_one_name_and_the_last_wins():
    """`--no-tensorboard ... --tensorboard` overrides a default as argparse does (one flag, on and off); two names
    of one setting (`--staleness` beside `--num-mini-batches`) stay refused."""
    from vespo.argv import flag_fields, two_spellings
    from vespo.train.fields import TrainFields

    spellings = flag_fields(TrainFields)
    assert two_spellings(["--no-tensorboard", "--tensorboard"], spellings) is None
    assert two_spellings(["--tensorboard", "--no_tensorboard"], spellings) is None
    message = two_spellings(["--staleness", "4", "--num-mini-batches", "8"], spellings)
    assert message == "--staleness and --num-mini-batches are two names of one setting: give one of them"

"""veRL configs and data in `vespo train`: vespo's own veRL examples load, settings that change the run are
refused in one line, veRL's parquet layout loads through the record loader."""

import os
import subprocess

import pytest
from _commands import ROOT
from _optional import require


def _dry_run(script: str, **env) -> dict:
    """The Hydra overrides of an examples/verl script as one YAML mapping of dotted keys."""
    import yaml

    out = subprocess.run(["bash", str(ROOT / "examples" / "verl" / script)], capture_output=True, text=True,
                         check=True, env={**os.environ, "VESPO_DRY_RUN": "1", **env}).stdout.splitlines()  # fmt: skip
    return {k.lstrip("+"): yaml.safe_load(v) for k, v in (line.split("=", 1) for line in out[1:])}


@pytest.mark.parametrize("script", ["dense_fsdp.sh", "qwen3_30b_a3b_megatron.sh", "code_eurus_megatron.sh"])
def test_vespos_own_verl_examples_load_with_one_warning_line(script, tmp_path, capsys):
    import yaml

    from vespo.train.config import ConfigError
    from vespo.train.config_io import load_yaml

    keys = _dry_run(script)
    path = tmp_path / "verl.yaml"
    path.write_text(yaml.safe_dump(keys))
    with pytest.raises(ConfigError) as refused:  # the run's length is veRL's epochs: the one thing to add
        load_yaml(path)
    assert str(refused.value).count("trainer.total_epochs") == 1 and len(str(refused.value)) < 300
    path.write_text(yaml.safe_dump(keys | {"trainer.total_training_steps": 5}))
    capsys.readouterr()
    got = load_yaml(path)
    warned = capsys.readouterr().err.strip().splitlines()
    assert len(warned) == 1 and "trainer.n_gpus_per_node" in warned[0] and "actor_rollout_ref.rollout.name" in warned[0]
    assert got["total_training_steps"] == 5 and got["ppo_mini_batch_size"] == 256 and got["kl_coef"] == 0.0
    assert got["reward_fn"] == f"{ROOT}/examples/verl/reward_fn.py:compute_score"
    assert got["method"] == keys["actor_rollout_ref.actor.policy_loss.loss_mode"].removeprefix("vespo_")


def test_verl_settings_that_change_the_run_are_refused_together_in_one_short_line(tmp_path):
    import yaml

    from vespo.train.config import ConfigError
    from vespo.train.config_io import load_yaml

    path = tmp_path / "verl.yaml"
    algorithm = {"adv_estimator": "gae", "rollout_correction": {"rollout_is": "token"}}
    path.write_text(yaml.safe_dump({"algorithm": algorithm, "actor_rollout_ref": {"actor": {"ppo_epochs": 4}}}))
    with pytest.raises(ConfigError) as refused:
        load_yaml(path)
    text = str(refused.value)
    assert "\n" not in text and len(text) - len(str(path)) < 350  # one line, not 1.5 KB of key lists
    for key in ("adv_estimator='gae'", "rollout_is='token'", "ppo_epochs=4"):
        assert key in text


def _write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


def test_verl_parquet_data_loads_through_the_record_loader(tmp_path):
    from vespo.data import load_records
    from vespo.rewards.batch import load_reward_fn
    from vespo.train.config import TrainConfig
    from vespo.train.setup import load_data

    rows = [{"data_source": "gsm8k", "prompt": [{"role": "user", "content": f"What is {i}+1?"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)}, "extra_info": {"index": i}}
            for i in range(20)]  # fmt: skip
    _write_parquet(tmp_path / "train.parquet", rows)
    records = load_records(str(tmp_path / "train.parquet"))
    assert (records[3]["prompt"], records[3]["answer"], records[3]["data_source"]) == ("What is 3+1?", "4", "gsm8k")
    cfg = TrainConfig(dataset=str(tmp_path / "train.parquet"), train_batch_size=4, ppo_mini_batch_size=4,
                      reward_fn=f"{ROOT}/examples/verl/reward_fn.py:compute_score")  # fmt: skip
    train, _ = load_data(
        cfg.data, cfg.embedded, eval_size=cfg.run.eval_size, batch_size=cfg.batch.train_batch_size
    )  # the trainer's loader, with veRL's own reward function adapted
    reward = load_reward_fn(cfg.data.reward_fn)
    assert reward(["\\boxed{4}", "\\boxed{5}"], answer=["4", "4"], data_source=["gsm8k"] * 2) == [1.0, 0.0]
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1?"}]
    _write_parquet(tmp_path / "chat.parquet", [rows[0] | {"prompt": chat}])
    with pytest.raises(ValueError, match="chat of 2 messages .system, user.; vespo trains on one user turn"):
        load_records(str(tmp_path / "chat.parquet"))
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match="cannot read as Parquet"):
        load_records(str(tmp_path / "bad.parquet"))


def test_verls_bypass_mode_becomes_vespos(tmp_path):
    """`algorithm.rollout_correction.bypass_mode` is read as vespo train's `bypass_mode` (either value)."""
    import yaml

    from vespo.train.config_io import load_yaml

    path = tmp_path / "verl.yaml"
    for value in (True, False):
        path.write_text(yaml.safe_dump({"algorithm": {"rollout_correction": {"bypass_mode": value}}}))
        assert load_yaml(path)["bypass_mode"] is value


def _verl_yaml(name: str) -> dict:
    """One of veRL's own config files (verl/trainer/config/<name>), as veRL ships it."""
    from pathlib import Path

    import yaml

    return yaml.safe_load((Path(require("verl").__file__).parent / "trainer" / "config" / name).read_text())


@pytest.mark.parametrize("use_kl_loss", [True, False])
def test_a_verl_yaml_trains_with_verls_defaults_read_from_verls_own_config(tmp_path, use_kl_loss):
    """Issue 50: `use_kl_loss: true` without `kl_loss_coef` trained with no KL (veRL's default is 0.001), and veRL's
    own defaults `lr_warmup_steps: -1`, `target_modules: all-linear`, `optim.betas` were refused. veRL's actor
    optimizer section as veRL ships it is read as is; `use_kl_loss`, `lora_rank` and an `optim` section that names
    only the warmup run with veRL's defaults for what they leave out: every value read from veRL's own YAML files
    (verl/trainer/config), not restated here."""
    import yaml

    from vespo.train.config import TrainConfig
    from vespo.train.config_io import load_yaml

    optim, actor = _verl_yaml("optim/fsdp.yaml"), _verl_yaml("actor/actor.yaml")
    model = _verl_yaml("model/hf_model.yaml")
    shipped = _verl_yaml("_generated_ppo_trainer.yaml")["actor_rollout_ref"]["actor"]["optim"]
    assert shipped["lr_warmup_steps"] == -1 and model["target_modules"] == "all-linear" and "betas" in shipped
    path = tmp_path / "verl.yaml"
    path.write_text(yaml.safe_dump({"actor_rollout_ref": {"actor": {"optim": shipped}}}))
    got = load_yaml(path)
    assert (got["lr"], got["weight_decay"], got["betas"]) == (shipped["lr"], shipped["weight_decay"],
                                                              tuple(shipped["betas"]))  # fmt: skip
    assert got["warmup_steps"] == 0 and got["warmup_ratio"] == shipped["lr_warmup_steps_ratio"]  # -1: the ratio's
    assert got["grad_clip"] == shipped["clip_grad"] and got["lr_scheduler_type"] == "constant"  # no warmup
    verl = {"actor_rollout_ref": {"actor": {"optim": {"lr_warmup_steps": -1}, "use_kl_loss": use_kl_loss},
                                  "model": {"lora_rank": 8}}}  # fmt: skip
    path.write_text(yaml.safe_dump(verl))
    got = load_yaml(path)
    assert got["kl_coef"] == (actor["kl_loss_coef"] if use_kl_loss else 0.0)  # 0.001: veRL's coefficient
    assert (got["weight_decay"], got["betas"]) == (optim["weight_decay"], tuple(optim["betas"]))
    assert (got["lora_alpha"], got["lora_target_modules"]) == (model["lora_alpha"], (model["target_modules"],))
    cfg = TrainConfig(**got)  # a valid run
    assert cfg.hardware.use_peft and cfg.hardware.lora_r == 8


def test_verls_constant_schedule_warms_up_and_the_coefficient_needs_use_kl_loss(tmp_path):
    """veRL's "constant" schedule has a warmup (get_constant_schedule_with_warmup): with one it is vespo's
    constant_with_warmup. `kl_loss_coef` without `use_kl_loss: true` weighs nothing in veRL (its default is false)."""
    import yaml

    from vespo.train.config_io import load_yaml

    path = tmp_path / "verl.yaml"
    optim = {"lr_scheduler_type": "constant", "lr_warmup_steps": 5}
    path.write_text(yaml.safe_dump({"actor_rollout_ref": {"actor": {"optim": optim, "kl_loss_coef": 0.05}}}))
    got = load_yaml(path)
    assert (got["lr_scheduler_type"], got["warmup_steps"], got["kl_coef"]) == ("constant_with_warmup", 5, 0.0)

"""Every spelling of a `vespo train` setting that worked at 9fcf8ea (before the config was cut into sections) still
builds the same config: each flat field as a flag and as a YAML key, the old flag names (`--staleness`), veRL's
nested keys and TRL's names. The names are written out here, as they were then, not read from today's code."""

import pytest
import yaml

from vespo.train.config_io import parse_args

OLD_FIELDS = (
    "model", "dataset", "eval_dataset", "dataset_split", "prompt_key", "answer_key", "skip_bad_records",
    "apply_chat_template", "reward_fn", "method", "hparams", "loss_agg_mode", "norm_adv_by_std", "adv_estimator",
    "kl_coef", "entropy_coeff", "train_batch_size", "ppo_mini_batch_size", "shuffle", "staleness", "rollout_n",
    "micro_batch_size", "total_training_steps", "optim", "lr", "lr_scheduler_type", "warmup_ratio", "warmup_steps",
    "weight_decay", "betas", "adam_epsilon", "grad_clip", "step_scale", "target_kl", "ess_alarm",
    "ess_alarm_patience", "stop_on_low_ess", "log_update_norm", "probe_every", "max_response_length", "temperature",
    "top_p", "top_k", "sampler_dtype", "rollout_logit_noise", "use_rollout_log_prob", "bypass_mode",
    "disable_dropout", "device", "bf16", "fp16", "gradient_checkpointing", "torch_compile", "torch_compile_backend",
    "use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "mode", "max_staleness", "sync_every",
    "num_samplers", "use_decoupled_loss", "sampler_engine", "task", "num_operands", "max_operand", "sft_steps",
    "sft_lr", "sft_batch_size", "sft_label_noise", "sft_seed", "seed", "run_dir", "overwrite_output_dir",
    "cache_dir", "resume", "allow_change", "save_every", "save_total_limit", "eval_every", "eval_size", "eval_top_p",
    "eval_n", "num_threads", "tensorboard", "wandb_project", "trackio_project", "progress", "log_completions",
    "num_completions_to_print",
)  # fmt: skip
"""`TrainFields` at 9fcf8ea, in order."""

VALUE = {  # a value other than the default for each field (valid alone, or with `NEEDS`)
    "model": "org/some-model", "dataset": "train.jsonl", "eval_dataset": "eval.jsonl", "dataset_split": "test",
    "prompt_key": "question", "answer_key": "solution", "reward_fn": "vespo.rewards:math_reward", "method": "grpo",
    "hparams": {"c1_pos": 1.5}, "loss_agg_mode": "token-mean", "adv_estimator": "opob", "kl_coef": 0.5,
    "entropy_coeff": 0.01, "train_batch_size": 32, "ppo_mini_batch_size": 8, "staleness": 2, "rollout_n": 4,
    "micro_batch_size": 32, "total_training_steps": 7, "optim": "sgd", "lr": 1e-3,
    "lr_scheduler_type": "cosine", "warmup_ratio": 0.25, "warmup_steps": 3, "weight_decay": 0.01,
    "betas": (0.8, 0.95), "adam_epsilon": 1e-6, "grad_clip": 0.5, "step_scale": "ess_sqrt", "target_kl": 0.05,
    "ess_alarm": 0.2, "ess_alarm_patience": 5, "probe_every": 2, "max_response_length": 20, "temperature": 0.7,
    "top_p": 0.9, "top_k": 5, "sampler_dtype": "bfloat16", "rollout_logit_noise": 0.5, "device": "cpu",
    "torch_compile_backend": "aot_eager", "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.1,
    "lora_target_modules": ("q_proj", "v_proj"), "mode": "async", "max_staleness": 6, "sync_every": 2,
    "num_samplers": 2, "sampler_engine": "vllm", "task": "chain", "num_operands": 4, "max_operand": 7,
    "sft_steps": 12, "sft_lr": 1e-3, "sft_batch_size": 8, "sft_label_noise": 0.25, "sft_seed": 3, "seed": 5,
    "run_dir": "runs/elsewhere", "cache_dir": "/tmp/vespo-cache", "allow_change": ("total_training_steps",),
    "save_every": 5, "save_total_limit": 3, "eval_every": 4, "eval_size": 50, "eval_top_p": 0.7, "eval_n": 2,
    "num_threads": 2, "wandb_project": "proj", "trackio_project": "proj", "num_completions_to_print": 3,
}  # fmt: skip
NEEDS = {"use_decoupled_loss": {"mode": "async"}, "sampler_engine": {"rollout_logit_noise": 0.0},
         "rollout_logit_noise": {"sampler_engine": "hf"}, "task": {"max_response_length": 20}}  # fmt: skip
"""Settings a value needs beside it (the config checks them together)."""
STALENESS = {"staleness": ("train_batch_size", 32)}  # N = 2 is train_batch_size = N x 16: the built config keeps that


def _value(name: str) -> object:
    """`VALUE`, or for a bool the opposite of its default."""
    from vespo.train.fields import TrainFields

    if name in VALUE:
        return VALUE[name]
    default = TrainFields.__dataclass_fields__[name].default
    assert isinstance(default, bool), name
    return not default


def _flags(name: str, value: object, flag: str | None = None) -> list[str]:
    """`value` as the command line spells it for `flag` (`--name`; a bool as --name / --no-name)."""
    flag = flag or f"--{name.replace('_', '-')}"
    if isinstance(value, bool):
        return [flag if value else f"--no-{flag[2:]}"]
    if isinstance(value, dict):
        return [flag, *(str(t) for kv in value.items() for t in kv)]
    if isinstance(value, tuple):
        return [flag, *map(str, value)]
    return [flag, str(value)]


def _expected(cfg, name: str, value: object) -> None:
    got_name, want = STALENESS.get(name, (name, value))
    assert cfg.flat()[got_name] == want, (name, cfg.flat()[got_name])


@pytest.mark.parametrize("name", OLD_FIELDS)
def test_every_old_field_is_a_flag_of_the_same_name(name):
    value, argv = _value(name), []
    for other, v in NEEDS.get(name, {}).items():
        argv += _flags(other, v)
    flag = "--num-mini-batches" if name == "staleness" else None  # its flag since before 9fcf8ea
    _expected(parse_args(argv + _flags(name, value, flag)), name, value)


@pytest.mark.parametrize("name", OLD_FIELDS)
def test_every_old_field_is_a_yaml_key_of_the_same_name(tmp_path, name):
    value = _value(name)
    data = {k: list(v) if isinstance(v, tuple) else v for k, v in ({name: value} | NEEDS.get(name, {})).items()}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    _expected(parse_args(["--config", str(tmp_path / "c.yaml")]), name, value)


def test_the_old_flag_names_and_spellings(capsys):
    """`--staleness` (deprecated, one line on stderr), `--async`, underscores for hyphens, `--flag=value`."""
    assert parse_args(["--staleness", "4"]).flat()["train_batch_size"] == 64
    assert "--staleness is deprecated; use --num-mini-batches" in capsys.readouterr().err
    assert parse_args(["--async"]).flat()["mode"] == "async"
    cfg = parse_args(["--run_dir", "runs/u", "--ppo_mini_batch_size=4", "--lr=1e-3"])
    assert (cfg.run.run_dir, cfg.batch.ppo_mini_batch_size, cfg.optimizer.lr) == ("runs/u", 4, 1e-3)


VERL = {  # veRL's key at 9fcf8ea -> (its value, the vespo field and the value it sets)
    "data.train_files": (["train.parquet"], "dataset", "train.parquet"),
    "data.val_files": ("eval.parquet", "eval_dataset", "eval.parquet"),
    "data.prompt_key": ("question", "prompt_key", "question"),
    "data.train_batch_size": (32, "train_batch_size", 32),
    "data.max_response_length": (24, "max_response_length", 24),
    "actor_rollout_ref.model.path": ("org/m", "model", "org/m"),
    "actor_rollout_ref.model.enable_gradient_checkpointing": (True, "gradient_checkpointing", True),
    "actor_rollout_ref.model.lora_rank": (8, "lora_r", 8),
    "actor_rollout_ref.model.lora_alpha": (4, "lora_alpha", 4),
    "actor_rollout_ref.model.target_modules": ("all-linear", "lora_target_modules", ("all-linear",)),
    "actor_rollout_ref.actor.ppo_mini_batch_size": (8, "ppo_mini_batch_size", 8),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": (4, "micro_batch_size", 4),
    "actor_rollout_ref.actor.loss_agg_mode": ("seq-mean-token-sum", "loss_agg_mode", "seq-mean-token-sum"),
    "actor_rollout_ref.actor.policy_loss.loss_mode": ("vanilla", "method", "grpo"),
    "actor_rollout_ref.actor.entropy_coeff": (0.01, "entropy_coeff", 0.01),
    "actor_rollout_ref.actor.grad_clip": (0.5, "grad_clip", 0.5),
    "actor_rollout_ref.actor.optim.clip_grad": (0.5, "grad_clip", 0.5),
    "actor_rollout_ref.actor.shuffle": (True, "shuffle", True),
    "actor_rollout_ref.actor.optim.lr": (1e-5, "lr", 1e-5),
    "actor_rollout_ref.actor.optim.weight_decay": (0.1, "weight_decay", 0.1),
    "actor_rollout_ref.actor.optim.lr_warmup_steps": (3, "warmup_steps", 3),
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": (0.1, "warmup_ratio", 0.1),
    "actor_rollout_ref.actor.optim.lr_scheduler_type": ("cosine", "lr_scheduler_type", "cosine"),
    "actor_rollout_ref.rollout.n": (4, "rollout_n", 4),
    "actor_rollout_ref.rollout.temperature": (0.6, "temperature", 0.6),
    "actor_rollout_ref.rollout.top_p": (0.9, "top_p", 0.9),
    "actor_rollout_ref.rollout.top_k": (-1, "top_k", 0),
    "actor_rollout_ref.rollout.response_length": (24, "max_response_length", 24),
    "algorithm.norm_adv_by_std_in_grpo": (False, "norm_adv_by_std", False),
    "algorithm.rollout_correction.bypass_mode": (True, "bypass_mode", True),
    "trainer.total_training_steps": (9, "total_training_steps", 9),
    "trainer.save_freq": (3, "save_every", 3),
    "trainer.test_freq": (-1, "eval_every", 0),
    "trainer.default_local_dir": ("runs/v", "run_dir", "runs/v"),
    "actor_rollout_ref.actor.clip_ratio_low": (0.1, "hparams", {"clip_ratio_low": 0.1}),
    "actor_rollout_ref.actor.clip_ratio_high": (0.3, "hparams", {"clip_ratio_high": 0.3}),
    "actor_rollout_ref.actor.clip_ratio_c": (4.0, "hparams", {"clip_ratio_c": 4.0}),
}
VERL_NEEDS = {"actor_rollout_ref.actor.clip_ratio_low": {"method": "grpo"},
              "actor_rollout_ref.actor.clip_ratio_high": {"method": "grpo"},
              "actor_rollout_ref.actor.clip_ratio_c": {"method": "grpo"}}  # fmt: skip


def _nested(key: str, value: object) -> dict:
    """`a.b.c: v` as veRL's nested YAML sections {a: {b: {c: v}}}."""
    head, _, rest = key.partition(".")
    return {head: _nested(rest, value) if rest else value}


@pytest.mark.parametrize("dotted", [False, True], ids=["nested", "dotted"])
@pytest.mark.parametrize("key", VERL)
def test_every_verl_key_of_9fcf8ea_sets_its_field(tmp_path, key, dotted):
    value, field, want = VERL[key]
    data = ({key: value} if dotted else _nested(key, value)) | VERL_NEEDS.get(key, {})
    (tmp_path / "verl.yaml").write_text(yaml.safe_dump(data))
    assert parse_args(["--config", str(tmp_path / "verl.yaml")]).flat()[field] == want


def test_verl_kl_loss_coef_weighs_the_kl_under_use_kl_loss(tmp_path):
    """`kl_loss_coef` (a VERL_KEYS entry at 9fcf8ea) is `kl_coef` under veRL's `use_kl_loss: true`."""
    actor = {"use_kl_loss": True, "kl_loss_coef": 0.2}
    (tmp_path / "verl.yaml").write_text(yaml.safe_dump({"actor_rollout_ref": {"actor": actor}}))
    assert parse_args(["--config", str(tmp_path / "verl.yaml")]).algorithm.kl_coef == 0.2


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["--output-dir", "runs/t"], {"run_dir": "runs/t"}),
        (["--output_dir=runs/t"], {"run_dir": "runs/t"}),
        (["--num-generations", "4"], {"rollout_n": 4}),
        (["--max-completion-length", "32"], {"max_response_length": 32}),
        (["--learning-rate", "1e-3"], {"lr": 1e-3}),
        (["--beta", "0.1"], {"kl_coef": 0.1}),
        (["--max-grad-norm", "0.5"], {"grad_clip": 0.5}),
        (["--steps-per-generation", "2"], {"train_batch_size": 32}),
        (["--per-device-train-batch-size", "16"], {"ppo_mini_batch_size": 2, "train_batch_size": 2}),
        (["--max-steps", "8", "--num-mini-batches", "2"], {"total_training_steps": 4}),
    ],
)
def test_every_trl_name_of_9fcf8ea_sets_its_field(argv, want):
    flat = parse_args(argv).flat()
    assert {k: flat[k] for k in want} == want

"""The other trainers' spellings of a vespo config: veRL's nested YAML keys (`from_verl_keys`, read by `--config`)
and TRL's command-line names (`take_trl_flags`, `from_trl`, read by `vespo train`). Each translates into vespo's flat
field names and units; what it cannot translate is refused in one line naming the key and the vespo setting to use.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import sys
import typing

from vespo.argv import field_flags, from_text, nearest
from vespo.train.config import FIELD_TYPES, ConfigError, conforms, describe_type, filled
from vespo.train.fields import TrainFields

# veRL's config paths (ppo_trainer.yaml) -> vespo fields; a veRL user's YAML, nested or with dotted keys, works as is
VERL_KEYS = {
    "data.train_files": "dataset",
    "data.val_files": "eval_dataset",
    "data.prompt_key": "prompt_key",
    "data.train_batch_size": "train_batch_size",
    "data.max_response_length": "max_response_length",
    "actor_rollout_ref.model.path": "model",
    "actor_rollout_ref.model.enable_gradient_checkpointing": "gradient_checkpointing",
    "actor_rollout_ref.model.lora_rank": "lora_r",
    "actor_rollout_ref.model.lora_alpha": "lora_alpha",
    "actor_rollout_ref.model.target_modules": "lora_target_modules",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "micro_batch_size",
    "actor_rollout_ref.actor.loss_agg_mode": "loss_agg_mode",
    "actor_rollout_ref.actor.policy_loss.loss_mode": "method",
    "actor_rollout_ref.actor.entropy_coeff": "entropy_coeff",
    "actor_rollout_ref.actor.grad_clip": "grad_clip",
    "actor_rollout_ref.actor.optim.clip_grad": "grad_clip",
    "actor_rollout_ref.actor.shuffle": "shuffle",
    "actor_rollout_ref.actor.optim.lr": "lr",
    "actor_rollout_ref.actor.optim.weight_decay": "weight_decay",
    "actor_rollout_ref.actor.optim.betas": "betas",
    "actor_rollout_ref.actor.optim.lr_warmup_steps": "warmup_steps",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": "warmup_ratio",
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "lr_scheduler_type",
    "actor_rollout_ref.rollout.n": "rollout_n",
    "actor_rollout_ref.rollout.temperature": "temperature",
    "actor_rollout_ref.rollout.top_p": "top_p",
    "actor_rollout_ref.rollout.top_k": "top_k",
    "actor_rollout_ref.rollout.response_length": "max_response_length",
    "algorithm.norm_adv_by_std_in_grpo": "norm_adv_by_std",
    "algorithm.rollout_correction.bypass_mode": "bypass_mode",
    "trainer.total_training_steps": "total_training_steps",
    "trainer.save_freq": "save_every",
    "trainer.test_freq": "eval_every",
    "trainer.default_local_dir": "run_dir",
}
VERL_HPARAMS = {f"actor_rollout_ref.actor.{k}": k for k in ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c")}
_VERL_ROOTS = ("data", "actor_rollout_ref", "algorithm", "trainer", "critic", "reward_model", "reward",
               "custom_reward_function", "ray_init", "ray_kwargs", "global_profiler", "transfer_queue")  # fmt: skip
VERL_IGNORED = (
    # cluster, parallelism, memory, kernels, logging and checkpoint plumbing: no number of a one-machine run changes
    "trainer.project_name", "trainer.experiment_name", "trainer.logger", "trainer.nnodes", "trainer.n_gpus_per_node",
    "trainer.device", "trainer.val_before_train", "trainer.log_val_generations", "trainer.resume_mode",
    "trainer.resume_from_path", "trainer.default_hdfs_dir", "trainer.del_local_ckpt_after_load",
    "trainer.max_*_ckpt_to_keep", "trainer.balance_batch", "trainer.critic_warmup", "trainer.ray_*",
    "trainer.use_legacy_worker_impl", "trainer.esi_redundant_time", "trainer.*_data_dir", "trainer.*profile*",
    "trainer.val_only",
    "data.max_prompt_length", "data.filter_overlong_prompts*", "data.truncation", "data.return_*", "data.tokenizer",
    "data.val_batch_size", "data.dataloader_num_workers", "data.trust_remote_code", "data.shuffle", "data.seed",
    "data.validation_shuffle", "data.use_shm", "data.reward_fn_key",
    "actor_rollout_ref.hybrid_engine", "actor_rollout_ref.nccl_timeout",
    "actor_rollout_ref.model.use_remove_padding", "actor_rollout_ref.model.enable_activation_offload",
    "actor_rollout_ref.model.use_shm", "actor_rollout_ref.model.trust_remote_code",
    "actor_rollout_ref.model.use_fused_kernels", "actor_rollout_ref.model.fused_kernel_options.*",
    "actor_rollout_ref.model.use_liger", "actor_rollout_ref.model.external_lib",
    "actor_rollout_ref.actor.strategy", "actor_rollout_ref.actor.ppo_micro_batch_size",
    "actor_rollout_ref.actor.use_dynamic_bsz", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size", "actor_rollout_ref.actor.fsdp_config.*",
    "actor_rollout_ref.actor.megatron.*", "actor_rollout_ref.actor.checkpoint.*", "actor_rollout_ref.actor.profiler.*",
    "actor_rollout_ref.actor.use_torch_compile", "actor_rollout_ref.actor.entropy_*",
    "actor_rollout_ref.actor.use_fused_kernels",
    "actor_rollout_ref.actor.optim.total_training_steps", "actor_rollout_ref.actor.optim._target_",
    "actor_rollout_ref.actor.policy_loss._target_",
    "actor_rollout_ref.actor.policy_loss.rollout_is", "actor_rollout_ref.actor.policy_loss.bypass_mode",
    "actor_rollout_ref.ref.*",
    "actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.mode", "actor_rollout_ref.rollout.*_parallel_size",
    "actor_rollout_ref.rollout.gpu_memory_utilization", "actor_rollout_ref.rollout.log_prob_*",
    "actor_rollout_ref.rollout.enable_*", "actor_rollout_ref.rollout.enforce_eager",
    "actor_rollout_ref.rollout.free_cache_engine", "actor_rollout_ref.rollout.max_num_*",
    "actor_rollout_ref.rollout.max_model_len", "actor_rollout_ref.rollout.load_format",
    "actor_rollout_ref.rollout.dtype",
    "actor_rollout_ref.rollout.disable_log_stats", "actor_rollout_ref.rollout.prompt_length",
    "actor_rollout_ref.rollout.calculate_log_probs", "actor_rollout_ref.rollout.engine_kwargs.*",
    "actor_rollout_ref.rollout.cudagraph_capture_sizes", "actor_rollout_ref.rollout.layered_summon",
    "actor_rollout_ref.rollout.update_weights_bucket_megabytes", "actor_rollout_ref.rollout.trace.*",
    "actor_rollout_ref.rollout.val_kwargs.*",  # held-out sampling: vespo evaluates with the training sampler
    "algorithm.kl_ctrl.*", "algorithm.gamma", "algorithm.lam", "algorithm.rollout_correction.*_threshold*",
    "critic.*", "ray_init.*", "ray_kwargs.*", "global_profiler.*", "transfer_queue.*",
)  # fmt: skip
"""veRL keys (fnmatch patterns) read and ignored, with one warning line listing them: they place and size the work
on a cluster (or, as `critic.*` and `algorithm.gamma` under GRPO advantages, are unused); none changes what a
one-machine run computes."""
VERL_ONLY_AS = {
    "algorithm.adv_estimator": (("grpo",), "vespo's advantages are GRPO's (group-relative)"),
    "algorithm.use_kl_in_reward": ((False,), "vespo has no KL penalty in the reward (kl_coef is the loss's)"),
    "algorithm.rollout_correction.rollout_is": ((None,), "vespo corrects with the sampler's log-probs itself"),
    "algorithm.rollout_correction.rollout_rs": ((None,), "vespo has no rejection sampling"),
    "actor_rollout_ref.actor.ppo_epochs": ((1,), "vespo takes one pass over a rollout batch"),
    "actor_rollout_ref.actor.kl_loss_type": (("low_var_kl", "k3"), "vespo's KL penalty is k3 (low_var_kl)"),
    "actor_rollout_ref.actor.use_kl_loss": ((True, False), ""),
    "actor_rollout_ref.actor.optim.optimizer": (("AdamW",), "vespo's optimizer is torch's AdamW (or --optim sgd)"),
    "actor_rollout_ref.actor.optim.optimizer_impl": (("torch.optim",), "vespo's AdamW is torch.optim's"),
    "actor_rollout_ref.actor.optim.min_lr_ratio": ((0.0, 0), "vespo's schedules decay to 0 (transformers')"),
    "actor_rollout_ref.actor.optim.num_cycles": ((0.5,), "vespo's cosine is transformers' half cycle"),
    "actor_rollout_ref.actor.optim.zero_indexed_step": ((True,), "vespo's schedules count steps from 0"),
    "actor_rollout_ref.rollout.do_sample": ((True,), "vespo samples"),
    "actor_rollout_ref.rollout.multi_turn.enable": ((False,), "vespo trains single-turn"),
    "reward_model.enable": ((False,), "vespo's rewards are rule-based (--reward-fn)"),
    "reward_model.reward_manager": (("naive",), "vespo applies the reward function as is"),
}
"""veRL keys accepted (silently) only at these values, with the reason other values are refused."""
_VERL_LOSS_MODES = {"vanilla": "grpo"}  # veRL's built-in PPO clip is vespo's grpo; vespo_<m> is vespo's m
VERL_DEFAULTS = {
    "actor_rollout_ref.actor.use_kl_loss": False,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.model.lora_alpha": 16,
    "actor_rollout_ref.model.target_modules": "all-linear",
    "actor_rollout_ref.actor.optim.weight_decay": 0.01,
    "actor_rollout_ref.actor.optim.betas": [0.9, 0.999],
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "constant",
}
"""veRL's defaults (verl/trainer/config: actor/actor.yaml, model/hf_model.yaml, optim/fsdp.yaml) where vespo's differ
and the veRL YAML says what it wants without them: the KL weight of `use_kl_loss: true`, LoRA's alpha and modules of
`lora_rank: r`, the AdamW and schedule of an `optim` section (veRL's "constant" warms up).
tests/integrations/test_verl_configs.py reads them from veRL's own files."""


def from_verl_keys(data: dict, *, where: str) -> dict:
    """Translate veRL's nested sections or dotted keys (`actor_rollout_ref.actor.ppo_mini_batch_size: 16`) into
    vespo fields (`VERL_KEYS`; clip ratios and `policy_loss.hparams.*` go to `hparams`, `kl_loss_coef` is `kl_coef`
    only under `use_kl_loss: true`, a veRL custom reward function becomes `reward_fn`), with veRL's defaults where
    they differ from vespo's (`VERL_DEFAULTS`); flat vespo keys pass through. Keys that change nothing on one machine
    (`VERL_IGNORED`) are dropped with one warning line listing them all; keys that would change the run and that
    vespo does not implement are refused together, in one line."""
    flat, out = _dotted(data)
    for key, value in _verl_defaults_in_force(flat).items():
        flat.setdefault(key, value)
    use_kl, kl_coef = (flat.pop(k, None) for k in _VERL_KL)
    if use_kl is not None:  # veRL weighs the KL loss only with use_kl_loss: true
        flat[_VERL_KL[0]] = use_kl  # type-checked with the others (`VERL_ONLY_AS`)
    reward = {k.rsplit(".", 1)[1]: flat.pop(k) for k in list(flat) if k.startswith(_REWARD_PREFIXES)}
    if reward.get("path"):  # a veRL compute_score(data_source, solution_str, ground_truth, extra_info), adapted on load
        out["reward_fn"] = f"{reward['path']}:{reward.get('name') or 'compute_score'}"
    ignored, refused = _translate(flat, out, where)
    if refused:
        raise ConfigError(f"{where}: veRL setting(s) that would change the run, not implemented by vespo: "
                          f"{'; '.join(refused)}")  # fmt: skip
    if use_kl is not None:
        _set(out, "kl_coef", kl_coef if use_kl is True and kl_coef is not None else 0.0, _VERL_KL[1], where)
    if flat.get("actor_rollout_ref.model.lora_rank"):
        out["use_peft"] = True
    if out.get("lr_scheduler_type") == "constant" and (out.get("warmup_steps") or out.get("warmup_ratio")):
        out["lr_scheduler_type"] = "constant_with_warmup"  # veRL's constant schedule warms up; vespo's does not
    if ignored:
        print(f"vespo: {where}: ignoring {len(ignored)} veRL key(s) that change nothing on one machine: "
              f"{', '.join(ignored)}", file=sys.stderr)  # fmt: skip
    return out


def _dotted(data: dict) -> tuple[dict, dict]:
    """(veRL's settings of `data` by dotted key, nested sections walked down to their leaves; the other keys, vespo's
    own, as given). Hydra's `+key` (add a key) reads as the key."""
    flat: dict = {}

    def walk(prefix: str, node: object) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(f"{prefix}.{key}", value)
        else:
            flat[prefix] = node

    out: dict = {}
    for key, value in data.items():
        if isinstance(key, str) and key.lstrip("+").split(".")[0] in _VERL_ROOTS:
            walk(key.lstrip("+"), value)
        else:
            out[key] = value
    return flat, out


def _translate(flat: dict, out: dict, where: str) -> tuple[list[str], list[str]]:
    """veRL's dotted settings `flat` into vespo fields in `out`; returns (keys ignored, keys refused with why)."""
    ignored, refused = [], []
    for key, value in flat.items():
        if key in VERL_HPARAMS or key.startswith("actor_rollout_ref.actor.policy_loss.hparams."):
            out["hparams"] = {**out.get("hparams", {}), key.rsplit(".", 1)[1]: value}
        elif key in VERL_ONLY_AS:
            accepted, why = VERL_ONLY_AS[key]
            if value not in accepted or type(value) not in {type(a) for a in accepted}:
                refused.append(f"{key}={value!r} ({why})")
        elif key == "trainer.total_epochs":
            if flat.get("trainer.total_training_steps") is None:
                refused.append(f"{key}={value!r} (vespo counts rollout steps: set trainer.total_training_steps)")
            else:
                ignored.append(key)
        elif key in VERL_KEYS:
            value = _verl_value(key, value, where, ignored)
            if value is not _DROP and value is not None:  # null: veRL's default, so vespo's
                _set(out, VERL_KEYS[key], value, key, where)
        elif any(fnmatch.fnmatchcase(key, pattern) for pattern in VERL_IGNORED) or value in (None, {}, []):
            ignored.append(key)  # a null or empty setting of anything is veRL's default: nothing to do
        else:
            near = nearest(key, (*VERL_KEYS, *VERL_HPARAMS, *VERL_ONLY_AS, *VERL_DEFAULTS))
            refused.append(f"{key} (no vespo counterpart{'; nearest: ' + ', '.join(near) if near else ''})")
    return ignored, refused


_REWARD_PREFIXES = ("custom_reward_function.", "reward.custom_reward_function.")
_DROP = object()
_VERL_KL = ("actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.kl_loss_coef")


def _verl_defaults_in_force(flat: dict) -> dict:
    """The `VERL_DEFAULTS` a veRL YAML runs with (`flat`: its dotted keys): the KL settings where it names one, LoRA's
    where `lora_rank` turns LoRA on, the optimizer's where it has an `optim` section."""
    sections = [_VERL_KL] * any(k in flat for k in _VERL_KL)
    sections += [("actor_rollout_ref.model.",)] * bool(flat.get("actor_rollout_ref.model.lora_rank"))
    optim = "actor_rollout_ref.actor.optim."
    sections += [(optim,)] * any(k.startswith(optim) for k in flat)
    return {k: v for k, v in VERL_DEFAULTS.items() if any(k.startswith(prefix) for s in sections for prefix in s)}


def _verl_value(key: str, value: object, where: str, ignored: list[str]) -> object:
    """A veRL value as vespo's field takes it: veRL's "off" spellings (-1, a warmup <= 0), lists of one file, a
    module name or list as a tuple."""
    if key in ("data.train_files", "data.val_files") and isinstance(value, list):
        if len(value) == 1 or (value and key == "data.val_files"):
            if len(value) > 1:
                ignored.append(f"{key}[1:] (vespo evaluates on the first file)")
            return value[0]
        raise ConfigError(f"{where}: {key} lists {len(value)} files; vespo trains on one: merge them or keep one")
    if key == "trainer.save_freq" and value == -1:  # veRL: never save; vespo saves at its default period
        ignored.append(f"{key}=-1")
        return _DROP
    if key in ("trainer.test_freq", "actor_rollout_ref.rollout.top_k") and value == -1:
        return 0  # off
    if key == "actor_rollout_ref.actor.optim.lr_warmup_steps" and isinstance(value, int) and value <= 0:
        return 0  # veRL: <= 0 takes lr_warmup_steps_ratio, as vespo's 0 does
    if key == "actor_rollout_ref.model.target_modules" and isinstance(value, str):
        return (value,)  # veRL's "all-linear" (or one module name)
    if key.endswith((".target_modules", ".betas")) and isinstance(value, list):
        return tuple(value)
    if key == "actor_rollout_ref.actor.policy_loss.loss_mode" and isinstance(value, str):
        return _VERL_LOSS_MODES.get(value, value.removeprefix("vespo_") if value != "vespo" else value)
    return value


def _set(out: dict, name: str, value: object, key: str, where: str) -> None:
    if name in out and out[name] != value:
        raise ConfigError(f"{where}: {key} sets {name}={value!r}, which is also set to {out[name]!r}")
    out[name] = value


TRL_NAMES = {
    # TRL's GRPOConfig / HF TrainingArguments flag -> the vespo field of the same concept, in the same unit
    "output_dir": "run_dir",
    "num_generations": "rollout_n",
    "max_completion_length": "max_response_length",
    "learning_rate": "lr",
    "beta": "kl_coef",  # both weigh a k3 estimate of KL(pi || pi_ref) in the loss
    "max_grad_norm": "grad_clip",
    "steps_per_generation": "staleness",  # optimizer steps per generation batch (TRL without gradient accumulation)
    # the same concept in another unit (`_from_trl`)
    "per_device_train_batch_size": "ppo_mini_batch_size",  # TRL: completions per optimizer step; vespo: prompts
    "max_steps": "total_training_steps",  # TRL: optimizer steps; vespo: rollout steps of N optimizer steps each
}
"""TRL's names `vespo train` accepts (`--output-dir`, `--num-generations 8`, ...; one process, no gradient
accumulation, as TRL's defaults)."""
TRL_REFUSED = {
    "num_train_epochs": "vespo counts rollout steps, not passes over the data: use --total-training-steps (or TRL's "
    "--max-steps, in optimizer steps)",
    "gradient_accumulation_steps": "vespo's --ppo-mini-batch-size is the prompts of one optimizer step and "
    "--micro-batch-size the sequences of one forward pass (accumulated)",
    "num_iterations": "vespo takes one pass over a rollout batch: reuse a batch over N optimizer steps with "
    "--num-mini-batches N",
    "epsilon": "TRL's clip is vespo's --method grpo --hparams clip_ratio_low X clip_ratio_high Y",
    "epsilon_high": "TRL's clip is vespo's --method grpo --hparams clip_ratio_low X clip_ratio_high Y",
    "loss_type": "vespo's aggregation is --loss-agg-mode (veRL's names) and the method --method",
}
"""TRL names without a vespo counterpart of the same meaning: refused with the vespo flag to use."""


def take_trl_flags(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """argv without TRL's flags (`--name value` or `--name=value`, hyphens or underscores), and their values by TRL
    name; a TRL name vespo has no counterpart for (`TRL_REFUSED`) is a one-line ConfigError naming the vespo flag."""
    rest, trl = [], {}
    tokens = iter(argv)
    for token in tokens:
        name, eq, value = token.partition("=")
        key = name[2:].replace("-", "_") if name.startswith("--") else ""
        if key in TRL_REFUSED:
            raise ConfigError(f"{name} (TRL) has no vespo counterpart: {TRL_REFUSED[key]}")
        if key not in TRL_NAMES:
            rest.append(token)
            continue
        if not eq:
            value = next(tokens, None)
            if value is None or value.startswith("--"):
                raise ConfigError(f"{name} needs a value")
        trl[key] = value
    return rest, trl


def from_trl(cfg: TrainFields, trl: dict[str, str], given: set[str]) -> TrainFields:
    """`cfg` with TRL's values (`TRL_NAMES`) in vespo's fields and units: --per-device-train-batch-size B (completions)
    is B / rollout_n prompts per optimizer step, and a rollout batch of one optimizer step (TRL's default generation
    batch) unless vespo's train_batch_size or staleness is set; --max-steps M (optimizer steps) is M / N rollout
    steps. A TRL flag given together with its vespo field (flags or --config) is refused."""
    changes: dict[str, object] = {}
    for key, value in trl.items():
        field, flag = TRL_NAMES[key], f"--{key.replace('_', '-')}"
        if field in given:
            raise ConfigError(f"{flag} is TRL's name for {field_flags(TrainFields)[field]}: give one of them")
        kind = next(t for t in typing.get_args(FIELD_TYPES[field]) or (FIELD_TYPES[field],) if t is not type(None))
        changes[field] = from_text(value, kind)
        if not conforms(changes[field], kind):
            raise ConfigError(f"{flag} must be {describe_type(kind)}, got {value!r}")
    cfg = dataclasses.replace(cfg, **{k: v for k, v in changes.items() if k not in _TRL_CONVERTED})
    if "ppo_mini_batch_size" in changes:
        completions, group = changes["ppo_mini_batch_size"], max(cfg.rollout_n, 1)  # rollout_n < 2: refused when built
        if completions < 1 or completions % group:
            raise ConfigError(
                f"--per-device-train-batch-size counts completions (TRL): it must be a positive multiple of "
                f"rollout_n={cfg.rollout_n} (the optimizer step's prompts x responses), got {completions}"
            )
        prompts = completions // group
        cfg = dataclasses.replace(cfg, ppo_mini_batch_size=prompts)
        if "train_batch_size" not in given and cfg.staleness is None:  # TRL's default: N = 1
            cfg = dataclasses.replace(cfg, train_batch_size=prompts)
    if "total_training_steps" in changes:
        steps = changes["total_training_steps"]
        mini = cfg.ppo_mini_batch_size
        n = filled(cfg)["train_batch_size"] // mini if mini >= 1 else 0  # n < 1: refused when built
        if steps < 1 or (n >= 1 and steps % n):
            raise ConfigError(
                f"--max-steps counts optimizer steps (TRL): it must be a positive multiple of the staleness N={n} "
                f"(--num-mini-batches: a rollout step is N optimizer steps; vespo's --total-training-steps counts "
                f"rollout steps), got {steps}"
            )
        cfg = dataclasses.replace(cfg, total_training_steps=steps // max(n, 1))
    return cfg


_TRL_CONVERTED = ("ppo_mini_batch_size", "total_training_steps")

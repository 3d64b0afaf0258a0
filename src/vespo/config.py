"""Trainer configuration: one dataclass whose attribute docstrings are the `vespo train --help` text (tyro).

Keys follow veRL/TRL names where the concept is shared (train_batch_size, ppo_mini_batch_size, rollout_n,
loss_agg_mode, lr, max_response_length, temperature, kl_coef, entropy_coeff). A YAML file given with `--config` sets
defaults; command-line flags override it. `validate` checks everything that can be checked before any compute.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import tyro
import yaml

from vespo.aggregation import LOSS_AGG_MODES
from vespo.losses import available_methods, method_hparams

EMBEDDED = "embedded"


@dataclass
class TrainConfig:
    # --- policy, data, reward
    model: str = EMBEDDED
    """Hub id or local path of a causal LM; "embedded" builds the tiny local model with an SFT warm start."""
    dataset: str = EMBEDDED
    """Hub id or .jsonl path with prompt/answer fields; "embedded" is the built-in arithmetic task."""
    eval_dataset: str | None = None
    """Held-out set (Hub id or .jsonl); None uses the embedded task's held-out split, or no evaluation otherwise."""
    dataset_split: str = "train"
    """Split of a Hub dataset."""
    prompt_key: str = "prompt"
    """Dataset field holding the prompt text."""
    answer_key: str = "answer"
    """Dataset field holding the ground-truth answer."""
    apply_chat_template: bool = False
    """Wrap prompts in the tokenizer's chat template (instruct models); plain text otherwise."""
    reward_fn: str = "vespo.rewards:math_reward"
    """`module:function` with the TRL reward signature fn(completions, answer, **kw) -> list[float]."""

    # --- algorithm
    method: str = "vespo"
    """Policy-loss method from the registry (`vespo.available_methods()`)."""
    hparams: dict[str, float | int | str] = field(default_factory=dict)
    """Method hyperparameters passed to the loss, e.g. `--hparams c1_pos 2 length_norm sqrt` (paper defaults)."""
    loss_agg_mode: str | None = None
    """token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm; None = the method's default."""
    norm_adv_by_std: bool = True
    """Divide group-centred rewards by the group std (GRPO); False gives Dr. GRPO-style A = R - mean."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to the initial (reference) policy; 0 disables it and the reference model."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss); 0 disables it."""

    # --- batch geometry: staleness N = train_batch_size / ppo_mini_batch_size
    train_batch_size: int = 16
    """Prompts per rollout step (the paper's global batch size, in prompts)."""
    ppo_mini_batch_size: int = 16
    """Prompts per optimizer step; the rollout batch is consumed in N sequential mini-batches."""
    shuffle: bool = False
    """Shuffle the rollout batch's rows before cutting mini-batches (veRL's actor `shuffle`; TRL always shuffles), so
    an optimizer step mixes responses of several prompts instead of whole groups (docs/training.md, "vs TRL")."""
    staleness: int | None = None
    """Shortcut: if set, train_batch_size = staleness * ppo_mini_batch_size."""
    rollout_n: int = 8
    """Responses sampled per prompt (the GRPO group size)."""
    micro_batch_size: int = 64
    """Sequences per forward/backward pass (gradient accumulation; does not change the result)."""
    total_training_steps: int = 100
    """Rollout steps to run (each = 1 rollout batch and N optimizer steps)."""

    # --- optimisation
    lr: float = 3e-4
    """AdamW learning rate (constant)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    grad_clip: float = 1.0
    """Max global grad norm per optimizer step."""
    log_update_norm: bool = False
    """Log actor/update_norm, the size of each optimizer step (costs one copy of the weights per mini-batch)."""

    # --- rollout
    max_response_length: int = 16
    """Max new tokens per response."""
    temperature: float = 1.0
    """Sampling temperature (the trainer's log-probs use the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    sampler_dtype: str = "float32"
    """Sampler weights dtype: float32 | bfloat16 | float16. Another dtype than the trainer's creates a real mismatch."""
    rollout_logit_noise: float = 0.0
    """Simulated train-inference mismatch: std of Gaussian noise added to the sampler's logits (0 = none)."""
    use_rollout_log_prob: bool = True
    """Pass the sampler's log-probs to the loss as rollout_log_prob (mismatch correction); False ignores them."""

    # --- asynchronous training (docs/training.md, "Asynchronous training")
    mode: str = "sync"
    """sync: generate, then train; async (`--async`): sampler processes generate while the learner trains."""
    max_staleness: int = 4
    """async: max optimizer steps a sample's policy version may lag the learner (TRL's max_staleness); staler samples
    are not generated (admission, as AReaL's max_head_offpolicyness) or, if late anyway, dropped."""
    sync_every: int = 1
    """async: publish the learner's weights to the samplers every this many optimizer steps (TRL weight_sync_steps)."""
    num_samplers: int = 1
    """async: sampler processes, each with its own copy of the policy."""
    use_decoupled_loss: bool = False
    """async: AReaL's decoupled objective W = (pi/pi_prox)(pi_prox/mu): the learner's weights at the update are
    old_log_prob (one extra forward) and mu enters as rollout_log_prob; otherwise mu is old_log_prob itself."""
    sampler_engine: str = "hf"
    """async: hf (the trainer's KV-cached sampler) | vllm (CUDA; weights pushed into the engine, not run on CPU)."""

    # --- embedded task and SFT warm start (used when model/dataset == "embedded")
    task: str = "arithmetic"
    """Embedded task: arithmetic (sums of num_operands numbers, ~11-token answers) | chain (last digit of a sum of
    num_operands digits, the running sum written after every digit: responses of 2 * num_operands + 6 tokens)."""
    num_operands: int = 3
    """Embedded task: numbers per sum (chain: the response-length knob, e.g. 5 -> 16 tokens, 125 -> 256)."""
    max_operand: int = 9
    """Embedded arithmetic task: largest operand (chain digits are 0-9)."""
    sft_steps: int = 400
    """Embedded warm start: SFT steps (cached by config hash in cache_dir)."""
    sft_lr: float = 3e-3
    """Embedded warm start: SFT learning rate."""
    sft_batch_size: int = 32
    """Embedded warm start: SFT batch size."""
    sft_label_noise: float = 0.5
    """Embedded warm start: fraction of demonstrations whose boxed answer is wrong (makes the policy uncertain)."""
    sft_seed: int = 0
    """Embedded warm start: seed (kept apart from `seed` so all RL seeds share one warm start)."""

    # --- run management
    seed: int = 0
    """Seed of prompt order, sampling and anything else random in RL."""
    run_dir: str = "runs/vespo"
    """Output directory: config.yaml, metrics.jsonl, TensorBoard events, plots, checkpoints."""
    cache_dir: str = "~/.cache/vespo"
    """Where warm-started embedded models are cached."""
    resume: bool = False
    """Continue from run_dir's last checkpoint (same result as an uninterrupted run)."""
    save_every: int = 25
    """Checkpoint every this many rollout steps (and at the end)."""
    eval_every: int = 20
    """Held-out evaluation every this many rollout steps (and at the start and end); 0 disables it."""
    eval_size: int = 200
    """Held-out prompts per evaluation (greedy-free: sampled at `temperature`, 1 response each)."""
    num_threads: int | None = None
    """torch CPU threads (None = torch's default)."""
    tensorboard: bool = True
    """Write TensorBoard events to run_dir/tb."""
    wandb_project: str | None = None
    """Also log to Weights & Biases (if installed) under this project."""
    trackio_project: str | None = None
    """Also log to trackio (if installed) under this project."""
    progress: bool = True
    """Show a progress bar with live reward and response length."""

    @property
    def num_mini_batches(self) -> int:
        """The staleness ratio N = train_batch_size / ppo_mini_batch_size."""
        return self.train_batch_size // self.ppo_mini_batch_size


def resolve(cfg: TrainConfig) -> TrainConfig:
    """Apply the `staleness` shortcut, then `validate`."""
    if cfg.staleness is not None:
        cfg = dataclasses.replace(cfg, train_batch_size=cfg.staleness * cfg.ppo_mini_batch_size, staleness=None)
    validate(cfg)
    return cfg


def validate(cfg: TrainConfig) -> None:
    """Raise ValueError naming the problem for any configuration that cannot run (checked before any compute)."""
    if cfg.method not in available_methods():
        raise ValueError(f"unknown method {cfg.method!r}; known methods: {available_methods()}")
    known = method_hparams(cfg.method)
    unknown = sorted(set(cfg.hparams) - set(known))
    if unknown:
        raise ValueError(f"method {cfg.method!r} has no hyperparameter(s) {unknown}; it accepts {sorted(known)}")
    if cfg.loss_agg_mode is not None and cfg.loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {cfg.loss_agg_mode!r}; choose one of {list(LOSS_AGG_MODES)}")
    positive = (
        "train_batch_size",
        "ppo_mini_batch_size",
        "rollout_n",
        "micro_batch_size",
        "total_training_steps",
        "max_response_length",
        "save_every",
        "eval_size",
        "sft_batch_size",
    )
    for name in positive:
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.staleness is not None and cfg.staleness < 1:
        raise ValueError(f"staleness must be >= 1, got {cfg.staleness}")
    if cfg.train_batch_size % cfg.ppo_mini_batch_size:
        raise ValueError(
            f"ppo_mini_batch_size={cfg.ppo_mini_batch_size} must divide "
            f"train_batch_size={cfg.train_batch_size} (staleness N = train_batch_size / mini-batch)"
        )
    if cfg.lr <= 0 or cfg.temperature <= 0 or not 0 < cfg.top_p <= 1 or cfg.grad_clip <= 0:
        raise ValueError("need lr > 0, temperature > 0, 0 < top_p <= 1 and grad_clip > 0")
    if min(cfg.kl_coef, cfg.entropy_coeff, cfg.rollout_logit_noise, cfg.eval_every, cfg.sft_steps) < 0:
        raise ValueError("kl_coef, entropy_coeff, rollout_logit_noise, eval_every and sft_steps must be >= 0")
    if not 0 <= cfg.sft_label_noise < 1:
        raise ValueError(f"sft_label_noise must be in [0, 1), got {cfg.sft_label_noise}")
    if cfg.sampler_dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"sampler_dtype must be float32, bfloat16 or float16, got {cfg.sampler_dtype!r}")
    _validate_task(cfg)
    _validate_async(cfg)
    if ":" not in cfg.reward_fn:
        raise ValueError(f"reward_fn must look like 'module:function', got {cfg.reward_fn!r}")
    for name in ("dataset", "eval_dataset"):
        value = getattr(cfg, name)
        if value and value.endswith(".jsonl") and not Path(value).expanduser().is_file():
            raise ValueError(f"{name} file not found: {value}")


def _validate_task(cfg: TrainConfig) -> None:
    if cfg.task not in ("arithmetic", "chain"):
        raise ValueError(f"task must be 'arithmetic' or 'chain', got {cfg.task!r}")
    if cfg.task == "chain" and cfg.dataset == EMBEDDED:
        from vespo.task import chain_response_tokens

        need = chain_response_tokens(cfg.num_operands)
        if cfg.num_operands < 2 or cfg.max_response_length < need:
            raise ValueError(
                f"task=chain with num_operands={cfg.num_operands} needs num_operands >= 2 and "
                f"max_response_length >= {need} (2 * num_operands + 6), got {cfg.max_response_length}"
            )


def _validate_async(cfg: TrainConfig) -> None:
    if cfg.mode not in ("sync", "async"):
        raise ValueError(f"mode must be 'sync' or 'async', got {cfg.mode!r}")
    if cfg.mode == "sync":
        if cfg.use_decoupled_loss:
            raise ValueError("use_decoupled_loss needs mode=async (in sync mode old_log_prob is already pi_prox)")
        return
    if cfg.sync_every < 1 or cfg.num_samplers < 1 or cfg.max_staleness < 0:
        raise ValueError("async mode needs sync_every >= 1, num_samplers >= 1 and max_staleness >= 0")
    need = cfg.num_mini_batches + cfg.sync_every - 2  # a batch of N mini-batches must fit in the window
    if cfg.max_staleness < need:
        raise ValueError(
            f"max_staleness={cfg.max_staleness} is too small: a batch of N={cfg.num_mini_batches} mini-batches with "
            f"sync_every={cfg.sync_every} needs max_staleness >= N + sync_every - 2 = {need}"
        )
    if cfg.sampler_engine not in ("hf", "vllm"):
        raise ValueError(f"sampler_engine must be 'hf' or 'vllm', got {cfg.sampler_engine!r}")
    if cfg.sampler_engine == "vllm":
        import importlib.util

        import torch

        if importlib.util.find_spec("vllm") is None or not torch.cuda.is_available():
            raise ValueError("sampler_engine=vllm needs vLLM installed (pip install 'vespo[vllm]') and a CUDA device")


def to_yaml(cfg: TrainConfig) -> str:
    """The config as YAML (the run dir's config.yaml; loadable with `--config`)."""
    data = dataclasses.asdict(cfg)
    data["betas"] = list(cfg.betas)
    return yaml.safe_dump(data, sort_keys=False)


def load_yaml(path: str | Path) -> dict:
    """Read a YAML config and check its keys are TrainConfig fields."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of TrainConfig fields")
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{path}: unknown config key(s) {unknown}")
    if "betas" in data:
        data["betas"] = tuple(data["betas"])
    return data


def parse_args(argv: list[str]) -> TrainConfig:
    """`[--config file.yaml] [flags]` -> resolved, validated TrainConfig; flags override the YAML file."""
    argv = [tok for a in argv for tok in (("--mode", "async") if a == "--async" else (a,))]  # `--async` shortcut
    defaults = TrainConfig()
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise ValueError("--config needs a YAML file path")
        defaults = TrainConfig(**load_yaml(argv[i + 1]))
        del argv[i : i + 2]
    cfg = tyro.cli(
        TrainConfig,
        args=argv,
        default=defaults,
        prog="vespo train",
        description="RL-train a causal LM with any vespo policy loss (no arguments: the embedded task).",
    )
    return resolve(cfg)

"""What a training run can be told, in sections: frozen dataclasses, each valid once built (its fields' types and
ranges, `vespo.train.checks`, and the rules among its own fields), whose attribute docstrings are the `vespo train
--help` text. `vespo.train.config.TrainConfig` holds one of each and checks them together.

The command line and YAML speak flat names (`--lr`, `ppo_mini_batch_size:`): `TrainFields` is every section's fields
in one flat, unchecked dataclass (what tyro parses), in section order; a field's flat name is its name in its
section. Keys follow veRL/TRL names where the concept is shared (train_batch_size, ppo_mini_batch_size, rollout_n,
loss_agg_mode, lr, max_response_length, temperature, kl_coef, entropy_coeff).
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from dataclasses import dataclass, field
from typing import Annotated, Literal

import tyro

from vespo.argv import RENAMED, flat_dataclass
from vespo.data.reasoning_gym import is_reasoning_gym, parse_spec
from vespo.machine import EMBEDDED
from vespo.train.checks import ConfigError, check_fields, fill

LossAggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
DEFAULT_TRAIN_BATCH_SIZE = 16
"""Prompts per rollout step when neither train_batch_size nor N (`staleness`) is given."""
BUILTIN_METHODS = ("aipo", "bapo", "cispo", "dppo_kl", "dppo_tv", "grpo", "gspo", "luspo", "m2po", "opsm",
                   "reinforce", "sapo", "topr", "vcpo", "vespo", "vespo_ess", "vespo_moment", "vespo_schedule",
                   "vespo_selfnorm")  # fmt: skip
"""The methods importing `vespo.losses` registers (tests/test_cli.py holds them equal to the registry's)."""


def known_methods() -> list[str]:
    """The registry's methods (`vespo.available_methods()`). Before `vespo.losses` is imported nothing can have
    registered another, so they are `BUILTIN_METHODS`: the command line refuses an unknown --method without torch."""
    if "vespo.losses" not in sys.modules:
        return sorted(BUILTIN_METHODS)
    from vespo.losses import available_methods

    return available_methods()


def rollout_batch_size(staleness: int | None, ppo_mini_batch_size: int, train_batch_size: int | None) -> int:
    """The rollout batch `train_batch_size` None stands for: N x ppo_mini_batch_size from N (`staleness`), else
    `DEFAULT_TRAIN_BATCH_SIZE`. N and train_batch_size are two spellings of one setting: both given and disagreeing
    is a ConfigError."""
    n, mini, batch = staleness, ppo_mini_batch_size, train_batch_size
    if n is not None and batch is not None and batch != n * mini:
        raise ConfigError(
            f"staleness={n} (--num-mini-batches N) sets train_batch_size = N x ppo_mini_batch_size = {n * mini}, "
            f"but train_batch_size={batch} was also given: give one of the two"
        )
    return batch if batch is not None else DEFAULT_TRAIN_BATCH_SIZE if n is None else n * mini


def default_reward_fn(dataset: str) -> str:
    """The reward `reward_fn: null` stands for: the task's own verifier for reasoning-gym, Math-Verify otherwise."""
    return f"vespo.rewards:{'reasoning_gym' if is_reasoning_gym(dataset) else 'math'}_reward"


@dataclass(frozen=True)
class DataSettings:
    """The policy, the data and the reward (`cfg.data`)."""

    model: str = EMBEDDED
    """Hub id or local path of a causal LM; "embedded" builds the tiny local model with an SFT warm start."""
    dataset: str = EMBEDDED
    """Training records: a local .json/.jsonl file ({"prompt", "answer"} math or {"prompt", "tests"} code), a Hub id,
    a set vespo knows by name (DAPO-Math-17k's Hub id), or reasoning-gym tasks
    (``reasoning-gym:<task>[:key=value...][,<task>...]``, docs/guides/models.md); "embedded" is the built-in arithmetic
    task."""
    eval_dataset: str | None = None
    """Held-out records (as `dataset`, or a benchmark name such as math500); None uses the embedded task's held-out
    split, the held-out split of a reasoning-gym `dataset`, or no evaluation otherwise."""
    dataset_split: str = "train"
    """Split of a Hub dataset."""
    prompt_key: str = "prompt"
    """Dataset field holding the prompt text."""
    answer_key: str = "answer"
    """Dataset field holding the ground-truth answer (math); code records carry `tests` instead."""
    skip_bad_records: bool = False
    """Skip dataset rows that cannot be graded (missing/null/list answer, empty prompt), with a count, instead of
    failing on the first one with its file and line."""
    apply_chat_template: bool = False
    """Wrap prompts in the tokenizer's chat template (instruct models); plain text otherwise."""
    reward_fn: str | None = None
    """`module:function` with TRL's reward signature fn(completions, **columns) -> list[float]; the record's other
    fields arrive as keyword lists (math: `answer`; code: `tests`, with `vespo.rewards:code_reward`). None: the
    task's own verifier for reasoning-gym datasets, Math-Verify (`vespo.rewards:math_reward`) otherwise."""

    def __post_init__(self) -> None:
        check_fields(self)
        for name in ("dataset", "eval_dataset"):  # reasoning-gym: installed tasks and their config fields
            if getattr(self, name) is not None and is_reasoning_gym(getattr(self, name)):
                try:
                    parse_spec(getattr(self, name))
                except ValueError as exc:
                    raise ConfigError(f"{name}: {exc}") from None
        if self.reward_fn is None:
            fill(self, reward_fn=default_reward_fn(self.dataset))


@dataclass(frozen=True)
class AlgorithmSettings:
    """The policy loss and the advantages (`cfg.algorithm`)."""

    method: str = "vespo"
    """Policy-loss method from the registry (`vespo.available_methods()`)."""
    hparams: dict[str, float | int | str | None] = field(default_factory=dict)
    """Method hyperparameters passed to the loss, e.g. `--hparams c1_pos 2 length_norm sqrt` (paper defaults)."""
    loss_agg_mode: LossAggMode | None = None
    """How the per-token loss is normalised (`vespo.aggregation.agg_loss`); None = the method's default."""
    norm_adv_by_std: bool = True
    """Divide group-centred rewards by the group std (GRPO); False gives Dr. GRPO-style A = R - mean."""
    adv_estimator: Literal["grpo", "opob"] = "grpo"
    """Advantages (veRL's name): grpo (group-relative) | opob (VCPO's off-policy optimal baseline, recomputed per
    mini-batch at its weights; one extra backward per sequence; sync mode, shuffle off; docs/methods/index.md)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to the initial (reference) policy; 0 disables it and the reference model."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss); 0 disables it."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.method not in known_methods():
            raise ConfigError(f"method: unknown method {self.method!r}; known methods: {known_methods()}")


@dataclass(frozen=True)
class BatchSettings:
    """Batch geometry (`cfg.batch`): the staleness N = train_batch_size / ppo_mini_batch_size."""

    train_batch_size: int | None = None
    """Prompts per rollout step (the paper's global batch size, in prompts); None: N x ppo_mini_batch_size with
    `--num-mini-batches N`, else 16."""
    ppo_mini_batch_size: int = 16
    """Prompts per optimizer step; the rollout batch is consumed in N sequential mini-batches."""
    shuffle: bool = False
    """Shuffle the rollout batch's rows before cutting mini-batches (veRL's actor `shuffle`; TRL always shuffles), so
    an optimizer step mixes responses of several prompts instead of whole groups (docs/guides/trainer.md, "vs TRL")."""
    staleness: Annotated[int | None, tyro.conf.arg(name="num_mini_batches", aliases=("--staleness",)), RENAMED] = None
    """N, the mini-batches per rollout step (the paper's staleness ratio): train_batch_size = N x ppo_mini_batch_size;
    give it or train_batch_size. `--staleness` is its old name, deprecated (the YAML key is `staleness`)."""
    rollout_n: int = 8
    """Responses sampled per prompt (the GRPO group size; >= 2, since advantages are relative to the group)."""
    micro_batch_size: int = 64
    """Sequences per forward/backward pass (gradient accumulation; does not change the result)."""
    total_training_steps: int = 100
    """Rollout steps to run (each = 1 rollout batch and N optimizer steps)."""

    def __post_init__(self) -> None:
        check_fields(self)
        batch = rollout_batch_size(self.staleness, self.ppo_mini_batch_size, self.train_batch_size)
        fill(self, train_batch_size=batch, staleness=None)  # two spellings of one setting: the section keeps one
        if self.rollout_n < 2:
            raise ConfigError(
                f"rollout_n must be >= 2, got {self.rollout_n}: advantages are relative to the group of responses to "
                "one prompt (R - mean R), so a group of 1 gives every advantage 0 and nothing is learned"
            )
        if self.train_batch_size % self.ppo_mini_batch_size:
            raise ConfigError(
                f"ppo_mini_batch_size={self.ppo_mini_batch_size} must divide "
                f"train_batch_size={self.train_batch_size} (staleness N = train_batch_size / mini-batch)"
            )

    @property
    def num_mini_batches(self) -> int:
        """The staleness ratio N = train_batch_size / ppo_mini_batch_size."""
        return self.train_batch_size // self.ppo_mini_batch_size


@dataclass(frozen=True)
class OptimizerSettings:
    """The optimizer, its schedule and the step controls over stale mini-batches (`cfg.optimizer`)."""

    optim: Literal["adamw_torch", "sgd"] = "adamw_torch"
    """Actor optimizer (TRL's names): adamw_torch | sgd (plain gradient steps, no momentum: the step follows the
    gradient's size, which Adam's normaliser does not; docs/results/index.md section 3)."""
    lr: float = 3e-4
    """Peak learning rate (see `lr_scheduler_type`)."""
    lr_scheduler_type: Literal["constant", "constant_with_warmup", "linear", "cosine"] = "constant"
    """Learning-rate schedule over the run's optimizer steps (TRL/transformers names; `transformers.get_scheduler`):
    warmup, then constant, linear decay to 0, or cosine decay to 0. "constant" ignores the warmup."""
    warmup_ratio: float = 0.0
    """Warmup as a fraction of all optimizer steps (total_training_steps x N); `warmup_steps` wins when > 0."""
    warmup_steps: int = 0
    """Warmup in optimizer steps (TRL's name); 0 uses `warmup_ratio`."""
    weight_decay: float = 0.0
    """Weight decay (decoupled for AdamW)."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon (TRL's name); a large value (e.g. 1e-2 with a ~100x lr) makes Adam's step follow the gradient."""
    grad_clip: float = 1.0
    """Max global grad norm per optimizer step."""
    step_scale: Literal["none", "mean_phi", "ess_sqrt"] = "none"
    """Step-size control for stale mini-batches (`vespo.step_control`): "mean_phi" scales each optimizer step by the
    mini-batch's mean VESPO weight Z = mean phi(W) (capped at 1; VESPO-family methods only, beyond the paper);
    "ess_sqrt" by sqrt(ESS/B) of its sequence weights pi/pi_sampler (VCPO's rule for AdamW; any method)."""
    target_kl: float | None = None
    """Trust region over stale mini-batches (PPO's name): skip the rest of a rollout's mini-batches once the k3
    estimate of KL(mu || pi) on the next one exceeds this; None = never."""
    ess_alarm: float = 0.1
    """Warn once (stderr) when the normalised ESS of the stalest mini-batch's importance weights W
    (`is/ess/last_mini_batch`) stays below this for `ess_alarm_patience` rollout steps, an early sign of collapse;
    0 disables it."""
    ess_alarm_patience: int = 3
    """Consecutive rollout steps below `ess_alarm` before the alarm fires."""
    stop_on_low_ess: bool = False
    """Stop the run (checkpointed, resumable) when the ESS alarm fires, instead of only warning."""
    log_update_norm: bool = False
    """Log actor/update_norm, the size of each optimizer step (costs one copy of the weights per mini-batch)."""
    probe_every: int = 0
    """Every this many rollout steps, run the gradient probe on the stalest mini-batch (`vespo.diagnostics`): the
    cosine of the method's policy gradient to GRPO's and to plain REINFORCE's on the same batch and weights, logged
    as `probe/*`; 0 = never. Costs one forward and up to three backward passes of one mini-batch; synchronous loop."""

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class RolloutSettings:
    """Generation and the log-probs the loss gets of it (`cfg.rollout`): the engine samples with these, and the
    learner scores its log-probs with the same temperature and truncation."""

    max_response_length: int = 16
    """Max new tokens per response."""
    temperature: float = 1.0
    """Sampling temperature (the trainer's log-probs use the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling mass. The learner's log-probs use the same truncated distribution (docs/methods/index.md)."""
    top_k: int = 0
    """Sample among the top_k most likely tokens (0: off); the learner's log-probs use the same truncation."""
    sampler_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Sampler weights dtype. Another dtype than the trainer's (float32) creates a real train-inference mismatch."""
    rollout_logit_noise: float = 0.0
    """Simulated train-inference mismatch: std of Gaussian noise added to the sampler's logits (0 = none)."""
    use_rollout_log_prob: bool = True
    """Pass the sampler's log-probs to the loss as rollout_log_prob (mismatch correction); False ignores them. In async
    mode the sampler's log-probs are the behaviour policy itself (old_log_prob) unless `use_decoupled_loss`, where
    this flag decides whether mu enters as rollout_log_prob (W = pi/pi_prox * pi_prox/mu) or not (W = pi/pi_prox)."""
    bypass_mode: bool = False
    """The sampler's log-probs are the old log-probs mu (veRL's `algorithm.rollout_correction.bypass_mode`): the
    learner does not score mu under its weights (a no-grad forward per rollout batch saved: a quarter of a long
    update, a retired measurement: `git show 57ade47:benchmarks/results/update_kernels.md`), and W = pi / mu carries
    staleness and the train-inference mismatch together, the behaviour policy being the sampler's (paper Sec. 2);
    `use_rollout_log_prob` then has nothing left to correct. Async mode does this already unless
    `use_decoupled_loss`."""
    disable_dropout: bool = True
    """Set every dropout probability of the policy to 0 (TRL's name), so the update (train mode) and the old
    log-probs (eval mode) compute one policy and W == 1 on the first mini-batch."""

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class HardwareSettings:
    """Device, precision and parameter-efficient training (`cfg.hardware`; docs/guides/trainer.md, "GPUs, precision
    and LoRA")."""

    device: str = "auto"
    """Where the policy, reference, rollouts and RNG live: auto (CUDA when present, else CPU) | cpu | cuda | cuda:i."""
    bf16: bool = False
    """bfloat16 autocast for the policy's forward passes (old log-probs and the update alike, so W == 1 at k = 0);
    master weights, optimizer state and all log-space loss math stay float32 (TRL's name)."""
    fp16: bool = False
    """float16 autocast with a dynamic loss scale (`torch.amp.GradScaler`; a step whose scaled gradient overflows is
    skipped); otherwise as `bf16` (TRL's name)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (`model.gradient_checkpointing_enable()`): less memory, slower."""
    torch_compile: bool = False
    """`torch.compile` the decoder body for the learner's log-prob passes (old, reference and update; generation stays
    eager), with dynamic shapes (TRL's name). Off by default: on CPU the compile costs 45 s (warm cache) to minutes
    and pays back only on long runs (a retired measurement: `git show 57ade47:benchmarks/results/torch_compile.md`)."""
    torch_compile_backend: Literal["inductor", "aot_eager", "eager"] = "inductor"
    """The `torch.compile` backend (transformers' name); eager / aot_eager trace without generating kernels (debug)."""
    use_peft: bool = False
    """Train LoRA adapters (peft) instead of all weights; the KL reference is the base model with the adapters
    disabled, as in TRL, not a second copy (TRL's names: lora_r, lora_alpha, lora_dropout, lora_target_modules)."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA scaling numerator (the update is scaled by lora_alpha / lora_r)."""
    lora_dropout: float = 0.05
    """LoRA dropout (set to 0 by `disable_dropout`, like every dropout of the policy)."""
    lora_target_modules: tuple[str, ...] | None = None
    """Module names to adapt, e.g. `q_proj v_proj`, or `all-linear`; None uses peft's default for the architecture."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.bf16 and self.fp16:
            raise ConfigError("bf16 and fp16 are exclusive: choose one autocast dtype")


@dataclass(frozen=True)
class AsyncSettings:
    """Asynchronous training (`cfg.async_`; docs/guides/trainer.md, "Asynchronous training")."""

    mode: Literal["sync", "async"] = "sync"
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
    sampler_engine: Literal["hf", "vllm"] = "hf"
    """The generation engine, sync and async: hf (the trainer's KV-cached sampler) | vllm (CUDA; the learner's
    weights pushed into the engine every step; not run on CPU)."""

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class EmbeddedSettings:
    """The embedded task and its SFT warm start, used when model/dataset == "embedded" (`cfg.embedded`)."""

    task: Literal["arithmetic", "chain", "scratchpad"] = "arithmetic"
    """Embedded task: arithmetic (sums of num_operands numbers, ~11-token answers) | chain (num_operands steps of a
    lagged running sum mod 10, every step written out: responses of 3 * num_operands + 5 tokens) | scratchpad
    (free-length sums: running sums optional, the length is learned; needs max_response_length >= the full
    solution, e.g. 18 at num_operands 6)."""
    num_operands: int = 3
    """Embedded task: numbers per sum (chain: steps, the response-length knob, e.g. 20 -> 65 tokens, 84 -> 257)."""
    max_operand: int = 9
    """Embedded arithmetic task: largest operand (chain digits are 0-9)."""
    sft_steps: int | None = None
    """Embedded warm start: SFT steps (cached by config hash in cache_dir); None: 400 for arithmetic, 8000 for chain
    (at 4000 the chain's digits are 87% right and held-out accuracy is near chance; at 8000, 100% and 0.5)."""
    sft_lr: float = 3e-3
    """Embedded warm start: SFT learning rate."""
    sft_batch_size: int = 32
    """Embedded warm start: SFT batch size."""
    sft_label_noise: float = 0.5
    """Embedded warm start: fraction of demonstrations whose boxed answer is wrong (makes the policy uncertain)."""
    sft_seed: int = 0
    """Embedded warm start: seed (kept apart from `seed` so all RL seeds share one warm start)."""

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class RunSettings:
    """Run management (`cfg.run`): seed, run dir, resume, checkpoints, evaluation, threads, logging."""

    seed: int = 0
    """Seed of prompt order, sampling and anything else random in RL."""
    run_dir: str | None = None
    """Output directory: config.yaml, metrics.jsonl, TensorBoard events, plots, checkpoints; None = runs/<method>.
    A directory left by a run that stopped before its first checkpoint is reused (the new run says so)."""
    overwrite_output_dir: bool = False
    """Replace the run already in run_dir (TRL's name): its config, metrics, events, checkpoints and final model are
    deleted when the new run starts; other files in run_dir are kept. Without it, a run dir with a checkpoint is
    continued when its config.yaml is this run's (the same command continues it) and refused otherwise."""
    cache_dir: str = "~/.cache/vespo"
    """Where warm-started embedded models are cached."""
    resume: bool = False
    """Continue from run_dir's last checkpoint (same result as an uninterrupted run); the whole config must match the
    saved run_dir/config.yaml except for bookkeeping fields (logging, progress, threads, save/eval frequency). Running
    the same command again does this too."""
    allow_change: tuple[Literal["total_training_steps"], ...] = ()
    """On --resume, fields allowed to differ from the saved config; only total_training_steps (to train longer)."""
    save_every: int = 25
    """Checkpoint every this many rollout steps (and at the end)."""
    save_total_limit: int = 1
    """Checkpoints kept (TRL's name): 1 keeps run_dir/checkpoints/last.pt only; K > 1 also keeps the last K saves as
    checkpoints/step_<step>.pt (hard links where the file system allows, so the newest costs no extra space)."""
    eval_every: int = 20
    """Held-out evaluation every this many rollout steps (and at the start and end); 0 disables it."""
    eval_size: int = 200
    """Held-out prompts per evaluation, sampled at `temperature`: the first eval_size of `eval_dataset`, or of the
    embedded task's fixed held-out pool (500 sums for arithmetic, 1000 for chain/scratchpad; the training set and
    the warm start do not depend on it)."""
    eval_top_p: float | None = None
    """Nucleus mass of held-out sampling; None: the training `top_p`. The official VESPO evaluation samples at 0.7
    (its scripts' val_kwargs; docs/guides/paper.md)."""
    eval_n: int = 1
    """Samples per held-out prompt: the logged eval/accuracy is avg@eval_n, whose binomial SD is about
    sqrt(p (1 - p) / (eval_size * eval_n)) (0.011 at 500 prompts x 4 and p = 0.5; 0.035 at 200 x 1)."""
    num_threads: int | None = None
    """torch CPU threads per process; None chooses them at start (`default_num_threads`: 1 for the embedded model,
    else the free cores, at most 4 for a model under 400 MB) and says so on stderr."""
    tensorboard: bool = True
    """Write TensorBoard events to run_dir/tb."""
    wandb_project: str | None = None
    """Also log to Weights & Biases (if installed) under this project."""
    trackio_project: str | None = None
    """Also log to trackio (if installed) under this project."""
    progress: bool = True
    """Show progress bars on stderr: training (live reward and response length, and after the first step one line
    estimating the time the run still needs) and each held-out evaluation (problems done, time left)."""
    log_completions: bool = False
    """Log sampled completions (TRL's name): prompt, completion, reward and advantage of the first
    `num_completions_to_print` rows of every rollout step, to run_dir/completions.jsonl and a TensorBoard text table."""
    num_completions_to_print: int = 8
    """Rows per rollout step that `log_completions` writes."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.resume and self.overwrite_output_dir:
            raise ConfigError("resume and overwrite_output_dir exclude each other: continue the run, or replace it")


SECTIONS: dict[str, type] = {
    "data": DataSettings,
    "algorithm": AlgorithmSettings,
    "batch": BatchSettings,
    "optimizer": OptimizerSettings,
    "rollout": RolloutSettings,
    "hardware": HardwareSettings,
    "async_": AsyncSettings,
    "embedded": EmbeddedSettings,
    "run": RunSettings,
}
"""`TrainConfig`'s attribute -> its section, in the order of the flat fields (config.yaml's, `--help`'s)."""
SECTION_OF = {f.name: attr for attr, section in SECTIONS.items() for f in dataclasses.fields(section)}
"""Flat field name -> the `TrainConfig` attribute of the section holding it."""


TrainFields = flat_dataclass(
    "TrainFields",
    SECTIONS.values(),
    module=__name__,
    doc="A run's settings as given, by their flat names, unchecked (`TrainConfig` checks them).",
)
FIELD_TYPES = typing.get_type_hints(TrainFields, include_extras=False)
"""Flat field name -> its annotation (what a YAML value or a sweep's extra setting is checked against)."""


ADDED_FIELDS = (
    "skip_bad_records", "adv_estimator", "shuffle", "optim", "lr_scheduler_type", "warmup_ratio", "warmup_steps",
    "adam_epsilon", "step_scale", "target_kl", "ess_alarm", "ess_alarm_patience", "stop_on_low_ess",
    "log_update_norm", "probe_every", "top_k", "bypass_mode", "disable_dropout", "device", "bf16", "fp16",
    "gradient_checkpointing", "torch_compile", "torch_compile_backend", "use_peft", "lora_r", "lora_alpha",
    "lora_dropout", "lora_target_modules", "mode", "max_staleness", "sync_every", "num_samplers", "use_decoupled_loss",
    "sampler_engine", "task", "sft_label_noise", "overwrite_output_dir", "allow_change", "save_total_limit",
    "eval_top_p", "eval_n", "log_completions", "num_completions_to_print",
)  # fmt: skip
"""Fields added after the first trainer (77a4ca8), each with the default it still has, which is how a run saved
before it ran: a config.yaml without one of these is read at its default (`vespo.train.resume.check_resume`); any
other field missing from a saved config.yaml is a difference."""

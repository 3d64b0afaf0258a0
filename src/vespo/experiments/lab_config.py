"""The settings of `vespo lab` (`LabConfig`, with the v2 model's `ChainSpec`) and their checks, importable without
torch: `--help` and bad input are answered before the workbench (`vespo.experiments.lab`, `lab_model`) is imported."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal

import tyro

from vespo.argv import RENAMED
from vespo.train.config import known_methods
from vespo.train.host import check_output_dir


@dataclass(frozen=True)
class ChainSpec:
    """The v2 model (`vespo lab --preset v2`); every cell of a grid shares one initial policy."""

    vocab: int = 1024
    """Tokens, EOS (id 0) included (>= 16)."""
    rank: int = 32
    """Rank d of the shared bilinear term E[prev] . U[y]."""
    zipf: float = 1.3
    """Zipf exponent of the initial distribution of the non-EOS tokens (rank r gets mass ~ r^-zipf)."""
    p_correct: float = 0.15
    """Initial probability of the correct token before the bilinear noise (below the Zipf head's 0.28, so the most
    likely token is a wrong one in most contexts: sharpening the current policy is harmful)."""
    mean_length: float = 0.5
    """Initial mean response length as a fraction of T (geometric: constant EOS probability per token)."""
    knots: int = 8
    """Hat functions of the EOS position term g(t)."""
    eval_samples: int = 1024
    """Sequences of the fixed evaluation sample that estimates E[R] (common random numbers across evaluations)."""
    min_length: float = 0.25
    """Shortest gradable response, as a fraction of T (shorter ones get R = 0: no answer by a length trick)."""
    success_quantile: float = 0.75
    """q = this quantile of the initial policy's accuracy (ungradable responses count -1): ~1/4 succeed."""
    reward: Literal["accuracy", "threshold"] = "accuracy"
    """"accuracy": R = the share of correct tokens of a gradable response (ended with EOS, >= min_length x T
    tokens), 0 otherwise: graded, so on-policy training leaves headroom (E[R] <= the token accuracy, which a rank-d
    model of V contexts does not saturate). "threshold": R = 1[gradable and a share >= q correct], the reward lab v2
    was published with (benchmarks/results/lab_v2*): it saturates on-policy (E[R] ~ 0.997 at N = 1, T = 256)."""

    def checks(self) -> list[tuple[str, bool, str, object]]:
        """(flag, valid, what is accepted, value) for every field: `vespo lab` reports the first invalid one."""
        return [
            ("chain.vocab", self.vocab >= 16, "an integer >= 16", self.vocab),
            ("chain.rank", self.rank >= 1, "an integer >= 1", self.rank),
            ("chain.zipf", math.isfinite(self.zipf) and self.zipf >= 0, "a finite number >= 0", self.zipf),
            ("chain.p_correct", 0 < self.p_correct < 1, "a number in (0, 1)", self.p_correct),
            ("chain.mean_length", 0 < self.mean_length <= 100, "a number in (0, 100]", self.mean_length),
            ("chain.knots", self.knots >= 2, "an integer >= 2", self.knots),
            ("chain.eval_samples", self.eval_samples >= 16, "an integer >= 16", self.eval_samples),
            ("chain.min_length", 0 <= self.min_length < 1, "a number in [0, 1)", self.min_length),
            ("chain.success_quantile", 0 < self.success_quantile < 1, "a number in (0, 1)", self.success_quantile),
            ("chain.reward", self.reward in ("accuracy", "threshold"), "accuracy or threshold", self.reward),
        ]


@dataclass(frozen=True)
class LabCell:
    """One run of a lab grid: a method at response length T and N mini-batches per rollout step, lr scale and seed."""

    method: str
    length: int
    num_mini_batches: int
    lr_scale: float
    seed: int
    hparams: tuple[tuple[str, object], ...] = ()

    @property
    def name(self) -> str:
        return f"{self.method}/T{self.length}/N{self.num_mini_batches}/lr{self.lr_scale:g}/seed{self.seed}"


MAX_LENGTH = 1 << 20
"""Largest response length T a lab cell accepts."""
MAX_VOCAB = 1 << 12
"""Largest vocabulary a lab cell accepts."""
MAX_LOGITS = 1 << 24
"""Largest T x V: theta, Adam's two moments, the gradient and the sampler's CDF are each (T, V) float64."""
MAX_BATCH_TOKENS = 1 << 26
"""Largest N x mini_batch_seqs x T: the rollout batch's tokens and two log-prob tensors (24 bytes a token)."""
MAX_STEPS = 1 << 20
"""Most optimizer steps per cell."""


@dataclass
class LabConfig:
    preset: Literal["v1", "v2"] = "v2"
    """v2: the shared-parameter chain policy with EOS (`chain` settings; `vocab`, `p_correct` and
    `rollout_logit_noise` unused); v1: independent logits per position (the original lab)."""
    chain: ChainSpec = ChainSpec()
    """The v2 model."""
    out_dir: str = "sweeps/lab"
    """Output directory: results.csv, results.md, mechanism.csv, figures; cells/ holds per-cell JSON (for resuming).
    New, empty, or an earlier lab grid's (continued)."""
    overwrite_output_dir: bool = False
    """Delete an earlier grid's outputs in `out_dir` first (its cells included), or write beside files vespo did not
    create there (never replacing them)."""
    methods: tuple[str, ...] = ("vespo", "grpo", "gspo", "topr")
    """Registered policy-loss methods to compare (`vespo.available_methods()`)."""
    length: tuple[int, ...] = (64, 1024)
    """Response lengths T."""
    num_mini_batches: Annotated[tuple[int, ...], tyro.conf.arg(aliases=("--staleness",)), RENAMED] = (1, 4, 16, 64)
    """Values of N, the mini-batches per rollout step (= rollout batch / mini-batch; the paper's staleness ratio).
    `--staleness` is its old name, deprecated."""
    lr_scale: tuple[float, ...] = (1 / 3, 1.0, 3.0)
    """Learning rates as multiples of `lr`."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Seeds of sampling (the initial policy is fixed by `init_seed`)."""
    lr: float = 0.005
    """Base learning rate."""
    optim: Annotated[Literal["adamw_torch", "sgd"], tyro.conf.arg(aliases=("--optimizer",))] = "adamw_torch"
    """adam (AdamW as the trainer, betas (beta1, 0.99), no decay) or sgd (plain gradient steps)."""
    grad_clip: float = 1.0
    """Max global gradient norm per optimizer step (as the trainer); 0 disables clipping."""
    adam_epsilon: Annotated[float, tyro.conf.arg(aliases=("--adam-eps",))] = 1e-8
    """Adam's epsilon: the floor under its per-parameter normaliser."""
    beta1: float = 0.9
    """Adam's first-moment decay (beta2 stays 0.99); 0 = no momentum: every step follows the current gradient."""
    step_scale: Literal["none", "mean_phi", "ess_sqrt"] = "none"
    """The trainer's `step_scale` (`vespo.step_control`): "mean_phi" moves the weights by Z x Adam's step, Z = the
    mini-batch's mean phi(W) capped at 1 (VESPO family only); "ess_sqrt" by sqrt of the normalised ESS of its sequence
    weights pi/pi_sampler (VCPO's rule; any method)."""
    momentum_scale: Literal["none", "mean_phi"] = "none"
    """"mean_phi": multiply Adam's first moment by Z (as above) before each step, so a stale mini-batch whose phi has
    collapsed does not keep taking the fresh mini-batches' momentum (beyond the paper, issue 29; VESPO family only)."""
    optimizer_steps: int = 128
    """Optimizer steps per cell, fixed across N (a multiple of every N): equal samples per cell."""
    mini_batch_seqs: Annotated[int, tyro.conf.arg(aliases=("--mini-batch-size",)), RENAMED] = 64
    """Sequences (not prompts) per optimizer step: mini_batch_seqs / rollout_n groups. `--mini-batch-size` is its old
    name, deprecated."""
    rollout_n: Annotated[int, tyro.conf.arg(aliases=("--group-size",))] = 8
    """Responses per group (the GRPO group; advantages are group-normalised)."""
    vocab: int = 4
    """Tokens per position."""
    p_correct: float = 0.5
    """Initial mean probability of the correct token per position."""
    init_seed: int = 0
    """Seed of the initial policy (shared by every cell)."""
    rollout_logit_noise: Annotated[float, tyro.conf.arg(aliases=("--mismatch-std",))] = 0.0
    """Std of seeded Gaussian noise on the sampler's logits (train-inference mismatch; its KL is reported)."""
    loss_agg_mode: str | None = None
    """Aggregation for every method; None = each method's own default."""
    eval_points: int = 8
    """Exact expected-reward evaluations per cell besides step 0 (the training reward is logged every step)."""
    jobs: int = 2
    """Cells run in parallel processes (one torch thread each)."""
    collapse_ratio: float = 0.5
    """A cell has collapsed when its final expected reward is below this fraction of the initial one."""


def cells(cfg: LabConfig) -> list[LabCell]:
    """All grid cells, once `check_lab_config` accepts the settings (before anything runs)."""
    check_lab_config(cfg)
    return [
        LabCell(meth, t, n, s, seed)
        for meth in cfg.methods
        for t in cfg.length
        for n in cfg.num_mini_batches
        for s in cfg.lr_scale
        for seed in cfg.seeds
    ]


def check_lab_config(cfg: LabConfig) -> None:
    """Every setting of a lab grid, sizes included (a cell holds the rollout batch's N x mini_batch_seqs x T tokens
    and log-probs, and (T, V) logits with Adam's state): ValueError naming the first bad one. The registry's checks
    (each method's hyperparameters and family) come last: they import torch, as the grid will."""
    check_output_dir("out_dir", cfg.out_dir)
    _check_grid(cfg)
    for name, ok, accepted in _value_checks(cfg):
        if not ok:
            raise ValueError(f"{name} must be {accepted}, got {getattr(cfg, name)!r}")
    _check_sizes(cfg)
    for name, ok, accepted, value in cfg.chain.checks() if cfg.preset == "v2" else []:
        if not ok:
            raise ValueError(f"{name} must be {accepted}, got {value!r}")
    _check_method_family(cfg)


def _check_grid(cfg: LabConfig) -> None:
    """The grid's axes: each one or more distinct values, the methods registered ones."""
    for name in ("methods", "length", "num_mini_batches", "lr_scale", "seeds"):  # grid axes: one or more, none twice
        values = getattr(cfg, name)
        if not values or len(set(values)) != len(values):
            raise ValueError(f"{name} must be one or more distinct values, got {list(values)}")
    unknown = sorted(set(cfg.methods) - set(known_methods()))
    if unknown:
        raise ValueError(f"methods: unknown {unknown}; registered methods are {known_methods()}")


def _value_checks(cfg: LabConfig) -> list[tuple[str, bool, str]]:
    """(setting, whether it is valid, what is accepted) of every single-valued setting, in the order checked."""
    return [
        ("length", all(1 <= t <= MAX_LENGTH for t in cfg.length), f"integers in [1, {MAX_LENGTH}]"),
        (
            "num_mini_batches",
            all(n >= 1 and cfg.optimizer_steps % n == 0 for n in cfg.num_mini_batches),
            f"positive divisors of optimizer_steps={cfg.optimizer_steps}",
        ),
        ("lr_scale", all(math.isfinite(s) and s > 0 for s in cfg.lr_scale), "finite numbers > 0"),
        ("lr", math.isfinite(cfg.lr) and cfg.lr > 0, "a finite number > 0"),
        ("optimizer_steps", 1 <= cfg.optimizer_steps <= MAX_STEPS, f"an integer in [1, {MAX_STEPS}]"),
        (
            "mini_batch_seqs",
            cfg.mini_batch_seqs >= cfg.rollout_n >= 2 and cfg.mini_batch_seqs % cfg.rollout_n == 0,
            "a multiple of rollout_n, and rollout_n >= 2",
        ),
        ("vocab", 2 <= cfg.vocab <= MAX_VOCAB, f"an integer in [2, {MAX_VOCAB}]"),
        ("p_correct", 0 < cfg.p_correct < 1, "a number in (0, 1)"),
        (
            "rollout_logit_noise",
            math.isfinite(cfg.rollout_logit_noise) and cfg.rollout_logit_noise >= 0,
            "a finite number >= 0",
        ),
        (
            "rollout_logit_noise",
            cfg.preset == "v1" or cfg.rollout_logit_noise == 0,
            "0 with --preset v2 (v1 models the mismatch)",
        ),
        ("length", cfg.preset == "v1" or min(cfg.length) >= 8, "integers >= 8 with --preset v2"),
        ("grad_clip", math.isfinite(cfg.grad_clip) and cfg.grad_clip >= 0, "a finite number >= 0"),
        ("adam_epsilon", math.isfinite(cfg.adam_epsilon) and cfg.adam_epsilon > 0, "a finite number > 0"),
        ("beta1", 0 <= cfg.beta1 < 1, "a number in [0, 1)"),
        ("eval_points", cfg.eval_points >= 1, "an integer >= 1"),
        ("collapse_ratio", 0 <= cfg.collapse_ratio <= 1, "a number in [0, 1]"),
        ("jobs", cfg.jobs >= 1, "an integer >= 1"),
    ]


def _check_sizes(cfg: LabConfig) -> None:
    """A cell's memory: the (T, V) logits and the rollout batch's N x mini_batch_seqs x T tokens."""
    t = max(cfg.length)
    if t * cfg.vocab > MAX_LOGITS:
        raise ValueError(f"length x vocab must be <= {MAX_LOGITS} logits per cell, got {t} x {cfg.vocab}")
    tokens = max(cfg.num_mini_batches) * cfg.mini_batch_seqs * t
    if tokens > MAX_BATCH_TOKENS:
        raise ValueError(
            f"num_mini_batches x mini_batch_seqs x length must be <= {MAX_BATCH_TOKENS} tokens per rollout batch "
            f"(~{MAX_BATCH_TOKENS * 24 / 2**30:.1f} GiB per cell), "
            f"got {max(cfg.num_mini_batches)} x {cfg.mini_batch_seqs} x {t}"
        )


def _check_method_family(cfg: LabConfig) -> None:
    """The registry's checks (each method's hyperparameters; the phi-based controls need VESPO-family methods)."""
    from vespo.losses import rollout_correction, validate_hparams  # torch, as the grid itself

    for method in cfg.methods:
        validate_hparams(method)
    has_phi = all(rollout_correction(m) == "fold" for m in cfg.methods)  # the VESPO family: phi(W) folds the ratio
    if cfg.step_scale == "mean_phi" and not has_phi:
        raise ValueError(
            "step_scale must be none or ess_sqrt unless every method is VESPO-family (mean_phi scales by mean phi), "
            f"got {cfg.step_scale!r}"
        )
    if cfg.momentum_scale != "none" and not has_phi:
        raise ValueError(
            "momentum_scale must be none unless every method is VESPO-family (it scales by mean phi), "
            f"got {cfg.momentum_scale!r}"
        )

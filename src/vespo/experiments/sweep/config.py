"""`vespo sweep`'s settings: `SweepConfig` (its flags), a grid's `Cell`, and how a preset's regime fills the fields a
user left at their defaults (`resolve`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Annotated

import tyro

from vespo.argv import RENAMED
from vespo.experiments.presets import NAMED, PRESET_REGIMES, PRESETS, Variant


@dataclass
class SweepConfig:
    out_dir: str = "sweeps/staleness"
    """Output directory (cells/, results.csv, results.md, figures): new, empty, or an earlier sweep's (continued)."""
    overwrite_output_dir: bool = False
    """Delete an earlier sweep's outputs in `out_dir` first (its cells included), or write beside files vespo did not
    create there (never replacing them)."""
    methods: tuple[str, ...] = ("vespo", "grpo", "gspo", "sapo", "topr", "topr-tokenmean", "cispo", "bapo")
    """Methods of the default grid (ignored when a preset is chosen): registered methods, or a named variant:
    `topr-tokenmean` (the length-normalised TOPR the VESPO paper compared against; `topr` is TOPR's own token-sum
    form), `vespo-unitpos`, `vcpo` (VCPO: its loss with its ESS step scaling and optimal baseline)."""
    preset: str | None = None
    """Preset instead of `methods`: length_norm | asymmetry | topr | step_controls | paper (the paper's staleness table
    in the paper's optimisation regime, docs/guides/paper.md: it also sets the task, N, seeds, mini-batch, steps, lr,
    evaluation and AdamW settings, wherever a flag is left at its default) | paper-long (the same table on 128-token
    chain responses where the methods' updates differ, with a regime gate per cell)."""
    variants: tuple[str, ...] = ()
    """With a preset: run only these of its variants (default: all of them), e.g. a subset of the paper table."""
    regime_applied: tyro.conf.Suppress[bool] = False
    """Set by `resolve`/`preset_config` once a preset's regime is applied: every field then says what the user
    chose (the command line starts from the preset's settings, so a flag always wins)."""
    num_mini_batches: Annotated[tuple[int, ...], tyro.conf.arg(aliases=("--staleness",)), RENAMED] = (
        1, 4, 8, 16, 32, 64)  # fmt: skip
    """Values of N, the mini-batches per rollout step (= train_batch_size / ppo_mini_batch_size; the paper's staleness
    ratio). `--staleness` is its old name, deprecated."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """RL seeds (all share one SFT warm start)."""
    ppo_mini_batch_size: Annotated[int, tyro.conf.arg(aliases=("--mini-batch-size",))] = 4
    """Prompts per optimizer step, fixed across N (`vespo train`'s name)."""
    rollout_n: int = 8
    """Responses per prompt."""
    optimizer_steps: int = 192
    """Optimizer steps per cell, fixed across N (must be a multiple of every N): equal samples per cell."""
    min_rollout_steps: int = 4
    """Every cell runs at least this many rollout steps: at N > optimizer_steps / min_rollout_steps its optimizer steps
    are scaled up to min_rollout_steps * N (more samples than the other cells; the tables say so)."""
    lr: tuple[float, ...] = (3e-4,)
    """Learning rates (a grid axis when several are given: rows are then named `method@lr<value>`)."""
    task: tuple[str, ...] = ("arithmetic",)
    """Embedded tasks (a grid axis when several are given: rows `method@<task>`): arithmetic (~11-token answers) |
    chain (`num_operands` steps of a running sum mod 10, written out) | scratchpad (free-length sums of
    `num_operands` digits, running sums optional)."""
    num_operands: Annotated[int, tyro.conf.arg(aliases=("--chain-operands",))] = 20
    """Chain task: steps per problem, responses 3 * num_operands + 5 tokens (20 -> 65, 84 -> 257); scratchpad: digits
    per sum (e.g. 5). `vespo train`'s name (the arithmetic task keeps its default, 3)."""
    eval_points: int = 4
    """Held-out evaluations per cell besides step 0 (at equal fractions of training)."""
    eval_size: int = 500
    """Held-out prompts per evaluation."""
    probes: int = 0
    """Gradient probes per cell (`vespo.diagnostics.gradient_probe`: the cosine of the method's gradient to GRPO's and
    plain REINFORCE's on the stalest mini-batch), at equal strides of rollout steps; 0 = none."""
    eval_n: int = 4
    """Samples per held-out prompt (avg@eval_n): the evaluation's binomial SD is ~ sqrt(p(1-p)/(eval_size*eval_n)),
    at most 0.011 with the defaults (issue 19's 0.015 floor; ~1.6 s per evaluation on the arithmetic task)."""
    jobs: int = 2
    """Cells run in parallel (one torch thread each)."""
    collapse_ratio: float = 0.5
    """A cell has collapsed when its final held-out accuracy is below this fraction of its step-0 accuracy."""
    cache_dir: str = "~/.cache/vespo"
    """Warm-start cache shared by all cells."""
    extra: dict[str, str] = field(default_factory=dict)
    """Additional `vespo train` flags for every cell, e.g. `--extra rollout_logit_noise 0.3 tensorboard False`; not
    the fields the sweep sets itself (`SWEEP_OWNED`)."""


SWEEP_OWNED = {
    "run_dir": "--out-dir",
    "cache_dir": "--cache-dir",
    "resume": "rerunning the sweep",
    "overwrite_output_dir": "--overwrite-output-dir",
    "allow_change": "another --out-dir",
    "method": "--methods or --preset",
    "hparams": "--preset",
    "seed": "--seeds",
    "lr": "--lr",
    "task": "--task",
    "ppo_mini_batch_size": "--mini-batch-size",
    "train_batch_size": "--num-mini-batches",
    "staleness": "--num-mini-batches",
    "rollout_n": "--rollout-n",
    "total_training_steps": "--optimizer-steps",
    "eval_size": "--eval-size",
    "eval_n": "--eval-n",
    "probe_every": "--probes",
}
"""`vespo train` fields the sweep sets for every cell (-> the sweep flag to use instead): `extra` may not set them."""


@dataclass(frozen=True)
class Cell:
    """One run of the grid: a variant (method, hparams, settings) at N mini-batches per rollout step, seed, lr and
    task."""

    variant: str
    method: str
    hparams: dict
    num_mini_batches: int
    seed: int
    lr: float = 3e-4
    task: str = "arithmetic"
    settings: dict = field(default_factory=dict)

    key: str = ""
    """Hash of the cell's whole `vespo train` config (`cell_key`): its run dir is named by it, so a finished cell is
    reused only for exactly the same settings."""

    @property
    def name(self) -> str:
        return f"{self.variant}/N{self.num_mini_batches}/seed{self.seed}" + (f"/{self.key}" if self.key else "")


def resolve(cfg: SweepConfig) -> SweepConfig:
    """The config a sweep runs with: a preset's regime (`PRESET_REGIMES`) fills every field left at SweepConfig's
    default (its `vespo train` settings reach every cell in `train_config`, below `extra`). Applied once
    (`regime_applied`); configs without a regime come back as they are. To set a field to SweepConfig's default value
    under a preset, use `preset_config` (the command line does)."""
    if cfg.preset not in PRESET_REGIMES or cfg.regime_applied:
        return cfg
    fields, train = PRESET_REGIMES[cfg.preset]
    defaults = SweepConfig()
    changes = {k: v for k, v in fields.items() if getattr(cfg, k) == getattr(defaults, k)}
    return dataclasses.replace(cfg, **changes, regime_applied=True)


def preset_config(preset: str, **fields) -> SweepConfig:
    """A SweepConfig that starts from `preset`'s regime, with `fields` set on top (any value, defaults included)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    return dataclasses.replace(resolve(SweepConfig(preset=preset)), **fields)


def variants(cfg: SweepConfig) -> dict[str, Variant]:
    """Variant name -> (method, hparams, settings) for the chosen preset (or its `variants` subset) or method list."""
    if cfg.preset is None:
        if cfg.variants:
            raise ValueError("variants selects among a preset's variants; without --preset use --methods")
        return {m: NAMED.get(m, (m, {}, {})) for m in cfg.methods}
    if cfg.preset not in PRESETS:
        raise ValueError(f"unknown preset {cfg.preset!r}; choose one of {sorted(PRESETS)}")
    chosen = PRESETS[cfg.preset]
    unknown = [v for v in cfg.variants if v not in chosen]
    if unknown or len(set(cfg.variants)) != len(cfg.variants):
        raise ValueError(f"variants must be distinct variants of preset {cfg.preset}: {list(chosen)}; got "
                         f"{list(cfg.variants)}")  # fmt: skip
    return {v: chosen[v] for v in cfg.variants} if cfg.variants else chosen

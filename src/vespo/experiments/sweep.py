"""`vespo sweep`: methods x N (`num_mini_batches`, the paper's staleness ratio gbs/mbs) x seeds on the embedded task,
in parallel processes, resumable.

Every cell uses the same mini-batch (`ppo_mini_batch_size` prompts x `rollout_n` responses) and the same total number of
optimizer steps, hence the same number of samples; only the rollout batch (N mini-batches) changes with N, as in the
paper (fixed mini-batch 256, varying global batch; Sec. 4.1). A cell runs at least `min_rollout_steps` rollout steps:
where `optimizer_steps / N` is fewer, its optimizer steps are scaled up to `min_rollout_steps * N` (stated in the
tables). Outputs: results.csv (one row per cell, final and best held-out accuracy), results.md (mean ± 95% CI over
seeds and the evaluation noise floor; significance: `vespo compare`), fig3_training_reward.png and fig4_dynamics.png
in the style of the paper's Figures 3 and 4.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import types
import typing
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import numpy as np
import tyro

from vespo.argv import RENAMED
from vespo.experiments.grid import GridInterrupted, claim_grid_dir, grid_cli, settings_key
from vespo.outputs import open_append, read_regular, write_atomic
from vespo.train.config import FIELD_TYPES, TrainConfig, conforms, describe_type
from vespo.train.config_io import to_yaml  # torch, scipy, matplotlib: imported where a grid runs or is drawn
from vespo.train.host import check_host, check_output_dir

Variant = tuple[str, dict, dict]
"""(method, hparams, other `vespo train` settings): one row of a table."""
NAMED: dict[str, Variant] = {
    # the TOPR the VESPO paper compared against: "with length normalization" (Sec. 4.4), i.e. token-mean aggregation;
    # plain "topr" is TOPR's own definition (its gradient sums over the sequence: seq-mean-token-sum)
    "topr-tokenmean": ("topr", {}, {"loss_agg_mode": "token-mean"}),
    "vespo-unitpos": ("vespo", {"positive_weight": "one"}, {}),  # issue 29: VESPO with TOPR's weight 1 on A >= 0
    # VCPO as its scripts run it: its loss with sequence-level rollout IS at threshold 8, ESS step scaling and the
    # off-policy optimal baseline (docs/methods/index.md); `vespo train --method vcpo` alone is the loss with GRPO
    # advantages.
    # The threshold is text, as `--hparams rollout_is_threshold 8.0` gives it (a correction option keeps its text:
    # veRL's "lower_upper" form), so the cells run with the command line keep their names (`cell_key`)
    "vcpo": ("vcpo", {"rollout_is_threshold": "8.0"}, {"step_scale": "ess_sqrt", "adv_estimator": "opob"}),
    # issue 54: VESPO with Kimi K2.5's squared log-ratio penalty at its tau; prime-rl's default loss (DPPO-Binary-TV
    # at 0.2 with no IS cap, plus the same penalty); dppo_tv, dppo_kl and luspo run under their own names
    "vespo-kltau": ("vespo", {"kl_tau": 1e-3}, {}),
    "dppo-primerl": (
        "dppo_tv", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": None, "kl_tau": 1e-3}, {}
    ),
}
"""Variants selectable by name in `methods` besides the registered methods."""
# preset -> {variant name: (method, hparams, settings)}; the default preset is filled from `methods`
PRESETS: dict[str, dict[str, Variant]] = {
    "length_norm": {  # paper Sec. 4.7 / App. G: VESPO without, with sqrt and with linear length normalisation
        "vespo": ("vespo", {}, {}),
        "vespo-sqrt": ("vespo", {"length_norm": "sqrt"}, {}),
        "vespo-linear": ("vespo", {"length_norm": "linear"}, {}),
    },
    "asymmetry": {  # paper Sec. 4.7: asymmetric (c1, c2) per advantage sign vs the same pair for both signs
        "vespo": ("vespo", {}, {}),
        "vespo-sym23": ("vespo", {"c1_neg": 2.0, "c2_neg": 3.0}, {}),
        "vespo-sym32": ("vespo", {"c1_pos": 3.0, "c2_pos": 2.0}, {}),
    },
    "topr": {"topr": ("topr", {}, {}), "topr-tokenmean": NAMED["topr-tokenmean"]},  # TOPR both ways
    "step_controls": {  # issue 19: step-size controls for stale mini-batches, beyond the paper
        "vespo": ("vespo", {}, {}),
        "vespo-meanphi": ("vespo", {}, {"step_scale": "mean_phi"}),
        "vespo-targetkl": ("vespo", {}, {"target_kl": 0.02}),
    },
    "paper": {  # the paper's staleness table (Sec. 4.2), in the paper's optimisation regime (`PRESET_REGIMES`)
        "vespo": ("vespo", {}, {}),
        "grpo": ("grpo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}, {}),  # DAPO's clip-higher bounds
        "gspo": ("gspo", {}, {}),
        "sapo": ("sapo", {}, {}),
        "cispo": ("cispo", {}, {}),
        "topr": ("topr", {}, {}),
        "topr-tokenmean": NAMED["topr-tokenmean"],
        # beyond the paper (issue 40): the off-policy corrections of 2025-26, each with its source's defaults
        "m2po": ("m2po", {}, {}),
        "opsm": ("opsm", {}, {}),
        "aipo": ("aipo", {}, {}),
        "vcpo": NAMED["vcpo"],
    },
    "paper-long": {  # issue 43: the staleness table where the methods' updates differ (`PRESET_REGIMES`, `GATES`)
        "vespo": ("vespo", {}, {}),
        "grpo": ("grpo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}, {}),  # DAPO's bounds, vespo's dual clip 3
        "grpo-dual10": ("grpo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 10.0}, {}),  # scripts'
        "gspo": ("gspo", {}, {}),
        "sapo": ("sapo", {}, {}),
        "cispo": ("cispo", {}, {}),
        "topr-tokenmean": NAMED["topr-tokenmean"],
        # beyond the paper (issue 40), as in `paper`: the off-policy corrections of 2025-26 with their sources' defaults
        "m2po": ("m2po", {}, {}),
        "opsm": ("opsm", {}, {}),
        "aipo": ("aipo", {}, {}),
        "vcpo": NAMED["vcpo"],
        # issue 54's corrections of 2026 at their sources' defaults (design corrections-2026's plan names them)
        "dppo-tv": ("dppo_tv", {}, {}),
        "luspo": ("luspo", {}, {}),
        "vespo-kltau": NAMED["vespo-kltau"],
    },
}
PAPER_TABLE = ("vespo", "grpo", "gspo", "sapo", "cispo", "topr", "topr-tokenmean")
"""The paper preset's variants that are the paper's staleness table (its others go beyond the paper: issue 40)."""

PROBE_METRICS = ("cos_grpo", "cos_reinforce", "cos_grpo_reinforce", "rel_diff_grpo", "rel_diff_reinforce",
                 "cos_split_half")  # fmt: skip
"""The gradient probe's metrics (`vespo.diagnostics.gradient_probe`) a cell summary reports as `probe_<name>`."""
PAPER_LR = 1e-4
"""The paper preset's learning rate, calibrated so the regime diagnostics land in docs/guides/paper.md's ranges."""
LONG_LR = 1e-4
"""The paper-long preset's learning rate (docs/guides/paper.md, "The long-response regime"): with the 128-token chain
and its warm start, the gate `GATES["paper-long"]` holds at N = 64 and the stale KL stays in the paper regime's range;
at 3e-4 VESPO's stale drift runs away (KL(mu || pi) ~1, mean phi ~0.04) and it collapses."""
LONG_WARM_START = {"sft_steps": 4000, "sft_lr": 1e-3}
"""The paper-long preset's warm start on the 41-step chain: at the chain's default SFT lr (3e-3) the 128-token chain
does not learn (teacher-forced digits 21-42% right over 2,500-8,000 steps); at 1e-3 its digits are 99.9% right
greedily after 4,000 steps, but sampled at temperature 1 about 2% of them are wrong, so held-out accuracy starts at
0.175 (chance 0.10): every step of a response carries some entropy, and RL has room below the ceiling."""
PAPER_ADAMW = {"betas": (0.9, 0.999), "weight_decay": 0.01, "grad_clip": 1.0}
"""The paper's optimiser settings (its official scripts keep veRL's AdamW defaults and grad_clip 1.0)."""
PRESET_REGIMES: dict[str, tuple[dict, dict]] = {
    "paper": (
        {  # SweepConfig fields (where left at their defaults): free-length task, >= 8 rollout steps at every N
            "task": ("scratchpad",),
            "num_operands": 4,
            "num_mini_batches": (1, 4, 8, 16, 64),
            "seeds": (0, 1, 2, 3, 4),
            "ppo_mini_batch_size": 8,  # 64 sequences: grad_clip 1.0 binds on ~4% of steps (2 prompts: ~40%)
            "optimizer_steps": 32,
            "min_rollout_steps": 8,
            "lr": (PAPER_LR,),
            "eval_size": 500,
            "eval_n": 2,
            "probes": 4,
        },
        # `vespo train` settings of every cell (a variant's or an `extra` entry of the same name wins): paper's AdamW
        PAPER_ADAMW,
    ),
    "paper-long": (
        {  # responses of 3 * 41 + 5 = 128 tokens, N up to 128, enough rollout steps for best and final to differ
            "task": ("chain",),
            "num_operands": 41,
            "num_mini_batches": (4, 16, 64, 128),
            # what 2 cores afford for the whole table; at the measured per-seed SD they detect ~0.07-0.09, not 0.03
            # (which needs 31-58 seeds): benchmarks/bench_paper_long.py's plan says so before any cell runs
            "seeds": tuple(range(9)),
            "ppo_mini_batch_size": 8,
            "optimizer_steps": 64,
            "min_rollout_steps": 8,
            "lr": (LONG_LR,),
            "eval_size": 500,
            "eval_n": 2,
            "eval_points": 4,
            "probes": 4,
        },
        PAPER_ADAMW | LONG_WARM_START,
    ),
}
"""Presets that set the training regime as well as the variants: preset -> (SweepConfig fields it sets where the user
left them at their defaults, `resolve`; `vespo train` settings of every cell, `train_config`)."""


@dataclass(frozen=True)
class Gate:
    """One condition of a preset's regime gate on a cell summary: `key` `op` `bound` ("<", "<=" or ">="), checked on
    cells of the given methods (None: every method) at N >= `min_n`."""

    key: str
    op: str
    bound: float
    label: str
    methods: tuple[str, ...] | None = None
    min_n: int = 1

    def holds(self, value: float | None) -> bool:
        if value is None or not np.isfinite(value):
            return False
        return {"<": value < self.bound, "<=": value <= self.bound, ">=": value >= self.bound}[self.op]


GATES: dict[str, tuple[Gate, ...]] = {
    "paper-long": (  # issue 43: where VESPO's and GRPO's updates can differ, and no setting of ours decides it
        Gate("grad_clipped_frac", "<", 0.10, "grad_clip share"),
        Gate("clip_frac_stalest", "<=", 0.05, "GRPO token clip share, stalest", methods=("grpo",)),
        Gate("log_w_std_stalest", ">=", 1.0, "sd log W, stalest", methods=("vespo", "grpo"), min_n=64),
    ),
}
"""Presets whose cells are checked against a regime gate (`gate`): the results say which cells miss it, and a
verdict uses the cells that pass (benchmarks/bench_paper_long.py)."""


def gate(preset: str | None, method: str, num_mini_batches: int, summary: dict) -> str:
    """A cell's regime gate: "" when the preset has none, "ok" when every condition that applies to its method and N
    holds, else "missed: " and each failed condition with its value (a value not logged fails)."""
    if preset not in GATES:
        return ""
    failed = []
    for g in GATES[preset]:
        applies = (g.methods is None or method in g.methods) and num_mini_batches >= g.min_n
        if applies and not g.holds(summary.get(g.key)):
            value = summary.get(g.key)
            failed.append(f"{g.label} {'not logged' if value is None else f'{value:.3g}'} (needs {g.op} {g.bound:g})")
    return "missed: " + "; ".join(failed) if failed else "ok"


FIG4_COLUMNS = (  # (metric, axis label, the metric's range: bands and limits stay inside it)
    ("reward/mean", "training reward", (0.0, 1.0)),
    ("eval/accuracy", "held-out accuracy", (0.0, 1.0)),
    ("response/length_mean", "response length (tokens)", (0.0, float("inf"))),
    ("response/clip_frac", "share cut at max length", (0.0, 1.0)),
    ("is/approx_kl", "KL(mu || pi)", (0.0, float("inf"))),
    ("actor/entropy", "entropy (nats)", (0.0, float("inf"))),
    ("loss/pg", "pg loss", None),
)


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
NOT_IDENTITY = ("run_dir", "cache_dir", "resume", "allow_change", "overwrite_output_dir", "progress")
"""TrainConfig fields left out of a cell's identity: where it is written, and bookkeeping that changes no number."""
LATER_FIELDS = {"adv_estimator": "grpo", "eval_top_p": None, "bypass_mode": False}
"""TrainConfig fields added after sweeps were run -> the value that reproduces those runs: left out of a cell's
identity at that value, so the cells run before the field existed keep their names (and are reused)."""


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


def cells(cfg: SweepConfig) -> list[Cell]:
    """All grid cells, validated (each cell's TrainConfig is resolved) before anything runs."""
    cfg = resolve(cfg)
    check_output_dir("out_dir", cfg.out_dir)
    axes = ("num_mini_batches", "seeds", "lr", "task") + (("methods",) if cfg.preset is None else ())
    for name in axes:  # grid axes: at least one value, none twice (two cells would share one run dir)
        values = getattr(cfg, name)
        if not values or len(set(values)) != len(values):
            raise ValueError(f"{name} must be one or more distinct values, got {list(values)}")
    for name, ok, accepted in (
        ("optimizer_steps", cfg.optimizer_steps >= 1, "an integer >= 1"),
        ("min_rollout_steps", cfg.min_rollout_steps >= 1, "an integer >= 1"),
        ("eval_points", cfg.eval_points >= 1, "an integer >= 1"),
        ("probes", cfg.probes >= 0, "an integer >= 0"),
        ("jobs", cfg.jobs >= 1, "an integer >= 1"),
        ("collapse_ratio", 0 <= cfg.collapse_ratio <= 1, "a number in [0, 1]"),
    ):
        if not ok:
            raise ValueError(f"{name} must be {accepted}, got {getattr(cfg, name)!r}")
    bad = [n for n in cfg.num_mini_batches if n < 1 or _optimizer_steps(cfg, n) % n]
    if bad:
        raise ValueError(f"optimizer_steps={cfg.optimizer_steps} must be a multiple of every N; not of {bad}")
    bad_lr = [lr for lr in cfg.lr if not 0 < lr < float("inf")]
    if bad_lr or not cfg.lr:
        raise ValueError(f"lr must be one or more finite numbers > 0, got {list(cfg.lr)}")

    def label(variant: str, lr: float, task: str) -> str:  # lr and task axes are extra rows: tables stay 2-D
        return variant + ("" if len(cfg.lr) == 1 else f"@lr{lr:g}") + ("" if len(cfg.task) == 1 else f"@{task}")

    for key in cfg.extra:
        name = key.replace("-", "_")
        if name in SWEEP_OWNED:
            raise ValueError(f"extra: {key} is set by the sweep for every cell; use {SWEEP_OWNED[name]}")
        if name not in FIELD_TYPES:
            raise ValueError(f"extra: {key} is not a `vespo train` field")
    grid = [
        Cell(label(v, lr, task), m, h, n, s, lr, task, settings)
        for task in cfg.task
        for v, (m, h, settings) in variants(cfg).items()
        for lr in cfg.lr
        for n in cfg.num_mini_batches
        for s in cfg.seeds
    ]
    return [dataclasses.replace(c, key=cell_key(check_host(train_config(cfg, c)))) for c in grid]  # and this machine


def cell_key(tc: TrainConfig) -> str:
    """Identity of a cell: a hash of its resolved `vespo train` config, all but `NOT_IDENTITY` (and `LATER_FIELDS`
    at their earlier value)."""
    config = tc.flat()
    later = {k for k, v in LATER_FIELDS.items() if config[k] == v}
    return settings_key({k: v for k, v in config.items() if k not in NOT_IDENTITY and k not in later})


def _optimizer_steps(cfg: SweepConfig, num_mini_batches: int) -> int:
    """A cell's optimizer steps: `optimizer_steps`, scaled up to `min_rollout_steps` rollout steps at large N."""
    return max(cfg.optimizer_steps, cfg.min_rollout_steps * num_mini_batches)


def train_config(cfg: SweepConfig, cell: Cell) -> TrainConfig:
    """The resolved TrainConfig a cell runs with: fixed mini-batch and optimizer steps, N mini-batches per rollout
    step; then the preset's regime, the variant's settings and the user's `extra`, each over the ones before."""
    cfg = resolve(cfg)
    rollout_steps = _optimizer_steps(cfg, cell.num_mini_batches) // cell.num_mini_batches
    fields = {
        "method": cell.method,
        "hparams": dict(cell.hparams),
        "seed": cell.seed,
        "ppo_mini_batch_size": cfg.ppo_mini_batch_size,
        "train_batch_size": cfg.ppo_mini_batch_size * cell.num_mini_batches,
        "rollout_n": cfg.rollout_n,
        "total_training_steps": rollout_steps,
        "lr": cell.lr,
        "task": cell.task,
        "eval_every": max(1, rollout_steps // cfg.eval_points),
        "eval_size": cfg.eval_size,
        "eval_n": cfg.eval_n,
        "save_every": max(1, rollout_steps // 8),
        "probe_every": max(1, rollout_steps // cfg.probes) if cfg.probes else 0,
        "num_threads": 1,
        "run_dir": str(Path(cfg.out_dir) / "cells" / cell.name),
        "cache_dir": cfg.cache_dir,
        "progress": False,
    }
    if cell.task == "chain":
        from vespo.embedded.task import chain_response_tokens  # imports torch

        fields |= {"num_operands": cfg.num_operands, "max_response_length": chain_response_tokens(cfg.num_operands)}
    if cell.task == "scratchpad":
        from vespo.embedded.task import scratchpad_response_tokens

        longest = scratchpad_response_tokens(cfg.num_operands, 9)
        fields |= {"num_operands": cfg.num_operands, "max_response_length": longest + 4}  # room to run over
    train = PRESET_REGIMES[cfg.preset][1] if cfg.preset in PRESET_REGIMES else {}
    for settings in (train, cell.settings, _typed_extra(cfg.extra)):  # the preset's regime, the variant's, `extra`
        fields |= settings
    return TrainConfig(**fields)


def _typed_extra(extra: dict[str, object]) -> dict[str, object]:
    """`extra` as TrainConfig fields (hyphens read as underscores) with values of the field's type, as `vespo train`'s
    command line reads text: "None" is None where None is accepted, "True"/"False" a bool, a number where one is; a
    value that is not text (an API caller's) is kept. A value that fits no type of its field is a one-line
    ValueError."""
    typed = {}
    for key, value in extra.items():
        name = key.replace("-", "_")
        hint = FIELD_TYPES[name]
        if isinstance(value, str):
            value = _from_text(value, hint)
        if not conforms(value, hint):
            raise ValueError(f"extra: {key} must be {describe_type(hint)}, got {value!r}")
        typed[name] = value
    return typed


def _from_text(text: str, hint: object) -> object:
    """`text` as the first type of `hint` it reads as (None, bool, int, float), else the text itself."""
    kinds = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for kind in kinds:
        if kind is type(None) and text == "None":
            return None
        if kind is bool and text in ("True", "False"):
            return text == "True"
        if kind in (int, float):
            with contextlib.suppress(ValueError):
                return kind(text)
    return text


def write_cell_config(tc: TrainConfig) -> list[str]:
    """Write a cell's config beside its run dir (`<key>.yaml`, headed by the command that runs it by hand) and return
    the command the sweep runs it with: `vespo train --config <key>.yaml` in a process of its own."""
    run_dir = Path(tc.run_dir)
    path = run_dir.parent / f"{run_dir.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    where = "" if path.is_absolute() else " from the directory the sweep ran in"
    header = (f"# a `vespo sweep` cell; run it{where} (--resume: continue its checkpoint) with\n"
              f"#   vespo train --config {shlex.quote(str(path))}\n")  # fmt: skip
    write_atomic(path, header + to_yaml(tc))
    return [sys.executable, "-m", "vespo", "train", "--config", str(path)]


def run_cell(cfg: SweepConfig, cell: Cell) -> dict:
    """Run one cell in a `vespo train` process on its config file (`write_cell_config`), resuming a half-finished one;
    returns its summary (also saved as summary.json). Nothing is deleted: the cell's run dir is its own (named by
    `cell_key`). A finished cell whose summary.json is damaged (a crash of an older vespo that wrote it in place) is
    summarised again from its metrics, saying so."""
    from vespo.train.logs import read_metrics
    from vespo.train.resume import CHECKPOINT

    tc = train_config(cfg, cell)
    run_dir = Path(tc.run_dir)
    done = run_dir / "summary.json"
    if os.path.lexists(done):  # finished: summarised afresh from its metrics when present (newer summaries say more)
        saved = _read_summary(done)
        has_metrics = (run_dir / "metrics.jsonl").is_file()
        if saved is not None and not has_metrics:
            return saved
        if has_metrics:
            summary = _gated(cfg, cell, summarize(cell, read_metrics(run_dir), cfg.collapse_ratio))
            if saved is None:
                print(f"vespo sweep: cell {cell.name}: {done} is damaged; summarised again from its metrics.jsonl",
                      file=sys.stderr)  # fmt: skip
                write_atomic(done, json.dumps(summary | {"wall_s": float("nan")}))
            return summary | {"wall_s": (saved or {}).get("wall_s", float("nan"))}
        print(f"vespo sweep: cell {cell.name}: {done} is damaged and the cell has no metrics.jsonl; running it again",
              file=sys.stderr)  # fmt: skip
        done.unlink()
    resume = (run_dir / CHECKPOINT).is_file()  # else a fresh run; one killed before its checkpoint is started over
    argv = write_cell_config(tc)
    log = run_dir.parent / f"{run_dir.name}.log"
    t0 = time.perf_counter()
    with open_append(log) as f:
        returncode = _CELLS.run([*argv, *(["--resume"] if resume else [])], stdout=f, stderr=subprocess.STDOUT)
    if returncode is None:  # the sweep is stopping: the cell was never started, or stopped
        return {}
    if returncode != 0:
        raise RuntimeError(f"cell {cell.name} failed (exit {returncode}); see {log}")
    summary = summarize(cell, read_metrics(run_dir), cfg.collapse_ratio)
    summary = _gated(cfg, cell, summary) | {"wall_s": time.perf_counter() - t0}
    write_atomic(done, json.dumps(summary))
    return summary


def _gated(cfg: SweepConfig, cell: Cell, summary: dict) -> dict:
    """The summary with its regime gate (`gate`) where the preset has one."""
    verdict = gate(cfg.preset, cell.method, cell.num_mini_batches, summary)
    return summary | ({"gate": verdict} if verdict else {})


def _read_summary(path: Path) -> dict | None:
    """A cell's summary.json, or None when it is not a regular file holding a JSON object."""
    try:
        saved = json.loads(read_regular(path, 1 << 22))
    except (OSError, ValueError, RecursionError):
        return None
    return saved if isinstance(saved, dict) else None


class _Cells:
    """The `vespo train` processes of the running cells: started only while the sweep is not stopping, and all
    stopped at once by `stop` (Ctrl-C), whichever thread runs them."""

    STOP_WAIT_S = 10.0
    """How long a cell may take to exit after its SIGINT before it is killed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen] = set()
        self.stopping = False

    def run(self, argv: list[str], **popen) -> int | None:
        """Run `argv` to the end and return its exit code; None when the sweep is stopping."""
        with self._lock:
            if self.stopping:
                return None
            proc = subprocess.Popen(argv, **popen)
            self._procs.add(proc)
        try:
            code = proc.wait()
        finally:
            with self._lock:
                self._procs.discard(proc)
        return None if self.stopping else code

    def stop(self) -> int:
        """Start no more cells; SIGINT every running one (its last checkpoint stays), kill any still alive after
        `STOP_WAIT_S`. Returns how many were running."""
        with self._lock:
            self.stopping = True
            procs = list(self._procs)
        deadline = time.monotonic() + 1.0  # a terminal's Ctrl-C reached them too: let them stop on their own first
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.poll() is None:  # only the sweep was signalled (kill -INT): pass it on
                with contextlib.suppress(OSError):
                    proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + self.STOP_WAIT_S
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return len(procs)


_CELLS = _Cells()


def regime_summary(rows: list[dict]) -> dict:
    """A run's regime diagnostics from its metrics rows: the share of optimizer steps cut by grad_clip; the
    diagnostics of the stalest mini-batch (`vespo.diagnostics`), means over rollout steps; the gradient probe's, means
    over the probed steps (None where not logged: mean phi or the token clip share of a method without them, a run
    without probes or whose probed batches had no gradient, or metrics that predate them). What `gate` checks."""
    from vespo.diagnostics import MEAN_PHI, PROBE_PREFIX

    def mean(key: str) -> float | None:  # over the steps that logged a finite value (nan: undefined at that step)
        values = [r[key] for r in rows if key in r and np.isfinite(r[key])]
        return float(np.mean(values)) if values else None

    def stalest(key: str) -> float | None:
        return mean(f"{key}/last_mini_batch")

    clipped = [r["actor/grad_clipped"] for r in rows if "actor/grad_clipped" in r]
    return {
        "grad_clipped_frac": float(np.mean(clipped)) if clipped else float("nan"),
        "kl_mu_pi_stalest": stalest("is/kl_mu_pi"),
        "log_w_std_stalest": stalest("is/log_w_std"),
        "mean_phi_stalest": stalest(MEAN_PHI),
        "momentum_share_stalest": stalest("actor/momentum_share"),
        "clip_frac_stalest": stalest("clip/frac"),
        **{f"probe_{name}": mean(f"{PROBE_PREFIX}{name}") for name in PROBE_METRICS},
    }


def summarize(cell: Cell, rows: list[dict], collapse_ratio: float) -> dict:
    """Final training reward (mean of the last quarter of rollout steps); held-out accuracy at the start, at the end
    (final checkpoint) and at its best evaluation (the paper's checkpoint selection); collapse; the mean response
    length over the first and the last fifth of rollout steps; the regime diagnostics (`regime_summary`)."""
    from vespo.losses import default_loss_agg_mode

    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    tail = rewards[-max(1, len(rewards) // 4) :]
    lengths = [r["response/length_mean"] for r in rows if "response/length_mean" in r]
    regime = regime_summary(rows)
    return {
        "task": cell.task,
        "variant": cell.variant,
        "method": cell.method,
        "loss_agg_mode": cell.settings.get("loss_agg_mode") or default_loss_agg_mode(cell.method),
        "N": cell.num_mini_batches,
        "seed": cell.seed,
        "rollout_steps": len(rewards),
        "final_train_reward": float(np.mean(tail)),
        "initial_eval_acc": evals[0],
        "final_eval_acc": evals[-1],
        "best_eval_acc": max(evals[1:] or evals),
        "collapsed": bool(evals[-1] < collapse_ratio * evals[0]),
        "grad_clipped_frac": regime.pop("grad_clipped_frac"),
        "initial_length": float(np.mean(lengths[: max(1, len(lengths) // 5)])) if lengths else float("nan"),
        "final_length": float(np.mean(lengths[-max(1, len(lengths) // 5) :])) if lengths else float("nan"),
        **regime,
    }


def write_tables(out_dir: Path, summaries: list[dict], *, eval_prompts: int = 0) -> None:
    """results.csv (per cell) and results.md: mean ± 95% CI over seeds, one row per variant (its method and
    aggregation said), one column per N, and the evaluation noise floor beside the held-out tables. Differences are
    not marked here: `vespo compare results.csv` tests them."""
    from vespo.experiments.compare import diagnostics_markdown
    from vespo.experiments.stats import format_ci, markdown_grid

    keys = list(dict.fromkeys(k for s in summaries for k in s))  # a cell summarised before a column existed: empty
    f = io.StringIO(newline="")
    w = csv.DictWriter(f, fieldnames=keys, restval="")
    w.writeheader()
    w.writerows(summaries)
    write_atomic(out_dir / "results.csv", f.getvalue())
    ns = sorted({s["N"] for s in summaries})
    names = list(dict.fromkeys(s["variant"] for s in summaries))
    lines = ["Variants: " + "; ".join(_describe(v, summaries) for v in names) + ".", ""]
    steps = {n: max(s["rollout_steps"] for s in summaries if s["N"] == n) for n in ns}
    lines += ["Rollout steps per cell: " + ", ".join(f"N={n}: {steps[n]}" for n in ns) + ".", ""]
    tables = (
        ("final_train_reward", "Final training reward"),
        ("final_eval_acc", "Held-out accuracy, final checkpoint"),
        ("best_eval_acc", "Held-out accuracy, best checkpoint (the paper's selection)"),
        ("grad_clipped_frac", "Share of optimizer steps cut by grad_clip"),
        ("initial_length", "Response length (tokens), first fifth of rollout steps"),
        ("final_length", "Response length (tokens), last fifth of rollout steps"),
    )
    missed = [f"{s['variant']}/N={s['N']}/seed {s['seed']}: {s['gate'].removeprefix('missed: ')}"
              for s in summaries if s.get("gate", "ok") != "ok"]  # fmt: skip
    if any("gate" in s for s in summaries):
        lines += [f"Regime gate: {len(summaries) - len(missed)} of {len(summaries)} cells pass"
                  + (f"; missed: {'; '.join(missed)}." if missed else "."), ""]  # fmt: skip
    for metric, title in tables:

        def cell(v: str, n: int, metric: str = metric) -> str:
            sel = [s for s in summaries if s["variant"] == v and s["N"] == n]
            return format_ci([s[metric] for s in sel]) + " ✗" * sum(s["collapsed"] for s in sel) if sel else "–"

        lines += [f"### {title} (mean ± 95% CI over seeds; ✗ = collapsed seeds)", ""]
        lines += markdown_grid(names, ns, cell)
        lines.append("")
        if "eval" in metric:
            lines += [_noise_floor(summaries, eval_prompts), ""]
        if metric == "best_eval_acc":  # the regime the accuracies were measured in, beside them
            cells = {(v, n): [s for s in summaries if s["variant"] == v and s["N"] == n] for v in names for n in ns}
            lines += [diagnostics_markdown(cells, "Held-out accuracy"), ""]
    write_atomic(out_dir / "results.md", "\n".join(lines) + "\n")


def _describe(variant: str, summaries: list[dict]) -> str:
    s = next(s for s in summaries if s["variant"] == variant)
    return f"`{variant}` = {s['method']} with {s['loss_agg_mode']}"


_SAME_AT_N1 = ("vespo", "grpo", "cispo", "bapo")  # W == 1 on-policy: the same step in exact arithmetic at N = 1


def _noise_floor(summaries: list[dict], eval_prompts: int) -> str:
    """The evaluation's binomial SD at the warm start's accuracy, and the N = 1 gap between methods that take the same
    step there (their difference is noise: seed-level sampling divergence plus evaluation noise)."""
    from vespo.experiments.stats import binomial_sd

    init = float(np.mean([s["initial_eval_acc"] for s in summaries]))
    text = f"Noise floor: warm-start held-out accuracy {init:.3f}"
    if eval_prompts:
        text += f"; binomial SD of one evaluation ({eval_prompts} samples) {binomial_sd(init, eval_prompts):.3f}"
    same = {}
    for s in summaries:
        if s["N"] == 1 and s["variant"] in _SAME_AT_N1:
            same.setdefault(s["variant"], []).append(s["final_eval_acc"])
    if len(same) >= 2:
        means = {v: float(np.mean(x)) for v, x in same.items()}
        text += (
            f"; N = 1 gap between {', '.join(sorted(means))} (identical there): "
            f"{max(means.values()) - min(means.values()):.3f}"
        )
    return text + "."


def _curves(out_dir: Path, cell: Cell, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(optimizer steps, values) of one metric of one cell; x = rollout step x N so all N share one axis."""
    from vespo.train.logs import read_metrics

    rows = [r for r in read_metrics(out_dir / "cells" / cell.name) if key in r]
    return np.array([r["step"] * cell.num_mini_batches for r in rows]), np.array([r[key] for r in rows])


def _seed_mean(out_dir: Path, group: list[Cell], key: str) -> tuple[np.ndarray, np.ndarray] | None:
    curves = [_curves(out_dir, c, key) for c in group]
    if not curves or any(len(x) == 0 for x, _ in curves):
        return None
    length = min(len(x) for x, _ in curves)
    return curves[0][0][:length], np.mean([y[:length] for _, y in curves], axis=0)


def plot(cfg: SweepConfig, grid: list[Cell]) -> None:
    """fig3_training_reward.png (a panel per method, a curve per N) and fig4_dynamics.png (rows N, metric columns);
    every axis labelled, one legend beside the panels."""
    from vespo.plots import Panel, Series, category_color, panel_figure, save_figure, sequential_color

    out_dir = Path(cfg.out_dir)
    names = list(dict.fromkeys(c.variant for c in grid))
    colors = {v: category_color(i) for i, v in enumerate(names)}
    styles = {v: ("-", "--", ":")[i // 10 % 3] for i, v in enumerate(names)}  # colours repeat after 10
    ns = list(cfg.num_mini_batches)

    def group(v, n):
        return [c for c in grid if c.variant == v and c.num_mini_batches == n]

    def series(v, n, key, style) -> dict[str, Series]:
        xy = _seed_mean(out_dir, group(v, n), key)
        return {} if xy is None else {"": Series(*xy, style=style)}

    fig3 = []
    for v in names:
        panel = Panel(v, "optimizer step", "training reward (mean over seeds)", bounds=(0.0, 1.0))
        for i, n in enumerate(ns):
            for line in series(v, n, "reward/mean", {"color": sequential_color(i, len(ns))}).values():
                panel.series[f"N={n}"] = line
        fig3.append(panel)
    save_figure(panel_figure([fig3]), out_dir / "fig3_training_reward.png")

    if len(cfg.lr) > 1:
        plot_lr_robustness(cfg, grid)

    fig4 = []
    for n in ns:
        row = []
        for key, label, bounds in FIG4_COLUMNS:
            panel = Panel(f"{label}, N={n}", "optimizer step", label, bounds=bounds)
            for v in names:
                style = {"color": colors[v], "ls": styles[v], "marker": "o" if key.startswith("eval/") else None,
                         "ms": 3}  # fmt: skip
                for line in series(v, n, key, style).values():
                    panel.series[v] = line
            row.append(panel)
        fig4.append(row)
    save_figure(panel_figure(fig4, title="mean over seeds", panel_size=(3.0, 2.3)), out_dir / "fig4_dynamics.png", 100)


def plot_lr_robustness(cfg: SweepConfig, grid: list[Cell]) -> None:
    """fig_lr_robustness.png: final held-out accuracy (mean and min over seeds) vs N, a line per learning rate, a
    panel per method (columns) and task (rows); the dotted line is the warm start's accuracy."""
    from vespo.plots import save_figure

    out_dir = Path(cfg.out_dir)
    paths = {c.name: out_dir / "cells" / c.name / "summary.json" for c in grid}
    summaries = [
        saved | {"lr": c.lr, "variant": c.variant, "task": c.task, "N": c.num_mini_batches}
        for c in grid
        if (saved := _read_summary(paths[c.name])) is not None
    ]
    save_figure(lr_robustness_figure(summaries, list(cfg.num_mini_batches)), out_dir / "fig_lr_robustness.png")


def _lr_of(summary: dict) -> float:
    """A cell's learning rate: its `lr`, or the `@lr<value>` of its variant name (results.csv's rows)."""
    if "lr" in summary:
        return float(summary["lr"])
    tag = next((t for t in summary["variant"].split("@")[1:] if t.startswith("lr")), None)
    return float(tag[2:]) if tag else float("nan")


def lr_robustness_figure(summaries: list[dict], num_mini_batches: list[int]):
    """The lr-robustness figure from per-cell summaries (`summarize`'s rows with their `lr`; results.csv's rows give
    the same): a panel per method and task, final held-out accuracy vs N, mean (solid) and worst seed (dashed) per
    learning rate."""
    from vespo.plots import N_AXIS, Panel, Series, panel_figure, sequential_color

    summaries = [s | {"lr": _lr_of(s), "base": s["variant"].split("@")[0]} for s in summaries]
    tasks = list(dict.fromkeys(s["task"] for s in summaries))
    bases = list(dict.fromkeys(s["base"] for s in summaries))
    lrs = sorted({s["lr"] for s in summaries})
    rows = []
    for task in tasks:
        row = []
        starts = [float(s["initial_eval_acc"]) for s in summaries if s["task"] == task]
        for base in bases:
            start = float(np.mean(starts)) if starts else None
            panel = Panel(f"{base} ({task})", N_AXIS, "final held-out accuracy", bounds=(0.0, 1.0), xscale="log2",
                          xticks=num_mini_batches, hline=start)  # fmt: skip
            for i, lr in enumerate(lrs):
                pts = []
                for n in num_mini_batches:
                    cell = (task, base, lr, n)
                    accs = [float(s["final_eval_acc"]) for s in summaries
                            if (s["task"], s["base"], s["lr"], int(s["N"])) == cell]  # fmt: skip
                    if accs:
                        pts.append((n, np.mean(accs), np.min(accs)))
                if pts:
                    x, mean, low = zip(*pts, strict=True)
                    color = sequential_color(i, len(lrs))
                    panel.series[f"lr {lr:g} (mean)"] = Series(x, mean, style={"color": color, "marker": "o"})
                    panel.series[f"lr {lr:g} (worst seed)"] = Series(x, low, style={"color": color, "ls": "--"})
            row.append(panel)
        rows.append(row)
    return panel_figure(rows, title="dotted: the warm start's accuracy")


SWEEP_OUTPUTS = ("cells", "results.csv", "results.md", "fig3_training_reward.png", "fig4_dynamics.png",
                 "fig_lr_robustness.png")  # fmt: skip
"""What a sweep writes in its out_dir (the manifest of its marker, `vespo.outputs`)."""


def sweep(cfg: SweepConfig) -> list[dict]:
    """Run (or finish) the grid in its claimed out_dir, then write the tables and figures. Returns the per-cell
    summaries."""
    cfg = resolve(cfg)
    grid = cells(cfg)
    columns = {"variant", "method", "N", "seed", "final_eval_acc"}  # `summarize`'s, in every vespo version
    with claim_grid_dir("sweep", cfg.out_dir, SWEEP_OUTPUTS, overwrite=cfg.overwrite_output_dir, columns=columns):
        return _run_grid(cfg, grid)


def _run_grid(cfg: SweepConfig, grid: list[Cell]) -> list[dict]:
    from tqdm.auto import tqdm

    from vespo.embedded.warm_start import WarmStartSpec, embedded_policy_path

    out_dir = Path(cfg.out_dir)

    global _CELLS
    _CELLS = _Cells()  # a fresh set per sweep (an API caller may run several)
    pool = ThreadPoolExecutor(max_workers=cfg.jobs)
    try:
        for task in cfg.task:  # warm start once per task, before the parallel cells race for it
            embedded_policy_path(WarmStartSpec.of(train_config(cfg, next(c for c in grid if c.task == task))))
        with tqdm(total=len(grid), desc="vespo sweep") as bar:
            futures = [pool.submit(run_cell, cfg, c) for c in grid]
            summaries = []
            for fut in futures:
                summaries.append(fut.result())
                bar.update(1)
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        running = _CELLS.stop()
        pool.shutdown(wait=True)
        raise GridInterrupted(_kept(cfg, grid, running)) from None
    pool.shutdown()
    write_tables(out_dir, summaries, eval_prompts=cfg.eval_size * cfg.eval_n)
    plot(cfg, grid)
    return summaries


def _kept(cfg: SweepConfig, grid: list[Cell], running: int) -> str:
    """What an interrupted sweep leaves, in one phrase."""
    done = sum((Path(cfg.out_dir) / "cells" / c.name / "summary.json").is_file() for c in grid)
    text = f"{done} of {len(grid)} cells finished and kept in {Path(cfg.out_dir) / 'cells'}"
    if running:
        text += f"; the {running} running cell(s) stopped at their last checkpoint"
    partial = [p for task in cfg.task if (p := _unfinished_warm_start(cfg, grid, task)) is not None]
    if partial:
        text += f"; the warm start's progress is kept in {partial[0]}"
    return text + "; the same command continues the sweep"


def _unfinished_warm_start(cfg: SweepConfig, grid: list[Cell], task: str) -> Path | None:
    from vespo.embedded.warm_start import WarmStartSpec, unfinished

    return unfinished(WarmStartSpec.of(train_config(cfg, next(c for c in grid if c.task == task))))


def cli(argv: list[str]) -> int:
    """`vespo sweep [flags]`."""

    def run(cfg: SweepConfig) -> None:
        sweep(cfg)
        print((Path(cfg.out_dir) / "results.md").read_text())

    description = "Methods x N mini-batches per rollout step x seeds on the embedded task; resumable; tables + figures."
    preset = next((a.split("=", 1)[1] if "=" in a else b for a, b in zip(argv, [*argv[1:], ""], strict=True) if
                   a.split("=", 1)[0] == "--preset"), None)  # fmt: skip
    default = preset_config(preset) if preset in PRESET_REGIMES else None  # flags override the preset's regime
    return grid_cli("vespo sweep", SweepConfig, argv, description, cells, run, default)

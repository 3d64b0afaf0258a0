"""The presets of `vespo sweep` as data: named variants, the paper's tables and their regimes (the settings calibrated
in docs/guides/paper.md), and the regime gate of the long table. Data and one predicate (`gate`), no I/O: both the
sweep and the paper's reproduction (`vespo.experiments.reproduce`) read them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
        "dppo_tv",
        {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": None, "kl_tau": 1e-3},
        {},
    ),
}
"""Variants selectable by name in `methods` besides the registered methods."""
PAPER_BASE: dict[str, Variant] = {
    "vespo": ("vespo", {}, {}),
    "grpo": ("grpo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}, {}),  # DAPO's clip-higher bounds, dual clip 3
}
"""The two methods every paper table starts with (GRPO at DAPO's clip-higher bounds)."""
CORRECTIONS_2025: dict[str, Variant] = {  # issue 40: the off-policy corrections of 2025-26, their sources' defaults
    "m2po": ("m2po", {}, {}),
    "opsm": ("opsm", {}, {}),
    "aipo": ("aipo", {}, {}),
    "vcpo": NAMED["vcpo"],
}
"""Beyond the paper: the 2025-26 off-policy corrections both paper presets run after the paper's methods."""
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
    # the paper's staleness table (Sec. 4.2), in the paper's optimisation regime (`PRESET_REGIMES`)
    "paper": PAPER_BASE
    | {m: (m, {}, {}) for m in ("gspo", "sapo", "cispo", "topr")}
    | {"topr-tokenmean": NAMED["topr-tokenmean"]}
    | CORRECTIONS_2025,
    # issue 43: the staleness table where the methods' updates differ (`PRESET_REGIMES`, `GATES`); GRPO also with
    # the scripts' dual clip 10; issue 54's corrections of 2026 at their sources' defaults (design corrections-2026)
    "paper-long": PAPER_BASE
    | {"grpo-dual10": ("grpo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 10.0}, {})}
    | {m: (m, {}, {}) for m in ("gspo", "sapo", "cispo")}
    | {"topr-tokenmean": NAMED["topr-tokenmean"]}
    | CORRECTIONS_2025
    | {"dppo-tv": ("dppo_tv", {}, {}), "luspo": ("luspo", {}, {}), "vespo-kltau": NAMED["vespo-kltau"]},
}
PAPER_TABLE = ("vespo", "grpo", "gspo", "sapo", "cispo", "topr", "topr-tokenmean")
"""The paper preset's variants that are the paper's staleness table (its others go beyond the paper: issue 40)."""
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
            # (which needs 31-58 seeds): `vespo reproduce paper-long`'s plan says so before any cell runs
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
verdict uses the cells that pass (`vespo.experiments.reproduce.verdicts`)."""


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

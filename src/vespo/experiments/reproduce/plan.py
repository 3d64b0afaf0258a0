"""A slice of the long table planned before any cell runs: its comparisons (each a signed sum of cells, paired over
seeds), their Holm families, the seeds power asks for, the estimated time, and plan.md's format (one section per
slice, `PLAN_HEAD` first)."""

from __future__ import annotations

import math
import re

import numpy as np

from vespo.experiments.presets import PRESETS
from vespo.experiments.reproduce.paper import PAPER, PAPER_N, RULES
from vespo.experiments.stats import minimal_detectable_difference, seeds_for
from vespo.experiments.sweep import SweepConfig, optimizer_steps, resolve, variants

PRESET = "paper-long"
ALPHA = 0.05
TARGET = 0.03
"""The difference (held-out accuracy) a slice's plan asks every family to detect with 80% power."""
PRIMARY = "best_eval_acc"
"""The primary checkpoint rule (the paper's: best checkpoint); the final checkpoint's verdicts are secondary."""
ASSUMED_SD = {"at one N": 0.044, "degradation": 0.060}
"""Per-seed SD of the paired differences a slice's family assumes: measured on the table's first slice (VESPO and
GRPO at N = 4 and 64, 5 seeds, best checkpoint): between methods at one N 0.040-0.044, of the change from N = 4 to 64
minus VESPO's 0.060. The report recomputes every MDD from the SD it measures."""
LATER = ("m2po", "opsm", "aipo", "vcpo")
"""The 2025-26 off-policy corrections of issue 40: the paper has no number for them, so their comparisons form
families of their own and leave the Holm correction of the paper's claims as it was."""
LATER_TAG = " · 2025-26 corrections"
PAPER_NAME = {"grpo": "grpo", "grpo-dual10": "grpo", "gspo": "gspo", "sapo": "sapo"}
"""Our variant -> the paper's row it is compared with (the paper's GRPO: DAPO bounds; its scripts' dual clip is 10)."""
COST = {"start_s": 20.0, "gen_s_per_seq": 0.0045, "update_s_per_step": 0.46, "eval_s_per_seq": 0.006, "probe_s": 1.0}
"""Seconds per phase of a paper-long cell on one core of this 2-core box (`estimate_seconds`), from the VESPO and GRPO
cells of benchmarks/results/paper_long/ (N = 4 and 64, two cells in parallel at load 2-3, with the preallocated KV
cache: an N = 64 cell ~450 s, an N = 4 cell ~100 s): process start and imports, one generated training response
(128 tokens), one optimizer step (mu scoring, forward, backward, diagnostics, AdamW), one held-out response, one
gradient probe."""
COST_NOTE = "per-phase costs of the committed cells on this box at load 2-3, two cells in parallel"
PLAN_HEAD = "# paper-long: the design"
"""How every section of plan.md (one per slice) begins: the merge and the report split plan.md on it."""
UNPLANNED = " · in no plan"
"""Suffix of the families of comparisons the table's cells allow but no slice planned (tested after the fact: their
own Holm families, exploratory, so the planned families keep the m their plans gave them)."""


def md(text: object) -> str:
    """`text` safe inside a markdown table cell: a `|` cannot open a column, a newline cannot start a row, HTML cannot
    open a tag."""
    s = re.sub(r"[\r\n\x0b\x0c\x85\u2028\u2029]+", " ", str(text))
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def csv_safe(value: object) -> object:
    """`value` safe in a CSV a spreadsheet opens: text that a spreadsheet would read as a formula (`=`, `+`, `-`, `@`,
    a tab or a carriage return first) gets a leading `'`; numbers stay numbers."""
    if not isinstance(value, str) or not value or value[0] not in "=+-@\t\r":
        return value
    try:
        float(value)
        return value  # "-0.05": a number, not a formula
    except ValueError:
        return "'" + value


def family_of(kind: str, other: str) -> str:
    """The Holm family of a table comparison of `kind` ("at one N" or "degradation") against `other`."""
    return kind + (LATER_TAG if other in LATER else "")


def assumed_sd(family: str) -> float:
    """The per-seed SD a table family assumes: its kind's (`ASSUMED_SD`)."""
    return ASSUMED_SD[family.removesuffix(LATER_TAG)]


def degradation(staleness: tuple[int, ...]) -> tuple[int, int] | None:
    """(N from, N to) of the degradation comparisons: 4 -> 64 when both run, else the smallest -> the largest N
    (`--smoke`), None with a single N."""
    if 4 in staleness and 64 in staleness:
        return 4, 64
    return (min(staleness), max(staleness)) if len(staleness) > 1 else None


def _paper_gap(variant: str, n: int) -> float | None:
    paper = PAPER.get(PAPER_NAME.get(variant, variant))
    return None if paper is None or n not in PAPER_N else paper[PAPER_N.index(n)]


def at_n(other: str, n: int, family: str) -> dict:
    """`other` vs VESPO at N = n: per seed other - VESPO, with the paper's gap (points) where it has both numbers."""
    row = {"family": family, "other": other, "column": n, "name": f"{other} vs VESPO at N={n}",
           "terms": [[1, other, n], [-1, "vespo", n]], "labels": ["favours VESPO", f"favours {other}"]}  # fmt: skip
    mine, theirs = _paper_gap(other, n), _paper_gap("vespo", n)
    if mine is not None and theirs is not None:
        row |= _paper(mine - theirs)
    return row


def change_minus_vespo(other: str, a: int, b: int, family: str) -> dict:
    """`other`'s change from N = a to b minus VESPO's: per seed (other_b - other_a) - (vespo_b - vespo_a)."""
    row = {"family": family, "other": other, "column": f"{a}→{b}",
           "name": f"{other}'s change from N={a} to {b} minus VESPO's",
           "terms": [[1, other, b], [-1, other, a], [-1, "vespo", b], [1, "vespo", a]],
           "labels": ["favours VESPO", f"favours {other}"]}  # fmt: skip
    gaps = [_paper_gap(v, n) for v in (other, "vespo") for n in (a, b)]
    if None not in gaps:
        row |= _paper((gaps[1] - gaps[0]) - (gaps[3] - gaps[2]))
    return row


def own_change(variant: str, a: int, b: int, family: str) -> dict:
    """`variant`'s own change from N = a to b: per seed variant_b - variant_a (the paper's "degradation")."""
    row = {"family": family, "other": variant, "column": f"{a}→{b}", "name": f"{variant}'s change from N={a} to {b}",
           "terms": [[1, variant, b], [-1, variant, a]],
           "labels": [f"falls from N={a} to {b}", f"rises from N={a} to {b}"]}  # fmt: skip
    gaps = [_paper_gap(variant, n) for n in (a, b)]
    if None not in gaps:
        row |= _paper(gaps[1] - gaps[0])
    return row


def comparisons(variants: list[str], staleness: tuple[int, ...]) -> list[dict]:
    """The comparisons a slice of the table plans: each baseline against VESPO at each N (family "at one N"), and
    each baseline's change from N = 4 to 64 against VESPO's (family "degradation"), the 2025-26 corrections
    (`LATER`) in families of their own; with the paper's difference (baseline - VESPO, points) and its sign where the
    paper reports both numbers."""
    out = []
    drop = degradation(staleness)
    for other in [v for v in variants if v != "vespo"]:
        out += [at_n(other, n, family_of("at one N", other)) for n in staleness]
        if drop is not None:
            out.append(change_minus_vespo(other, *drop, family_of("degradation", other)))
    return out


def _paper(gap: float) -> dict:
    return {"paper_diff_pct": round(gap, 1), "sign": int(np.sign(gap))}


def families(found: list[dict]) -> dict[str, int]:
    """Family -> its size m (Holm's correction runs over each family, per checkpoint rule)."""
    out: dict[str, int] = {}
    for c in found:
        out[c["family"]] = out.get(c["family"], 0) + 1
    return out


def comparison_cells(c: dict) -> list[tuple[str, int]]:
    """The (variant, N) cells a comparison reads."""
    return list(dict.fromkeys((v, int(n)) for _, v, n in c["terms"]))


def choose_seeds(variants: list[str], staleness: tuple[int, ...], target: float = TARGET) -> int | None:
    """The fewest seeds at which every family of a slice detects `target` with 80% power (paired t at Holm's
    first-step level, the assumed SD); None when no number up to 200 does."""
    needed = [
        seeds_for(target, assumed_sd(f), ALPHA / m) for f, m in families(comparisons(variants, staleness)).items()
    ]
    return None if None in needed else max(needed, default=2)


def plan_rows(variants: list[str], staleness: tuple[int, ...], seeds: int) -> list[dict]:
    """Per family of a slice: the assumed SD, seeds, m, Holm's first-step level and the MDD at 80% power."""
    rows = []
    for family, m in families(comparisons(variants, staleness)).items():
        sd = assumed_sd(family)
        mdd = minimal_detectable_difference(sd, seeds, ALPHA / m)
        rows.append({"family": family, "comparisons": m, "assumed_sd": sd, "seeds": seeds, "level": ALPHA / m,
                     "mdd": mdd, "detects_target": bool(mdd <= TARGET)})  # fmt: skip
    return rows


def estimate_seconds(cfg: SweepConfig) -> float:
    """Estimated wall seconds of the sweep's cells on `cfg.jobs` cores (`COST`; cells already finished count too)."""
    cfg = resolve(cfg)
    per_seed = sum(cell_seconds(cfg, n) for n in cfg.num_mini_batches)
    return per_seed * len(variants(cfg)) * len(cfg.seeds) * len(cfg.lr) * len(cfg.task) / cfg.jobs


def cell_seconds(cfg: SweepConfig, n: int) -> float:
    """Estimated seconds of one cell at N = n on one core (`COST`)."""

    cfg = resolve(cfg)
    steps = optimizer_steps(cfg, n)
    rollout_steps = steps // n
    seqs = steps * cfg.ppo_mini_batch_size * cfg.rollout_n  # every sequence is generated once
    evals = (1 + min(cfg.eval_points, rollout_steps)) * cfg.eval_size * cfg.eval_n
    return (COST["start_s"] + seqs * COST["gen_s_per_seq"] + steps * COST["update_s_per_step"]
            + evals * COST["eval_s_per_seq"] + cfg.probes * COST["probe_s"])  # fmt: skip


def plan_text(cfg: SweepConfig) -> str:
    """A slice's plan.md section: its comparisons, families, seeds, MDDs and estimated time."""
    cfg = resolve(cfg)
    variants = list(cfg.variants or PRESETS[PRESET])
    found = comparisons(variants, cfg.num_mini_batches)
    rows = plan_rows(variants, cfg.num_mini_batches, len(cfg.seeds))
    hours = estimate_seconds(cfg) / 3600
    lines = [
        f"{PLAN_HEAD} of one slice",
        "",
        f"Variants {', '.join(variants)}; N = {', '.join(map(str, cfg.num_mini_batches))}; seeds {list(cfg.seeds)}; "
        f"{len(variants) * len(cfg.num_mini_batches) * len(cfg.seeds)} cells. Estimated wall time on {cfg.jobs} cores: "
        f"{hours:.1f} h ({COST_NOTE}).",
        "",
        f"Comparisons ({len(found)} per checkpoint rule, both rules: {', '.join(RULES.values())}): "
        + "; ".join(c["name"] for c in found)
        + ".",
        "",
        "| family | comparisons m (this slice) | assumed per-seed SD | seeds | Holm first-step level | MDD at 80% "
        f"power (fraction) | detects {TARGET} |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {md(r['family'])} | {r['comparisons']} | {r['assumed_sd']:.3f} | {r['seeds']} | "
                     f"{r['level']:.2g} | {r['mdd']:.3f} | {'yes' if r['detects_target'] else 'no'} |")  # fmt: skip
    need = choose_seeds(variants, cfg.num_mini_batches)
    lines += ["", f"Seeds needed to detect {TARGET} in every family: {need if need else 'more than 200'} (paired t, "
              "exact noncentral t; SD assumed as `ASSUMED_SD` says). This section is git's to date: a family whose "
              "plan is committed with or after its results is exploratory."]  # fmt: skip
    return "\n".join(lines) + "\n"


def section_names(section: str) -> list[str]:
    """The comparisons a plan.md section names (its "Comparisons (...): a; b; c." line)."""
    m = re.search(r"^Comparisons \(.*?\): (.*)\.$", section, re.M)
    return m.group(1).split("; ") if m else []


def cell_values(rows: list[dict], metric: str) -> dict[tuple[str, int], dict[int, float]]:
    """`metric` of every cell of results.csv rows: (variant, N) -> {seed: value}, finite values only."""
    out: dict[tuple[str, int], dict[int, float]] = {}
    for r in rows:
        x = float(r[metric]) if r.get(metric) not in (None, "") else math.nan
        if math.isfinite(x):
            out.setdefault((r["variant"], int(r["N"])), {})[int(r["seed"])] = x
    return out

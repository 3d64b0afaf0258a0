"""Where VESPO and GRPO actually differ: the paper's staleness table on 128-token responses, with designs git can date.

One command: `python benchmarks/bench_paper_long.py [--seeds ...] [--jobs 2] [--variants ...] [--num-mini-batches ...]`
runs `vespo sweep --preset paper-long` (docs/guides/paper.md, "The long-response regime": the 41-step chain task,
128-token responses, the paper's AdamW settings, N in {4, 16, 64, 128}) into benchmarks/results/paper_long/
(resumable: the same command finishes it; per-cell runs under cells/ are not committed). Before any cell runs it
prints, and writes to plan.md, the slice's design: its comparisons (VESPO against each baseline at each N, and each
baseline's change from N = 4 to 64 against VESPO's, under both checkpoint rules; the 2025-26 corrections, `LATER`, in
families of their own), per family the assumed per-seed SD of the paired differences, the seeds, the family size m and
the minimal detectable difference (MDD) at 80% power at Holm's first-step level 0.05 / m, and the estimated wall time.

Designs (issue 53): `--design NAME --plan-only` writes plans/NAME.md once (`DESIGNS`; a new design gets a new name,
an existing plan file is never rewritten); commit that file alone; `--design NAME` then runs its cells (refused while
the plan is not committed) into designs/NAME/ (one sweep per warm start: `sft<seed>/`) and its summaries into
designs/NAME/results.csv. The report reads every design's comparisons from the plan file as git holds it at the commit
that added it, never from this code.

The report (after the cells, or `--report-only`) writes results.md / results.csv (the sweep's), verdicts.png and
verdicts.md / verdicts.json / verdicts.csv: every planned comparison (a planned one whose cells never ran stays in
its family at p = 1) with our difference (a fraction of held-out accuracy; the paper's in points), its paired t over
the seeds whose cells pass the regime gate (`vespo.experiments.sweep.GATES["paper-long"]`), the Holm-adjusted p over
its family, the verdict (which side it favours and whether that is the paper's sign; unresolved with its MDD), the gate
values and the gradient probe's cosines with the split-half ceiling beside them. It reads git (`registration`): per
family, the commit of its plan and the first commit holding its results; a family whose plan does not strictly
precede its results is exploratory (shown, never bolded), and exploratory and confirmatory results are separate
tables.

A table built in slices: `--report-only --add-results DIR...` adds the slices' cells and plans to out-dir's
results.csv / results.md / plan.md (a cell in two slices must agree; a slice of another task or preset, or a variant
the preset does not name, is refused before anything is written). A slice run into an out-dir whose table holds other
cells goes to out-dir/slices/<design> instead (`run_dir`).

`--smoke --out-dir DIR`: VESPO and GRPO on the 3-step chain at N = 2 and 4, one seed, a 2-step warm start in DIR (CI).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import hashlib
import importlib.util
import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from vespo.argv import warn_renamed
from vespo.experiments.compare import load_rows
from vespo.experiments.stats import (
    TEST_NAMES,
    fisher_exact,
    holm,
    mean_ci,
    minimal_detectable_difference,
    paired_t,
    seeds_for,
)
from vespo.experiments.sweep import GATES, PRESETS, SweepConfig, gate, preset_config, resolve, sweep, write_tables
from vespo.outputs import read_regular, write_atomic

_spec = importlib.util.spec_from_file_location(
    "bench_paper_staleness", Path(__file__).with_name("bench_paper_staleness.py")
)
short = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(short)  # the paper's numbers, one copy

OUT = Path("benchmarks/results/paper_long")
PRESET = "paper-long"
ALPHA = 0.05
TARGET = 0.03
"""The difference (held-out accuracy) a slice's plan asks every family to detect with 80% power."""
RULES = short.RULES
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
SMOKE = {"num_mini_batches": (2, 4), "seeds": (0,), "variants": ("vespo", "grpo"), "num_operands": 3, "eval_size": 10,
         "eval_n": 1, "eval_points": 1, "optimizer_steps": 4, "min_rollout_steps": 1, "ppo_mini_batch_size": 2,
         "rollout_n": 2, "probes": 1}  # fmt: skip
"""`--smoke`: SweepConfig fields of a tiny grid (the paper-long regime otherwise)."""
PLAN_HEAD = "# paper-long: the design"
"""How every section of plan.md (one per slice) begins: the merge and the report split plan.md on it."""
PLAN_CAP = 1 << 20
"""The most bytes a plan file may hold (a reader never loads more)."""
STRING_COLUMNS = ("task", "variant", "method", "loss_agg_mode", "gate", "collapsed")
"""results.csv columns that hold text; every other column of a slice must hold a number (or be empty)."""


# ---------------------------------------------------------------------------------------------------------------------
# Names written into markdown and CSV


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


# ---------------------------------------------------------------------------------------------------------------------
# Comparisons: each a signed sum of cells, paired over seeds


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
    paper = short.PAPER.get(PAPER_NAME.get(variant, variant))
    return None if paper is None or n not in short.PAPER_N else paper[short.PAPER_N.index(n)]


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
    from vespo.experiments.sweep import variants

    cfg = resolve(cfg)
    per_seed = sum(cell_seconds(cfg, n) for n in cfg.num_mini_batches)
    return per_seed * len(variants(cfg)) * len(cfg.seeds) * len(cfg.lr) * len(cfg.task) / cfg.jobs


def cell_seconds(cfg: SweepConfig, n: int) -> float:
    """Estimated seconds of one cell at N = n on one core (`COST`)."""
    from vespo.experiments.sweep import optimizer_steps

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


# ---------------------------------------------------------------------------------------------------------------------
# Designs: plan files written once, read back from git


PLANS = "plans"
DESIGN_DIR = "designs"
DESIGN_FENCE = "```json design"
"""The fenced block of a plan file that holds its design as JSON (what the report and the runner read)."""


def _measured_sd(rows: list[dict], terms_of, ns, metrics=tuple(RULES)) -> dict[str, float]:
    """SD over seeds of the paired differences `terms_of(n)` (a comparison's terms) in `rows`, per N and metric."""
    out = {}
    values = {m: _values(rows, m) for m in metrics}
    for metric in metrics:
        for n in ns:
            terms = terms_of(n)
            seeds = set.intersection(*(set(values[metric].get((v, k), {})) for _, v, k in terms))
            d = [sum(sign * values[metric][(v, k)][s] for sign, v, k in terms) for s in sorted(seeds)]
            if len(d) >= 2:
                out[f"{metric} N={n}"] = float(np.std(d, ddof=1))
    return out


def _seed_plan(warm_starts: tuple[int, ...], first: int, count: int) -> list[dict]:
    """`count` fresh seeds from `first` up, split evenly over the warm starts (consecutive blocks)."""
    per = math.ceil(count / len(warm_starts))
    return [{"sft_seed": k, "seeds": list(range(first + i * per, first + (i + 1) * per))}
            for i, k in enumerate(warm_starts)]  # fmt: skip


def _design(name: str, question: str, variants: list[str], ns: list[int], warm: list[dict], found: list[dict],
            sd: dict[str, float], sd_source: str, sweep_fields: dict, why: str) -> dict:  # fmt: skip
    """A design's JSON: what runs, what is compared, and each family's power at the SD it assumes."""
    seeds = sum(len(w["seeds"]) for w in warm)
    fams = []
    for family, m in families(found).items():
        mdd = minimal_detectable_difference(sd[family], seeds, ALPHA / m)
        fams.append({"family": family, "m": m, "assumed_sd": round(sd[family], 4), "seeds": seeds,
                     "level": ALPHA / m, "mdd": round(mdd, 4)})  # fmt: skip
    cfg = preset_config(PRESET, out_dir="/tmp/unused", jobs=1, variants=tuple(variants), num_mini_batches=tuple(ns),
                        seeds=tuple(range(seeds)), **sweep_fields)  # fmt: skip
    cost = {str(n): round(cell_seconds(cfg, n)) for n in ns}
    return {"design": name, "question": question, "preset": PRESET, "variants": variants, "num_mini_batches": ns,
            "warm_starts": warm, "sweep": sweep_fields, "comparisons": found, "families": fams,
            "primary_rule": PRIMARY, "alpha": ALPHA, "sd_source": sd_source, "why": why,
            "cost_s_per_cell": cost, "cells": len(variants) * len(ns) * seeds}  # fmt: skip


def design_confirm_n64(table: list[dict]) -> dict:
    """Issue 53 item 2: VESPO vs GRPO (dual clip 3) at N = 64 on fresh seeds (100 up) from two warm starts, seeds
    from the power calculation for an MDD <= 0.05 at the measured SD of the paired differences (the larger of the two
    checkpoint rules), one comparison per checkpoint rule, best checkpoint primary."""
    target, warm = 0.05, (0, 100)
    sds = _measured_sd(table, lambda n: [[1, "grpo", n], [-1, "vespo", n]], [64])
    sd = max(sds.values())
    need = seeds_for(target, sd, ALPHA)
    need = math.ceil(need / len(warm)) * len(warm)
    found = [at_n("grpo", 64, "confirm-n64: VESPO vs GRPO at N=64")]
    why = (f"seeds: the fewest at which the paired t at alpha = {ALPHA} (one comparison per checkpoint rule) detects "
           f"{target} with 80% power at the measured SD {sd:.4f} ({need} after rounding up to an equal number per "
           f"warm start); warm starts: SFT seeds {list(warm)}, built independently (the table's and a fresh one); "
           "RL seeds 100 up, never used before; both warm starts are the preset's (4,000 SFT steps at lr 1e-3). The "
           "test is the paired t over all pairs whose cells pass the regime gate (a seed whose cell misses it is "
           "dropped from both sides and reported), each warm start's mean difference beside it; whatever it shows "
           "is reported.")  # fmt: skip
    return _design("confirm-n64", "Is VESPO's held-out accuracy above GRPO's (dual clip 3) at N = 64 on seeds it was "
                   "not chosen on?", ["vespo", "grpo"], [64], _seed_plan(warm, 100, need), found,
                   {found[0]["family"]: sd}, "results.csv at the plan's parent commit, grpo - vespo at N = 64: "
                   + ", ".join(f"{k} {v:.4f}" for k, v in sds.items()), {}, why)  # fmt: skip


EQUAL_STEPS = 512
"""Optimizer updates of every cell of the equal-steps design: the preset's count at N = 64 (8 rollout steps x 64), so
N = 64 keeps the table's cell length while N = 4 and 16 get 8x and 4x the updates they had; a multiple of 4, 16 and
64. The paper's 1,500 would take ~3x longer (~21 min a cell on one core, ~5 h for 30 cells on 2 cores)."""


def design_equal_steps(table: list[dict]) -> dict:
    """Issue 53 item 3: VESPO and GRPO at N = 4, 16, 64 with `EQUAL_STEPS` optimizer updates in every cell, 5 fresh
    seeds (200 up) on the table's warm start: each method's own change from N = 4 to 64 (the paper's degradation)
    and GRPO's minus VESPO's, and GRPO vs VESPO at each N."""
    ns = [4, 16, 64]
    at = "equal steps: GRPO vs VESPO at one N"
    drop = "equal steps: change from N=4 to 64"
    found = [at_n("grpo", n, at) for n in ns]
    found += [own_change("vespo", 4, 64, drop), own_change("grpo", 4, 64, drop),
              change_minus_vespo("grpo", 4, 64, drop)]  # fmt: skip
    sd_at = _measured_sd(table, lambda n: [[1, "grpo", n], [-1, "vespo", n]], ns)
    sd_drop = {f"grpo's change minus VESPO's, {k}": v for k, v in _measured_sd(
        table, lambda n: change_minus_vespo("grpo", 4, n, drop)["terms"], [64]).items()}  # fmt: skip
    for v in ("vespo", "grpo"):
        sd_drop |= {f"{v}'s change, {k}": x for k, x in _measured_sd(
            table, lambda n, v=v: own_change(v, 4, n, drop)["terms"], [64]).items()}  # fmt: skip
    sd_at = {f"grpo - vespo, {k}": v for k, v in sd_at.items()}
    sd = {at: max(sd_at.values()), drop: max(sd_drop.values())}
    why = (f"{EQUAL_STEPS} optimizer updates per cell at every N: the paper runs the same number of gradient steps "
           "(1,500) at every N, the preset 64 / 128 / 512 at N = 4 / 16 / 64, so its N axis is also a training-length "
           f"axis. {EQUAL_STEPS} is the preset's count at N = 64 (8 rollout steps of 64 mini-batches), so N = 64 "
           "keeps the table's cell length and N = 4 and 16 get 8x and 4x the updates they had (128 and 32 rollout "
           "steps); it is a multiple of 4, 16 and 64, and every cell generates the same 32,768 responses. The paper's "
           "1,500 would take ~3x longer (~21 min a cell on one core, ~5 h for the 30 cells on 2 cores). 5 seeds "
           "(200-204, fresh) on the table's warm start (SFT seed 0); at the measured SDs they detect only the MDDs "
           "of the table above: a smaller degradation is not seen, and the plan says so before it runs.")  # fmt: skip
    return _design("equal-steps", "Does accuracy fall from N = 4 to 64 when every cell takes the same optimizer "
                   "updates, and by more for GRPO than for VESPO?", ["vespo", "grpo"], ns, _seed_plan((0,), 200, 5),
                   found, sd, "results.csv at the plan's parent commit (preset cells, unequal steps): " +
                   ", ".join(f"{k} {v:.4f}" for k, v in (sd_at | sd_drop).items()),
                   {"optimizer_steps": EQUAL_STEPS, "min_rollout_steps": 1}, why)  # fmt: skip


CORRECTIONS_2026 = {v: PRESETS[PRESET][v] for v in ("dppo-tv", "luspo", "vespo-kltau")}
"""Issue 54's variants of the preset (variant -> method, hparams, settings), each at its sources' defaults:
DPPO-Binary-TV (`dppo_tv`: veRL 0.9.1's and prime-rl's default form; TV threshold 0.15, IS cap C = 20), LUSPO
(`luspo`: TRL's, GSPO's clip bounds 3e-4 / 4e-4, seq-mean-token-sum), and VESPO with Kimi K2.5's squared log-ratio
penalty (`kl_tau` = 1e-3, prime-rl's name and default)."""


def _resolved(method: str, hparams: dict) -> str:
    """A method's hyperparameters as it resolves them (its defaults under `hparams`), or `hparams` where the method
    is not registered in this checkout."""
    from vespo.losses import available_methods, validate_hparams

    return str(validate_hparams(method, **hparams) if method in available_methods() else hparams or "(defaults)")


def design_corrections_2026(table: list[dict]) -> dict:
    """Issue 54 item 5: DPPO, LUSPO and VESPO with the squared log-ratio penalty against VESPO at N = 4 and 64, 5
    seeds (the table's 0-4 on its warm start, so they pair with the table's 2025-26 corrections), in a Holm family of
    their own (the 2025-26 corrections'; the earlier family of issue 40 is left as its plans made it)."""
    ns = [4, 64]
    family = "at one N · 2025-26 corrections (issue 54)"
    found = [at_n(v, n, family) for v in CORRECTIONS_2026 for n in ns]  # DPPO, LUSPO, VESPO + penalty vs VESPO
    sds = {}
    for v in LATER:
        sds |= {f"{v} {k}": x for k, x in _measured_sd(table, lambda n, v=v: [[1, v, n], [-1, "vespo", n]],
                                                       ns).items()}  # fmt: skip
    sd = float(np.median(list(sds.values()))) if sds else ASSUMED_SD["at one N"]
    why = ("5 seeds (0-4) on the table's warm start (SFT seed 0), VESPO run again beside them under the same code; "
           "the variants at their sources' defaults: " + "; ".join(f"{v} = {m} {_resolved(m, h)}" for v, (m, h, _)
                                                                   in CORRECTIONS_2026.items()) +
           ". One Holm family of their 6 comparisons (the 2025-26 corrections' own, as issue 40's were; issue 40's "
           "family stays as its plans made it, so no earlier family grows after its results). Assumed SD: the median "
           "over the table's 2025-26 corrections of the SD of their paired differences with VESPO (their runaways "
           "make the largest uninformative). N = 4 runs first (cheap), N = 64 after.")  # fmt: skip
    d = _design("corrections-2026", "Does DPPO, LUSPO or VESPO with the squared log-ratio penalty differ from VESPO "
                "at N = 4 or 64?", ["vespo", *CORRECTIONS_2026], ns, _seed_plan((0,), 0, 5), found,
                {family: sd}, "results.csv at the plan's parent commit: " +
                ", ".join(f"{k} {v:.4f}" for k, v in sds.items()), {}, why)  # fmt: skip
    return d | {"variant_defs": {v: [m, h, s] for v, (m, h, s) in CORRECTIONS_2026.items()}}


DESIGNS = {"confirm-n64": design_confirm_n64, "equal-steps": design_equal_steps,
           "corrections-2026": design_corrections_2026}  # fmt: skip
"""Design name -> its builder (from the committed table's results.csv, for the SDs it assumes)."""


def design_text(d: dict) -> str:
    """A plan file: the design in words and tables, and the JSON block the runner and the report read."""
    lines = [f"# paper-long design `{d['design']}`: written once, committed alone before any of its cells runs", "",
             d["question"], "",
             f"Variants {', '.join(d['variants'])}; N = {', '.join(map(str, d['num_mini_batches']))}; "
             + "; ".join(f"SFT seed {w['sft_seed']}: RL seeds {w['seeds'][0]}-{w['seeds'][-1]}" for w in
                         d["warm_starts"])
             + f"; {d['cells']} cells"
             + (f"; sweep settings {d['sweep']}" if d["sweep"] else "") + ".", "",
             f"Primary rule: {RULES[d['primary_rule']]}; the final checkpoint's verdicts are secondary. Test: "
             f"{TEST_NAMES['paired_t']}, on the seeds whose cells pass the regime gate, Holm over each family per rule "
             f"(alpha = {d['alpha']}); differences are fractions of held-out accuracy (0-1), the paper's in points.",
             "", "Comparisons: " + "; ".join(c["name"] for c in d["comparisons"]) + ".", "",
             "| family | m | assumed per-seed SD (fraction) | seeds | Holm first-step level | MDD at 80% power |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for f in d["families"]:
        lines.append(f"| {md(f['family'])} | {f['m']} | {f['assumed_sd']:.4f} | {f['seeds']} | {f['level']:.3g} | "
                     f"{f['mdd']:.4f} |")  # fmt: skip
    cost = ", ".join(f"N = {n}: {s / 60:.0f} min" for n, s in d["cost_s_per_cell"].items())
    lines += ["", f"Why: {d['why']}", "", f"SD source: {d['sd_source']}.", "",
              f"Estimated time per cell on one core ({COST_NOTE}): {cost}.", "", DESIGN_FENCE,
              json.dumps(d, indent=1, ensure_ascii=True), "```", ""]  # fmt: skip
    return "\n".join(lines)


def parse_design(text: str, source: str) -> dict:
    """The design JSON of a plan file (ValueError naming `source` when it has none)."""
    start = text.find(DESIGN_FENCE)
    end = text.find("\n```", start + len(DESIGN_FENCE)) if start >= 0 else -1
    if start < 0 or end < 0:
        raise ValueError(f"{source}: no {DESIGN_FENCE!r} block; a design's plan file is written by --plan-only")
    try:
        d = json.loads(text[start + len(DESIGN_FENCE) : end])
    except ValueError as exc:
        raise ValueError(f"{source}: its design block is not JSON ({exc})") from None
    keys = {"design", "variants", "num_mini_batches", "warm_starts", "comparisons"}
    if not isinstance(d, dict) or not keys <= set(d):
        raise ValueError(f"{source}: its design block lacks design / variants / num_mini_batches / warm_starts / "
                         "comparisons")  # fmt: skip
    return d


def read_text(path: Path) -> str:
    """A plan file's text: a regular file (never through a link), UTF-8, at most `PLAN_CAP` bytes; else one
    ValueError naming it."""
    try:
        return read_regular(path, cap=PLAN_CAP).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        why = "a symbolic link" if path.is_symlink() else exc.strerror or str(exc)
        raise ValueError(f"{path}: cannot read ({why}); a plan must be a regular file") from None


def write_plan(out: Path, name: str) -> Path:
    """Write plans/<name>.md once, from `DESIGNS[name]` and the table's results.csv: an existing plan file is never
    rewritten (a new design gets a new name)."""
    path = out / PLANS / f"{name}.md"
    if path.exists() or path.is_symlink():
        raise ValueError(f"{path} exists: a plan is written once; a new design gets a name of its own")
    text = design_text(DESIGNS[name](load_rows(out / "results.csv", PRIMARY)))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    return path


# ---------------------------------------------------------------------------------------------------------------------
# Registration: what git says about when a plan and its results were committed


def _git(root: Path, *args: str) -> str | None:
    """stdout of `git -C root args`, None when git fails (no repository, unknown path)."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.decode("utf-8", "replace") if done.returncode == 0 else None


def git_root(path: Path) -> Path | None:
    top = _git(path if path.is_dir() else path.parent, "rev-parse", "--show-toplevel")
    return Path(top.strip()) if top else None


def history(root: Path, rel: str) -> list[str]:
    """Commits that changed `rel`, oldest first (following no renames)."""
    text = _git(root, "log", "--reverse", "--format=%H", "--", rel)
    return text.split() if text else []


def show(root: Path, commit: str, rel: str) -> str | None:
    return _git(root, "show", f"{commit}:{rel}")


def classify(plan_commit: str | None, results_commit: str | None, precedes: bool) -> tuple[str, str]:
    """The registration rule: confirmatory only when the plan's commit strictly precedes the first commit holding the
    family's results (or the results are not committed yet); a plan committed with or after its results, or not at
    all, makes the family exploratory."""
    if plan_commit is None:
        return "exploratory", "no commit holds its plan"
    if results_commit is None:
        return "confirmatory", f"plan {plan_commit[:7]}; results not committed yet"
    if plan_commit == results_commit:
        return "exploratory", f"plan added in the same commit as its results ({plan_commit[:7]})"
    if not precedes:
        return "exploratory", f"plan {plan_commit[:7]} does not precede its results {results_commit[:7]}"
    return "confirmatory", f"plan {plan_commit[:7]} precedes its results {results_commit[:7]}"


def _precedes(root: Path, a: str, b: str) -> bool:
    return a != b and _git(root, "merge-base", "--is-ancestor", a, b) is not None


def _cells_in(text: str | None) -> set[tuple[str, int]]:
    if not text:
        return set()
    try:
        return {(r["variant"], int(r["N"])) for r in csv.DictReader(io.StringIO(text))}
    except (KeyError, ValueError, TypeError):
        return set()


def _first_results(root: Path, rel: str, members: list[dict]) -> str | None:
    """The first commit whose `rel` holds every cell of some member comparison."""
    for commit in history(root, rel):
        cells = _cells_in(show(root, commit, rel))
        if any(set(comparison_cells(c)) <= cells for c in members):
            return commit
    return None


def registration(out: Path, fams: dict[str, list[dict]], results_rel: str, plan_commit_of) -> dict:
    """Per family: its plan's commit (`plan_commit_of(root, members)`), the first commit of `results_rel` holding its
    results, and its class (`classify`). Outside git every family is exploratory."""
    root = git_root(out)
    out_rel = None if root is None else Path(out).resolve().relative_to(root.resolve()).as_posix()
    reg = {}
    for family, members in fams.items():
        if root is None:
            reg[family] = {"plan_commit": None, "results_commit": None, "class": "exploratory",
                           "why": "not in a git repository"}  # fmt: skip
            continue
        plan = plan_commit_of(root, out_rel, members)
        results = _first_results(root, f"{out_rel}/{results_rel}", members)
        cls, why = classify(plan, results, results is not None and plan is not None and _precedes(root, plan, results))
        reg[family] = {"plan_commit": plan, "results_commit": results, "class": cls, "why": why}
    return reg


def _table_plan_commit(root: Path, out_rel: str, members: list[dict]) -> str | None:
    """The commit by which plan.md named every member of a table family (the last member's first appearance); None
    when one never appears."""
    commits = history(root, f"{out_rel}/plan.md")
    first = {}
    for i, commit in enumerate(commits):
        text = show(root, commit, f"{out_rel}/plan.md") or ""
        for c in members:
            if c["name"] not in first and _names_in(text, c["name"]):
                first[c["name"]] = i
    if len(first) < len(members):
        return None
    return commits[max(first.values())]


def _names_in(text: str, name: str) -> bool:
    return any(name in _section_names(s) for s in text.split(PLAN_HEAD)[1:])


def _design_plan_commit(name: str):
    def plan_commit(root: Path, out_rel: str, members: list[dict]) -> str | None:
        rel = f"{out_rel}/{PLANS}/{name}.md"
        text = _git(root, "log", "--reverse", "--diff-filter=A", "--format=%H", "--", rel)
        return text.split()[0] if text and text.split() else None

    return plan_commit


# ---------------------------------------------------------------------------------------------------------------------
# The table's plan.md: its slices' sections


def _section_names(section: str) -> list[str]:
    m = re.search(r"^Comparisons \(.*?\): (.*)\.$", section, re.M)
    return m.group(1).split("; ") if m else []


def table_plan(text: str, source: str) -> tuple[list[dict], list[dict]]:
    """(planned comparisons, slices) of plan.md: each section's comparisons as its variants and N define them (a
    comparison planned by several slices once, with every slice's seeds), and per slice its seeds and family sizes."""
    planned: dict[str, dict] = {}
    slices = []
    for i, section in enumerate(text.split(PLAN_HEAD)[1:]):
        m = re.search(r"^Variants (.+?); N = ([\d, ]+); seeds \[([\d, ]*)\]", section, re.M)
        if not m:
            raise ValueError(f"{source}: slice {i + 1} names no variants, N and seeds")
        variants = m.group(1).split(", ")
        ns = tuple(int(x) for x in m.group(2).split(", "))
        seeds = [int(x) for x in m.group(3).split(", ") if x]
        unknown = [v for v in variants if v not in PRESETS[PRESET]]
        if unknown:
            raise ValueError(f"{source}: slice {i + 1} names variants the preset does not: {unknown}")
        by = {c["name"]: c for c in comparisons(variants, ns)}
        names = _section_names(section)
        missing = [n for n in names if n not in by]
        if missing:
            raise ValueError(f"{source}: slice {i + 1} plans comparisons its variants and N do not define: {missing}")
        for n in names:
            planned.setdefault(n, by[n] | {"slices": [], "seeds_planned": []})
            planned[n]["slices"].append(i + 1)
            planned[n]["seeds_planned"].append(seeds)
        slices.append({"slice": i + 1, "seeds": seeds, "sizes": families([by[n] for n in names])})
    return list(planned.values()), slices


UNPLANNED = " · in no plan"
"""Suffix of the families of comparisons the table's cells allow but no slice planned (tested after the fact: their
own Holm families, exploratory, so the planned families keep the m their plans gave them)."""


def slices_run(found: list[dict], rows: list[dict]) -> list[dict]:
    """The comparisons of `found` whose cells all have rows (a table without plan.md: what ran is what it tests)."""
    present = {(r["variant"], int(r["N"])) for r in rows}
    return [c for c in found if all(cell in present for cell in comparison_cells(c))]


# ---------------------------------------------------------------------------------------------------------------------
# Verdicts


def _gated_seeds(rows: list[dict], cells: list[tuple[str, int]]) -> set | None:
    """Seeds whose cells (variant, N) all pass the regime gate; None when the rows carry no gate (every seed counts)."""
    if not any(r.get("gate") for r in rows):
        return None
    ok = {(r["variant"], int(r["N"]), int(r["seed"])) for r in rows if r.get("gate") == "ok"}
    seeds = {int(r["seed"]) for r in rows}
    return {s for s in seeds if all((v, n, s) in ok for v, n in cells)}


def _values(rows: list[dict], metric: str) -> dict[tuple[str, int], dict[int, float]]:
    out: dict[tuple[str, int], dict[int, float]] = {}
    for r in rows:
        x = float(r[metric]) if r.get(metric) not in (None, "") else math.nan
        if math.isfinite(x):
            out.setdefault((r["variant"], int(r["N"])), {})[int(r["seed"])] = x
    return out


def _mean(rows: list[dict], variant: str, n: int, key: str) -> float | None:
    values = [float(r[key]) for r in rows if r["variant"] == variant and int(r["N"]) == n and r.get(key) not in
              (None, "")]  # fmt: skip
    values = [v for v in values if math.isfinite(v)]
    return float(np.mean(values)) if values else None


PROBE_KEYS = ("probe_cos_grpo", "probe_cos_reinforce", "probe_cos_split_half")
DIAG_KEYS = ("log_w_std_stalest", "clip_frac_stalest", "grad_clipped_frac", *PROBE_KEYS)


def verdicts(rows: list[dict], plan: list[dict]) -> list[dict]:
    """Every planned comparison under each checkpoint rule: our difference (the signed sum of its cells, per seed,
    over the seeds whose cells all pass the gate; a fraction of held-out accuracy), its paired t-test with the 95% CI
    of the mean difference, the p-value Holm-adjusted over its family (a comparison without 2 gated seeds counts as
    p = 1 and stays in its family), the verdict and its MDD (measured SD, Holm's first-step level), the gate values
    and the probe's cosines."""
    sizes = families(plan)
    out = []
    for metric, rule in RULES.items():
        values = _values(rows, metric)
        found = []
        for c in plan:
            cells = comparison_cells(c)
            ran = set.intersection(*(set(values.get(k, {})) for k in cells))
            keep = _gated_seeds(rows, cells)
            seeds = sorted(s for s in ran if keep is None or s in keep)
            d = [sum(sign * values[(v, int(n))][s] for sign, v, n in c["terms"]) for s in seeds]
            row = c | {"rule": rule, "metric": metric, "primary": metric == PRIMARY, "seeds": len(seeds),
                       "seeds_run": len(ran), "tested_seeds": seeds}  # fmt: skip
            warm = {int(r["seed"]): int(r["sft_seed"]) for r in rows if r.get("sft_seed") not in (None, "")}
            if warm:  # a design over several warm starts: each one's mean difference beside the pooled test
                by = {}
                for s, x in zip(seeds, d, strict=True):
                    by.setdefault(warm.get(s), []).append(x)
                row["by_warm_start"] = {str(k): float(np.mean(x)) for k, x in sorted(by.items())}
            if len(seeds) >= 2:
                mean, half = mean_ci(d)
                row |= {"diff": mean, "ci_low": mean - half, "ci_high": mean + half, "p": paired_t(d, [0.0] * len(d)),
                        "sd": float(np.std(d, ddof=1)), "test": "paired_t"}  # fmt: skip
            else:
                row |= {"diff": math.nan, "ci_low": math.nan, "ci_high": math.nan, "p": 1.0, "sd": math.nan,
                        "test": None}  # fmt: skip
            n = max(int(k) for _, _, k in c["terms"])
            row |= _collapses(rows, ("vespo", c["other"]), n, seeds)
            for tag, side in (("vespo", "vespo"), ("other", c["other"])):
                for key in DIAG_KEYS:
                    row[f"{tag}_{key}"] = _mean(rows, side, n, key)
            found.append(row)
        for family, m in sizes.items():
            members = [r for r in found if r["family"] == family]
            for r, q in zip(members, holm([r["p"] for r in members]), strict=True):
                r["p_adjusted"] = q
                r["family_m"] = m
                r["mdd"] = minimal_detectable_difference(r["sd"], r["seeds"], ALPHA / m) if r["test"] else math.nan
                r["verdict"] = _verdict(r)
        out += found
    return out


def _collapses(rows: list[dict], sides: tuple[str, str], n: int, seeds: list[int]) -> dict:
    """Collapsed seeds (results.csv's `collapsed`) of each side at N = n among the tested seeds, and Fisher's exact
    test on the two counts: reported beside the paired t, which stays the planned test."""
    flags = {(r["variant"], int(r["N"]), int(r["seed"])): r.get("collapsed") in ("True", True) for r in rows}
    counts = [sum(flags.get((v, n, s), False) for s in seeds) for v in sides]
    p = fisher_exact(counts[0], len(seeds), counts[1], len(seeds)) if seeds and any(counts) else math.nan
    return {"collapsed_vespo": counts[0], "collapsed_other": counts[1], "fisher_p": p}


def _verdict(r: dict) -> str:
    """Which side a significant difference favours (the comparison's `labels`: negative, positive) and whether the
    paper's difference has its sign ("same sign as paper" says no more than the sign); unresolved otherwise."""
    if r["test"] is None:
        return "not run (p = 1 in its family)" if r["seeds_run"] == 0 else "not tested (fewer than 2 gated seeds)"
    if not (r["p_adjusted"] < ALPHA and r["diff"] != 0):
        return "unresolved"
    text = r["labels"][0] if r["diff"] < 0 else r["labels"][1]
    if "sign" in r:
        text += "; same sign as paper" if np.sign(r["diff"]) == r["sign"] else "; opposite sign to paper"
    return text


def _fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}g}"


def _gate_text(g) -> str:
    where = f"{', '.join(g.methods)} cells" if g.methods else "every cell"
    return f"{g.label} {g.op} {g.bound:g} ({where}{f', N >= {g.min_n}' if g.min_n > 1 else ''})"


def caveats(r: dict, reg: dict) -> str:
    """The post-hoc caveats of one result, written beside it: its family's registration when exploratory, and seeds
    a later slice added to a comparison an earlier slice had planned (after its result was seen)."""
    notes = []
    fam = reg.get(r["family"])
    if r["family"].endswith(UNPLANNED):
        notes.append("no slice planned it: tested after the cells were seen")
    elif fam and fam["class"] == "exploratory":
        notes.append(f"exploratory: {fam['why']}")
    if len(r.get("slices", [])) > 1:
        later = sorted({s for seeds in r["seeds_planned"][1:] for s in seeds})
        notes.append(f"seeds {later} added by slice {', '.join(map(str, r['slices'][1:]))}'s plan, after slice "
                     f"{r['slices'][0]}'s result")  # fmt: skip
    if r["test"] is None and r["seeds_run"] == 0:
        notes.append("planned, never run: counted at p = 1")
    return "; ".join(notes)


HEADER = ("| comparison | paper (points) | rule | our diff (fraction) [95% CI] | gated seeds | adj. p (m) | verdict | "
          "caveat | collapsed (VESPO / other), Fisher p | sd log W (VESPO / other) | tok-clip other | grad-clip "
          "(VESPO / other) | cos·GRPO (VESPO / other) | cos·REINF (VESPO / other) | split-half cos (VESPO / other) "
          "|")  # fmt: skip
"""The verdict tables' columns: differences are fractions of held-out accuracy, the paper's in points (%)."""


def _row_md(r: dict, bold: bool) -> str:
    verdict = md(r["verdict"])
    if r["verdict"] == "unresolved":
        verdict += f"<br>MDD {_fmt(r['mdd'], 2)}"
    elif bold and r["test"] and r["p_adjusted"] < ALPHA:
        verdict = f"**{verdict}**"
    paper = f"{r['paper_diff_pct']:+.1f}" if "paper_diff_pct" in r else "–"
    ci = f" [{_fmt(r['ci_low'], 2)}, {_fmt(r['ci_high'], 2)}]" if math.isfinite(r["ci_low"]) else ""
    if r.get("by_warm_start"):
        ci += "<br>by SFT seed: " + ", ".join(f"{k}: {_fmt(x)}" for k, x in r["by_warm_start"].items())
    rule = md(r["rule"]) + ("" if r["primary"] else " (secondary)")
    same_as_grpo = r["other"] == "grpo"  # GRPO's gradient against itself: 1 by construction, not shown

    def pair(key: str, digits: int = 2) -> str:
        other = "–" if same_as_grpo and key == "probe_cos_grpo" else _fmt(r[f"other_{key}"], digits)
        return f"{_fmt(r[f'vespo_{key}'], digits)} / {other}"

    collapsed = f"{r['collapsed_vespo']} / {r['collapsed_other']}"
    collapsed += f", p = {_fmt(r['fisher_p'], 2)}" if math.isfinite(r["fisher_p"]) else ""
    return (f"| {md(r['name'])} | {paper} | {rule} | {_fmt(r['diff'])}{ci} | {r['seeds']} of {r['seeds_run']} | "
            f"{_fmt(r['p_adjusted'])} ({r['family_m']}) | {verdict} | {md(r.get('caveat', '')) or '–'} | {collapsed} | "
            f"{pair('log_w_std_stalest')} | {_fmt(r['other_clip_frac_stalest'], 2)} | {pair('grad_clipped_frac')} | "
            f"{pair('probe_cos_grpo')} | {pair('probe_cos_reinforce')} | {pair('probe_cos_split_half')} |")  # fmt: skip


def verdicts_markdown(found: list[dict], seeds: list[int], reg: dict | None = None, slices: list[dict] = ()) -> str:
    """verdicts.md: the registration of every family (from git), then the confirmatory and the exploratory results in
    separate tables (only confirmatory verdicts are bolded); `seeds`: the seeds the results hold."""
    reg = reg or {}
    gates = "; ".join(_gate_text(g) for g in GATES[PRESET])
    first = [r for r in found if r["metric"] == PRIMARY]
    sizes = families(first)
    lines = [
        "# paper-long: VESPO against each baseline where their updates differ",
        "",
        f"Our runs: `vespo sweep --preset paper-long` (docs/guides/paper.md), seeds {seeds}; the paper: "
        'Qwen3-30B-A3B, average accuracy (%, points), its Table "staleness" (GRPO and GRPO with the scripts\' dual '
        "clip 10 are both compared with the paper's GRPO row). Our differences are fractions of held-out accuracy "
        f"(0-1). Test: {TEST_NAMES['paired_t']}, on the seeds whose cells pass the regime gate ({gates}); Holm over "
        "each family per checkpoint rule (m beside each adjusted p); a planned comparison without 2 gated seeds "
        "counts as p = 1 and stays in its family. Verdict: the side a significant difference (alpha = "
        f"{ALPHA}, after Holm) favours, and whether the paper's difference has the same sign (the sign only, not its "
        "size); unresolved: not significant, with the MDD (80% power, the measured SD, Holm's first-step level) "
        "under it: a smaller difference cannot be seen. Collapsed: seeds whose held-out accuracy ended below half its "
        "start, Fisher's exact test on the two counts beside the paired t. Split-half cos: the method's gradient on "
        "one half of the probed mini-batch against the other half: the ceiling of the cross-method cosines.",
        "",
        "## Registration (read from git)",
        "",
        "| family | m | planned by slice | plan commit | first commit with its results | class |",
        "|---|---|---|---|---|---|",
    ]
    for family, m in sizes.items():
        g = reg.get(family, {"plan_commit": None, "results_commit": None, "class": "exploratory", "why": "no plan"})
        per = [str(s["sizes"][family]) for s in slices if family in s["sizes"]]
        planned = f"the slices planned {', '.join(per)}" if per else "none" if family.endswith(UNPLANNED) else (
            "its plan file")  # fmt: skip
        lines.append(f"| {md(family)} | {m} | {planned} | {(g['plan_commit'] or '–')[:7]} | "
                     f"{(g['results_commit'] or '–')[:7]} | {g['class']}: {md(g['why'])} |")  # fmt: skip
    for cls in ("confirmatory", "exploratory"):
        chosen = [r for r in found if reg.get(r["family"], {}).get("class", "exploratory") == cls]
        lines += ["", f"## {cls.capitalize()} results" + ("" if cls == "confirmatory" else
                  " (post hoc: shown, never bolded; each row's caveat says why)"), ""]  # fmt: skip
        if not chosen:
            lines.append("None.")
            continue
        lines += [HEADER, "|---" * HEADER.count(" | ") + "|---|"]
        lines += [_row_md(r, cls == "confirmatory") for r in chosen]
    counts: dict[str, dict[str, int]] = {}
    for r in found:
        key = f"{reg.get(r['family'], {}).get('class', 'exploratory')}, {r['rule']}"
        counts.setdefault(key, {}).setdefault(r["verdict"], 0)
        counts[key][r["verdict"]] += 1
    lines += ["", "Summary: " + "; ".join(f"{md(rule)}: " + ", ".join(f"{md(k)} {v}" for k, v in sorted(c.items()))
                                          for rule, c in counts.items()) + "."]  # fmt: skip
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------------
# Slices: a merge that refuses what is not this table's


def config(out: Path, seeds: list[int] | None, jobs: int, variants: list[str], num_mini_batches: list[int],
           smoke: bool, **fields) -> SweepConfig:  # fmt: skip
    fields |= {"variants": tuple(variants), "num_mini_batches": tuple(num_mini_batches)}
    if seeds is not None:
        fields["seeds"] = tuple(seeds)
    extra = {"tensorboard": "False"} | fields.pop("extra", {})
    if smoke:  # a 2-step warm start cached under out, not in the user's cache
        fields |= SMOKE | {"cache_dir": str(out / "cache")}
        extra |= {"sft_steps": "2"}
    return preset_config(PRESET, out_dir=str(out), jobs=jobs, extra=extra, **fields)


def run_dir(out: Path, cfg: SweepConfig) -> Path:
    """Where a run of `cfg` goes: `out` itself when it holds no table, or only cells of this grid (the same command
    finishing it); else `out/slices/<design>`, so that a new design never rewrites a table that holds other cells."""
    from vespo.experiments.sweep import variants

    table = out / "results.csv"
    if not table.is_file():
        return out
    cfg = resolve(cfg)
    names = list(variants(cfg))
    grid = {(v, n, s) for v in names for n in cfg.num_mini_batches for s in cfg.seeds}
    held = {(r["variant"], int(r["N"]), int(r["seed"])) for r in load_rows(table, PRIMARY)}
    if held <= grid:
        return out
    ns, seeds = "-".join(map(str, cfg.num_mini_batches)), "-".join(map(str, cfg.seeds))
    tag = hashlib.sha1(" ".join(names).encode()).hexdigest()[:6]
    return out / "slices" / f"N{ns}_seeds{seeds}_{tag}"


CELL_KEY = ("task", "variant", "N", "seed")


def check_slice(rows: list[dict], source: str, tasks: set[str] | None = None) -> None:
    """A slice's results.csv is this table's: a `task` column, the table's task (`tasks`; the preset's when the table
    has none), variants the preset names with the preset's method and aggregation, integer N and seeds, numbers in
    every numeric column, and a gate that its own values give. ValueError naming the first field that is not."""
    from vespo.losses import default_loss_agg_mode

    preset = PRESETS[PRESET]
    tasks = tasks or set(resolve(SweepConfig(preset=PRESET)).task)
    for i, r in enumerate(rows, start=2):  # line 1 is the header
        where = f"{source} line {i}"
        if None in r or None in r.values():
            raise ValueError(f"{where}: not as many fields as the header has")
        if "task" not in r:
            raise ValueError(f"{source}: no task column; a slice of the {PRESET} table names its task "
                             f"({sorted(tasks)})")  # fmt: skip
        if r["task"] not in tasks:
            raise ValueError(f"{where}: task {r['task']!r} is not this table's ({sorted(tasks)}): another task's slice")
        if r["variant"] not in preset:
            raise ValueError(f"{where}: variant {r['variant']!r} is not one of preset {PRESET}'s: {list(preset)}")
        method, hparams, settings = preset[r["variant"]]
        mode = settings.get("loss_agg_mode") or default_loss_agg_mode(method)
        if r.get("method", method) != method or r.get("loss_agg_mode", mode) != mode:
            raise ValueError(f"{where}: variant {r['variant']!r} ran {r.get('method')!r} with "
                             f"{r.get('loss_agg_mode')!r}; preset {PRESET}'s is {method} with {mode}: another "
                             "preset's slice")  # fmt: skip
        for key in ("N", "seed"):
            if not re.fullmatch(r"\d{1,9}", r.get(key) or ""):
                raise ValueError(f"{where}: {key} must be a non-negative integer, got {r.get(key)!r}")
        for key, value in r.items():
            if key in STRING_COLUMNS or value == "":
                continue
            try:
                float(value)
            except ValueError:
                raise ValueError(f"{where}: column {key!r} must hold a number, got {value!r}") from None
        if r.get("collapsed", "False") not in ("True", "False"):
            raise ValueError(f"{where}: collapsed must be True or False, got {r['collapsed']!r}")
        if "gate" in r:
            summary = {k: (float(v) if v != "" else None) for k, v in r.items() if k not in STRING_COLUMNS}
            want = gate(PRESET, method, int(r["N"]), summary)
            if r["gate"] != want:
                raise ValueError(f"{where}: gate {r['gate']!r} is not what the cell's own values give ({want!r})")


def merge_rows(rows: list[dict], extra: list[dict], source: str) -> list[dict]:
    """`rows` with the cells of `extra` (a slice run in another out-dir, `check_slice`d) added; a cell in both must
    hold the same values (ValueError naming it otherwise)."""
    check_slice(extra, source, {r["task"] for r in rows if "task" in r} or None)
    have = {tuple(r[k] for k in CELL_KEY): r for r in rows}
    out = list(rows)
    for r in extra:
        key = tuple(r[k] for k in CELL_KEY)
        if key not in have:
            out.append(r)
            have[key] = r
        elif any(not _same(have[key].get(k, ""), v) for k, v in r.items() if k != "wall_s"):
            raise ValueError(f"{source}: cell {'/'.join(key)} differs from the one already in results.csv")
    return out


def _same(a: str, b: str) -> bool:
    """Two results.csv fields hold the same value (numbers compared as numbers; an empty field is NaN)."""
    try:
        x, y = (float(v) if v != "" else math.nan for v in (a, b))
    except ValueError:
        return a == b
    return (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)


def _typed(row: dict) -> dict:
    """A results.csv row as the cell summary it was written from (numbers, booleans; an empty field: NaN)."""
    out = {}
    for k, v in row.items():
        if k in ("N", "seed", "rollout_steps", "sft_seed"):
            out[k] = int(v)
        elif v in ("True", "False"):
            out[k] = v == "True"
        else:
            try:
                out[k] = float(v) if v != "" else math.nan
            except ValueError:
                out[k] = v
    return out


def prepare_merge(out: Path, add: list[Path]) -> tuple[list[dict], str]:
    """The merged rows and plan.md of the table and its slices, every input read and checked first (`check_slice`,
    `read_text`, `table_plan`): a ValueError here leaves every file as it was."""
    rows = load_rows(out / "results.csv", PRIMARY)
    check_slice(rows, str(out / "results.csv"), {r["task"] for r in rows if "task" in r} or None)
    texts = [read_text(out / "plan.md")] if (out / "plan.md").exists() or (out / "plan.md").is_symlink() else []
    for d in add:
        extra = load_rows(d / "results.csv", PRIMARY)
        rows = merge_rows(rows, extra, str(d / "results.csv"))
        if not ((d / "plan.md").exists() or (d / "plan.md").is_symlink()):
            raise ValueError(f"{d}: no plan.md; a slice of the {PRESET} table is run by this script, which writes one")
        texts.append(read_text(d / "plan.md"))
        planned = {
            v
            for section in texts[-1].split(PLAN_HEAD)[1:]
            for m in [re.search(r"^Variants (.+?); N = ", section, re.M)]
            if m
            for v in m.group(1).split(", ")
        }
        if not planned:
            raise ValueError(f"{d / 'plan.md'}: no section beginning {PLAN_HEAD!r}: not a slice of the {PRESET} table")
        unplanned = sorted({r["variant"] for r in extra} - planned)
        if unplanned:
            raise ValueError(f"{d}: results.csv holds variants its plan.md does not name: {unplanned}")
    parts = (PLAN_HEAD + part for text in texts for part in text.split(PLAN_HEAD)[1:])
    text = "\n".join(dict.fromkeys(part.strip() + "\n" for part in parts))
    table_plan(text, "the merged plan.md")
    return rows, text


# ---------------------------------------------------------------------------------------------------------------------
# The report


def design_results(out: Path, d: dict) -> list[dict]:
    path = out / DESIGN_DIR / d["design"] / "results.csv"
    return load_rows(path, PRIMARY) if path.is_file() else []


def committed_designs(out: Path) -> list[dict]:
    """The designs of plans/*.md, each as git holds it at the commit that added it (the working tree's when it is not
    committed: then its families are exploratory); `changed` when the file differs from that commit's."""
    found = []
    root = git_root(out)
    for path in sorted((out / PLANS).glob("*.md")) if (out / PLANS).is_dir() else []:
        text = read_text(path)
        d = parse_design(text, str(path))
        d["changed"] = False
        if root is not None:
            rel = path.resolve().relative_to(root.resolve()).as_posix()
            added = _git(root, "log", "--reverse", "--diff-filter=A", "--format=%H", "--", rel)
            if added and added.split():
                committed = show(root, added.split()[0], rel)
                if committed is not None and committed != text:
                    d = parse_design(committed, f"{rel} at {added.split()[0][:7]}") | {"changed": True}
        found.append(d)
    return found


def report(out: Path, cfg: SweepConfig | None = None, rows: list[dict] | None = None) -> list[dict]:
    """verdicts.md / .json / .csv (and verdicts.png) of the table and of every design in plans/."""
    found, reg, slices = [], {}, []
    table = rows if rows is not None else (load_rows(out / "results.csv", PRIMARY)
                                           if (out / "results.csv").exists() else [])  # fmt: skip
    if table:
        variants = list(dict.fromkeys(r["variant"] for r in table))
        ran = slices_run(comparisons(variants, tuple(sorted({int(r["N"]) for r in table}))), table)
        if (out / "plan.md").exists() or (out / "plan.md").is_symlink():
            plan, slices = table_plan(read_text(out / "plan.md"), str(out / "plan.md"))
            names = {c["name"] for c in plan}  # what the cells allow and no plan named: families of their own
            plan += [c | {"family": c["family"] + UNPLANNED} for c in ran if c["name"] not in names]
        else:
            plan = ran
        fams = {}
        for c in plan:
            fams.setdefault(c["family"], []).append(c)
        reg |= registration(out, fams, "results.csv", _table_plan_commit)
        found += verdicts(table, plan)
    seeds = {int(r["seed"]) for r in table}
    for d in committed_designs(out):
        rows_d = design_results(out, d)
        seeds |= {int(r["seed"]) for r in rows_d}
        fams = {}
        for c in d["comparisons"]:
            fams.setdefault(c["family"], []).append(c)
        got = registration(out, fams, f"{DESIGN_DIR}/{d['design']}/results.csv", _design_plan_commit(d["design"]))
        if d["changed"]:
            got = {f: g | {"class": "exploratory", "why": g["why"] + "; the plan file changed after its commit"}
                   for f, g in got.items()}  # fmt: skip
        reg |= got
        found += [r | {"design": d["design"]} for r in verdicts(rows_d, d["comparisons"])]
    for r in found:
        r["caveat"] = caveats(r, reg)
        r["registration"] = reg.get(r["family"], {}).get("class", "exploratory")
    write_atomic(out / "verdicts.md", verdicts_markdown(found, sorted(seeds), reg, slices))
    units = {"diff": "fraction of held-out accuracy (0-1), per seed summed over the comparison's terms",
             "paper_diff_pct": "points (%) of the paper's average accuracy"}  # fmt: skip
    write_atomic(out / "verdicts.json", json.dumps({"units": units, "registration": reg, "verdicts": found}, indent=1))
    keys = list(dict.fromkeys(k for r in found for k in r))
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=keys, restval="")
    w.writeheader()
    w.writerows([{k: csv_safe(v if not isinstance(v, list) else json.dumps(v)) for k, v in r.items()} for r in found])
    write_atomic(out / "verdicts.csv", text.getvalue())
    if table:
        short.plot_verdicts(table, out)
    return found


# ---------------------------------------------------------------------------------------------------------------------
# Running a design


def plan_committed(out: Path, name: str) -> str:
    """The commit that added plans/<name>.md, once the file is committed and unchanged; else a ValueError saying to
    commit it alone first."""
    path = out / PLANS / f"{name}.md"
    root = git_root(out)
    if not path.is_file() or root is None:
        raise ValueError(f"{path}: no committed plan; write it with --design {name} --plan-only and commit it alone")
    rel = path.resolve().relative_to(root.resolve()).as_posix()
    added = _git(root, "log", "--reverse", "--diff-filter=A", "--format=%H", "--", rel)
    if not added or not added.split():
        raise ValueError(f"{path} is not committed: commit it alone (git add {rel} && git commit) before its cells run")
    if show(root, added.split()[0], rel) != read_text(path):
        raise ValueError(f"{path} differs from the commit that added it ({added.split()[0][:7]}): a plan is written "
                         "once; a new design gets a name of its own")  # fmt: skip
    return added.split()[0]


def run_design(out: Path, name: str, jobs: int, ns: list[int] | None, until: datetime.datetime | None) -> None:
    """Run a committed design's cells seed by seed (the design's seeds interleaved over its warm starts, so pairs
    finish together), each seed a sweep of the design's variants into designs/<name>/sft<k>/ (a warm start is built,
    on one thread, by the first sweep that needs it); after each seed, designs/<name>/results.csv and the report. No
    seed starts after `until` (UTC)."""
    import torch

    from vespo.experiments.sweep import cells

    torch.set_num_threads(1)
    plan_committed(out, name)
    d = parse_design(read_text(out / PLANS / f"{name}.md"), name)
    ns = ns or d["num_mini_batches"]
    bad = [n for n in ns if n not in d["num_mini_batches"]]
    if bad:
        raise ValueError(f"--num-mini-batches {bad}: design {name} plans N = {d['num_mini_batches']} only")
    where = out / DESIGN_DIR / name

    def cfg_of(k: int, seeds: list[int]) -> SweepConfig:
        return config(where / f"sft{k}", seeds, jobs, d["variants"], ns, False, extra={"sft_seed": str(k)},
                      **d["sweep"])  # fmt: skip

    cfgs = {w["sft_seed"]: cfg_of(w["sft_seed"], w["seeds"]) for w in d["warm_starts"]}
    for c in cfgs.values():
        cells(c)  # every cell validated before any runs
    order = [(w["sft_seed"], s) for i in range(max(len(w["seeds"]) for w in d["warm_starts"]))
             for w in d["warm_starts"] if i < len(w["seeds"]) for s in [w["seeds"][i]]]  # fmt: skip
    summaries: list[dict] = []
    for k, s in order:
        if until is not None and datetime.datetime.now(datetime.timezone.utc) >= until:
            print(f"design {name}: {until:%H:%M} UTC reached; no more seeds start (rerun to continue)", flush=True)
            break
        summaries = [r for r in summaries if not (r["sft_seed"] == k and r["seed"] == s)]
        summaries += [r | {"sft_seed": k} for r in sweep(cfg_of(k, [s]))]
        where.mkdir(parents=True, exist_ok=True)
        write_tables(where, summaries, eval_prompts=cfgs[k].eval_size * cfgs[k].eval_n)
        report(out)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the preset's (chosen by power)")
    p.add_argument("--jobs", type=int, default=2, help="cells in parallel (one torch thread each)")
    p.add_argument("--variants", nargs="+", default=list(PRESETS[PRESET]), help="a subset of the preset's")
    p.add_argument(
        "--num-mini-batches",
        "--staleness",
        type=int,
        nargs="+",
        default=None,
        help="values of N, the mini-batches per rollout step (default 4 16 64 128; with --design: its N or a subset; "
        "--staleness: old name, deprecated)",
    )
    p.add_argument("--out-dir", type=Path, default=OUT, help="where the sweep, plan and verdicts go")
    p.add_argument("--smoke", action="store_true", help="four tiny cells, in seconds (CI)")
    p.add_argument("--plan-only", action="store_true", help="print (with --design: write once) the design, run nothing")
    p.add_argument("--report-only", action="store_true", help="rebuild the verdicts from out-dir's results")
    p.add_argument("--design", choices=sorted(DESIGNS), default=None,
                   help="a design of its own: --plan-only writes plans/NAME.md once; without it, its cells run once "
                   "that file is committed")  # fmt: skip
    p.add_argument("--until", default=None, metavar="HH:MM",
                   help="with --design: no seed's cells start after this time (UTC, today)")  # fmt: skip
    p.add_argument(
        "--add-results",
        type=Path,
        nargs="+",
        default=[],
        metavar="DIR",
        help="out-dirs of slices of the table run separately: their cells and plans join out-dir's",
    )
    args = p.parse_args()
    warn_renamed(p.prog, sys.argv[1:], {"--staleness": "--num-mini-batches"})
    try:
        if args.design is not None:
            if args.plan_only:
                path = write_plan(args.out_dir, args.design)
                print(read_text(path), flush=True)
                raise SystemExit(0)
            until = None
            if args.until is not None:
                try:
                    hh, mm = (int(x) for x in args.until.split(":"))
                    until = datetime.datetime.now(datetime.timezone.utc).replace(hour=hh, minute=mm, second=0)
                except ValueError:
                    raise ValueError(f"--until must be HH:MM (UTC), got {args.until!r}") from None
            if not args.report_only:
                run_design(args.out_dir, args.design, args.jobs, args.num_mini_batches, until)
            report(args.out_dir)
            print((args.out_dir / "verdicts.md").read_text())
            raise SystemExit(0)
        ns = args.num_mini_batches or [4, 16, 64, 128]
        cfg = config(args.out_dir, args.seeds, args.jobs, args.variants, ns, args.smoke)
        if not (args.report_only or args.plan_only) and (where := run_dir(args.out_dir, cfg)) != args.out_dir:
            print(f"{args.out_dir} holds a table with cells outside this design: it runs in {where} (merge it: "
                  f"--report-only --out-dir {args.out_dir} --add-results {where})", flush=True)  # fmt: skip
            args.out_dir = where
            cfg = config(where, args.seeds, args.jobs, args.variants, ns, args.smoke)
        text = plan_text(cfg)
        if args.add_results:  # every input read and checked before any file is written
            rows, text = prepare_merge(args.out_dir, args.add_results)
        print(text, flush=True)
        if args.plan_only:
            raise SystemExit(0)
        if not args.report_only:
            sweep(cfg)
        if args.add_results:  # the union becomes the table's results.csv, results.md and plan.md
            write_tables(args.out_dir, [_typed(r) for r in rows], eval_prompts=cfg.eval_size * cfg.eval_n)
        if args.add_results or not args.report_only:  # a report alone leaves the slices' designs as they are
            write_atomic(args.out_dir / "plan.md", text)
        report(args.out_dir)
    except ValueError as exc:
        p.error(str(exc))
    print((args.out_dir / "verdicts.md").read_text())

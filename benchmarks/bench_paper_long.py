"""Where VESPO and GRPO actually differ: the paper's staleness table on 128-token responses, powered before it runs.

One command: `python benchmarks/bench_paper_long.py [--seeds ...] [--jobs 2] [--variants ...] [--num-mini-batches ...]`
runs `vespo sweep --preset paper-long` (docs/paper_regime.md, "The long-response regime": the 41-step chain task,
128-token responses, the paper's AdamW settings, N in {4, 16, 64, 128}) into benchmarks/results/paper_long/
(resumable: the same command finishes it; per-cell runs under cells/ are not committed). Before any cell runs it
prints, and writes to plan.md, the design fixed here (issue 43):

- the comparisons: VESPO against each baseline at each N, and each baseline's change from N = 4 to 64 against
  VESPO's (the degradation difference), under both checkpoint rules (best: the paper's; final); the 2025-26
  corrections (M2PO, OPSM, AIPO, VCPO: no paper number) are tested in families of their own (`LATER`);
- per family (Holm's correction runs over a family): the assumed per-seed SD of the paired differences (`ASSUMED_SD`,
  and where it comes from), the seeds, the family size m and the minimal detectable difference (MDD) at 80% power of
  the paired t-test at Holm's first-step level 0.05 / m (exact: noncentral t); the seeds are the fewest that detect
  `TARGET` (0.03) in every family (`choose_seeds`); the plan says how many that is and what the seeds run detect;
- the estimated wall time on 2 cores (`estimate_seconds`, from the per-phase costs measured on this box).

After the cells it writes results.md / results.csv (the sweep's, with the regime gate of every cell), verdicts.png
(held-out accuracy vs N per variant, both checkpoint rules, beside the paper's numbers), verdicts.md /
verdicts.json / verdicts.csv: every comparison with our difference, its test (paired t over the seeds whose cells
pass the gate: `vespo.experiments.sweep.GATES["paper-long"]`), the Holm-adjusted p over its fixed family (a
comparison left without 2 gated seeds counts as p = 1), the verdict (reproduced / contradicted where the paper has a
number, else VESPO ahead / behind; unresolved with its MDD from the measured SD), the gate values and the gradient
probe's cosines beside it. Variants are the preset's (`PRESETS["paper-long"]`): a loss added there joins the plan.

A table built in slices (each its own command and out-dir, each design fixed before its cells ran):
`--report-only --add-results DIR...` adds the slices' cells and plans to out-dir's results.csv / results.md /
plan.md (a cell in two slices must agree) and tests the comparisons the slices planned, Holm over their union. A
design run into an out-dir whose table holds other cells (a rerun on unseen seeds or another N into the committed
table's directory) goes to out-dir/slices/<design> instead (`run_dir`): its verdicts stand alone, the table is left
as it was.

`--smoke --out-dir DIR`: VESPO and GRPO on the 3-step chain at N = 2 and 4, one seed, a 2-step warm start in DIR (CI).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib.util
import io
import json
import math
import sys
from pathlib import Path

import numpy as np

from vespo.cli import warn_renamed
from vespo.experiments.compare import load_rows
from vespo.experiments.stats import (
    TEST_NAMES,
    compare,
    fisher_exact,
    holm,
    minimal_detectable_difference,
    seeds_for,
)
from vespo.experiments.sweep import GATES, PRESETS, SweepConfig, preset_config, resolve, sweep, write_tables
from vespo.outputs import read_regular, write_atomic

_spec = importlib.util.spec_from_file_location(
    "bench_paper_staleness", Path(__file__).with_name("bench_paper_staleness.py")
)
short = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(short)  # the paper's numbers and the verdict rule, one copy

OUT = Path("benchmarks/results/paper_long")
PRESET = "paper-long"
ALPHA = 0.05
TARGET = 0.03
"""The difference (held-out accuracy) the design must detect with 80% power in every family."""
RULES = short.RULES
ASSUMED_SD = {"at one N": 0.044, "degradation": 0.060}
"""Per-seed SD of the paired differences each family assumes: measured on the table's first slice (VESPO and GRPO at
N = 4 and 64, 5 seeds, best checkpoint; benchmarks/results/paper_long/verdicts.json): between methods at one N
0.040-0.044, of the change from N = 4 to 64 minus VESPO's 0.060. (Before any long cell ran the plan assumed the
short table's 0.016 / 0.018, 2.5-4x too small.) The report recomputes every MDD from the SD it measures."""
LATER = ("m2po", "opsm", "aipo", "vcpo")
"""The 2025-26 off-policy corrections (issue 40): the paper has no number for them and their question is a
practitioner's (which correction beside VESPO), so their comparisons form families of their own, fixed before their
cells ran: adding them leaves the Holm correction of the paper's claims as it was."""
LATER_TAG = " · 2025-26 corrections"
PAPER_NAME = {"grpo": "grpo", "grpo-dual10": "grpo", "gspo": "gspo", "sapo": "sapo"}
"""Our variant -> the paper's row it is compared with (the paper's GRPO: DAPO bounds; its scripts' dual clip is 10)."""
COST = {"start_s": 20.0, "gen_s_per_seq": 0.0045, "update_s_per_step": 0.46, "eval_s_per_seq": 0.006, "probe_s": 1.0}
"""Seconds per phase of a paper-long cell on one core of this 2-core box (`estimate_seconds`), from the VESPO and GRPO
cells of benchmarks/results/paper_long/ (N = 4 and 64, two cells in parallel at load 2-3, with the preallocated KV
cache: an N = 64 cell ~450 s, an N = 4 cell ~100 s): process start and imports, one generated training response
(128 tokens), one optimizer step (mu scoring, forward, backward, diagnostics, AdamW), one held-out response, one
gradient probe."""
SMOKE = {"num_mini_batches": (2, 4), "seeds": (0,), "variants": ("vespo", "grpo"), "num_operands": 3, "eval_size": 10,
         "eval_n": 1, "eval_points": 1, "optimizer_steps": 4, "min_rollout_steps": 1, "ppo_mini_batch_size": 2,
         "rollout_n": 2, "probes": 1}  # fmt: skip
"""`--smoke`: SweepConfig fields of a tiny grid (the paper-long regime otherwise)."""


def family_of(kind: str, other: str) -> str:
    """The Holm family of a comparison of `kind` ("at one N" or "degradation") against `other`."""
    return kind + (LATER_TAG if other in LATER else "")


def assumed_sd(family: str) -> float:
    """The per-seed SD a family assumes: its kind's (`ASSUMED_SD`), for the paper's baselines and the later ones."""
    return ASSUMED_SD[family.removesuffix(LATER_TAG)]


def degradation(staleness: tuple[int, ...]) -> tuple[int, int] | None:
    """(N from, N to) of the degradation comparisons: 4 -> 64 when both run, else the smallest -> the largest N
    (`--smoke`), None with a single N."""
    if 4 in staleness and 64 in staleness:
        return 4, 64
    return (min(staleness), max(staleness)) if len(staleness) > 1 else None


def comparisons(variants: list[str], staleness: tuple[int, ...]) -> list[dict]:
    """The comparisons this benchmark tests, fixed before any cell runs: each baseline against VESPO at each N
    (family "at one N"), and each baseline's change from N = 4 to 64 against VESPO's (family "degradation"), the
    2025-26 corrections (`LATER`) in families of their own; with the
    paper's difference (baseline - VESPO, points) and its sign where the paper reports both numbers."""
    out = []
    drop = degradation(staleness)
    for other in [v for v in variants if v != "vespo"]:
        paper = short.PAPER.get(PAPER_NAME.get(other, ""))
        for n in staleness:
            row = {
                "family": family_of("at one N", other),
                "other": other,
                "column": n,
                "name": f"{other} vs VESPO at N={n}",
            }
            if paper is not None and n in short.PAPER_N:
                i = short.PAPER_N.index(n)
                row |= _paper(paper[i] - short.PAPER["vespo"][i])
            out.append(row)
        if drop is not None:
            a, b = drop
            row = {"family": family_of("degradation", other), "other": other, "column": f"{a}→{b}",
                   "name": f"{other}'s change from N={a} to {b} minus VESPO's"}  # fmt: skip
            if paper is not None and drop == (4, 64):
                i, j = short.PAPER_N.index(4), short.PAPER_N.index(64)
                row |= _paper((paper[j] - paper[i]) - (short.PAPER["vespo"][j] - short.PAPER["vespo"][i]))
            out.append(row)
    return out


def _paper(gap: float) -> dict:
    return {"paper_diff_pct": round(gap, 1), "sign": int(np.sign(gap))}


def families(found: list[dict]) -> dict[str, int]:
    """Family -> its size m (Holm's correction runs over each family, per checkpoint rule)."""
    out: dict[str, int] = {}
    for c in found:
        out[c["family"]] = out.get(c["family"], 0) + 1
    return out


def choose_seeds(variants: list[str], staleness: tuple[int, ...], target: float = TARGET) -> int | None:
    """The fewest seeds at which every family detects `target` with 80% power (paired t at Holm's first-step level,
    the assumed SD); None when no number up to 200 does."""
    needed = [
        seeds_for(target, assumed_sd(f), ALPHA / m) for f, m in families(comparisons(variants, staleness)).items()
    ]
    return None if None in needed else max(needed, default=2)


def plan_rows(variants: list[str], staleness: tuple[int, ...], seeds: int) -> list[dict]:
    """Per family: the assumed SD, seeds, m, Holm's first-step level and the MDD at 80% power."""
    rows = []
    for family, m in families(comparisons(variants, staleness)).items():
        sd = assumed_sd(family)
        mdd = minimal_detectable_difference(sd, seeds, ALPHA / m)
        rows.append({"family": family, "comparisons": m, "assumed_sd": sd, "seeds": seeds, "level": ALPHA / m,
                     "mdd": mdd, "detects_target": bool(mdd <= TARGET)})  # fmt: skip
    return rows


def estimate_seconds(cfg: SweepConfig) -> float:
    """Estimated wall seconds of the sweep's cells on `cfg.jobs` cores (`COST`; cells already finished count too)."""
    from vespo.experiments.sweep import _optimizer_steps, variants

    cfg = resolve(cfg)
    per_seed = 0.0
    for n in cfg.num_mini_batches:
        steps = _optimizer_steps(cfg, n)
        rollout_steps = steps // n
        seqs = steps * cfg.ppo_mini_batch_size * cfg.rollout_n  # every sequence is generated once
        evals = (1 + min(cfg.eval_points, rollout_steps)) * cfg.eval_size * cfg.eval_n
        per_seed += (COST["start_s"] + seqs * COST["gen_s_per_seq"] + steps * COST["update_s_per_step"]
                     + evals * COST["eval_s_per_seq"] + cfg.probes * COST["probe_s"])  # fmt: skip
    return per_seed * len(variants(cfg)) * len(cfg.seeds) * len(cfg.lr) * len(cfg.task) / cfg.jobs


def plan_text(cfg: SweepConfig) -> str:
    cfg = resolve(cfg)
    variants = list(cfg.variants or PRESETS[PRESET])
    found = comparisons(variants, cfg.num_mini_batches)
    rows = plan_rows(variants, cfg.num_mini_batches, len(cfg.seeds))
    hours = estimate_seconds(cfg) / 3600
    lines = [
        "# paper-long: the design, fixed before the cells run",
        "",
        f"Variants {', '.join(variants)}; N = {', '.join(map(str, cfg.num_mini_batches))}; seeds {list(cfg.seeds)}; "
        f"{len(variants) * len(cfg.num_mini_batches) * len(cfg.seeds)} cells. Estimated wall time on {cfg.jobs} cores: "
        f"{hours:.1f} h ({COST_NOTE}).",
        "",
        f"Comparisons ({len(found)} per checkpoint rule, both rules: {', '.join(RULES.values())}): "
        + "; ".join(c["name"] for c in found)
        + ".",
        "",
        "| family | comparisons m | assumed per-seed SD | seeds | Holm first-step level | MDD at 80% power | "
        f"detects {TARGET} |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['family']} | {r['comparisons']} | {r['assumed_sd']:.3f} | {r['seeds']} | {r['level']:.2g} "
                     f"| {r['mdd']:.3f} | {'yes' if r['detects_target'] else 'no'} |")  # fmt: skip
    need = choose_seeds(variants, cfg.num_mini_batches)
    lines += ["", f"Seeds needed to detect {TARGET} in every family: {need if need else 'more than 200'} (paired t, "
              "exact noncentral t; SD assumed as `ASSUMED_SD` says)."]  # fmt: skip
    return "\n".join(lines) + "\n"


COST_NOTE = "per-phase costs of the committed cells on this box at load 2-3, two cells in parallel"


def _gated_seeds(rows: list[dict], cells: list[tuple[str, int]]) -> dict | None:
    """Seeds whose cells (variant, N) all pass the regime gate; None when the rows carry no gate (every seed counts)."""
    if not any(r.get("gate") for r in rows):
        return None
    ok = {(r["variant"], int(r["N"]), int(r["seed"])) for r in rows if r.get("gate") == "ok"}
    seeds = {int(r["seed"]) for r in rows}
    return {s for s in seeds if all((v, n, s) in ok for v, n in cells)}


def _values(rows: list[dict], metric: str) -> dict[tuple[str, int], dict[int, float]]:
    out: dict[tuple[str, int], dict[int, float]] = {}
    for r in rows:
        out.setdefault((r["variant"], int(r["N"])), {})[int(r["seed"])] = float(r[metric])
    return out


def _mean(rows: list[dict], variant: str, n: int, key: str) -> float | None:
    values = [float(r[key]) for r in rows if r["variant"] == variant and int(r["N"]) == n and r.get(key) not in
              (None, "")]  # fmt: skip
    values = [v for v in values if math.isfinite(v)]
    return float(np.mean(values)) if values else None


def verdicts(rows: list[dict], variants: list[str], staleness: tuple[int, ...]) -> list[dict]:
    """Every fixed comparison under each checkpoint rule: our difference (baseline - VESPO) over the gated seeds, its
    paired t-test, the p-value Holm-adjusted over its fixed family (a comparison without 2 gated seeds counts as p =
    1), the verdict and its MDD (measured SD, Holm's first-step level), the gate values and the probe's cosines."""
    plan = slices_run(comparisons(variants, staleness), rows)
    sizes = families(plan)
    drop = degradation(staleness)
    out = []
    for metric, rule in RULES.items():
        values = _values(rows, metric)
        found = []
        for c in plan:
            cells = comparison_cells(c)
            if isinstance(c["column"], int):
                groups = {k: values.get(k, {}) for k in cells}
            else:
                a, b = drop
                groups = {(v, c["column"]): {s: values.get((v, b), {}).get(s, math.nan) - values.get((v, a), {}).get(
                    s, math.nan) for s in set(values.get((v, a), {})) & set(values.get((v, b), {}))}
                    for v in ("vespo", c["other"])}  # fmt: skip
            keep = _gated_seeds(rows, cells)
            groups_all = {k: {s: x for s, x in g.items() if math.isfinite(x)} for k, g in groups.items()}
            groups = {k: {s: x for s, x in g.items() if (keep is None or s in keep) and math.isfinite(x)}
                      for k, g in groups.items()}  # fmt: skip
            seeds = sorted(set(groups[("vespo", c["column"])]) & set(groups[(c["other"], c["column"])]))
            ran = set(groups_all[("vespo", c["column"])]) & set(groups_all[(c["other"], c["column"])])
            row = c | {"rule": rule, "metric": metric, "seeds": len(seeds), "seeds_run": len(ran)}
            if len(seeds) >= 2:
                (cmp,) = compare({k: {s: g[s] for s in seeds} for k, g in groups.items()}, "vespo", test="paired_t")
                row |= {"diff": cmp.diff, "p": cmp.p, "sd": cmp.sd, "test": cmp.test}
            else:
                row |= {"diff": math.nan, "p": 1.0, "sd": math.nan, "test": None}
            n = c["column"] if isinstance(c["column"], int) else drop[1]
            row |= _collapses(rows, ("vespo", c["other"]), n, seeds)
            for side in ("vespo", c["other"]):
                tag = "vespo" if side == "vespo" else "other"
                for key in ("log_w_std_stalest", "clip_frac_stalest", "grad_clipped_frac", "probe_cos_grpo",
                            "probe_cos_reinforce"):  # fmt: skip
                    row[f"{tag}_{key}"] = _mean(rows, side, n, key)
            found.append(row)
        for family, m in sizes.items():
            members = [r for r in found if r["family"] == family]
            for r, q in zip(members, holm([r["p"] for r in members]), strict=True):
                r["p_adjusted"] = q
                r["mdd"] = minimal_detectable_difference(r["sd"], r["seeds"], ALPHA / m) if r["test"] else math.nan
                r["verdict"] = _verdict(r)
        out += found
    return out


def _collapses(rows: list[dict], sides: tuple[str, str], n: int, seeds: list[int]) -> dict:
    """Collapsed seeds (held-out accuracy ended below half its start: results.csv's `collapsed`) of each side at N = n
    among the tested seeds, and Fisher's exact test on the two counts: reported beside the paired t, which stays the
    planned test (a collapse makes the accuracy bimodal; the counts are what an exact test can speak to)."""
    flags = {(r["variant"], int(r["N"]), int(r["seed"])): r.get("collapsed") in ("True", True) for r in rows}
    counts = [sum(flags.get((v, n, s), False) for s in seeds) for v in sides]
    p = fisher_exact(counts[0], len(seeds), counts[1], len(seeds)) if seeds and any(counts) else math.nan
    return {"collapsed_vespo": counts[0], "collapsed_other": counts[1], "fisher_p": p}


def _verdict(r: dict) -> str:
    if r["test"] is None:
        return "not run" if r["seeds_run"] == 0 else "not tested (fewer than 2 seeds pass the gate)"
    if "sign" in r:
        return short.verdict(r["diff"], r["p_adjusted"], r["sign"], ALPHA)
    if r["p_adjusted"] < ALPHA and r["diff"] != 0:
        return "VESPO ahead" if r["diff"] < 0 else "VESPO behind"
    return "unresolved"


def _collapse_text(r: dict) -> str:
    text = f"{r['collapsed_vespo']} / {r['collapsed_other']}"
    return text + (f", p = {_fmt(r['fisher_p'], 2)}" if math.isfinite(r["fisher_p"]) else "")


def _fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}g}"


def _gate_text(g) -> str:
    where = f"{', '.join(g.methods)} cells" if g.methods else "every cell"
    return f"{g.label} {g.op} {g.bound:g} ({where}{f', N >= {g.min_n}' if g.min_n > 1 else ''})"


def verdicts_markdown(found: list[dict], seeds: list[int]) -> str:
    """verdicts.md: every comparison's row; `seeds`: the seeds results.csv holds (not the report command's)."""
    gates = "; ".join(_gate_text(g) for g in GATES[PRESET])
    rule = next(iter(RULES.values()))
    sizes = families([r for r in found if r["rule"] == rule])
    holm_over = ", ".join(f"{family} m = {m}" for family, m in sizes.items())
    lines = [
        "# paper-long: VESPO against each baseline where their updates differ",
        "",
        f"Our runs: `vespo sweep --preset paper-long` (docs/paper_regime.md), seeds {seeds}; the paper: "
        'Qwen3-30B-A3B, average accuracy (%), its Table "staleness" (GRPO and GRPO with the scripts\' dual clip 10 '
        "are both compared with the paper's GRPO row). Test: "
        f"{TEST_NAMES['paired_t']}, on the seeds whose cells pass the regime gate ({gates}); Holm over each fixed "
        f"family per checkpoint rule ({holm_over}: the comparisons the slices of plan.md planned); a comparison "
        "without 2 gated seeds counts as p = 1. **reproduced** / "
        "**contradicted**: significant with / against the paper's sign; VESPO ahead / behind: significant where the "
        f"paper has no number; unresolved: not significant at alpha = {ALPHA}, with the MDD (80% power, the measured "
        "SD, Holm's first-step level) under it: a smaller difference cannot be seen. Collapsed: seeds whose held-out "
        "accuracy ended below half its start, with Fisher's exact test on the two counts (two-sided, unadjusted) "
        "where any seed collapsed: beside the planned paired t, not instead of it.",
        "",
        "| comparison | paper (pts) | rule | our diff | gated seeds | adj. p | verdict | collapsed (VESPO / other), "
        "Fisher p | sd log W (VESPO / other) | tok-clip other | grad-clip (VESPO / other) | cos·GRPO (VESPO / other) | "
        "cos·REINF VESPO |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in found:
        verdict = r["verdict"]
        if verdict == "unresolved":
            verdict += f"<br>MDD {_fmt(r['mdd'], 2)}"
        elif verdict in ("reproduced", "contradicted", "VESPO ahead", "VESPO behind"):
            verdict = f"**{verdict}**"
        paper = f"{r['paper_diff_pct']:+.1f}" if "paper_diff_pct" in r else "–"
        lines.append(
            f"| {r['name']} | {paper} | {r['rule']} | {_fmt(r['diff'])} | {r['seeds']} of {r['seeds_run']} | "
            f"{_fmt(r['p_adjusted'])} | "
            f"{verdict} | {_collapse_text(r)} | "
            f"{_fmt(r['vespo_log_w_std_stalest'], 2)} / {_fmt(r['other_log_w_std_stalest'], 2)} | "
            f"{_fmt(r['other_clip_frac_stalest'], 2)} | {_fmt(r['vespo_grad_clipped_frac'], 2)} / "
            f"{_fmt(r['other_grad_clipped_frac'], 2)} | {_fmt(r['vespo_probe_cos_grpo'], 2)} / "
            f"{_fmt(r['other_probe_cos_grpo'], 2)} | {_fmt(r['vespo_probe_cos_reinforce'], 2)} |"
        )
    counts: dict[str, dict[str, int]] = {}
    for r in found:
        counts.setdefault(r["rule"], {}).setdefault(r["verdict"], 0)
        counts[r["rule"]][r["verdict"]] += 1
    lines += ["", "Summary: " + "; ".join(f"{rule}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
                                          for rule, c in counts.items()) + "."]  # fmt: skip
    return "\n".join(lines) + "\n"


def config(out: Path, seeds: list[int] | None, jobs: int, variants: list[str], num_mini_batches: list[int],
           smoke: bool) -> SweepConfig:  # fmt: skip
    fields = {"variants": tuple(variants), "num_mini_batches": tuple(num_mini_batches)}
    if seeds is not None:
        fields["seeds"] = tuple(seeds)
    extra = {"tensorboard": "False"}
    if smoke:  # a 2-step warm start cached under out, not in the user's cache
        fields |= SMOKE | {"cache_dir": str(out / "cache")}
        extra |= {"sft_steps": "2"}
    return preset_config(PRESET, out_dir=str(out), jobs=jobs, extra=extra, **fields)


def run_dir(out: Path, cfg: SweepConfig) -> Path:
    """Where a run of `cfg` goes: `out` itself when it holds no table, or only cells of this grid (the same command
    finishing it); else `out/slices/<design>`, so that a new design (other seeds, another N) never rewrites a table
    that holds other cells: its verdicts stand alone there, and `--report-only --add-results` merges it."""
    from vespo.experiments.sweep import variants

    table = out / "results.csv"
    if not table.is_file():
        return out
    cfg = resolve(cfg)
    names = list(variants(cfg))
    grid = {(v, n, s) for v in names for n in cfg.num_mini_batches for s in cfg.seeds}
    held = {(r["variant"], int(r["N"]), int(r["seed"])) for r in load_rows(table, "best_eval_acc")}
    if held <= grid:
        return out
    ns, seeds = "-".join(map(str, cfg.num_mini_batches)), "-".join(map(str, cfg.seeds))
    tag = hashlib.sha1(" ".join(names).encode()).hexdigest()[:6]
    return out / "slices" / f"N{ns}_seeds{seeds}_{tag}"


CELL_KEY = ("task", "variant", "N", "seed")


def merge_rows(rows: list[dict], extra: list[dict], source: str) -> list[dict]:
    """`rows` with the cells of `extra` (a slice of the table run in another out-dir) added; a cell in both must hold
    the same values (ValueError naming it otherwise)."""
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
    """Two results.csv fields hold the same value (numbers compared as numbers: a row written again by
    `write_tables` may spell them differently; an empty field is NaN)."""
    try:
        x, y = (float(v) if v != "" else math.nan for v in (a, b))
    except ValueError:
        return a == b
    return (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)


def _typed(row: dict) -> dict:
    """A results.csv row as the cell summary it was written from (numbers, booleans; an empty field: NaN)."""
    out = {}
    for k, v in row.items():
        if k in ("N", "seed", "rollout_steps"):
            out[k] = int(v)
        elif v in ("True", "False"):
            out[k] = v == "True"
        else:
            try:
                out[k] = float(v) if v != "" else math.nan
            except ValueError:
                out[k] = v
    return out


def slices_run(found: list[dict], rows: list[dict]) -> list[dict]:
    """The planned comparisons whose cells belong to a slice that ran (a (variant, N) with rows): the table is built
    from slices, each fixed before its cells ran, so the Holm families are the union of the slices' plans."""
    present = {(r["variant"], int(r["N"])) for r in rows}
    return [c for c in found if all(cell in present for cell in comparison_cells(c))]


def comparison_cells(c: dict) -> list[tuple[str, int]]:
    """The (variant, N) cells a planned comparison reads: VESPO's and the baseline's at its N, or at both ends of
    its degradation ("4→64")."""
    if isinstance(c["column"], int):
        return [("vespo", c["column"]), (c["other"], c["column"])]
    a, b = (int(x) for x in c["column"].split("→"))
    return [(v, n) for v in ("vespo", c["other"]) for n in (a, b)]


def report(out: Path, cfg: SweepConfig, add: list[Path] = ()) -> list[dict]:
    rows = load_rows(out / "results.csv", "best_eval_acc")
    for path in add:
        rows = merge_rows(rows, load_rows(path, "best_eval_acc"), str(path))
    if add:  # the union becomes the table's results.csv and results.md
        write_tables(out, [_typed(r) for r in rows], eval_prompts=cfg.eval_size * cfg.eval_n)
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    staleness = tuple(sorted({int(r["N"]) for r in rows}))
    found = verdicts(rows, variants, staleness)
    write_atomic(out / "verdicts.md", verdicts_markdown(found, sorted({int(r["seed"]) for r in rows})))
    write_atomic(out / "verdicts.json", json.dumps(found, indent=1))
    keys = list(dict.fromkeys(k for r in found for k in r))
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=keys, restval="")
    w.writeheader()
    w.writerows(found)
    write_atomic(out / "verdicts.csv", text.getvalue())
    short.plot_verdicts(rows, out)
    return found


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
        default=[4, 16, 64, 128],
        help="values of N, the mini-batches per rollout step (--staleness: old name, deprecated)",
    )
    p.add_argument("--out-dir", type=Path, default=OUT, help="where the sweep, plan and verdicts go")
    p.add_argument("--smoke", action="store_true", help="four tiny cells, in seconds (CI)")
    p.add_argument("--plan-only", action="store_true", help="print the design and the time estimate, run nothing")
    p.add_argument("--report-only", action="store_true", help="rebuild the verdicts from out-dir's results.csv")
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
        cfg = config(args.out_dir, args.seeds, args.jobs, args.variants, args.num_mini_batches, args.smoke)
        if not (args.report_only or args.plan_only) and (where := run_dir(args.out_dir, cfg)) != args.out_dir:
            print(f"{args.out_dir} holds a table with cells outside this design: it runs in {where} (merge it: "
                  f"--report-only --out-dir {args.out_dir} --add-results {where})", flush=True)  # fmt: skip
            args.out_dir = where
            cfg = config(where, args.seeds, args.jobs, args.variants, args.num_mini_batches, args.smoke)
        text = plan_text(cfg)
        print(text, flush=True)
        if args.plan_only:
            raise SystemExit(0)
        if not args.report_only:
            sweep(cfg)
    except ValueError as exc:
        p.error(str(exc))
    if args.add_results:  # plan.md keeps every slice's design, in the order the slices ran
        plans = [args.out_dir / "plan.md", *(d / "plan.md" for d in args.add_results)]
        head = "# paper-long: the design"
        parts = (head + part for path in plans if path.is_file()
                 for part in read_regular(path).decode().split(head)[1:])  # fmt: skip
        text = "\n".join(dict.fromkeys(part.strip() + "\n" for part in parts))
    if args.add_results or not args.report_only:  # a report alone leaves the designs fixed before the cells as they are
        write_atomic(args.out_dir / "plan.md", text)
    try:
        report(args.out_dir, cfg, [d / "results.csv" for d in args.add_results])
    except ValueError as exc:
        p.error(str(exc))
    print((args.out_dir / "verdicts.md").read_text())

"""`vespo reproduce paper`: the paper's staleness table beside ours (`vespo sweep --preset paper`), then a verdict on
every ordering it claims.

It runs the paper preset (docs/guides/paper.md: the scratchpad task, AdamW betas (0.9, 0.999), weight decay 0.01,
grad_clip 1.0, >= 8 rollout steps per cell) into benchmarks/results/paper_staleness/ (resumable: rerun the same
command to finish it; per-cell runs under cells/ are not committed), then writes there:

- results.md / results.csv / fig3_training_reward.png / fig4_dynamics.png: the sweep's own tables and figures;
- compare_vespo_best_eval_acc.md, compare_vespo_final_eval_acc.md: `vespo compare --baseline vespo --test auto`;
- verdicts.md / verdicts.json / verdicts.csv: for each ordering of the paper's Table "staleness" (Qwen3-30B-A3B avg %;
  VESPO above GRPO, GSPO and SAPO at every N; SAPO and GSPO degrading more than VESPO from N = 4 to 64), under both
  checkpoint rules (best = the paper's selection; final), the side a significant difference (after Holm) favours and
  whether the paper's has the same sign (the sign only, not its size), or "unresolved", with the regime diagnostics
  beside it;
- verdicts.png: held-out accuracy vs N per method, both rules, beside the paper's numbers.

The between-method tests are `vespo compare`'s (`--test auto`: paired t over the shared seeds, Fisher's exact test on
collapse counts where a seed collapsed), Holm over each table. `--smoke --out-dir DIR`: VESPO and GRPO at N = 4, one
seed, one rollout step of 4 mini-batches of 2 prompts x 2 on a 2-step warm start built in DIR (CI; in seconds).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np

from vespo.experiments.compare import DIAGNOSTICS, comparison_inputs, load_rows, markdown
from vespo.experiments.presets import PAPER_TABLE
from vespo.experiments.stats import TEST_NAMES, compare
from vespo.experiments.sweep import SweepConfig, preset_config, resolve, sweep

OUT = Path("benchmarks/results/paper_staleness")
PAPER_N = (4, 16, 32, 64)
PAPER = {  # paper Table "staleness": Qwen3-30B-A3B, average accuracy (%) over its benchmarks, at N = 4 / 16 / 32 / 64
    "vespo": (70.0, 67.3, 64.5, 61.8),
    "grpo": (54.0, 51.1, 52.4, 48.6),
    "gspo": (59.9, 58.3, 50.0, 47.6),
    "sapo": (65.2, 50.5, 20.9, 16.5),
}
RULES = {"best_eval_acc": "best checkpoint (the paper's rule)", "final_eval_acc": "final checkpoint"}
DEGRADATION = (4, 64)
"""N from -> N to of the degradation claims (the paper's SAPO and GSPO lose more accuracy than VESPO between them)."""
SMOKE = {"num_mini_batches": (4,), "seeds": (0,), "variants": ("vespo", "grpo"), "eval_size": 10, "eval_n": 1,
         "eval_points": 1, "optimizer_steps": 4, "min_rollout_steps": 1, "ppo_mini_batch_size": 2,
         "rollout_n": 2}  # fmt: skip
"""`--smoke`: SweepConfig fields of a tiny grid (the paper regime otherwise)."""


def paper_claims() -> list[dict]:
    """Every ordering the paper's staleness table claims: VESPO above each baseline at each N, and a baseline's drop
    from N = 4 to 64 larger than VESPO's where the paper's is (the claim's sign is of `other - vespo`)."""
    claims = []
    for other in ("grpo", "gspo", "sapo"):
        for i, n in enumerate(PAPER_N):
            gap = PAPER[other][i] - PAPER["vespo"][i]
            claims.append({"claim": f"VESPO > {other.upper()} at N={n}", "other": other, "column": n,
                           "sign": int(np.sign(gap)), "paper_diff_pct": round(gap, 1)})  # fmt: skip
    drop = {m: PAPER[m][PAPER_N.index(DEGRADATION[1])] - PAPER[m][PAPER_N.index(DEGRADATION[0])] for m in PAPER}
    for other in ("grpo", "gspo", "sapo"):
        gap = drop[other] - drop["vespo"]
        if gap < 0:  # the paper's VESPO degrades less than this baseline
            text = f"{other.upper()} loses more than VESPO from N={DEGRADATION[0]} to {DEGRADATION[1]}"
            claims.append({"claim": text, "other": other, "column": drop_column(), "sign": -1,
                           "paper_diff_pct": round(gap, 1)})  # fmt: skip
    return claims


def drop_column() -> str:
    """The column name of the degradation claims: "4→64"."""
    return f"{DEGRADATION[0]}→{DEGRADATION[1]}"


def verdict(diff: float, p_adjusted: float, sign: int, alpha: float = 0.05) -> str:
    """Which side a significant difference (baseline - VESPO, after correction) favours and whether the paper's
    difference has its sign ("same sign as paper" says no more than the sign: "reproduced" would claim its size) |
    unresolved (not significant, or no difference measured). What favours VESPO never reads as a contradiction."""
    if not (math.isfinite(diff) and math.isfinite(p_adjusted)) or p_adjusted >= alpha or diff == 0:
        return "unresolved"
    side = "favours VESPO" if diff < 0 else "favours the baseline"
    return side + ("; same sign as paper" if np.sign(diff) == sign else "; opposite sign to paper")


def drop_groups(groups: dict, collapsed: dict | None) -> tuple[dict, dict | None]:
    """Per-seed change of a metric from N = 4 to 64, `{(variant, "4→64"): {seed: value(64) - value(4)}}`, and the
    collapse flags of the N = 64 cells (a collapse there makes the change bimodal: Fisher's test, as at N = 64)."""
    a, b = DEGRADATION
    out, flags = {}, {}
    for v in dict.fromkeys(v for v, _ in groups):
        if (v, a) in groups and (v, b) in groups:
            seeds = sorted(set(groups[(v, a)]) & set(groups[(v, b)]))
            out[(v, drop_column())] = {s: groups[(v, b)][s] - groups[(v, a)][s] for s in seeds}
            if collapsed is not None:
                flags[(v, drop_column())] = {s: collapsed[(v, b)][s] for s in seeds}
    return out, (flags if collapsed is not None else None)


def _diagnostics(rows: list[dict], variant: str, n: object) -> dict:
    """Means over seeds of the regime diagnostics of one cell (N of a degradation claim: its stalest, N = 64)."""
    n = DEGRADATION[1] if n == drop_column() else n
    sel = [r for r in rows if r["variant"] == variant and int(r["N"]) == n]
    out = {}
    for key, _ in DIAGNOSTICS:
        values = [float(r[key]) for r in sel if r.get(key) not in (None, "")]
        values = [x for x in values if math.isfinite(x)]
        out[key] = float(np.mean(values)) if values else None
    return out


def verdicts(rows: list[dict], alpha: float = 0.05) -> list[dict]:
    """Each paper claim under each checkpoint rule: our difference (other - vespo), its test, the Holm-adjusted p (over
    the rule's comparison table: every variant vs VESPO at every N; the degradation claims form their own table),
    the verdict, and both sides' regime diagnostics. Claims at an N this grid did not run are "not run"."""
    out = []
    for metric, rule in RULES.items():
        groups, collapsed = comparison_inputs(rows, metric)
        by = {(c.method, c.column): c for c in compare(groups, "vespo", test="auto", collapsed=collapsed)}
        drops, drop_flags = drop_groups(groups, collapsed)
        by |= {(c.method, c.column): c for c in compare(drops, "vespo", test="auto", collapsed=drop_flags)}
        for claim in paper_claims():
            c = by.get((claim["other"], claim["column"]))
            row = claim | {"rule": rule, "metric": metric}
            if c is None:
                out.append(row | {"verdict": "not run", "diff": None, "p_adjusted": None, "test": None})
                continue
            row |= {"diff": c.diff, "p_adjusted": c.p_adjusted, "test": c.test, "seeds": c.n[0], "mdd": c.mdd(alpha),
                    "collapsed": list(c.collapsed) if c.collapsed else None,
                    "verdict": verdict(c.diff, c.p_adjusted, claim["sign"], alpha)}  # fmt: skip
            for side in ("vespo", claim["other"]):
                row |= {f"{side if side == 'vespo' else 'other'}_{k}": v
                        for k, v in _diagnostics(rows, side, claim["column"]).items()}  # fmt: skip
            out.append(row)
    return out


def fmt(x: float | None, digits: int = 3) -> str:
    """`x` to `digits` significant digits; "–" when it is missing or not finite."""
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}g}"


def verdicts_markdown(found: list[dict], rows: list[dict], alpha: float = 0.05) -> str:
    """verdicts.md: how the verdicts are reached, one row per claim and checkpoint rule, and the counts per rule."""
    seeds = sorted({int(r["seed"]) for r in rows})
    lines = [
        "# The paper's staleness orderings: same sign as the paper, opposite, or unresolved",
        "",
        f"Our runs: `vespo sweep --preset paper` (docs/guides/paper.md), {len(seeds)} seeds sharing one warm start; "
        'the paper: Qwen3-30B-A3B, average accuracy (%, points), its Table "staleness"; our differences are fractions '
        f"of held-out accuracy (0-1). A verdict says which side our difference (baseline − VESPO) favours when it is "
        f"significant at alpha = {alpha} after Holm, and whether the paper's has the same sign (the sign only, not "
        "its size); unresolved otherwise. GRPO = GRPO with DAPO's "
        "clip-higher bounds (0.2, 0.28); SAPO, GSPO at their defaults.",
        "",
        "Tests (`vespo compare --test auto`, one code path): the design is paired (a seed fixes the initial policy and "
        f"the random streams of every method), so {TEST_NAMES['paired_t']} [t]; where a seed collapsed (final "
        f"held-out accuracy below half its start) the outcome is bimodal, so {TEST_NAMES['fisher']} [F]. Holm over "
        "each table: per checkpoint rule, every variant vs VESPO at every N (as in compare_vespo_*.md); the "
        f"degradation claims (change from N = {DEGRADATION[0]} to {DEGRADATION[1]}, per seed, paired) form a second "
        "table per rule. Diagnostics (means over seeds, at the claim's N; the degradation claims: N = "
        f"{DEGRADATION[1]}): clip = share of optimizer steps cut by grad_clip, KL = per-token KL(mu || pi) at the "
        "stalest mini-batch, φ̄ = VESPO's mean weight there.",
        "",
        "| claim | paper diff (pts) | rule | our diff | test | adj. p | verdict | clip (VESPO / other) | KL (VESPO / "
        "other) | φ̄ VESPO |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in found:
        if r["verdict"] == "not run":
            lines.append(f"| {r['claim']} | {r['paper_diff_pct']:+.1f} | {r['rule']} | – | – | – | not run (N not in "
                         "this grid) | – | – | – |")  # fmt: skip
            continue
        word = f"**{r['verdict']}**" if r["verdict"] != "unresolved" else f"unresolved (MDD {fmt(r.get('mdd'), 2)})"
        if r["other"] == "gspo" and r["verdict"] != "unresolved":
            word += " †"
        test = {"paired_t": "t", "fisher": "F"}.get(r["test"], r["test"])
        if r["test"] == "fisher" and r.get("collapsed"):
            test += f" (✗ {r['collapsed'][0]} vs {r['collapsed'][1]})"
        lines.append(
            f"| {r['claim']} | {r['paper_diff_pct']:+.1f} | {r['rule']} | {r['diff']:+.3f} | {test} | "
            f"{r['p_adjusted']:.3g} | {word} | {fmt(r['vespo_grad_clipped_frac'], 2)} / "
            f"{fmt(r['other_grad_clipped_frac'], 2)} | {fmt(r['vespo_kl_mu_pi_stalest'])} / "
            f"{fmt(r['other_kl_mu_pi_stalest'])} | {fmt(r['vespo_mean_phi_stalest'])} |"
        )
    counts = {}
    for r in found:
        counts.setdefault(r["rule"], {}).setdefault(r["verdict"], 0)
        counts[r["rule"]][r["verdict"]] += 1
    lines += ["", "Summary: " + "; ".join(f"{rule}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
                                          for rule, c in counts.items()) + "."]  # fmt: skip
    lines += ["", "MDD: the minimal detectable difference of an unresolved comparison, at 80% power of the paired "
              "t-test at Holm's first-step level (alpha / the family's size) with the measured SD of its paired "
              "differences: a smaller difference cannot be seen. † driven by the short responses (issue 43): at "
              "~10 tokens GSPO's length-normalised ratio spreads ~15–20× more than at the paper's lengths and its "
              "sequence clip binds on ~46–47% of tokens at N = 64 (GRPO's token clip: 1.3%); the long-response "
              "table (`vespo reproduce paper-long`) is where this ordering is tested."]  # fmt: skip
    return "\n".join(lines) + "\n"


def run(
    out: Path, seeds: list[int], jobs: int, variants: list[str], num_mini_batches: list[int], smoke: bool
) -> SweepConfig:
    """Run (or finish) the paper preset's grid in `out` (`--smoke`: `SMOKE` on a 2-step warm start cached in `out`)."""
    fields = {"seeds": tuple(seeds), "variants": tuple(variants), "num_mini_batches": tuple(num_mini_batches)}
    extra = {"tensorboard": "False"}
    if smoke:  # a 2-step warm start cached under out, not in the user's cache
        fields |= SMOKE | {"cache_dir": str(out / "cache")}
        extra |= {"sft_steps": "2"}
    cfg = preset_config("paper", out_dir=str(out), jobs=jobs, extra=extra, **fields)
    sweep(cfg)
    return cfg


COVERAGE = "Grid run here:"


def coverage(rows: list[dict]) -> str:
    """One line: which variants, N and seeds of the full preset table the results cover, and what is left to run."""
    full = resolve(SweepConfig(preset="paper"))
    ran_v = list(dict.fromkeys(r["variant"] for r in rows))
    ran_n = sorted({int(r["N"]) for r in rows})
    ran_s = sorted({int(r["seed"]) for r in rows})
    text = f"{COVERAGE} variants {', '.join(ran_v)}; N = {', '.join(map(str, ran_n))}; seeds {ran_s}."
    left = [f"variants {', '.join(v for v in PAPER_TABLE if v not in ran_v)}",
            f"N = {', '.join(str(n) for n in full.num_mini_batches if n not in ran_n)}",
            f"seeds {[x for x in full.seeds if x not in ran_s]}"]  # fmt: skip
    left = [x for x in left if not x.endswith((" ", "= ", "[]"))]
    if left:
        text += f" A subset of the preset's table; not run: {'; '.join(left)}. The same command with the full "
        text += "`--variants`/`--num-mini-batches`/`--seeds` (the defaults) runs the rest, reusing every finished cell."
    return text


def report(out: Path) -> list[dict]:
    """From out's results.csv: the coverage line atop results.md, `vespo compare`'s tables per checkpoint rule, and
    verdicts.md / .json / .csv / .png; returns the verdicts."""
    rows = load_rows(out / "results.csv", "best_eval_acc")
    results = out / "results.md"
    if results.is_file() and not results.read_text().startswith(COVERAGE):  # the sweep's tables, said what they cover
        results.write_text(coverage(rows) + "\n\n" + results.read_text())
    for metric in RULES:
        groups, collapsed = comparison_inputs(rows, metric)
        text = markdown(groups, "vespo", "auto", metric, collapsed=collapsed)
        (out / f"compare_vespo_{metric}.md").write_text(text)
    found = verdicts(rows)
    (out / "verdicts.md").write_text(verdicts_markdown(found, rows))
    (out / "verdicts.json").write_text(json.dumps(found, indent=1))
    keys = list(dict.fromkeys(k for r in found for k in r))
    with (out / "verdicts.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, restval="")
        w.writeheader()
        w.writerows(found)
    plot_verdicts(rows, out)
    return found


def plot_verdicts(rows: list[dict], out: Path) -> None:
    """verdicts.png: ours (held-out accuracy vs N, both rules, mean over seeds) beside the paper's (avg % vs N)."""
    from vespo.plots import N_AXIS, Panel, Series, category_color, panel_figure, save_figure

    names = list(dict.fromkeys(r["variant"] for r in rows))
    ns = sorted({int(r["N"]) for r in rows})
    panels = []
    for metric, rule in RULES.items():
        panel = Panel(f"ours: {rule}", N_AXIS, "held-out accuracy", bounds=(0.0, 1.0), xscale="log2", xticks=ns)
        for i, v in enumerate(names):
            y = [
                np.mean([float(r[metric]) for r in rows if r["variant"] == v and int(r["N"]) == n] or [np.nan])
                for n in ns
            ]  # an N the variant did not run breaks its line (NaN), no line drawn across it
            panel.series[v] = Series(ns, y, style={"color": category_color(i), "marker": "o"})
        panels.append(panel)
    paper = Panel("paper: Qwen3-30B-A3B", N_AXIS, "average accuracy (%)", bounds=(0.0, 100.0), xscale="log2",
                  xticks=list(PAPER_N))  # fmt: skip
    for v, ys in PAPER.items():
        i = names.index(v) if v in names else len(names) + list(PAPER).index(v)
        paper.series[v] = Series(PAPER_N, ys, style={"color": category_color(i), "marker": "s", "ls": "--"})
    save_figure(panel_figure([[*panels, paper]], panel_size=(4.2, 3.2)), out / "verdicts.png")

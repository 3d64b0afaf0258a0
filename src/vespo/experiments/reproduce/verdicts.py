"""The long table's verdicts: every planned comparison under each checkpoint rule, tested (paired t over the seeds whose
cells pass the regime gate, Holm over its family, the MDD under an unresolved one) and written as verdicts.md."""

from __future__ import annotations

import math

import numpy as np

from vespo.experiments.presets import GATES
from vespo.experiments.reproduce.paper import RULES, fmt
from vespo.experiments.reproduce.plan import (
    ALPHA,
    PRESET,
    PRIMARY,
    UNPLANNED,
    cell_values,
    comparison_cells,
    families,
    md,
)
from vespo.experiments.stats import TEST_NAMES, fisher_exact, holm, mean_ci, minimal_detectable_difference, paired_t


def _gated_seeds(rows: list[dict], cells: list[tuple[str, int]]) -> set | None:
    """Seeds whose cells (variant, N) all pass the regime gate; None when the rows carry no gate (every seed counts)."""
    if not any(r.get("gate") for r in rows):
        return None
    ok = {(r["variant"], int(r["N"]), int(r["seed"])) for r in rows if r.get("gate") == "ok"}
    seeds = {int(r["seed"]) for r in rows}
    return {s for s in seeds if all((v, n, s) in ok for v, n in cells)}


def _mixed_builds(rows: list[dict], cells: list[tuple[str, int]]) -> set:
    """Seeds whose cells (variant, N) started from different warm-start builds (`warm_start`, where recorded): such a
    pair compares two starting policies as well as two methods, so it is not a pair."""
    builds: dict[int, set] = {}
    for r in rows:
        if (r["variant"], int(r["N"])) in cells and r.get("warm_start") not in (None, ""):
            builds.setdefault(int(r["seed"]), set()).add(r["warm_start"])
    return {s for s, b in builds.items() if len(b) > 1}


def _mean(rows: list[dict], variant: str, n: int, key: str) -> float | None:
    values = [float(r[key]) for r in rows if r["variant"] == variant and int(r["N"]) == n and r.get(key) not in
              (None, "")]  # fmt: skip
    values = [v for v in values if math.isfinite(v)]
    return float(np.mean(values)) if values else None


PROBE_KEYS = ("probe_cos_grpo", "probe_cos_reinforce", "probe_cos_split_half")
DIAG_KEYS = ("log_w_std_stalest", "clip_frac_stalest", "grad_clipped_frac", *PROBE_KEYS)


def verdicts(rows: list[dict], plan: list[dict]) -> list[dict]:
    """Every planned comparison under each checkpoint rule: our difference (the signed sum of its cells, per seed,
    over the seeds whose cells all pass the gate and share one warm-start build; a fraction of held-out accuracy), its
    paired t-test with the 95% CI of the mean difference, the p-value Holm-adjusted over its family (a comparison
    without 2 gated seeds counts as p = 1 and stays in its family), the verdict and its MDD (measured SD, Holm's
    first-step level), the gate values and the probe's cosines."""
    sizes = families(plan)
    out = []
    for metric, rule in RULES.items():
        values = cell_values(rows, metric)
        found = []
        for c in plan:
            cells = comparison_cells(c)
            ran = set.intersection(*(set(values.get(k, {})) for k in cells))
            keep = _gated_seeds(rows, cells)
            mixed = _mixed_builds(rows, cells)
            seeds = sorted(s for s in ran if (keep is None or s in keep) and s not in mixed)
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
        verdict += f"<br>MDD {fmt(r['mdd'], 2)}"
    elif bold and r["test"] and r["p_adjusted"] < ALPHA:
        verdict = f"**{verdict}**"
    paper = f"{r['paper_diff_pct']:+.1f}" if "paper_diff_pct" in r else "–"
    ci = f" [{fmt(r['ci_low'], 2)}, {fmt(r['ci_high'], 2)}]" if math.isfinite(r["ci_low"]) else ""
    if r.get("by_warm_start"):
        ci += "<br>by SFT seed: " + ", ".join(f"{k}: {fmt(x)}" for k, x in r["by_warm_start"].items())
    rule = md(r["rule"]) + ("" if r["primary"] else " (secondary)")
    same_as_grpo = r["other"] == "grpo"  # GRPO's gradient against itself: 1 by construction, not shown

    def pair(key: str, digits: int = 2) -> str:
        other = "–" if same_as_grpo and key == "probe_cos_grpo" else fmt(r[f"other_{key}"], digits)
        return f"{fmt(r[f'vespo_{key}'], digits)} / {other}"

    collapsed = f"{r['collapsed_vespo']} / {r['collapsed_other']}"
    collapsed += f", p = {fmt(r['fisher_p'], 2)}" if math.isfinite(r["fisher_p"]) else ""
    return (f"| {md(r['name'])} | {paper} | {rule} | {fmt(r['diff'])}{ci} | {r['seeds']} of {r['seeds_run']} | "
            f"{fmt(r['p_adjusted'])} ({r['family_m']}) | {verdict} | {md(r.get('caveat', '')) or '–'} | {collapsed} | "
            f"{pair('log_w_std_stalest')} | {fmt(r['other_clip_frac_stalest'], 2)} | {pair('grad_clipped_frac')} | "
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

"""Why does TOPR beat VESPO at N = 64 on the arithmetic task? A 2x2 (+ lr arm) that tells the explanations apart.

One command: `python benchmarks/bench_topr_discriminator.py [--seeds 0 1 2 3 4] [--jobs 1]` runs `vespo sweep` at
N = 64 on the arithmetic task (staleness_v3's cell: 4 prompts x 8 responses per optimizer step, 256 optimizer steps
= 4 rollout steps, lr 3e-4) in three arms, every arm over the same seeds (one warm start, shared random streams):

- `clip1`: grad_clip 1.0 (the default) — vespo, vespo-unitpos (VESPO with TOPR's weight 1 on A >= 0, phi(W) kept on
  A < 0: `positive_weight="one"`) and topr-tokenmean (the TOPR the VESPO paper compared against);
- `noclip`: vespo and vespo-unitpos with grad_clip 1e9 (never binds): with `clip1`, the 2x2;
- `lr1e-4`: vespo and topr-tokenmean at lr 1e-4 with 3x the optimizer steps (768 = 12 rollout steps; more samples).

Three explanations, each with its test: (1) TOPR's weight 1 on stale positives: vespo-unitpos beats vespo and
closes the gap to TOPR, with and without clipping; (2) the clipping confound: VESPO's deficit (to vespo-unitpos)
changes or goes away without grad_clip (TOPR itself runs with clipping only: the CPU budget); (3) the lr: TOPR's win
goes away at lr 1e-4. Tests (`vespo.experiments.stats.compare`, test per
comparison by design): paired t over the seeds (a seed fixes warm start and streams), Fisher's exact test on collapse
counts where a seed collapsed (final checkpoint); Holm over every comparison of a checkpoint rule. Both rules: the
final checkpoint and the best one (the paper's). Writes benchmarks/results/topr_discriminator/{results.md,
results.csv,comparisons.json,discriminator.png}; the sweeps' cells/ are not committed.
`--smoke --out-dir DIR`: vespo and vespo-unitpos of the clip1 arm at N = 2, one seed, 2 optimizer steps on a 2-step
warm start built in DIR (CI). `--report-only --out-dir DIR` rewrites the report from DIR/results.csv.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

import numpy as np

from vespo.experiments.compare import DIAGNOSTICS, DIAGNOSTICS_NOTE
from vespo.experiments.stats import TEST_NAMES, compare, format_ci, holm, paired_bootstrap_ci

OUT = Path("benchmarks/results/topr_discriminator")
VARIANTS = ("vespo", "vespo-unitpos", "topr-tokenmean")
ARMS = {  # arm -> (variants, lr, optimizer_steps, extra `vespo train` flags)
    "clip1": (VARIANTS, 3e-4, 192, {"grad_clip": "1.0"}),
    "noclip": (("vespo", "vespo-unitpos"), 3e-4, 192, {"grad_clip": "1e9"}),
    "lr1e-4": (("vespo", "topr-tokenmean"), 1e-4, 768, {"grad_clip": "1.0"}),
}
"""192 optimizer steps run as 256 at N = 64 (min_rollout_steps = 4), as in staleness_v3; 768 = 3 x 256."""
SMOKE = {"num_mini_batches": (2,), "eval_size": 10, "eval_n": 1, "eval_points": 1, "optimizer_steps": 2,
         "min_rollout_steps": 1, "ppo_mini_batch_size": 2, "rollout_n": 2}  # fmt: skip
"""`--smoke`: SweepConfig fields of a tiny cell."""
KEEP = ("final_eval_acc", "best_eval_acc", "initial_eval_acc", "collapsed", "final_train_reward")
RULES = (("final_eval_acc", "final checkpoint"), ("best_eval_acc", "best checkpoint (the paper's rule)"))


def run(
    seeds: list[int],
    jobs: int,
    root: Path = OUT,
    smoke: bool = False,
    lr_seeds: list[int] | None = None,
    arms: list[str] | None = None,
) -> list[dict]:
    """One sweep per arm under root/grid_<arm> (the lr arm over `lr_seeds`, default `seeds`); one row per cell."""
    from vespo.experiments.sweep import SweepConfig, sweep

    common = dict(num_mini_batches=(64,), seeds=tuple(seeds), eval_size=500, eval_n=4, eval_points=4, jobs=jobs)
    tiny: dict[str, str] = {}
    if smoke:  # a 2-step warm start cached under root, not in the user's cache
        common = common | SMOKE | {"cache_dir": str(root / "cache")}
        tiny = {"sft_steps": "2", "max_response_length": "8"}
    rows = []
    for arm, (methods, lr, steps, extra) in ARMS.items():
        if arms and arm not in arms:
            continue
        if smoke and arm != "clip1":  # the smoke run: two cells of one arm
            continue
        if smoke:
            methods, steps = methods[:2], 2
        if arm == "lr1e-4" and lr_seeds and not smoke:
            common = common | {"seeds": tuple(lr_seeds)}
        fields = common | {"optimizer_steps": steps, "extra": {"tensorboard": "False"} | extra | tiny}
        cfg = SweepConfig(out_dir=str(root / f"grid_{arm}"), methods=methods, lr=(lr,), **fields)
        for s in sweep(cfg):
            row = {"arm": arm, "variant": s["variant"], "N": s["N"], "seed": s["seed"], "lr": lr}
            row |= {k: s.get(k) for k in KEEP} | {k: s.get(k) for k, _ in DIAGNOSTICS}
            rows.append(row)
    return rows


def collect(root: Path) -> list[dict]:
    """The rows of every finished arm, from each arm's sweep results.csv (arms run as separate commands)."""
    rows = []
    for arm, (_, lr, _, _) in ARMS.items():
        path = root / f"grid_{arm}" / "results.csv"
        for s in csv.DictReader(path.open(newline="")) if path.is_file() else []:
            row = {"arm": arm, "variant": s["variant"], "N": int(s["N"]), "seed": int(s["seed"]), "lr": lr}
            rows.append(row | {k: s.get(k) for k in KEEP} | {k: s.get(k) for k, _ in DIAGNOSTICS})
    return rows


def _num(x) -> float:
    return math.nan if x in (None, "") else float(x)


def comparisons(rows: list[dict], metric: str) -> list[dict]:
    """The discriminating contrasts on `metric`, each by `stats.compare` (test chosen per comparison by design),
    Holm over all of them together."""
    by: dict[tuple[str, str], dict[int, float]] = {}
    flags: dict[tuple[str, str], dict[int, bool]] | None = {} if metric == "final_eval_acc" else None
    for r in rows:
        key, seed = (r["arm"], r["variant"]), int(r["seed"])
        by.setdefault(key, {})[seed] = _num(r[metric])
        if flags is not None:
            flags.setdefault(key, {})[seed] = str(r["collapsed"]) in ("True", "1")
    out = []

    def add(family: str, pairs: list[tuple[tuple[str, str], tuple[str, str]]]) -> None:
        for a_key, b_key in pairs:  # a - b
            if a_key not in by or b_key not in by:
                continue
            seeds = sorted(set(by[a_key]) & set(by[b_key]))  # paired over the seeds both sides ran
            groups = {("a", 0): {s: by[a_key][s] for s in seeds}, ("b", 0): {s: by[b_key][s] for s in seeds}}
            col = None
            if flags is not None:
                col = {("a", 0): {s: flags[a_key][s] for s in seeds}, ("b", 0): {s: flags[b_key][s] for s in seeds}}
            (c,) = compare(groups, "b", test="auto", collapsed=col)
            d, lo, hi = paired_bootstrap_ci([by[a_key][s] for s in seeds], [by[b_key][s] for s in seeds])
            out.append({"family": family, "a": "/".join(a_key), "b": "/".join(b_key), "diff": c.diff, "p": c.p,
                        "test": c.test, "collapsed": c.collapsed, "ci": (lo, hi), "n": len(seeds)})  # fmt: skip

    arms = ("clip1", "noclip")
    add("(1) weight 1 on stale positives", [((a, "vespo-unitpos"), (a, "vespo")) for a in arms])
    add("(1) what is left between TOPR and unitpos", [((a, "topr-tokenmean"), (a, "vespo-unitpos")) for a in arms])
    add("TOPR vs VESPO", [((a, "topr-tokenmean"), (a, "vespo")) for a in (*arms, "lr1e-4")])
    add("(2) clipping: grad_clip off - on", [(("noclip", v), ("clip1", v)) for v in VARIANTS])
    add("(3) lr 1e-4 (3x steps) - lr 3e-4", [(("lr1e-4", v), ("clip1", v)) for v in ("vespo", "topr-tokenmean")])
    for c, q in zip(out, holm([c["p"] for c in out]) if out else [], strict=True):
        c["p_holm"] = q
    return out


def report(rows: list[dict], out: Path = OUT, command: str = "") -> str:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    keys = list(dict.fromkeys((r["arm"], r["variant"]) for r in rows))
    sel = {k: [r for r in rows if (r["arm"], r["variant"]) == k] for k in keys}
    n_seeds = len({r["seed"] for r in rows})
    init = init_here = [_num(r["initial_eval_acc"]) for r in rows]
    text = [
        "# TOPR vs VESPO at N = 64 (arithmetic task): which explanation survives",
        "",
        f"Command: `{command or 'python benchmarks/bench_topr_discriminator.py'}`. {n_seeds} seeds per cell, every arm"
        " on the same seeds (one warm start and shared random streams per seed: the design is paired). Held-out "
        "accuracy avg@4 on 500 prompts at 4 points + step 0; 4 x 8 responses per optimizer step; 256 optimizer steps "
        "(lr1e-4: 768). `vespo-unitpos` = VESPO with weight 1 on A >= 0 (TOPR's) and phi(W) on A < 0.",
        "",
        f"Noise floor: warm start {np.nanmean(init):.3f}; one evaluation's binomial SD <= "
        f"{0.5 / math.sqrt(2000):.3f} (2,000 samples).",
        "",
        "| arm | variant | final acc | best acc | ✗ collapsed | "
        + " | ".join(label for _, label in DIAGNOSTICS)
        + " |",
        "|---" * (5 + len(DIAGNOSTICS)) + "|",
    ]
    for k in keys:
        rs = sel[k]
        diag = [f"{np.nanmean([_num(r[d]) for r in rs]):.3g}" for d, _ in DIAGNOSTICS]
        ncol = sum(str(r["collapsed"]) in ("True", "1") for r in rs)
        text.append(
            f"| {k[0]} | {k[1]} | {format_ci([_num(r['final_eval_acc']) for r in rs])} | "
            f"{format_ci([_num(r['best_eval_acc']) for r in rs])} | {ncol}/{len(rs)} | " + " | ".join(diag) + " |"
        )
    text += ["", "Diagnostics: " + DIAGNOSTICS_NOTE + " (means over seeds).", ""]
    v3 = Path("benchmarks/results/staleness_v3/results.csv")
    if v3.is_file():  # the committed evidence this discriminates, for the reader to set beside the table
        ref = [r for r in csv.DictReader(v3.open(newline="")) if r["N"] == "64"]
        acc = {v: np.mean([float(r["final_eval_acc"]) for r in ref if r["variant"] == v]) for v in VARIANTS}
        init = np.mean([float(r["initial_eval_acc"]) for r in ref])
        if not any(math.isnan(acc[v]) for v in ("vespo", "topr-tokenmean")):
            text += [
                f"Reference, staleness_v3 at N = 64 (final checkpoint, its own warm start at {init:.3f}): vespo "
                f"{acc['vespo']:.3f}, topr-tokenmean {acc['topr-tokenmean']:.3f} (TOPR − VESPO "
                f"{acc['topr-tokenmean'] - acc['vespo']:+.3f}). This run's warm start scores "
                f"{np.nanmean(init_here):.3f}: a different warm start, so compare the contrasts below, not the levels.",
                "",
            ]
    result = {}
    for metric, rule in RULES:
        cs = comparisons(rows, metric)
        result[metric] = cs
        text += [
            f"## Contrasts, {rule}",
            "",
            "Test per comparison, by design: paired t-test over the shared seeds [t]; where a seed collapsed (final "
            "checkpoint only) Fisher's exact test on collapse counts [F], since the outcome is then bimodal. "
            f"Two-sided, Holm-corrected over the {len(cs)} contrasts of this rule; 95% CI = paired bootstrap of the "
            "mean difference. **Bold** = adjusted p < 0.05; nothing else is bold.",
            "",
            "| family | a − b | diff | 95% CI | test | p (Holm) |",
            "|---|---|---|---|---|---|",
        ]
        for c in cs:
            tag = {"paired_t": "t", "fisher": "F", "welch": "Welch"}.get(c["test"], c["test"])
            if c["test"] == "fisher" and c["collapsed"]:
                tag += f" ✗{c['collapsed'][0]}/{c['n']} vs {c['collapsed'][1]}/{c['n']}"
            p = f"{c['p_holm']:.3g}"
            line = f"{c['diff']:+.3f}"
            if c["p_holm"] < 0.05:
                line, p = f"**{line}**", f"**{p}**"
            text.append(
                f"| {c['family']} | {c['a']} − {c['b']} | {line} | [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}] | {tag} "
                f"| {p} |"
            )
        text += ["", *verdict(cs, rule), ""]
    text.append("Tests: " + "; ".join(f"[{k}] {v}" for k, v in (("t", TEST_NAMES["paired_t"]),
                                                                    ("F", TEST_NAMES["fisher"])))  + ".")  # fmt: skip
    (out / "results.md").write_text("\n".join(text) + "\n")
    (out / "comparisons.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    _plot(rows, keys, out)
    return "\n".join(text)


def verdict(cs: list[dict], rule: str) -> list[str]:
    """One line per explanation, read off the Holm-adjusted contrasts (alpha 0.05)."""
    get = {(c["a"], c["b"]): c for c in cs}

    def says(a: str, b: str) -> str:
        c = get.get((a, b))
        if c is None:
            return "not run"
        sig = c["p_holm"] < 0.05
        return f"{c['diff']:+.3f} (p={c['p_holm']:.2g}{', significant' if sig else ', not significant'})"

    return [
        f"Verdict ({rule}):",
        f"- (1) weight 1 on stale positives: unitpos − vespo = {says('clip1/vespo-unitpos', 'clip1/vespo')} with "
        f"clipping, {says('noclip/vespo-unitpos', 'noclip/vespo')} without; TOPR − unitpos (clipped) = "
        f"{says('clip1/topr-tokenmean', 'clip1/vespo-unitpos')}.",
        f"- (2) clipping confound: grad_clip off − on = {says('noclip/vespo', 'clip1/vespo')} for vespo, "
        f"{says('noclip/vespo-unitpos', 'clip1/vespo-unitpos')} for vespo-unitpos; TOPR − VESPO (clipped) = "
        f"{says('clip1/topr-tokenmean', 'clip1/vespo')}.",
        f"- (3) lr: TOPR − VESPO at lr 1e-4 (3x steps) = {says('lr1e-4/topr-tokenmean', 'lr1e-4/vespo')}"
        " (the lr arm's seeds only: an observation when fewer than 5; it also draws 3x the samples).",
    ]


def _plot(rows: list[dict], keys: list[tuple[str, str]], out: Path) -> None:
    from vespo.plots import Panel, Series, category_color, panel_figure, save_figure

    panels = []
    for metric, rule in RULES:
        panel = Panel(rule, "arm / variant", "held-out accuracy", bounds=(0.0, 1.0))
        for i, v in enumerate(VARIANTS):
            xs, ys = [], []
            for j, k in enumerate(keys):
                if k[1] == v:
                    vals = [_num(r[metric]) for r in rows if (r["arm"], r["variant"]) == k]
                    xs += [j + 0.04 * (s - len(vals) / 2) for s in range(len(vals))]
                    ys += vals
            panel.series[v] = Series(xs, ys, style={"color": category_color(i), "ls": "none", "marker": "o", "ms": 4})
        panels.append(panel)
    fig = panel_figure([panels], title="N = 64, one dot per seed", panel_size=(5.5, 3.6))
    for ax in fig.axes[:2]:
        ax.set_xticks(range(len(keys)), [f"{a}\n{v.replace('topr-tokenmean', 'topr-tm')}" for a, v in keys], fontsize=6)
    save_figure(fig, out / "discriminator.png")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--lr-seeds", type=int, nargs="+", help="seeds of the lr1e-4 arm (default: --seeds)")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--out-dir", type=Path, default=OUT, help="where the sweeps and results go")
    p.add_argument("--smoke", action="store_true", help="tiny cells, in seconds (CI)")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), help="run only these arms (default: all)")
    p.add_argument("--report-only", action="store_true",
                   help="rewrite the report from the finished arms' OUT_DIR/grid_*/results.csv")  # fmt: skip
    args = p.parse_args()
    if args.report_only:
        rows = collect(args.out_dir)
    else:
        rows = run([0] if args.smoke else args.seeds, args.jobs, args.out_dir, args.smoke, args.lr_seeds, args.arms)
    cmd = "python benchmarks/bench_topr_discriminator.py" + (f" --seeds {' '.join(map(str, args.seeds))}")
    cmd += f" --lr-seeds {' '.join(map(str, args.lr_seeds))}" if args.lr_seeds else ""
    print(report(rows, args.out_dir, cmd))

"""Step-size controls for stale mini-batches against plain VESPO, each beside the plain lr of nearest step size.

One command: `python benchmarks/bench_step_controls.py [--seeds 0 1 2 3 4] [--jobs 2]` runs `vespo sweep` on the
arithmetic task at N in {8, 32}: plain VESPO at lr 9e-4 (3x the default, where it collapsed in the lr grid), 3e-4
and 1e-4, and VESPO at 9e-4 with `step_scale=mean_phi` and with `target_kl=0.02`, every cell logging its update
norm. It writes benchmarks/results/step_controls/{results.md,controls.csv,controls.png}: per variant and N the
held-out accuracy (mean ± 95% CI over seeds) and the mean update norm per optimizer step, and for each control the
plain-VESPO learning rate whose mean update norm is nearest, with the ratio of the two norms (the step sizes are not
matched: target-KL's update norms are 1.5-3.6x the nearest plain arm's). Tests fit the design: every cell shares
the warm start and a seed fixes every arm's random streams, so a control and a plain arm are paired over seeds
(paired t-test); where a seed collapsed (final accuracy < 0.5 x initial) the outcome is bimodal and the test is
Fisher's exact test on collapsed seeds (`vespo.experiments.stats.compare`); Holm over each table (final and best
checkpoint). Beyond the paper; reported whichever way it goes. `--report-only` rewrites the report from
controls.csv alone (the grids' sweep directories are not committed).
`--smoke --out-dir DIR`: one lr and one control (mean_phi) at N = 2, one seed, 2 optimizer steps of 2 prompts x 2 on
a 2-step warm start built in DIR (CI; each cell is a `vespo train` process).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

from vespo.experiments.stats import TEST_NAMES, compare, format_ci
from vespo.experiments.sweep import SweepConfig, cells, sweep

OUT = Path("benchmarks/results/step_controls")
LRS = (9e-4, 3e-4, 1e-4)
CONTROLS = {"vespo-meanphi": {"step_scale": "mean_phi"}, "vespo-targetkl": {"target_kl": "0.02"}}


def _update_norm(cell_dir: Path) -> float:
    rows = [json.loads(line) for line in (cell_dir / "metrics.jsonl").read_text().splitlines() if line]
    return float(np.mean([r["actor/update_norm"] for r in rows if "actor/update_norm" in r]))


SMOKE = {"num_mini_batches": (2,), "eval_size": 10, "eval_n": 1, "eval_points": 1, "optimizer_steps": 2,
         "min_rollout_steps": 1, "ppo_mini_batch_size": 2, "rollout_n": 2}  # fmt: skip
"""`--smoke`: SweepConfig fields of a tiny cell."""


def run(seeds: list[int], jobs: int, root: Path = OUT, smoke: bool = False) -> list[dict]:
    """The plain-VESPO lr grid and the two controls at the high lr, as sweeps under root/grid_*."""
    common = dict(num_mini_batches=(8, 32), seeds=tuple(seeds), eval_size=500, eval_n=4, jobs=jobs)
    lrs_plain, controls, tiny = LRS, CONTROLS, {}
    if smoke:  # one plain lr, one control; a 2-step warm start cached under root, not in the user's cache
        common, lrs_plain = common | SMOKE | {"cache_dir": str(root / "cache")}, LRS[:1]
        controls, tiny = dict(list(CONTROLS.items())[:1]), {"sft_steps": "2", "max_response_length": "8"}
    rows = []
    runs = {"plain": (("vespo",), lrs_plain, {})} | {name: (("vespo",), (LRS[0],), s) for name, s in controls.items()}
    for name, (methods, lrs, settings) in runs.items():
        out = root / f"grid_{name}"
        extra = {"log_update_norm": "True", "tensorboard": "False"} | settings | tiny
        cfg = SweepConfig(out_dir=str(out), methods=methods, lr=lrs, extra=extra, **common)
        for c, s in zip(cells(cfg), sweep(cfg), strict=True):  # summaries come back in grid order
            label = f"vespo@lr{c.lr:g}" if name == "plain" else name  # plain rows are vespo@lr<value>
            cell = out / "cells" / c.name
            rows.append({"variant": label, "N": s["N"], "seed": s["seed"], "final_eval_acc": s["final_eval_acc"],
                         "best_eval_acc": s["best_eval_acc"], "update_norm": _update_norm(cell),
                         "collapsed": s["collapsed"]})  # fmt: skip
    return rows


def _load(out: Path) -> list[dict]:
    """controls.csv rows, numbers parsed."""
    rows = list(csv.DictReader((out / "controls.csv").open(newline="")))
    for r in rows:
        for k in ("final_eval_acc", "best_eval_acc", "update_norm"):
            r[k] = float(r[k])
        r["N"], r["seed"] = int(r["N"]), int(r["seed"])
    return rows


def report(rows: list[dict], out: Path = OUT) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "controls.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    ns = sorted({r["N"] for r in rows})
    sel = {(v, n): [r for r in rows if r["variant"] == v and r["N"] == n] for v in variants for n in ns}
    lines = ["| variant | " + " | ".join(f"N={n}: held-out acc | N={n}: update norm" for n in ns) + " |"]
    lines.append("|---" * (2 * len(ns) + 1) + "|")
    for v in variants:
        cells = []
        for n in ns:
            rs = sel[(v, n)]
            cells += [format_ci([r["final_eval_acc"] for r in rs]), format_ci([r["update_norm"] for r in rs], 4)]
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    # nearest step size: for each control and N, the plain lr whose mean update norm is closest (log scale)
    nearest, pairs = [], []
    for n in ns:
        plain = {v: np.mean([r["update_norm"] for r in sel[(v, n)]]) for v in variants if v.startswith("vespo@lr")}
        for control in CONTROLS:
            if not sel.get((control, n)):
                continue
            norm = np.mean([r["update_norm"] for r in sel[(control, n)]])
            match = min(plain, key=lambda v: abs(np.log(plain[v] / norm)))
            nearest.append(f"N={n}: {control} mean update norm {norm:.4g}, nearest plain arm {match} "
                           f"({plain[match]:.4g}; ratio {norm / plain[match]:.2f})")  # fmt: skip
            pairs.append((n, control, match))
    text = [
        "# Step-size controls vs plain VESPO (arithmetic task; mean ± 95% CI over seeds)",
        "",
        *lines,
        "",
        "Nearest step size (not matched: a ratio far from 1 means the control's steps are larger or smaller than the "
        "plain arm it is compared with): " + "; ".join(nearest) + ".",
        "",
    ]
    has_flags = all(r.get("collapsed") not in (None, "") for r in rows)
    for metric, rule in (("final_eval_acc", "final checkpoint"), ("best_eval_acc", "best checkpoint")):
        raw = []
        for n, control, match in pairs:
            groups = {(v, n): {int(r["seed"]): float(r[metric]) for r in sel[(v, n)]} for v in (control, match)}
            flags = None
            if metric == "final_eval_acc" and has_flags:  # the best checkpoint precedes a collapse: no flags
                flags = {(v, n): {int(r["seed"]): str(r["collapsed"]) in ("True", "1") for r in sel[(v, n)]}
                         for v in (control, match)}  # fmt: skip
            (c,) = compare(groups, match, test="auto", collapsed=flags)
            raw.append((n, control, match, c))
        from vespo.experiments.stats import holm

        adjusted = holm([c.p for *_, c in raw]) if raw else []
        text += [
            f"{rule.capitalize()}, each control vs the plain-VESPO lr of nearest step size: the test the design "
            "calls for (one warm start, a seed fixes every arm's streams: paired t-test over the seeds; where a seed "
            "collapsed, Fisher's exact test on collapsed seeds, since the outcome is then bimodal), two-sided, "
            f"Holm-corrected over the {len(raw)} comparisons; bold = adjusted p < 0.05:",
            "",
        ]
        for (n, control, match, c), q in zip(raw, adjusted, strict=True):
            what = TEST_NAMES[c.test] + (f", collapsed {c.collapsed[0]}/{c.n[0]} vs {c.collapsed[1]}/{c.n[1]}"
                                         if c.test == "fisher" else "")  # fmt: skip
            line = f"N={n}: {control} − {match} = {c.diff:+.3f}, adjusted p = {q:.3g} ({what})"
            text.append(f"- **{line}**" if q < 0.05 else f"- {line}")
        text.append("")
    (out / "results.md").write_text("\n".join(text) + "\n")
    _plot(rows, variants, ns, out)


def _plot(rows, variants, ns, out: Path) -> None:
    from vespo.plots import Panel, Series, panel_figure, save_figure

    panels = []
    for n in ns:
        panel = Panel(f"N = {n}", "mean update norm per optimizer step", "final held-out accuracy", bounds=(0.0, 1.0))
        panel.xscale = "log"
        for i, v in enumerate(variants):
            rs = [r for r in rows if r["variant"] == v and r["N"] == n]
            if rs:
                x, y = [r["update_norm"] for r in rs], [r["final_eval_acc"] for r in rs]
                panel.series[v] = Series(x, y, style={"color": f"C{i}", "ls": "none", "marker": "o", "ms": 4})
        panels.append(panel)
    save_figure(panel_figure([panels], panel_size=(5, 3.8)), out / "controls.png")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out-dir", type=Path, default=OUT, help="where the sweeps and results go")
    p.add_argument("--smoke", action="store_true", help="three tiny cells, in seconds (CI)")
    p.add_argument("--report-only", action="store_true", help="rewrite the report from OUT_DIR/controls.csv")
    args = p.parse_args()
    if args.report_only:
        report(_load(args.out_dir), args.out_dir)
    else:
        report(run([0] if args.smoke else args.seeds, args.jobs, args.out_dir, args.smoke), args.out_dir)
    print((args.out_dir / "results.md").read_text())

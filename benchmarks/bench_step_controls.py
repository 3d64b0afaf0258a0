"""Step-size controls for stale mini-batches against plain VESPO at a lower learning rate, at matched step size.

One command: `python benchmarks/bench_step_controls.py [--seeds 0 1 2 3 4] [--jobs 2]` runs `vespo sweep` on the
arithmetic task at N in {8, 32}: plain VESPO at lr 9e-4 (3x the default, where it collapsed in the lr grid), 3e-4
and 1e-4, and VESPO at 9e-4 with `step_scale=mean_phi` and with `target_kl=0.02`, every cell logging its update
norm. It writes benchmarks/results/step_controls/{results.md,comparison.md,controls.csv,controls.png}: per variant
and N the held-out accuracy (mean ± 95% CI over seeds) and the mean update norm per optimizer step, and for each
control the plain-VESPO learning rate whose mean update norm is closest (the matched-step-size control), compared
by Welch's t-test with Holm's correction over all comparisons. Beyond the paper; reported whichever way it goes.
`--smoke --out-dir DIR`: one lr and one control (mean_phi) at N = 2, one seed, 2 optimizer steps of 2 prompts x 2 on
a 2-step warm start built in DIR (CI; each cell is a `vespo train` process).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

from vespo.experiments.stats import format_ci, holm, welch
from vespo.experiments.sweep import SweepConfig, cells, sweep

OUT = Path("benchmarks/results/step_controls")
LRS = (9e-4, 3e-4, 1e-4)
CONTROLS = {"vespo-meanphi": {"step_scale": "mean_phi"}, "vespo-targetkl": {"target_kl": "0.02"}}


def _update_norm(cell_dir: Path) -> float:
    rows = [json.loads(line) for line in (cell_dir / "metrics.jsonl").read_text().splitlines() if line]
    return float(np.mean([r["actor/update_norm"] for r in rows if "actor/update_norm" in r]))


SMOKE = {"staleness": (2,), "eval_size": 10, "eval_n": 1, "eval_points": 1, "optimizer_steps": 2,
         "min_rollout_steps": 1, "ppo_mini_batch_size": 2, "rollout_n": 2}  # fmt: skip
"""`--smoke`: SweepConfig fields of a tiny cell."""


def run(seeds: list[int], jobs: int, root: Path = OUT, smoke: bool = False) -> list[dict]:
    """The plain-VESPO lr grid and the two controls at the high lr, as sweeps under root/grid_*."""
    common = dict(staleness=(8, 32), seeds=tuple(seeds), eval_size=500, eval_n=4, jobs=jobs)
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
                         "best_eval_acc": s["best_eval_acc"], "update_norm": _update_norm(cell)})  # fmt: skip
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
    # matched step size: for each control and N, the plain lr whose mean update norm is closest (log scale)
    matched, tests = [], []
    for n in ns:
        plain = {v: np.mean([r["update_norm"] for r in sel[(v, n)]]) for v in variants if v.startswith("vespo@lr")}
        for control in CONTROLS:
            if not sel.get((control, n)):
                continue
            norm = np.mean([r["update_norm"] for r in sel[(control, n)]])
            match = min(plain, key=lambda v: abs(np.log(plain[v] / norm)))
            matched.append(f"N={n}: {control} mean update norm {norm:.4g} is matched by {match} ({plain[match]:.4g})")
            a = [r["final_eval_acc"] for r in sel[(control, n)]]
            b = [r["final_eval_acc"] for r in sel[(match, n)]]
            tests.append((n, control, match, float(np.mean(a) - np.mean(b)), welch(a, b)))
    adjusted = holm([p for *_, p in tests]) if tests else []
    text = [
        "# Step-size controls vs plain VESPO at a lower lr (arithmetic task; mean ± 95% CI over seeds)",
        "",
        *lines,
        "",
        "Matched step size: " + "; ".join(matched) + ".",
        "",
        f"Welch's t-test, each control vs its matched plain-VESPO lr on final held-out accuracy ({len(tests)} "
        "comparisons, two-sided, Holm-corrected; bold = adjusted p < 0.05):",
        "",
    ]
    for (n, control, match, diff, _), q in zip(tests, adjusted, strict=True):
        line = f"N={n}: {control} − {match} = {diff:+.3f}, adjusted p = {q:.3g}"
        text.append(f"- **{line}**" if q < 0.05 else f"- {line}")
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
    args = p.parse_args()
    report(run([0] if args.smoke else args.seeds, args.jobs, args.out_dir, args.smoke), args.out_dir)
    print((args.out_dir / "results.md").read_text())

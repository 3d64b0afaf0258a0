"""Step-size controls for stale mini-batches against plain VESPO at a lower learning rate, at matched step size.

One command: `python benchmarks/bench_step_controls.py [--seeds 0 1 2 3 4] [--jobs 2]` runs `vespo sweep` on the
arithmetic task at N in {8, 32}: plain VESPO at lr 9e-4 (3x the default, where it collapsed in the lr grid), 3e-4
and 1e-4, and VESPO at 9e-4 with `step_scale=mean_phi` and with `target_kl=0.02`, every cell logging its update
norm. It writes benchmarks/results/step_controls/{results.md,comparison.md,controls.csv,controls.png}: per variant
and N the held-out accuracy (mean ± 95% CI over seeds) and the mean update norm per optimizer step, and for each
control the plain-VESPO learning rate whose mean update norm is closest (the matched-step-size control), compared
by Welch's t-test with Holm's correction over all comparisons. Beyond the paper; reported whichever way it goes.
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


def run(seeds: list[int], jobs: int) -> list[dict]:
    """The plain-VESPO lr grid and the two controls at the high lr, as sweeps under OUT/grid_*."""
    common = dict(staleness=(8, 32), seeds=tuple(seeds), eval_size=500, eval_n=4, jobs=jobs)
    rows = []
    runs = {"plain": (("vespo",), LRS, {})} | {name: (("vespo",), (LRS[0],), s) for name, s in CONTROLS.items()}
    for name, (methods, lrs, settings) in runs.items():
        out = OUT / f"grid_{name}"
        extra = {"log_update_norm": "True", "tensorboard": "False"} | settings
        cfg = SweepConfig(out_dir=str(out), methods=methods, lr=lrs, extra=extra, **common)
        for c, s in zip(cells(cfg), sweep(cfg), strict=True):  # summaries come back in grid order
            label = s["variant"] if name == "plain" else name  # plain rows are vespo@lr<value>
            cell = out / "cells" / c.name
            rows.append({"variant": label, "N": s["N"], "seed": s["seed"], "final_eval_acc": s["final_eval_acc"],
                         "best_eval_acc": s["best_eval_acc"], "update_norm": _update_norm(cell)})  # fmt: skip
    return rows


def report(rows: list[dict]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "controls.csv").open("w", newline="") as f:
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
    (OUT / "results.md").write_text("\n".join(text) + "\n")
    _plot(rows, variants, ns)


def _plot(rows, variants, ns) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ns), figsize=(5 * len(ns), 3.8), squeeze=False)
    for ax, n in zip(axes[0], ns, strict=True):
        for i, v in enumerate(variants):
            rs = [r for r in rows if r["variant"] == v and r["N"] == n]
            if rs:
                x, y = [r["update_norm"] for r in rs], [r["final_eval_acc"] for r in rs]
                ax.scatter(x, y, label=v, color=f"C{i}", s=18)
        ax.set(xscale="log", xlabel="mean update norm per optimizer step", ylabel="final held-out accuracy",
               title=f"N = {n}")  # fmt: skip
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT / "controls.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args()
    report(run(args.seeds, args.jobs))
    print((OUT / "results.md").read_text())

"""Issue 13's goal on the lab grid: does an adaptive VESPO variant never collapse and match every baseline at N >= 16?

One command (after the grid, ~15 min of one CPU core):
`vespo lab --preset v1 --methods vespo grpo topr vespo_moment vespo_ess vespo_selfnorm vespo_schedule --length 64 1024
--num-mini-batches 1 4 16 64 --lr-scale 0.3333333333333333 1 3 --seeds 0 1 2 --jobs 1
--out-dir benchmarks/results/adaptive/lab_grid && python benchmarks/bench_adaptive_goal.py`
reads lab_grid/results.csv and mechanism.csv and writes goal.md, goal.csv and goal.png beside them: per variant
and cell, the seed-mean final expected reward minus the best baseline's (GRPO, TOPR), collapses, and the mechanism
metrics of the stalest mini-batch (k = N - 1) that explain a loss. `python benchmarks/bench_adaptive_goal.py [DIR]`
reads another grid directory; `--smoke --out-dir DIR` runs a tiny lab grid (the same methods, T = 8, N in {1, 16},
one seed) into DIR/lab_grid and reads that, in seconds.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

DIR = Path(__file__).parent / "results" / "adaptive" / "lab_grid"
BASELINES = ("grpo", "topr")
VARIANTS = ("vespo", "vespo_moment", "vespo_ess", "vespo_selfnorm", "vespo_schedule")
TOL = 0.01  # "at least as good": within 0.01 of the best baseline's seed mean (seed std is <= ~0.01 in this lab)


def _read(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def main(directory: Path = DIR) -> None:
    results, mech = _read(directory / "results.csv"), _read(directory / "mechanism.csv")
    final, collapsed = defaultdict(list), defaultdict(int)
    for r in results:
        key = (r["method"], int(r["length"]), int(r["staleness"]), float(r["lr_scale"]))
        final[key].append(float(r["final_reward"]))
        collapsed[key] += int(r["collapsed"]) or not int(r["finite"])
    stale = defaultdict(list)  # (method, T, N, lr) -> rows of the stalest mini-batch
    for r in mech:
        if int(r["k"]) == int(r["staleness"]) - 1:
            stale[(r["method"], int(r["length"]), int(r["staleness"]), float(r["lr_scale"]))].append(r)
    grid = sorted({k[1:] for k in final})
    rows, index = [], {}  # index: (method, T, N, lr) -> row
    for method in VARIANTS:
        for cell in grid:
            best = max(BASELINES, key=lambda b: np.mean(final[(b, *cell)]))
            m = stale.get((method, *cell), [])
            rows.append({
                "method": method, "length": cell[0], "staleness": cell[1], "lr_scale": round(cell[2], 4),
                "final_reward": np.mean(final[(method, *cell)]), "seed_std": np.std(final[(method, *cell)]),
                "best_baseline": best, "baseline_reward": np.mean(final[(best, *cell)]),
                "gap": np.mean(final[(method, *cell)]) - np.mean(final[(best, *cell)]),
                "collapsed_seeds": collapsed[(method, *cell)],
                "stale_update_norm": np.mean([float(x["update_norm"]) for x in m]) if m else np.nan,
                "stale_ess": np.mean([float(x["ess"]) for x in m]) if m else np.nan,
                "stale_top1_share": np.mean([float(x["top1_share"]) for x in m]) if m else np.nan,
            })  # fmt: skip
            index[(method, *cell)] = rows[-1]
    with open(directory / "goal.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    base_stale = {
        (b, *cell): np.mean([float(x["update_norm"]) for x in stale[(b, *cell)]]) for b in BASELINES for cell in grid
    }
    lines = [
        "# Adaptive VESPO vs the best baseline (GRPO, TOPR) on the lab grid",
        "",
        f"Gap = seed-mean final expected reward of the variant minus the best baseline's; 'matches' = gap >= -{TOL}.",
        "",
        "| method | collapsed cells (any seed) | N >= 16 cells matched | worst N >= 16 cell (T, N, lr): gap |",
        "|---|---|---|---|",
    ]
    for method in VARIANTS:
        mine = [r for r in rows if r["method"] == method]
        hi = [r for r in mine if r["staleness"] >= 16]
        worst = min(hi, key=lambda r: r["gap"])
        lines.append(
            f"| {method} | {sum(r['collapsed_seeds'] > 0 for r in mine)} of {len(mine)} | "
            f"{sum(r['gap'] >= -TOL for r in hi)} of {len(hi)} | "
            f"({worst['length']}, {worst['staleness']}, x{worst['lr_scale']:.3g}): {worst['gap']:+.3f} |"
        )
    lines += ["", "## Per cell (N >= 16): final reward, gap, and the stalest mini-batch's update norm", ""]
    lines += [
        "| T | N | lr | best baseline | " + " | ".join(VARIANTS) + " |",
        "|---|---|---|---|" + "---|" * len(VARIANTS),
    ]
    for cell in grid:
        if cell[1] < 16:
            continue
        by = {m: index[(m, *cell)] for m in VARIANTS}
        b = by["vespo"]["best_baseline"]
        head = f"| {cell[0]} | {cell[1]} | x{cell[2]:.3g} | {b} {by['vespo']['baseline_reward']:.3f}"
        head += f" (upd {base_stale[(b, *cell)]:.3f}) |"
        cols = [f" {r['final_reward']:.3f} ({r['gap']:+.3f}; upd {r['stale_update_norm']:.3f}) |" for r in by.values()]
        lines.append(head + "".join(cols))
    (directory / "goal.md").write_text("\n".join(lines) + "\n")
    _plot(directory, np.array([[index[(m, *c)]["gap"] for c in grid] for m in VARIANTS]), grid)
    print("\n".join(lines[: 5 + len(VARIANTS) + 2]))


def _plot(directory: Path, gaps: np.ndarray, grid: list[tuple]) -> None:
    """goal.png: gap to the best baseline (variants x cells), red = worse, blue = better."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(14, 3.6))
    lim = max(abs(gaps).max(), 1e-3)
    im = ax.imshow(gaps, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
    ax.set_yticks(range(len(VARIANTS)), VARIANTS)
    ax.set_xticks(range(len(grid)), [f"T{c[0]} N{c[1]}\nlr x{c[2]:.2g}" for c in grid], fontsize=6)
    for i in range(gaps.shape[0]):
        for j in range(gaps.shape[1]):
            ax.text(j, i, f"{gaps[i, j]:+.2f}", ha="center", va="center", fontsize=5)
    ax.set_title("final expected reward minus the best of GRPO/TOPR (lab, mean of 3 seeds)")
    ax.set(xlabel="lab cell: length T, N (mini-batches per rollout step), lr multiple", ylabel="adaptive VESPO variant")
    fig.colorbar(im, ax=ax, fraction=0.02)
    fig.tight_layout()
    fig.savefig(directory / "goal.png", dpi=120)


def smoke_grid(out_dir: Path) -> Path:
    """A tiny lab grid of the same methods (v1 preset, T = 8, N in {1, 16}, lr x1, one seed) in out_dir/lab_grid."""
    from vespo.experiments.lab import LabConfig, lab

    grid = out_dir / "lab_grid"
    lab(LabConfig(preset="v1", out_dir=str(grid), methods=(*BASELINES, *VARIANTS), length=(8,),
                  num_mini_batches=(1, 16), lr_scale=(1.0,), seeds=(0,), optimizer_steps=16, mini_batch_seqs=8,
                  rollout_n=4, eval_points=1, jobs=1))  # fmt: skip
    return grid


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("directory", type=Path, nargs="?", default=DIR, help="the lab grid's out_dir")
    ap.add_argument("--smoke", action="store_true", help="run a tiny lab grid into --out-dir and read it (CI)")
    ap.add_argument("--out-dir", type=Path, help="with --smoke: where the tiny grid and goal.* go")
    a = ap.parse_args()
    if a.smoke and a.out_dir is None:
        ap.error("--smoke needs --out-dir")
    main(smoke_grid(a.out_dir) if a.smoke else a.directory)

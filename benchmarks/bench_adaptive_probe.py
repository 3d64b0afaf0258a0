"""Why the adaptive variants lose to GRPO at N = 64, lr x1 in the lab: step size, or how many sequences carry it?

One command: `python benchmarks/bench_adaptive_probe.py` (~3 min on one core) writes
benchmarks/results/adaptive/probe.{csv,md}. At the two cells where every variant loses most (T = 64 and 1024,
N = 64, lr x1; 3 seeds) it runs the default variants next to settings that flatten the kernel (an ESS target of
0.9 instead of 0.5), loosen the moment target, or cap the self-normalised gain, and reports the final expected
reward with the stalest mini-batch's update norm and top-1% gradient share.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np

from vespo.experiments.lab import LabCell, LabConfig, run_cell

OUT = Path(__file__).parent / "results" / "adaptive"
ARMS = [  # (label, method, hparams)
    ("grpo", "grpo", ()),
    ("vespo", "vespo", ()),
    ("vespo_selfnorm", "vespo_selfnorm", ()),
    ("vespo_selfnorm max_gain=2", "vespo_selfnorm", (("max_gain", 2.0),)),
    ("vespo_ess ess_target=0.5", "vespo_ess", ()),
    ("vespo_ess ess_target=0.9", "vespo_ess", (("ess_target", 0.9),)),
    ("vespo_moment C=(1,1.5)", "vespo_moment", ()),
    ("vespo_moment C=(2,2)", "vespo_moment", (("moment_target_pos", 2.0), ("moment_target_neg", 2.0))),
]


def main(seeds: tuple[int, ...] = (0, 1, 2)) -> None:
    cfg = LabConfig()  # the lab grid's defaults: Adam, lr 5e-3, 128 optimizer steps, mini-batch 64
    rows = []
    for length in (64, 1024):
        for label, method, hp in ARMS:
            for seed in seeds:
                r = run_cell(cfg, LabCell(method, length, 64, 1.0, seed, hp))
                s, per_k = r["summary"], r["per_k"]
                rows.append({
                    "arm": label, "length": length, "seed": seed, "final_reward": s["final_reward"],
                    "stale_update_norm": per_k["update_norm"][-1], "stale_top1_share": per_k["top1_share"][-1],
                    "mean_update_norm": float(np.mean(per_k["update_norm"])),
                })  # fmt: skip
                print(label, length, seed, f"{s['final_reward']:.3f}", file=sys.stderr)
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "probe.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [
        "# Lab probe: N = 64, lr x1 (mean of 3 seeds; k = 63 is the stalest mini-batch)",
        "",
        "| arm | T | final E[R] | update norm, k = 63 | mean update norm | top-1% gradient share, k = 63 |",
        "|---|---|---|---|---|---|",
    ]
    for length in (64, 1024):
        for label, _, _ in ARMS:
            sel = [r for r in rows if r["arm"] == label and r["length"] == length]
            mean = {k: np.mean([r[k] for r in sel]) for k in sel[0] if k not in ("arm", "length", "seed")}
            lines.append(
                f"| {label} | {length} | {mean['final_reward']:.3f} | {mean['stale_update_norm']:.3f} | "
                f"{mean['mean_update_norm']:.3f} | {mean['stale_top1_share']:.3f} |"
            )
    (OUT / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

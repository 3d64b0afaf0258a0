"""Why the adaptive variants lose to GRPO at N = 64, lr x1 in the lab: step size, or how many sequences carry it?

One command: `python benchmarks/bench_adaptive_probe.py` (~3 min on one core) writes
benchmarks/results/adaptive/probe.{csv,md}. At the two cells where every variant loses most (T = 64 and 1024,
N = 64, lr x1; 3 seeds) it runs the default variants next to settings that flatten the kernel (an ESS target of
0.9 instead of 0.5), loosen the moment target, or cap the self-normalised gain, and reports the final expected
reward with the stalest mini-batch's update norm and top-1% gradient share. `--smoke --out-dir DIR`: every arm at
T = 8, N = 4, one seed, 4 optimizer steps of 8 sequences (seconds; CI).
"""

from __future__ import annotations

import argparse
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


def main(seeds: tuple[int, ...] = (0, 1, 2), out: Path = OUT, smoke: bool = False) -> None:
    cfg = LabConfig()  # the lab grid's defaults: Adam, lr 5e-3, 128 optimizer steps, mini-batch 64
    lengths, num_mini_batches = (64, 1024), 64
    if smoke:  # the same cells, tiny
        cfg = LabConfig(optimizer_steps=4, mini_batch_seqs=8, rollout_n=4, eval_points=1)
        lengths, num_mini_batches = (8,), 4
    rows = []
    for length in lengths:
        for label, method, hp in ARMS:
            for seed in seeds:
                r = run_cell(cfg, LabCell(method, length, num_mini_batches, 1.0, seed, hp))
                s, per_k = r["summary"], r["per_k"]
                rows.append({
                    "arm": label, "length": length, "seed": seed, "final_reward": s["final_reward"],
                    "stale_update_norm": per_k["update_norm"][-1], "stale_top1_share": per_k["top1_share"][-1],
                    "mean_update_norm": float(np.mean(per_k["update_norm"])),
                })  # fmt: skip
                print(label, length, seed, f"{s['final_reward']:.3f}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "probe.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    k = num_mini_batches - 1
    lines = [
        f"# Lab probe: N = {num_mini_batches}, lr x1 (mean of {len(seeds)} seeds; k = {k} is the stalest mini-batch)",
        "",
        f"| arm | T | final E[R] | update norm, k = {k} | mean update norm | top-1% gradient share, k = {k} |",
        "|---|---|---|---|---|---|",
    ]
    for length in lengths:
        for label, _, _ in ARMS:
            sel = [r for r in rows if r["arm"] == label and r["length"] == length]
            mean = {k: np.mean([r[k] for r in sel]) for k in sel[0] if k not in ("arm", "length", "seed")}
            lines.append(
                f"| {label} | {length} | {mean['final_reward']:.3f} | {mean['stale_update_norm']:.3f} | "
                f"{mean['mean_update_norm']:.3f} | {mean['stale_top1_share']:.3f} |"
            )
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, default=OUT, help="where probe.{csv,md} go (benchmarks/results/adaptive)")
    ap.add_argument("--smoke", action="store_true", help="tiny cells, one seed, in seconds (CI)")
    a = ap.parse_args()
    main((0,) if a.smoke else (0, 1, 2), a.out_dir, a.smoke)

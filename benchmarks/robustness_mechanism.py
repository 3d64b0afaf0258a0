"""The mechanism metrics of a finished `vespo sweep`, per method, lr and N (mean over seeds and rollout steps).

One command per sweep: `python benchmarks/robustness_mechanism.py SWEEP_DIR` (a `vespo sweep --out-dir`)
writes mechanism.csv and mechanism.md beside its results.md. For the stalest mini-batch of every rollout step (the last
one; the first is fresh) it reports the mean log W, the ESS of W, the share of sum W on the top 1% of sequences,
the gradient norm before clipping and the update norm, next to the fresh mini-batch's gradient and update norms and
the cell's final held-out accuracy (docs/results/index.md, the trainer grid). `--smoke --out-dir DIR`: a one-cell sweep
(vespo, N = 2, one seed, 2 optimizer steps of 2 prompts x 2 on a 2-step warm start) into DIR, then this on it (CI).
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

COLUMNS = {  # output column -> metrics key (per rollout step)
    "log_w_mean_last": "is/log_w_mean/last_mini_batch",
    "ess_last": "weight/ess/last_mini_batch",
    "top1pct_share_last": "is/top1pct_w_share/last_mini_batch",
    "grad_norm_first": "actor/grad_norm/first_mini_batch",
    "grad_norm_last": "actor/grad_norm/last_mini_batch",
    "update_norm_first": "actor/update_norm/first_mini_batch",
    "update_norm_last": "actor/update_norm/last_mini_batch",
}


def main(sweep_dir: Path) -> None:
    groups: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for summary in sorted((sweep_dir / "cells").glob("*/N*/seed*/*/summary.json")):
        cell = json.loads(summary.read_text())
        rows = [json.loads(line) for line in (summary.parent / "metrics.jsonl").read_text().splitlines() if line]
        steps = [r for r in rows if "reward/mean" in r]
        stats = {col: float(np.mean([r[key] for r in steps if key in r])) for col, key in COLUMNS.items()}
        groups[(cell["variant"], cell["N"])].append(stats | {"final_eval_acc": cell["final_eval_acc"]})
    out = []
    for (variant, n), cells in sorted(groups.items()):
        out.append(
            {"variant": variant, "N": n, "seeds": len(cells)}
            | {k: float(np.mean([c[k] for c in cells])) for k in [*COLUMNS, "final_eval_acc"]}
        )
    with (sweep_dir / "mechanism.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(out[0]))
        w.writeheader()
        w.writerows(out)
    head = "| variant | N | held-out | log W (L) | ESS (L) | top-1% (L) | grad F / L | update F / L |"
    lines = [
        "# Mechanism per cell group (mean over seeds and rollout steps; F = fresh, L = stalest mini-batch)",
        "",
        head,
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in out:
        lines.append(
            f"| {r['variant']} | {r['N']} | {r['final_eval_acc']:.3f} | {r['log_w_mean_last']:.2f} | "
            f"{r['ess_last']:.2f} | {r['top1pct_share_last']:.2f} | {r['grad_norm_first']:.2g} / "
            f"{r['grad_norm_last']:.2g} | {r['update_norm_first']:.2g} / {r['update_norm_last']:.2g} |"
        )
    (sweep_dir / "mechanism.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def smoke_sweep(out_dir: Path) -> Path:
    """A one-cell `vespo sweep` (N = 2, so the first and last mini-batch differ) into out_dir/sweep."""
    from vespo.experiments.sweep import SweepConfig, sweep

    cfg = SweepConfig(out_dir=str(out_dir / "sweep"), methods=("vespo",), num_mini_batches=(2,), seeds=(0,),
                      optimizer_steps=2, min_rollout_steps=1, ppo_mini_batch_size=2, rollout_n=2, eval_points=1,
                      eval_size=10, eval_n=1, jobs=1, cache_dir=str(out_dir / "cache"),
                      extra={"sft_steps": "2", "max_response_length": "8", "log_update_norm": "True",
                             "tensorboard": "False"})  # fmt: skip
    sweep(cfg)
    return Path(cfg.out_dir)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dir", type=Path, nargs="?", help="a finished `vespo sweep` out_dir")
    ap.add_argument("--smoke", action="store_true", help="run a one-cell sweep into --out-dir and read it (CI)")
    ap.add_argument("--out-dir", type=Path, help="with --smoke: where the sweep and mechanism.* go")
    a = ap.parse_args()
    if a.smoke != (a.sweep_dir is None) or (a.smoke and a.out_dir is None):
        ap.error("give a sweep_dir, or --smoke --out-dir DIR")
    main(smoke_sweep(a.out_dir) if a.smoke else a.sweep_dir)

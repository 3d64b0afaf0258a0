"""Forward + backward cost of every policy loss at (B=256, T=8192) on CPU, as ratios to REINFORCE.

Run: `python benchmarks/bench_losses.py` (1-2 minutes on 2 cores); writes benchmarks/results/losses.{json,csv,png}.
Methods are timed round-robin in the same process so machine noise hits all of them alike; the median of the
repeats is reported. The cost includes input validation and metrics (the public `compute_policy_loss`).
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import statistics
import time
from pathlib import Path

import torch

import vespo

RESULTS = Path(__file__).parent / "results"


def make_inputs(B: int, T: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    log_prob = -torch.rand(B, T, generator=g) * 3
    mask = (torch.arange(T).unsqueeze(0) < torch.randint(T // 4, T + 1, (B, 1), generator=g)).float()
    return {
        "log_prob": log_prob,
        "old_log_prob": log_prob + torch.randn(B, T, generator=g) * 0.05,
        "advantages": torch.randn(B, generator=g),
        "response_mask": mask,
    }


def time_once(method: str, inputs: dict[str, torch.Tensor]) -> float:
    lp = inputs["log_prob"].clone().requires_grad_()
    start = time.perf_counter()
    loss, _ = vespo.compute_policy_loss(method, **{**inputs, "log_prob": lp})
    loss.backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    inputs = make_inputs(args.batch, args.seq_len)
    methods = vespo.available_methods()
    times: dict[str, list[float]] = {m: [] for m in methods}
    for m in methods:  # warm-up
        time_once(m, inputs)
    for _ in range(args.repeats):
        for m in methods:
            times[m].append(time_once(m, inputs))
    median = {m: statistics.median(t) for m, t in times.items()}
    base = median["reinforce"]
    rows = [
        {"method": m, "median_s": round(median[m], 5), "ratio_to_reinforce": round(median[m] / base, 3)}
        for m in sorted(methods, key=median.get)
    ]
    vespo_vs_grpo = median["vespo"] / median["grpo"]
    summary = {
        "shape": [args.batch, args.seq_len],
        "repeats": args.repeats,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "vespo_over_grpo": round(vespo_vs_grpo, 3),
        "goal_vespo_over_grpo_at_most": 1.2,
        "rows": rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "losses.json").write_text(json.dumps(summary, indent=2) + "\n")
    with open(RESULTS / "losses.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    names = [r["method"] for r in rows]
    ax.barh(
        names, [r["ratio_to_reinforce"] for r in rows], color=["tab:red" if n == "vespo" else "tab:gray" for n in names]
    )
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel(f"forward+backward time / REINFORCE's (B={args.batch}, T={args.seq_len}, CPU)")
    ax.set_title(f"policy-loss cost; VESPO / GRPO = {vespo_vs_grpo:.2f}")
    fig.tight_layout()
    fig.savefig(RESULTS / "losses.png", dpi=110)
    for r in rows:
        print(f"{r['method']:>10}  {r['median_s'] * 1e3:8.1f} ms   x{r['ratio_to_reinforce']:.2f}")
    print(f"VESPO / GRPO = {vespo_vs_grpo:.3f} (goal <= 1.2)")


if __name__ == "__main__":
    main()

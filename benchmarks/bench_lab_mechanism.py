"""What the optimiser does with a gradient VESPO shrank: the same stale lab cell under Adam, Adam with a large eps, SGD.

One command: `python benchmarks/bench_lab_mechanism.py` writes benchmarks/results/lab_mechanism.{json,md,png}.
Per mini-batch index k (k optimizer steps stale) it reports the gradient norm before clipping, the parameter update
norm, the ESS of W and the share of the gradient carried by the top 1% of sequences, for VESPO and REINFORCE (no
reshaping: phi = W), at T = 1024, N = 16, 3x the lab's base lr (docs/results.md, "Mechanism"). `--smoke --out-dir
DIR`: the same arms and methods at T = 8, one seed, 16 optimizer steps of 8 sequences (seconds; CI).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from vespo.experiments.lab import LabCell, LabConfig, run_cell

OUT = Path(__file__).parent / "results"
ARMS = {  # name -> (optimizer, base lr, adam_eps); cells run at 3x the base lr
    "adam": ("adamw_torch", 0.005, 1e-8),
    "adam_eps1e-2": ("adamw_torch", 0.5, 1e-2),  # eps >> sqrt(v): Adam ~ SGD with lr/eps (lr raised to match)
    "sgd": ("sgd", 50.0, 1e-8),  # 3 x 50 x ~0.0026 (fresh grad norm) ~ 0.4 = Adam's first update norm at 3x
}
METHODS = ("vespo", "reinforce", "grpo")


def plot(rows: list[dict], path: Path) -> None:
    """lab_mechanism.png: per mini-batch index k, a row per optimiser arm, a column per metric, a line per method."""
    from vespo.plots import Panel, Series, panel_figure, save_figure

    keys = (  # (metric, axis label, range, scale)
        ("grad_norm", "gradient norm", None, "log"),
        ("update_norm", "update norm", None, "log"),
        ("ess", "normalised ESS of W", (0.0, 1.0), None),
        ("top1_share", "gradient share of top 1%", (0.0, 1.0), None),
        ("log_w_mean", "mean sequence log W", None, None),
    )
    grid = []
    for arm in ARMS:
        row = []
        for key, label, bounds, scale in keys:
            panel = Panel(f"{arm}: {label}", "mini-batch index k", label, bounds=bounds, yscale=scale)
            for method in METHODS:
                runs = [r["per_k"][key] for r in rows if (r["arm"], r["method"]) == (arm, method)]
                curve = np.mean(runs, axis=0)
                panel.series[method] = Series(np.arange(len(curve)), curve)
            row.append(panel)
        grid.append(row)
    save_figure(panel_figure(grid), path, dpi=100)


def main(seeds: tuple[int, ...] = (0, 1), out: Path = OUT, smoke: bool = False) -> None:
    rows = []
    size = (
        dict(optimizer_steps=16, mini_batch_size=8, rollout_n=4)
        if smoke
        else dict(optimizer_steps=64, mini_batch_size=64)
    )
    length = 8 if smoke else 1024
    for arm, (opt, lr, eps) in ARMS.items():
        cfg = LabConfig(optim=opt, lr=lr, adam_epsilon=eps, eval_points=2, **size)
        for method in METHODS:
            for seed in seeds:
                r = run_cell(cfg, LabCell(method, length, 16, 3.0, seed))
                rows.append({"arm": arm, "method": method, "seed": seed} | r["summary"] | {"per_k": r["per_k"]})
                print(arm, method, seed, f"final E[R] {r['summary']['final_reward']:.3f}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    (out / "lab_mechanism.json").write_text(json.dumps(rows))
    lines = [
        "# Lab mechanism: T=1024, N=16, lr x3 (mean over seeds)",
        "",
        "late = mini-batch indices k = 8..15; ratios are VESPO / REINFORCE over those indices.",
        "",
        "| optimiser | method | final E[R] | grad norm k=0 | grad norm late | update k=0 | update late | ESS late "
        "| top-1% grad share late |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def mean(arm, method, key, ks):
        return float(np.mean([np.mean(r["per_k"][key][ks]) for r in rows if (r["arm"], r["method"]) == (arm, method)]))

    late = slice(8, 16)
    for arm in ARMS:
        for method in METHODS:
            fin = np.mean([r["final_reward"] for r in rows if (r["arm"], r["method"]) == (arm, method)])
            vals = [
                mean(arm, method, "grad_norm", slice(0, 1)),
                mean(arm, method, "grad_norm", late),
                mean(arm, method, "update_norm", slice(0, 1)),
                mean(arm, method, "update_norm", late),
                mean(arm, method, "ess", late),
                mean(arm, method, "top1_share", late),
            ]
            lines.append(f"| {arm} | {method} | {fin:.3f} | " + " | ".join(f"{v:.3g}" for v in vals) + " |")
    lines += ["", "| optimiser | grad ratio late (vespo/reinforce) | update ratio late |", "|---|---|---|"]
    for arm in ARMS:
        g = mean(arm, "vespo", "grad_norm", late) / mean(arm, "reinforce", "grad_norm", late)
        u = mean(arm, "vespo", "update_norm", late) / mean(arm, "reinforce", "update_norm", late)
        lines.append(f"| {arm} | {g:.3f} | {u:.3f} |")
    (out / "lab_mechanism.md").write_text("\n".join(lines) + "\n")

    plot(rows, out / "lab_mechanism.png")
    print((out / "lab_mechanism.md").read_text())


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, default=OUT, help="where lab_mechanism.{json,md,png} go")
    ap.add_argument("--smoke", action="store_true", help="tiny cells, one seed, in seconds (CI)")
    a = ap.parse_args()
    main((0,) if a.smoke else (0, 1), a.out_dir, a.smoke)

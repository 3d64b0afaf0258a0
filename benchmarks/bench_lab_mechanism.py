"""What the optimiser does with a gradient VESPO shrank: the same stale lab cell under Adam, Adam with a large eps, SGD.

One command: `python benchmarks/bench_lab_mechanism.py` writes benchmarks/results/lab_mechanism.{json,md,png}.
Per mini-batch index k (k optimizer steps stale) it reports the gradient norm before clipping, the parameter update
norm, the ESS of W and the share of the gradient carried by the top 1% of sequences, for VESPO and REINFORCE (no
reshaping: phi = W), at T = 1024, N = 16, 3x the lab's base lr (docs/results.md, "Mechanism").
"""

from __future__ import annotations

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


def main(seeds: tuple[int, ...] = (0, 1)) -> None:
    rows = []
    for arm, (opt, lr, eps) in ARMS.items():
        cfg = LabConfig(optim=opt, lr=lr, adam_epsilon=eps, optimizer_steps=64, mini_batch_size=64, eval_points=2)
        for method in METHODS:
            for seed in seeds:
                r = run_cell(cfg, LabCell(method, 1024, 16, 3.0, seed))
                rows.append({"arm": arm, "method": method, "seed": seed} | r["summary"] | {"per_k": r["per_k"]})
                print(arm, method, seed, f"final E[R] {r['summary']['final_reward']:.3f}", file=sys.stderr)
    OUT.mkdir(exist_ok=True)
    (OUT / "lab_mechanism.json").write_text(json.dumps(rows))
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
    (OUT / "lab_mechanism.md").write_text("\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("grad_norm", "update_norm", "ess", "top1_share", "log_w_mean")
    fig, axes = plt.subplots(len(ARMS), len(keys), figsize=(3.3 * len(keys), 2.6 * len(ARMS)), squeeze=False)
    for i, arm in enumerate(ARMS):
        for j, key in enumerate(keys):
            ax = axes[i][j]
            for method in METHODS:
                runs = [r["per_k"][key] for r in rows if (r["arm"], r["method"]) == (arm, method)]
                ax.plot(np.mean(runs, axis=0), label=method)
            ax.set_title(f"{arm}: {key}", fontsize=9)
            ax.set_xlabel("mini-batch index k")
            if key in ("grad_norm", "update_norm"):
                ax.set_yscale("log")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT / "lab_mechanism.png", dpi=100)
    print((OUT / "lab_mechanism.md").read_text())


if __name__ == "__main__":
    main()

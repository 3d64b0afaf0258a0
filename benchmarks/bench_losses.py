"""Forward + backward cost of every policy loss at (B, T) = (256, 8192) fp32 on CPU, side by side with the engines.

Run: `python benchmarks/bench_losses.py` (a few minutes on 2 shared cores); writes
benchmarks/results/losses.{json,csv,png}.

Each vespo method is timed through the public `vespo.compute_policy_loss` (token-mean unless the baseline fixes
another mode), with its metrics (kept as tensors: converted once per logged step, not per call), once with the
fused input check (`validate=True`, the default) and once without (`validate=False`, what the veRL/TRL adapters
use). Baselines, in the same process: TRL's VESPO path (`GRPOTrainer.get_gamma_weights` then the weighted token-mean
loss, as `_compute_loss` does), veRL's built-in `vanilla`/`gspo`/`sapo`/`cispo` policy losses (with their own
metrics and `.item()` calls), and a bare masked sum over the same inputs (the floor). All candidates run round-robin
in one process so machine noise hits them alike; the median over repeats is reported, and ratios are of medians.
Single-threaded by default: on a shared machine with a CPU quota, multi-threaded runs measure the quota's time
slices (every op ~8 ms), not the work.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

import vespo

RESULTS = Path(__file__).parent / "results"
# vespo method -> (veRL built-in, vespo hyperparameters matching veRL's defaults for it, veRL actor fields, mode)
VERL_PAIRS = {
    "grpo": ("vanilla", {}, {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}, "token-mean"),
    "gspo": ("gspo", {}, {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}, "seq-mean-token-mean"),
    "sapo": ("sapo", {}, {"tau_pos": 1.0, "tau_neg": 1.05}, "seq-mean-token-mean"),
    "cispo": ("cispo", {"ratio_min": 0.8, "ratio_max": 1.28}, {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28},
              "token-mean"),
}  # fmt: skip


def make_inputs(B: int, T: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Log-probs in [-3, 0], behaviour log-probs within ~0.05 of them, ragged lengths in [T/4, T], A ~ N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    log_prob = -torch.rand(B, T, generator=g) * 3
    mask = (torch.arange(T).unsqueeze(0) < torch.randint(T // 4, T + 1, (B, 1), generator=g)).float()
    return {
        "log_prob": log_prob,
        "old_log_prob": -(log_prob + torch.randn(B, T, generator=g) * 0.05).abs(),
        "advantages": torch.randn(B, generator=g),
        "response_mask": mask,
    }


def fwd_bwd(loss_fn: Callable[[torch.Tensor], torch.Tensor], log_prob: torch.Tensor) -> float:
    lp = log_prob.clone().requires_grad_()
    start = time.perf_counter()
    loss_fn(lp).backward()
    return time.perf_counter() - start


def candidates(inputs: dict[str, torch.Tensor], with_baselines: bool) -> dict[str, Callable]:
    """name -> loss function of log_prob; vespo's under "<method>", "<method> (no validation)", baselines by name."""
    old, adv, mask = inputs["old_log_prob"], inputs["advantages"], inputs["response_mask"]
    out: dict[str, Callable] = {}
    for method in vespo.available_methods():
        hp, mode = {}, "token-mean"
        if method in VERL_PAIRS:
            _, hp, _, mode = VERL_PAIRS[method]
        for validate in (True, False):

            def ours(lp, method=method, hp=hp, mode=mode, validate=validate):
                loss, _ = vespo.compute_policy_loss(
                    method, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask,
                    loss_agg_mode=mode, validate=validate, **hp,
                )  # fmt: skip
                return loss

            out[method if validate else f"{method} (no validation)"] = ours

    def masked_sum(lp):
        return (lp * mask).sum() / mask.sum()

    out["masked sum"] = masked_sum
    if not with_baselines:
        return out

    from trl.trainer.grpo_trainer import GRPOTrainer

    def trl_vespo(lp):  # GRPOTrainer._compute_loss, loss_type="vespo", token-mean normaliser
        phi = GRPOTrainer.get_gamma_weights(adv.unsqueeze(1), lp - old, mask, None)  # (B, 1), no grad
        return (-phi * adv.unsqueeze(1) * lp * mask).sum() / mask.sum().clamp(min=1.0)

    out["TRL vespo"] = trl_vespo

    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config import ActorConfig, PolicyLossConfig

    adv_tok = adv.unsqueeze(-1).expand_as(mask).contiguous()  # veRL takes token-level advantages
    for builtin, _, actor_kw, mode in VERL_PAIRS.values():
        cfg = ActorConfig(
            strategy="fsdp", rollout_n=8, ppo_micro_batch_size_per_gpu=2,
            policy_loss=PolicyLossConfig(loss_mode=builtin), **actor_kw,
        )  # fmt: skip
        fn = get_policy_loss_fn(builtin)

        def theirs(lp, fn=fn, cfg=cfg, mode=mode):
            return fn(old, lp, adv_tok, mask, loss_agg_mode=mode, config=cfg)[0]

        out[f"veRL {builtin}"] = theirs
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, see above)")
    parser.add_argument("--no-baselines", action="store_true", help="skip TRL and veRL (if not installed)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    inputs = make_inputs(args.batch, args.seq_len)
    fns = candidates(inputs, with_baselines=not args.no_baselines)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():  # warm-up
        fwd_bwd(fn, inputs["log_prob"])
    for _ in range(args.repeats):
        for name, fn in fns.items():
            times[name].append(fwd_bwd(fn, inputs["log_prob"]))
    med = {name: statistics.median(t) for name, t in times.items()}
    floor = med["masked sum"]
    pairs = {"vespo": "TRL vespo"} | {m: f"veRL {b}" for m, (b, *_) in VERL_PAIRS.items()}
    rows = []
    for name in fns:
        method = name.split(" ")[0]
        baseline = pairs.get(method) if method in vespo.available_methods() else None
        row = {
            "candidate": name,
            "median_ms": round(med[name] * 1e3, 3),
            "min_ms": round(min(times[name]) * 1e3, 3),
            "x_masked_sum": round(med[name] / floor, 2),
            "baseline": baseline or "",
            "x_baseline": round(med[name] / med[baseline], 3) if baseline in med else "",
        }
        rows.append(row)
    goal = {r["candidate"]: r["x_baseline"] for r in rows if r["x_baseline"] != ""}
    summary = {
        "command": "python benchmarks/bench_losses.py",
        "shape": [args.batch, args.seq_len],
        "dtype": "float32",
        "repeats": args.repeats,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "goal": "vespo's method (with metrics) / its engine baseline <= 1.2",
        "ratios_to_baseline": goal,
        "rows": rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "losses.json").write_text(json.dumps(summary, indent=2) + "\n")
    with open(RESULTS / "losses.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, args)
    for r in rows:
        vs = f"   x{r['x_baseline']} vs {r['baseline']}" if r["x_baseline"] != "" else ""
        cost = f"{r['median_ms']:8.2f} ms (min {r['min_ms']:7.2f})  x{r['x_masked_sum']:5.2f} masked sum"
        print(f"{r['candidate']:>28}  {cost}{vs}")


def plot(rows: list[dict], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.32 * len(rows) + 1.2))
    names = [r["candidate"] for r in rows][::-1]
    vals = [r["median_ms"] for r in rows][::-1]
    colors = ["tab:blue" if n.split(" ")[0] in ("TRL", "veRL", "masked") else "tab:red" for n in names]
    ax.barh(names, vals, color=colors)
    ax.set_xlabel(f"forward + backward, median ms (B={args.batch}, T={args.seq_len}, fp32, CPU)")
    ax.set_title("policy-loss cost: vespo (red) vs engine built-ins (blue)")
    fig.tight_layout()
    fig.savefig(RESULTS / "losses.png", dpi=110)


if __name__ == "__main__":
    main()

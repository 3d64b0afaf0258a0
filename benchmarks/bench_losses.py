"""Forward + backward cost of every policy loss at (B, T) = (256, 8192) fp32 on CPU, side by side with the engines.

Run: `python benchmarks/bench_losses.py` (a few minutes on 2 shared cores); writes
benchmarks/results/losses.{json,csv,png}.

Each vespo method is timed through the public `vespo.compute_policy_loss` (token-mean unless the baseline fixes
another mode), with its metrics (kept as tensors: converted once per logged step, not per call), once with the
fused input check (`validate=True`, the default) and once without (`validate=False`, what the veRL/TRL adapters
use). Baselines, in the same process: TRL's VESPO path (`GRPOTrainer.get_gamma_weights` then the weighted token-mean
loss, as `_compute_loss` does), veRL's built-in `vanilla`/`gspo`/`sapo`/`cispo` policy losses (with their own
metrics and `.item()` calls), and a bare masked sum over the same inputs (the floor, baseline of the methods no
engine has). Each candidate is timed against its baseline in paired rounds, back to back in A B B A order, so
machine noise hits both alike; the ratio reported is the median of the per-round ratios (the ratio of the two
minima is given too).
Single-threaded by default: on a shared machine with a CPU quota, multi-threaded runs measure the quota's time
slices (every op ~8 ms), not the work. `--smoke --out-dir DIR`: (B, T) = (8, 32), one paired round (seconds; CI).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
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
    from vespo.losses import batch_context, uses_batch_context

    old, adv, mask = inputs["old_log_prob"], inputs["advantages"], inputs["response_mask"]
    batch = vespo.PolicyBatch(inputs["log_prob"], old, adv, mask)
    out: dict[str, Callable] = {}
    for method in vespo.available_methods():
        hp, mode = {}, "token-mean"
        if method in VERL_PAIRS:
            _, hp, _, mode = VERL_PAIRS[method]
        if uses_batch_context(method):  # the mini-batch's statistics, as the trainer passes them (mini-batch 2 of 4)
            hp = hp | {"batch_context": batch_context(batch, mini_batch_index=1, num_mini_batches=4)}
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
    if importlib.util.find_spec("verl") is None:  # veRL has a venv of its own (bash .ci/install_verl.sh)
        print("veRL is not installed here: its built-in losses are left out (run in .venv-verl to compare)")
        return out

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


def paired_ratio(a: Callable, b: Callable, log_prob: torch.Tensor, rounds: int) -> tuple[float, list, list]:
    """Median over rounds of time(a) / time(b), timed back to back in A B B A order (noise hits both alike)."""
    ta, tb, ratios = [], [], []
    for r in range(rounds):
        if r % 2:
            y, x = fwd_bwd(b, log_prob), fwd_bwd(a, log_prob)
        else:
            x, y = fwd_bwd(a, log_prob), fwd_bwd(b, log_prob)
        ta.append(x)
        tb.append(y)
        ratios.append(x / y)
    return statistics.median(ratios), ta, tb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=21, help="paired rounds per comparison")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, see above)")
    parser.add_argument("--no-baselines", action="store_true", help="skip TRL and veRL (if not installed)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="where losses.{json,csv,png} go")
    parser.add_argument("--smoke", action="store_true", help="a tiny batch, one round, in seconds (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.batch, args.seq_len, args.repeats = 8, 32, 1
    torch.set_num_threads(args.threads)

    inputs = make_inputs(args.batch, args.seq_len)
    lp = inputs["log_prob"]
    fns = candidates(inputs, with_baselines=not args.no_baselines)
    for fn in fns.values():  # warm-up
        fwd_bwd(fn, lp)
    pairs = {"vespo": "TRL vespo"} | {m: f"veRL {b}" for m, (b, *_) in VERL_PAIRS.items()}
    rows = []
    for name in fns:
        if name == "masked sum" or name.split(" ")[0] in ("TRL", "veRL"):
            continue
        method = name.split(" ")[0]
        baseline = pairs.get(method, "masked sum") if not args.no_baselines else "masked sum"
        baseline = baseline if baseline in fns else "masked sum"  # an engine that is not installed here
        ratio, ta, tb = paired_ratio(fns[name], fns[baseline], lp, args.repeats)
        rows.append(
            {
                "candidate": name,
                "median_ms": round(statistics.median(ta) * 1e3, 2),
                "min_ms": round(min(ta) * 1e3, 2),
                "baseline": baseline,
                "baseline_median_ms": round(statistics.median(tb) * 1e3, 2),
                "baseline_min_ms": round(min(tb) * 1e3, 2),
                "x_baseline_paired_median": round(ratio, 3),
                "x_baseline_min": round(min(ta) / min(tb), 3),
            }
        )
    summary = {
        "command": "python benchmarks/bench_losses.py",
        "shape": [args.batch, args.seq_len],
        "dtype": "float32",
        "rounds": args.repeats,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "goal": "vespo's method (with metrics) / its engine baseline <= 1.2",
        "ratios_to_baseline": {
            r["candidate"]: r["x_baseline_paired_median"] for r in rows if r["baseline"] != "masked sum"
        },
        "rows": rows,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "losses.json").write_text(json.dumps(summary, indent=2) + "\n")
    with open(args.out_dir / "losses.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, args)
    for r in rows:
        print(
            f"{r['candidate']:>26}  {r['median_ms']:7.2f} ms (min {r['min_ms']:6.2f})  vs {r['baseline']:>12} "
            f"{r['baseline_median_ms']:7.2f} ms (min {r['baseline_min_ms']:6.2f}):  "
            f"x{r['x_baseline_paired_median']:.2f} paired median, x{r['x_baseline_min']:.2f} of minima"
        )


def plot(rows: list[dict], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["baseline"] != "masked sum"]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.4))
    names = [f"{r['candidate']} / {r['baseline']}" for r in rows][::-1]
    vals = [r["x_baseline_paired_median"] for r in rows][::-1]
    ax.barh(names, vals, color=["tab:red" if v > 1.2 else "tab:green" for v in vals])
    ax.axvline(1.0, color="k", lw=0.8)
    ax.axvline(1.2, color="tab:red", lw=0.8, ls="--", label="goal 1.2")
    ax.set_xlabel(f"time ratio, median of paired rounds (B={args.batch}, T={args.seq_len}, fp32, CPU, fwd+bwd)")
    ax.set_ylabel("vespo method / the engine's own loss")
    ax.set_title("vespo's loss (with metrics) vs the engine's own")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)  # beside the bars, never over one
    fig.tight_layout()
    fig.savefig(args.out_dir / "losses.png", dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    main()

"""Where a long-regime mini-batch's update time goes, and which levers exist (issue 39): one mini-batch of the
`paper-long` cell, timed per arm on one torch thread.

One command: `python benchmarks/bench_update_kernels.py [--repeats 5]` (about a minute) writes
benchmarks/results/update_kernels.{json,md}; `--smoke --out-dir DIR` runs it on a random tiny model in seconds (CI).

Model: the `paper-long` preset's warm start (the embedded Llama, hidden 64, 3 layers, head dim 16; built first if
missing, ~10-17 min on one core) or, with `--smoke`, a random model of the same shape. Batch: 64 sequences (8
prompts x 8) of a 10-token prompt and 128 response tokens, as the 41-step chain's. Arms, alternated per repeat:

  * `update`: the learner's forward and backward of the mini-batch (`vespo.rollout.response_log_probs` under grad,
    a token-mean of the log-probs, backward): the cell's per-mini-batch work, fp32, PyTorch's SDPA attention (its
    flash kernel on CPU);
  * `update, eager attention`: the same with transformers' eager attention (matmul, softmax, matmul);
  * `update, bf16 autocast`: the same under CPU bf16 autocast (`vespo train --bf16`);
  * `score mu`: the no-grad forward that scores mu for the update (what `--bypass-mode` saves);
  * and the profile of one `update`: self CPU time of its top operators.

Seconds are medians over the repeats; the ratios compare arms measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from vespo.outputs import write_atomic

OUT = Path(__file__).parent / "results"
PROMPT, RESPONSE, ROWS = 10, 128, 64


def _model(smoke: bool):
    """The preset's warm-start policy (or, smoke, a random model of its shape) and the embedded tokenizer."""
    from vespo.embedded.task import build_tiny_model, build_tokenizer

    if smoke:
        tokenizer = build_tokenizer()
        return build_tiny_model(tokenizer), "a random model of the preset's shape (smoke)"
    from vespo.embedded.warm_start import WarmStartSpec, embedded_policy_path
    from vespo.experiments.sweep import cells, preset_config, train_config
    from vespo.models import load_policy

    cfg = preset_config("paper-long", variants=("vespo",), num_mini_batches=(64,), seeds=(0,), out_dir="unused")
    path = embedded_policy_path(WarmStartSpec.of(train_config(cfg, cells(cfg)[0])))
    return load_policy(str(path))[0], "the paper-long preset's warm start (41-step chain)"


def _rollout(vocab: int, rows: int, generator: torch.Generator):
    from vespo.rollout import Rollout

    ids = torch.randint(4, vocab, (rows, PROMPT + RESPONSE), generator=generator)
    mask = torch.ones_like(ids)
    return Rollout(ids, mask, torch.ones(rows, RESPONSE), torch.zeros(rows, RESPONSE))


def _arms(model, rollout):
    from vespo.rollout.hf import response_log_probs

    def set_attention(name: str) -> None:
        model.config._attn_implementation = name
        for module in model.modules():
            if hasattr(module, "config"):
                module.config._attn_implementation = name

    def update(bf16: bool = False, attention: str = "sdpa") -> None:
        set_attention(attention)
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logp, _ = response_log_probs(model, rollout)
        logp.sum().div(logp.numel()).backward()

    def score() -> None:
        set_attention("sdpa")
        with torch.no_grad():
            response_log_probs(model, rollout)

    return {
        "update": update,
        "update, eager attention": lambda: update(attention="eager"),
        "update, bf16 autocast": lambda: update(bf16=True),
        "score mu": score,
    }


def _profile(fn) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    return [{"op": e.key, "self_ms": e.self_cpu_time_total / 1e3, "share": e.self_cpu_time_total / total}
            for e in events[:8]]  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out-dir", type=Path, default=OUT, help="where update_kernels.{json,md} go")
    p.add_argument("--smoke", action="store_true", help="a random model, 8 rows, one repeat (CI)")
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = 8 if args.smoke else ROWS
    repeats = 1 if args.smoke else args.repeats
    model, label = _model(args.smoke)
    model.train()
    arms = _arms(model, _rollout(model.config.vocab_size, rows, torch.Generator().manual_seed(0)))
    for fn in arms.values():  # warm-up: allocator, kernels
        fn()
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(repeats):
        for name, fn in arms.items():
            t0 = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(xs) for name, xs in seconds.items()}
    top = _profile(arms["update"])
    result = {"model": label, "rows": rows, "prompt": PROMPT, "response": RESPONSE, "repeats": repeats,
              "threads": 1, "load": os.getloadavg(), "seconds": seconds, "median_s": med, "profile": top,
              "torch": torch.__version__}  # fmt: skip
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out_dir / "update_kernels.json", json.dumps(result, indent=1))
    base = med["update"]
    md = [
        f"One `paper-long` mini-batch ({rows} sequences of {PROMPT} prompt + {RESPONSE} response tokens) on {label}, "
        f"one torch thread, {repeats} alternated repeats, load average {result['load'][0]:.1f} on "
        f"{os.cpu_count()} cores at the end (`python benchmarks/bench_update_kernels.py`). Medians:",
        "",
        "| arm | seconds | vs update |",
        "|---|---|---|",
        *(f"| {name} | {s:.3f} | {s / base:.2f}x |" for name, s in med.items()),
        "",
        "Self CPU time of one `update` (torch.profiler, top operators):",
        "",
        "| operator | ms | share |",
        "|---|---|---|",
        *(f"| `{r['op']}` | {r['self_ms']:.1f} | {r['share']:.0%} |" for r in top),
    ]
    write_atomic(args.out_dir / "update_kernels.md", "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())

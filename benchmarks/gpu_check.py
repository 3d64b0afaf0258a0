"""GPU check: the default job, a larger locally built model on the chain task, LoRA and bf16, on CUDA vs CPU.

One command: `python benchmarks/gpu_check.py [--steps 20]`. Needs a CUDA device (it says so and exits 1 otherwise).
Each case runs `vespo train` twice with identical settings, `--device cuda` and `--device cpu` (the CPU run is cut
to `--cpu-steps` rollout steps, enough for a rate), and records samples/s (responses per second of the whole loop),
CUDA peak memory, and whether the training reward rose (mean of the last third of steps vs the first third). Writes
benchmarks/results/gpu/{results.json,results.md}. No network: the models are built locally (random init, the
embedded character tokenizer), so the larger model learns only what RL alone can teach it in `--steps` steps.
`--smoke --out-dir DIR`: every case for one rollout step of 2 prompts x 2 on a tiny "larger" model and a 2-step warm
start built in DIR (seconds); without CUDA it prints "skipped: no CUDA" and exits 0 (CI).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

OUT = Path("benchmarks/results/gpu")


def _larger_model(path: Path, layers: int, hidden: int) -> int:
    """A ~50-100M-parameter Llama with the embedded tokenizer, saved to `path`; returns its parameter count."""
    import transformers

    from vespo.embedded.task import build_tokenizer

    tok = build_tokenizer()
    config = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, max_position_embeddings=1024,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def _run(args: list[str], run_dir: Path, device: str) -> dict:
    from vespo.cli import main
    from vespo.train.logs import read_metrics

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    rc = main(["train", *args, "--device", device, "--run-dir", str(run_dir), "--no-progress", "--no-tensorboard"])
    wall = time.perf_counter() - t0
    rows = read_metrics(run_dir)
    third = max(1, len(rows) // 3)
    rewards = [r["reward/mean"] for r in rows]
    return {
        "rc": rc,
        "steps": len(rows),
        "wall_s": wall,
        "loop_s": sum(r.get("time/step_s", 0.0) for r in rows),
        "reward_first_third": sum(rewards[:third]) / third,
        "reward_last_third": sum(rewards[-third:]) / third,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
    }


SMOKE = ["--train-batch-size", "2", "--ppo-mini-batch-size", "2", "--rollout-n", "2", "--sft-steps", "2",
         "--eval-size", "10"]  # fmt: skip
"""`--smoke`: flags of every case (a tiny batch and warm start)."""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20, help="rollout steps per CUDA run")
    p.add_argument("--cpu-steps", type=int, default=3, help="rollout steps per CPU run (a rate, not a curve)")
    p.add_argument("--out-dir", type=Path, default=OUT, help="where results.{json,md} go (benchmarks/results/gpu)")
    p.add_argument("--smoke", action="store_true", help="every case, one tiny step; exits 0 without CUDA (CI)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        if args.smoke:
            print("gpu_check: skipped: no CUDA")
            return 0
        print("gpu_check: no CUDA device on this machine: nothing was run (see docs/guides/trainer.md)")
        return 1
    smoke = [*SMOKE, "--cache-dir", str(args.out_dir / "cache")] if args.smoke else []
    if args.smoke:
        args.steps = args.cpu_steps = 1
        args.out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=args.out_dir if args.smoke else None))
    layers, hidden = (1, 128) if args.smoke else (8, 768)
    n_params = _larger_model(tmp / "larger", layers=layers, hidden=hidden)
    chain = ["--model", str(tmp / "larger"), "--task", "chain", "--num-operands", "20", "--max-response-length", "65"]
    if args.smoke:
        chain[-3:] = ["5", "--max-response-length", "20"]
    cases = {
        "default": [],
        "default-bf16": ["--bf16"],
        f"chain-{n_params / 1e6:.0f}M": chain,
        f"chain-{n_params / 1e6:.0f}M-bf16-lora": [*chain, "--bf16", "--use-peft", "--lora-r", "16"],
        f"chain-{n_params / 1e6:.0f}M-gradckpt": [*chain, "--gradient-checkpointing"],
    }
    results = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cases": {}}
    for name, extra in cases.items():
        per = {}
        for device, steps in (("cuda", args.steps), ("cpu", args.cpu_steps)):
            flags = [*extra, *smoke, "--total-training-steps", str(steps), "--eval-every", "0"]
            run = _run(flags, tmp / name / device, device)
            responses = run["steps"] * (2 * 2 if args.smoke else 16 * 8)  # train_batch_size x rollout_n
            run["samples_per_s"] = responses / max(run["loop_s"], 1e-9)
            per[device] = run
        per["speedup"] = per["cuda"]["samples_per_s"] / per["cpu"]["samples_per_s"]
        per["reward_rose"] = per["cuda"]["reward_last_third"] > per["cuda"]["reward_first_third"]
        results["cases"][name] = per
        print(name, json.dumps(per))
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    lines = [f"GPU check on {results['device']} (torch {results['torch']}); `python benchmarks/gpu_check.py`", "",
             "| case | CUDA samples/s | CPU samples/s | speedup | peak GiB | reward first→last third |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for name, per in results["cases"].items():
        c, g = per["cpu"], per["cuda"]
        lines.append(
            f"| {name} | {g['samples_per_s']:.1f} | {c['samples_per_s']:.1f} | {per['speedup']:.1f}x | "
            f"{g['peak_mem_gib']:.2f} | {g['reward_first_third']:.3f} → {g['reward_last_third']:.3f} |"
        )
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the chain task's warm start costs and reaches at each response length (docs/guides/trainer.md, the chain task).

One command: `python benchmarks/bench_chain_warmstart.py` writes benchmarks/results/chain_warmstart.{json,md}.
Per number of steps K (responses of 3K + 5 tokens) on one torch thread: the seconds per SFT step (mean of 10 steps
after 2 of warm-up) and the projected cost of the default SFT; for every K whose warm start is already in the cache
(`vespo train --task chain --num-operands K` builds it; `--build` builds it here), its held-out accuracy as the
trainer measures it (one sample per prompt at temperature 1, 200 prompts) and the teacher-forced accuracy of the
chain's digits (greedy next token given a correct prefix). `--smoke --out-dir DIR`: K = 5, 2 timed steps, a 2-step
warm start built in DIR, 10 held-out prompts (seconds; CI).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from vespo.embedded.task import build_tiny_model, build_tokenizer, chain_response_tokens, embedded_split, solution_text
from vespo.embedded.warm_start import SFT_STEPS, WarmStartSpec, embedded_policy_path, sft_cache_key, sft_warm_start
from vespo.models import load_policy
from vespo.train.config import TrainConfig
from vespo.train.setup import evaluate, load_data

OUT = Path(__file__).parent / "results"


def chain_config(k: int, **overrides) -> TrainConfig:
    settings = {"task": "chain", "num_operands": k, "max_response_length": chain_response_tokens(k), "eval_size": 200}
    return TrainConfig(**(settings | overrides))  # defaults filled in, as `vespo train` runs it


def seconds_per_step(k: int, steps: int = 10) -> float:
    """Wall seconds of one SFT step (batch 32) at K steps, fresh model, one thread."""
    tok = build_tokenizer()
    train, _ = embedded_split("chain", num_operands=k, max_operand=9, eval_size=200)
    model = build_tiny_model(tok, max_position_embeddings=max(256, 2 * (4 * k + 16)))
    sft_warm_start(model, tok, train, steps=2, lr=3e-3, batch_size=32, seed=0)
    t0 = time.perf_counter()
    sft_warm_start(model, tok, train, steps=steps, lr=3e-3, batch_size=32, seed=1)
    return (time.perf_counter() - t0) / steps


@torch.no_grad()
def teacher_forced_digit_accuracy(model, tok, records: list[dict]) -> float:
    """Share of the chain's digits (addends and running digits) the model predicts greedily after a correct prefix."""
    hits = total = 0
    for r in records:
        prompt = tok(r["prompt"]).input_ids
        target = tok(solution_text(_problem(r)), add_special_tokens=False).input_ids
        logits = model(input_ids=torch.tensor([prompt + target])).logits[0, len(prompt) - 1 : -1]
        pred = logits.argmax(-1)
        digits = [i for i, t in enumerate(tok.convert_ids_to_tokens(target)) if t.isdigit()][:-1]  # not the box
        hits += int((pred[digits] == torch.tensor(target)[digits]).sum())
        total += len(digits)
    return hits / total


def _problem(record: dict):
    from vespo.embedded.task import Problem

    return Problem(record["prompt"], record["answer"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[5, 20, 41, 84], help="chain steps K")
    parser.add_argument("--build", action="store_true", help="build missing warm starts (default SFT; slow)")
    parser.add_argument("--out-dir", type=Path, default=OUT, help="where chain_warmstart.{json,md} go")
    parser.add_argument("--smoke", action="store_true", help="K = 5, a 2-step warm start built in --out-dir (CI)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = args.out_dir
    smoke = {"sft_steps": 2, "eval_size": 10, "cache_dir": str(out / "cache")} if args.smoke else {}
    if args.smoke:
        args.steps, args.build = [5], True
    rows = []
    for k in args.steps:
        cfg = chain_config(k, **smoke)
        sft_steps = cfg.sft_steps or SFT_STEPS["chain"]
        row = {"K": k, "response_tokens": chain_response_tokens(k), "sft_steps": sft_steps}
        row["s_per_sft_step"] = seconds_per_step(k, steps=2 if args.smoke else 10)
        row["projected_sft_minutes"] = row["s_per_sft_step"] * sft_steps / 60
        spec = WarmStartSpec.of(cfg)
        cached = (Path(cfg.cache_dir).expanduser() / f"embedded-{sft_cache_key(spec)}" / "config.json").is_file()
        if cached or args.build:
            t0 = time.perf_counter()
            model, tok = load_policy(embedded_policy_path(spec))
            if not cached:
                row["measured_sft_minutes"] = (time.perf_counter() - t0) / 60
            _, eval_set = load_data(cfg)
            row["heldout_accuracy"] = evaluate(model, tok, eval_set, cfg)["eval/accuracy"]
            row["teacher_forced_digit_accuracy"] = teacher_forced_digit_accuracy(model, tok, eval_set[:50])
        rows.append(row)
        print(json.dumps(row), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "chain_warmstart.json").write_text(json.dumps(rows, indent=1))
    lines = [
        "# Chain task warm start by length (one torch thread; chance accuracy 0.10)",
        "",
        "| K | response tokens | s / SFT step | default SFT, min (projected) | held-out acc. | chain digits right |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        acc = f"{r['heldout_accuracy']:.3f}" if "heldout_accuracy" in r else "not built"
        tf = f"{r['teacher_forced_digit_accuracy']:.3f}" if "teacher_forced_digit_accuracy" in r else "–"
        lines.append(
            f"| {r['K']} | {r['response_tokens']} | {r['s_per_sft_step']:.3f} | {r['projected_sft_minutes']:.1f} "
            f"| {acc} | {tf} |"
        )
    (out / "chain_warmstart.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

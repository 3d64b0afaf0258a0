"""VESPO through TRL's `GRPOTrainer` with vLLM rollouts, stale by N optimizer steps, the train-inference mismatch
corrected as the official VESPO code corrects it: token-level truncated IS at 2, folded into VESPO's sequence weight.

    pip install -e ".[trl]" vllm     # in the clone
    accelerate launch examples/trl/vespo_grpo.py --model Qwen/Qwen3-8B-Base --num-mini-batches 8

Why the correction is set here: TRL's default, `vllm_importance_sampling_mode="sequence_mask"`, zeroes every
sequence whose ratio pi_old / pi_vLLM (a product over its tokens) exceeds `vllm_importance_sampling_clip_max` (3), so
long responses, whose small per-token gaps add up, are dropped more often than short ones; TRL's own
`loss_type="vespo"` refuses that mode when its trainer starts. `VespoGRPOTrainer` accepts every mode
(docs/guides/verl.md); this script asks for `token_truncate` at 2, veRL's rollout correction in the official recipe.
"""

from __future__ import annotations

import argparse
import sys

from vespo.cli import warn_renamed
from vespo.integrations.trl import VespoGRPOConfig

IS_MODE = "token_truncate"
"""min(pi_old / pi_vLLM, 2) per token, folded into W (not TRL's default `sequence_mask`)."""
IS_CLIP_MAX = 2.0


def build_config(output_dir: str, *, num_mini_batches: int = 8, **overrides) -> VespoGRPOConfig:
    """The run's config: VESPO at the paper's (c1, c2), `num_mini_batches` optimizer steps per vLLM generation (the
    paper's N), 8 responses per prompt, lr 1e-6, no KL, token-mean; `overrides` are any other `VespoGRPOConfig`
    field."""
    settings = dict(
        output_dir=output_dir,
        vespo_method="vespo",  # the paper's defaults: (c1, c2) = (2, 3) for A > 0, (3, 2) for A < 0
        steps_per_generation=num_mini_batches,  # one generation batch feeds N optimizer steps
        num_generations=8,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        learning_rate=1e-6,
        beta=0.0,
        max_completion_length=4096,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode=IS_MODE,
        vllm_importance_sampling_clip_max=IS_CLIP_MAX,
        logging_steps=1,
    )
    return VespoGRPOConfig(**(settings | overrides))


def main(argv: list[str] | None = None) -> None:
    from datasets import Dataset

    from vespo.data import load_records
    from vespo.integrations.trl import VespoGRPOTrainer
    from vespo.rewards import math_reward

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="Qwen/Qwen3-8B-Base")
    p.add_argument("--dataset", default="BytedTsinghua-SIA/DAPO-Math-17k", help="a Hub id or .jsonl (prompt, answer)")
    p.add_argument(
        "--num-mini-batches",
        "--staleness",
        type=int,
        default=8,
        help="N: optimizer steps per generation batch (--staleness: old name, deprecated)",
    )
    p.add_argument("--output-dir", default="runs/trl_vespo")
    p.add_argument("--max-steps", type=int, default=-1)
    a = p.parse_args(argv)
    warn_renamed(p.prog, sys.argv[1:] if argv is None else argv, {"--staleness": "--num-mini-batches"})
    records = load_records(a.dataset)
    ds = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in records])
    args = build_config(a.output_dir, num_mini_batches=a.num_mini_batches, max_steps=a.max_steps)
    VespoGRPOTrainer(model=a.model, reward_funcs=math_reward, args=args, train_dataset=ds).train()


if __name__ == "__main__":
    main()

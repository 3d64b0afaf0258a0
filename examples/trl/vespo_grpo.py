"""VESPO through TRL's `GRPOTrainer`, stale by N optimizer steps, with vLLM rollouts on a GPU and the train-inference
mismatch corrected as the official VESPO code corrects it: token-level truncated IS at 2, folded into VESPO's weight.

Where it runs: on a CUDA GPU with vLLM and bf16 (the paper's setting, the default where CUDA is present), or on a CPU
with TRL's own generation in fp32 (the default without CUDA, said on stderr when it starts; `--no-vllm --no-bf16`
asks for the same on a GPU). `--help` answers before TRL or torch is imported.

    pip install -e ".[trl]" vllm     # in the clone
    accelerate launch examples/trl/vespo_grpo.py --model Qwen/Qwen3-8B-Base --num-mini-batches 8
    python examples/trl/vespo_grpo.py --model PATH --dataset data.jsonl --num-mini-batches 1 \
        --max-completion-length 16 --max-steps 1       # CPU: a local model, one step (vLLM and bf16 off)

Why the correction is set here: TRL's default, `vllm_importance_sampling_mode="sequence_mask"`, zeroes every
sequence whose ratio pi_old / pi_vLLM (a product over its tokens) exceeds `vllm_importance_sampling_clip_max` (3), so
long responses, whose small per-token gaps add up, are dropped more often than short ones; TRL's own
`loss_type="vespo"` refuses that mode when its trainer starts. `VespoGRPOTrainer` accepts every mode
(docs/integrations.md); this script asks for `token_truncate` at 2, veRL's rollout correction in the official recipe.
Without vLLM TRL samples with the policy itself, so there is no mismatch to correct and the correction is off.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

from vespo.argv import warn_renamed  # argparse only: TRL and torch are imported after the command line is read

IS_MODE = "token_truncate"
"""min(pi_old / pi_vLLM, 2) per token, folded into W (not TRL's default `sequence_mask`)."""
IS_CLIP_MAX = 2.0


def build_config(output_dir: str, *, num_mini_batches: int = 8, use_vllm: bool = True, **overrides):
    """The run's `VespoGRPOConfig`: VESPO at the paper's (c1, c2), `num_mini_batches` optimizer steps per generation
    batch (the paper's N), 8 responses per prompt, lr 1e-6, no KL, token-mean; with `use_vllm`, colocated vLLM and
    TRL's correction at the token level truncated at 2; `overrides` are any other `VespoGRPOConfig` field (`bf16`,
    `use_cpu`, ...)."""
    from vespo.integrations.trl import VespoGRPOConfig  # imports TRL

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
        use_vllm=use_vllm,
        logging_steps=1,
    )
    if use_vllm:
        settings |= dict(
            vllm_mode="colocate",
            vllm_importance_sampling_correction=True,
            vllm_importance_sampling_mode=IS_MODE,
            vllm_importance_sampling_clip_max=IS_CLIP_MAX,
        )
    else:  # TRL samples with the policy itself: nothing to correct
        settings["vllm_importance_sampling_correction"] = False
    return VespoGRPOConfig(**(settings | overrides))


def parser() -> argparse.ArgumentParser:
    """The command line; reading it imports nothing heavy (`--help` answers at once)."""
    p = argparse.ArgumentParser(
        prog="vespo_grpo.py",
        description=__doc__.split("\n")[0] + " Runs on a CUDA GPU (vLLM, bf16) or on a CPU (both off, the default "
        "without CUDA).",
    )
    p.add_argument("--model", default="Qwen/Qwen3-8B-Base", help="a Hub id or a local model directory")
    p.add_argument("--dataset", default="BytedTsinghua-SIA/DAPO-Math-17k", help="a Hub id or .jsonl (prompt, answer)")
    p.add_argument(
        "--num-mini-batches",
        "--staleness",
        type=_positive_int,
        default=8,
        help="N: optimizer steps per generation batch (--staleness: old name, deprecated)",
    )
    p.add_argument("--max-completion-length", type=_positive_int, default=4096, help="response length cap (tokens)")
    p.add_argument("--output-dir", default="runs/trl_vespo")
    p.add_argument("--max-steps", type=int, default=-1, help="optimizer steps (-1: one epoch of the dataset)")
    p.add_argument(
        "--vllm",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="generate with colocated vLLM (needs CUDA and vLLM); default: on where both are present",
    )
    p.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bf16 mixed precision; default: on where the CUDA device supports it, off on a CPU (fp32)",
    )
    return p


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def hardware_settings(use_vllm: bool | None, bf16: bool | None) -> tuple[dict, str | None]:
    """(`use_vllm`, `bf16`, `use_cpu` for `build_config`, the line that says what an unset flag defaulted to and
    why, or None); ValueError for `--vllm` where it cannot run."""
    import torch

    cuda = torch.cuda.is_available()
    has_vllm = importlib.util.find_spec("vllm") is not None
    if use_vllm and not (cuda and has_vllm):
        raise ValueError("--vllm needs a CUDA device and vLLM installed (pip install vllm); pass --no-vllm")
    why = []
    if use_vllm is None:
        use_vllm = cuda and has_vllm
        if not use_vllm:
            why.append("vLLM off (" + ("no CUDA device" if not cuda else "vLLM is not installed") + ")")
    if bf16 is None:
        bf16 = cuda and torch.cuda.is_bf16_supported()
        if not bf16:
            why.append("bf16 off (" + ("no CUDA device: fp32 on the CPU" if not cuda else "not on this GPU") + ")")
    note = f"vespo_grpo.py: {', '.join(why)}; --vllm / --bf16 to change" if why else None
    return {"use_vllm": use_vllm, "bf16": bf16, "use_cpu": not cuda}, note


def main(argv: list[str] | None = None) -> None:
    p = parser()
    a = p.parse_args(argv)
    warn_renamed(p.prog, sys.argv[1:] if argv is None else argv, {"--staleness": "--num-mini-batches"})
    try:
        hardware, note = hardware_settings(a.vllm, a.bf16)
    except ValueError as exc:
        p.error(str(exc))
    if note:
        print(note, file=sys.stderr, flush=True)
    from datasets import Dataset

    from vespo.data import load_records
    from vespo.integrations.trl import VespoGRPOTrainer
    from vespo.rewards import math_reward

    records = load_records(a.dataset)
    ds = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in records])
    args = build_config(
        a.output_dir,
        num_mini_batches=a.num_mini_batches,
        max_steps=a.max_steps,
        max_completion_length=a.max_completion_length,
        **hardware,
    )
    VespoGRPOTrainer(model=a.model, reward_funcs=math_reward, args=args, train_dataset=ds).train()


if __name__ == "__main__":
    main()

"""Generation: the `Rollout` record and `Engine` protocol (`types`), the Hugging Face sampler and log-prob scorer
(`hf`), and vLLM (`vllm`, CUDA only)."""

from vespo.rollout.hf import HFEngine, decode_responses, generate_texts, response_log_probs, sample
from vespo.rollout.types import Engine, Rollout, pack_rollout

__all__ = [
    "Engine",
    "HFEngine",
    "Rollout",
    "decode_responses",
    "generate_texts",
    "pack_rollout",
    "response_log_probs",
    "sample",
]

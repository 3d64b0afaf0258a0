"""Generation: the `Rollout` record and `Engine` protocol (`types`), the Hugging Face sampler and log-prob scorer
(`hf`), and vLLM (`vllm`, CUDA only)."""

from vespo.rollout.hf import HFEngine, decode_responses, response_log_probs, sample
from vespo.rollout.types import Engine, Rollout, SamplingSettings, pack_rollout


def build_engine(
    kind: str, settings: SamplingSettings, *, policy_path: str | None = None, seed: int = 0, model=None, tokenizer=None
):
    """The one way a loop or an evaluation gets its generation engine: "vllm" (CUDA; its own weights, loaded from
    `policy_path`, else from the in-memory `model`), or "hf" on `model` (the learner's, shared, or a cast copy when
    `settings.dtype` differs) when given, else a private copy from `policy_path`."""
    if kind == "vllm":
        from vespo.rollout.vllm import VLLMEngine

        if policy_path is None:
            return VLLMEngine.from_model(model, tokenizer, settings, seed=seed)
        return VLLMEngine(policy_path, settings, seed=seed)
    if model is not None:
        return HFEngine.from_model(model, tokenizer, settings)
    return HFEngine.from_path(policy_path, settings)


__all__ = [
    "Engine",
    "HFEngine",
    "Rollout",
    "SamplingSettings",
    "build_engine",
    "decode_responses",
    "pack_rollout",
    "response_log_probs",
    "sample",
]

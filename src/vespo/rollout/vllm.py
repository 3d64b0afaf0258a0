"""vLLM generation (CUDA only; written against vLLM's `LLM` API and not run on the CPU CI): the one vLLM engine, for
the sync loop, the async samplers and evaluation (`vespo eval --backend vllm`).

Log-probs are vLLM's "processed" ones (after temperature, top-k and top-p): the log-probs of the distribution actually
sampled, the convention of `vespo.rollout.hf.sample` and of the learner's `response_log_probs`.
"""

from __future__ import annotations

import importlib.util
import tempfile

import torch

from vespo.models import load_tokenizer
from vespo.rollout.types import SamplingSettings, pack_rollout

Tensor = torch.Tensor


def vllm_available() -> bool:
    """True when the vLLM backend can be used (vLLM importable and a CUDA device present)."""
    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


class VLLMEngine:
    """vLLM in the sampler's own process; each published version is pushed in place with the model runner's
    `load_weights` (as TRL's colocate mode and veRL's sharding manager do), then the prefix cache is reset.

    Log-probs are vLLM's "processed" ones (after temperature, top-k and top-p), vespo's convention (the learner
    recomputes them on the same processed distribution; docs/methods/index.md). Needs CUDA: written against
    vLLM's `LLM` API with the in-process driver worker, and not run here; `pack_rollout` is tested on HF samples.
    """

    def __init__(self, policy_path: str, settings: SamplingSettings, *, seed: int = 0):
        from vllm import LLM

        self.tokenizer = load_tokenizer(policy_path)
        self.llm = LLM(
            model=str(policy_path),
            dtype=settings.dtype,
            seed=seed,
            logprobs_mode="processed_logprobs",
        )
        self.settings = settings

    @classmethod
    def from_model(cls, model, tokenizer, settings: SamplingSettings, *, seed: int = 0) -> VLLMEngine:
        """An engine on an in-memory HF model (an evaluation during training): saved to a temporary directory,
        which vLLM reads once while it builds its own copy of the weights."""
        with tempfile.TemporaryDirectory() as path:
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
            return cls(path, settings, seed=seed)

    def load(self, named: list[tuple[str, Tensor]]) -> None:
        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
        runner.model.load_weights(named)
        self.llm.reset_prefix_cache()

    def generate(self, prompts: list[str], generator: torch.Generator):
        from vllm import SamplingParams

        s = self.settings
        params = SamplingParams(
            n=s.n,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k or -1,  # vLLM: -1 disables
            max_tokens=s.max_new_tokens,
            logprobs=0,  # the sampled token's log-prob only
            seed=int(torch.randint(2**31 - 1, (1,), generator=generator, device=generator.device)),  # per request
        )
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        prompt_ids, response_ids, logps = [], [], []
        for out in outputs:
            for comp in out.outputs:
                prompt_ids.append(list(out.prompt_token_ids))
                response_ids.append(list(comp.token_ids))
                logps.append([d[t].logprob for d, t in zip(comp.logprobs, comp.token_ids, strict=True)])
        return pack_rollout(prompt_ids, response_ids, logps, pad_id=self.tokenizer.pad_token_id)

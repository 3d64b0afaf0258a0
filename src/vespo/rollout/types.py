"""What every generation engine returns (`Rollout`) and how an engine is driven (`Engine`): shared by the sync
trainer, the async samplers and evaluation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import transformers

Tensor = torch.Tensor


@dataclass
class Rollout:
    """A sampled batch, prompts repeated n times consecutively (rows i*n .. i*n+n-1 belong to prompt i).

    Layout is left-padded prompt then right-padded response, so the response starts at column P for every row.
    """

    input_ids: Tensor  # (B, P + T) prompt then response token ids
    attention_mask: Tensor  # (B, P + T) 1 on real tokens
    response_mask: Tensor  # (B, T) 1 on response tokens up to and including <eos>
    rollout_log_prob: Tensor  # (B, T) sampler log-probs of the sampled tokens, 0 on padding

    @property
    def prompt_len(self) -> int:
        return self.input_ids.shape[1] - self.response_mask.shape[1]

    @property
    def response_ids(self) -> Tensor:  # (B, T)
        return self.input_ids[:, self.prompt_len :]

    def select(self, rows: Tensor | slice) -> Rollout:
        """The sub-batch of the given rows (a mini- or micro-batch)."""
        fields = (self.input_ids, self.attention_mask, self.response_mask, self.rollout_log_prob)
        return Rollout(*(t[rows] for t in fields))


@dataclass(frozen=True)
class SamplingSettings:
    """What an engine needs to sample a rollout, and nothing else (a loop builds it from its own config)."""

    n: int = 8
    """Responses per prompt (the GRPO group)."""
    max_new_tokens: int = 64
    """Response length cap."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """Top-k truncation (0: off)."""
    logit_noise_std: float = 0.0
    """A controlled train-inference mismatch: Gaussian noise on the sampler's logits (HF engine only)."""
    dtype: str = "float32"
    """The engine's copy of the weights: float32 | bfloat16 | float16 (a low-precision inference engine)."""


class Engine(Protocol):
    """A generation engine: HF (`vespo.rollout.hf.HFEngine`: the learner's own model, a cast copy, or a private copy
    in a sampler process) or vLLM (`vespo.rollout.vllm.VLLMEngine`). The sync loop and the async samplers drive it
    the same way: `load` the learner's weights, then `generate`."""

    tokenizer: transformers.PreTrainedTokenizerBase

    def load(self, named: list[tuple[str, Tensor]]) -> None:
        """Copy the learner's named parameters into the engine's weights (a weight sync)."""

    def generate(self, prompts: list[str], generator: torch.Generator) -> Rollout:
        """`settings.n` responses per prompt with their sampler log-probs; all randomness from `generator`."""


def pack_rollout(prompt_ids: list[list[int]], response_ids: list[list[int]], logps: list[list[float]], *, pad_id: int):
    """Token lists from an inference engine -> `Rollout` (prompt left-padded, response right-padded, mask = tokens
    generated up to and including <eos>, sampler log-probs 0 on padding), the layout `vespo.rollout.sample` returns."""
    b = len(prompt_ids)
    p, t = max(map(len, prompt_ids)), max(1, max(map(len, response_ids)))
    ids = torch.full((b, p + t), pad_id, dtype=torch.long)
    attn = torch.zeros(b, p + t, dtype=torch.long)
    lp = torch.zeros(b, t)
    for i, (pi, ri, li) in enumerate(zip(prompt_ids, response_ids, logps, strict=True)):
        ids[i, p - len(pi) : p] = torch.tensor(pi, dtype=torch.long)
        attn[i, p - len(pi) : p] = 1
        ids[i, p : p + len(ri)] = torch.tensor(ri, dtype=torch.long)
        attn[i, p : p + len(ri)] = 1
        lp[i, : len(li)] = torch.tensor(li, dtype=torch.float32)
    return Rollout(ids, attn, attn[:, p:].clone(), lp)

"""Rollouts: sample completions with their sampler log-probs, and score fixed sequences under a policy.

The policy is the distribution actually sampled: logits / temperature, then top-k, then top-p truncation, renormalised
(`processed_logits`; vLLM's "processed_logprobs"). The sampler records log pi_rollout(y_t) of that distribution and the
trainer recomputes the same quantity under its own weights with `response_log_probs`, so on-policy W == 1 at any
top_p / top_k and any difference between the two is train-inference mismatch (paper Sec. 4.6; docs/methods/index.md).
This module is the Hugging Face backend (KV-cached sampling in the trainer's own process, or in a sampler process
through `HFEngine`); `vespo.rollout.vllm` is the vLLM one.
"""

from __future__ import annotations

import inspect
import weakref
from copy import deepcopy

import torch
import transformers
from torch.utils.checkpoint import checkpoint
from transformers.cache_utils import DynamicLayer

from vespo.rollout.types import Rollout, SamplingSettings

Tensor = torch.Tensor


def _position_ids(attention_mask: Tensor) -> Tensor:
    """Positions counting real tokens only, so left padding does not shift the prompt (as HF generate does)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, L)


OUTSIDE_LOG_PROB = -1e4  # log-prob of a token outside the learner's top-k / top-p set (probability 0; kept finite)


def processed_logits(logits: Tensor, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0) -> Tensor:
    """The sampling distribution's logits (..., V): divided by `temperature`, then everything outside the `top_k`
    largest (0: off) and outside the nucleus of mass `top_p` set to -inf (the order of vLLM and HF generate)."""
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return top_p_filter(logits, top_p)


def top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """Nucleus filtering: keep the smallest set of tokens whose probability mass reaches `top_p` (Holtzman et al.)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    drop_sorted = cum - sorted_logits.softmax(-1) >= top_p  # mass before this token already reaches top_p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def _forward_params(model):
    """The parameters of the causal LM's own `forward` (a peft model passes them through to its base model's)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inspect.signature(base.forward).parameters


def _cache_keyword(model) -> str:
    """The KV-cache argument and output name of `model.forward`: `cache` (transformers >= 5.2x, where
    `past_key_values` is deprecated) or `past_key_values` (earlier releases)."""
    return "cache" if "cache" in _forward_params(model) else "past_key_values"


class _PreallocatedLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values live in buffers sized for the whole rollout: a decoded token is written
    into its slot, where `DynamicLayer.update` copies the whole cache (`torch.cat`) at every token, which made decoding
    quadratic in the length (half the generation time of a 128-token rollout on the embedded model)."""

    def __init__(self, layer: DynamicLayer, capacity: int):
        super().__init__()
        length = layer.keys.shape[-2]
        self._keys = layer.keys.new_empty(*layer.keys.shape[:-2], capacity, layer.keys.shape[-1])
        self._values = layer.values.new_empty(*layer.values.shape[:-2], capacity, layer.values.shape[-1])
        self._keys[..., :length, :], self._values[..., :length, :] = layer.keys, layer.values
        self.device, self.is_initialized, self._length = layer.keys.device, True, length
        self.keys, self.values = self._keys[..., :length, :], self._values[..., :length, :]

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        end = self._length + key_states.shape[-2]
        if end > self._keys.shape[-2]:
            raise RuntimeError(f"preallocated KV cache holds {self._keys.shape[-2]} positions; {end} were written")
        self._keys[..., self._length : end, :], self._values[..., self._length : end, :] = key_states, value_states
        self._length = end
        self.keys, self.values = self._keys[..., :end, :], self._values[..., :end, :]
        return self.keys, self.values


def _preallocate(cache, new_tokens: int) -> None:
    """Give each plain `DynamicLayer` of a prefilled cache room for `new_tokens` more positions (`_PreallocatedLayer`);
    sliding-window, quantised and legacy caches are left as they are."""
    for i, layer in enumerate(getattr(cache, "layers", ())):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.dim() == 4:
            cache.layers[i] = _PreallocatedLayer(layer, layer.keys.shape[-2] + new_tokens)


def _last_logits_only(model) -> dict:
    """`logits_to_keep=1` where `model.forward` takes it (transformers' causal LMs): the lm_head on the last
    position only."""
    return {"logits_to_keep": 1} if "logits_to_keep" in _forward_params(model) else {}


@torch.no_grad()
def sample(
    model: transformers.PreTrainedModel,
    tokenizer: transformers.PreTrainedTokenizerBase,
    prompts: list[str],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    generator: torch.Generator | None = None,
    logit_noise_std: float = 0.0,
) -> Rollout:
    """Sample `n` completions per prompt with the HF model (KV cache), recording sampler log-probs.

    `logit_noise_std` > 0 simulates an inference engine that disagrees with the trainer: i.i.d. Gaussian noise of
    that std is added to the sampler's logits (drawn from `generator`), so log pi_rollout != log pi_train by a
    controlled amount. The model runs in whatever dtype it is in (a bf16 copy gives the dtype mismatch).
    """
    if n < 1 or max_new_tokens < 1 or temperature <= 0 or not 0 < top_p <= 1 or top_k < 0:
        raise ValueError(
            f"need n>=1, max_new_tokens>=1, temperature>0, 0<top_p<=1, top_k>=0; got n={n}, "
            f"max_new_tokens={max_new_tokens}, temperature={temperature}, top_p={top_p}, top_k={top_k}"
        )
    device = next(model.parameters()).device
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    prompt_ids = enc.input_ids.repeat_interleave(n, 0).to(device)  # (B, P)
    mask = enc.attention_mask.repeat_interleave(n, 0).to(device)  # (B, P)
    batch = prompt_ids.shape[0]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    tokens, log_probs, alive_cols = [], [], []
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    cache_kw, positions = _cache_keyword(model), _position_ids(mask)
    cache, last_logits = _prefill(model, enc, n, prompt_ids, mask, positions, cache_kw)
    _preallocate(cache, max_new_tokens - 1)
    for i in range(max_new_tokens):
        tok, logp = _draw(last_logits, temperature, top_p, top_k, logit_noise_std, generator)
        tok = torch.where(alive, tok, torch.full_like(tok, pad))
        tokens.append(tok)
        tok_logp = logp.gather(-1, tok[:, None]).squeeze(-1)  # (B,)
        log_probs.append(torch.where(alive, tok_logp, torch.zeros_like(tok_logp)))
        alive_cols.append(alive.clone())
        alive = alive & (tok != eos)
        if i == max_new_tokens - 1 or not alive.any():
            break
        mask = torch.cat([mask, torch.ones_like(tok[:, None])], dim=1)
        positions = positions[:, -1:] + 1
        out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=positions, use_cache=True,
                    **{cache_kw: cache})  # fmt: skip
        cache, last_logits = out[cache_kw], out.logits[:, -1]
    response = torch.stack(tokens, 1)  # (B, T)
    response_mask = torch.stack(alive_cols, 1).long()  # (B, T)
    full_ids = torch.cat([prompt_ids, response], 1)  # (B, P + T)
    full_mask = torch.cat([enc.attention_mask.repeat_interleave(n, 0).to(device), response_mask], 1)
    return Rollout(full_ids, full_mask, response_mask, torch.stack(log_probs, 1).float())


def _prefill(model, enc, n: int, prompt_ids: Tensor, mask: Tensor, positions: Tensor, cache_kw: str):
    """(KV cache, last position's logits (B, V)) of the prompts, each repeated `n` times: each distinct prompt is
    run once, the last position's logits only, then its cache repeated (the prompt pass was n times the work, and the
    (B, P, V) logits the largest tensor of a rollout); a legacy tuple cache prefills every row."""
    unique_mask, last_only = enc.attention_mask.to(mask.device), _last_logits_only(model)
    out = model(input_ids=enc.input_ids.to(mask.device), attention_mask=unique_mask,
                position_ids=_position_ids(unique_mask), use_cache=True, **last_only)  # fmt: skip
    cache = out[cache_kw]
    if hasattr(cache, "batch_repeat_interleave"):
        cache.batch_repeat_interleave(n)
        return cache, out.logits[:, -1].repeat_interleave(n, 0)  # (B, V)
    out = model(input_ids=prompt_ids, attention_mask=mask, position_ids=positions, use_cache=True, **last_only)
    return out[cache_kw], out.logits[:, -1]


def _draw(
    last_logits: Tensor, temperature: float, top_p: float, top_k: int, noise_std: float, generator
) -> tuple[Tensor, Tensor]:
    """One token per row (B,) from the processed distribution, and that distribution's log-probs (B, V) (-inf
    outside the top-k / top-p set); `noise_std` > 0 adds the simulated engine's Gaussian noise to the logits first."""
    logits = last_logits.float() / temperature  # (B, V)
    if noise_std > 0:
        noise = torch.randn(logits.shape, generator=generator, device=logits.device)
        logits = logits + noise_std * noise
    logits = processed_logits(logits, top_p=top_p, top_k=top_k)  # the distribution sampled from
    logp = logits.log_softmax(-1)  # (B, V)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1), logp


LOG_PROB_CHUNK_BYTES = 64 * 2**20
"""Size of one chunk's fp32 logits in `response_log_probs`: (rows x positions) per chunk = this / (4 V), e.g. 341
response positions at SmolLM2's V = 49,152, one chunk for the embedded model's small vocabulary."""

_PLAIN_HEAD_MODEL_TYPES = frozenset(
    {
        "deepseek_v3", "gemma", "gemma2", "gemma3_text", "gpt2", "gpt_neox", "llama", "mistral", "mixtral", "olmo",
        "olmo2", "phi", "phi3", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "smollm3", "stablelm", "starcoder2",
    }
)  # fmt: skip
"""`config.model_type`s whose `*ForCausalLM.forward` computes logits = lm_head(last hidden state), then only the
optional `final_logit_softcapping` (gemma2, gemma3_text), as read in transformers 5.x. Other models (a logit scale:
cohere, granite; a bias; remote code) keep the full-logits path, whose values are right by construction."""


def _split_head(model) -> tuple[torch.nn.Module, torch.nn.Module, float | None] | None:
    """(decoder body, lm_head, final logit softcap or None) of an HF causal LM whose logits are exactly
    softcap(lm_head(body(...).last_hidden_state)), or None when that cannot be vouched for (then the caller
    materialises the full logits as the model's own forward does). A LoRA/peft model is unwrapped to the base model
    its adapters were injected into; prompt-learning peft methods, which add virtual tokens in their forward, are
    not split."""
    peft_config = getattr(model, "active_peft_config", None)
    if peft_config is not None and getattr(peft_config, "is_prompt_learning", False):
        return None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) not in _PLAIN_HEAD_MODEL_TYPES:
        return None
    if not type(base).__name__.endswith("ForCausalLM") or not hasattr(base, "get_decoder"):
        return None
    head = base.get_output_embeddings()
    body = base.get_decoder()
    if head is None or body is None or body is base:
        return None
    return body, head, getattr(config, "final_logit_softcapping", None)


_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Decoder body -> its `torch.compile`d forward, used by `response_log_probs` only (`compile_log_probs`)."""


def compile_log_probs(model, backend: str = "inductor") -> bool:
    """Make `response_log_probs` run `model`'s decoder body through `torch.compile` (dynamic shapes: one graph for
    every batch and length); generation and every other call of the model stay eager, and the weights, state_dict
    and checkpoints are the model's own. False (nothing compiled) for models taking the full-logits path."""
    split = _split_head(model)
    if split is None:
        return False
    body = split[0]
    _COMPILED[body] = torch.compile(body.forward, dynamic=True, backend=backend)
    return True


def _token_log_probs(
    logits: Tensor, targets: Tensor, temperature: float, top_p: float, top_k: int, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """log pi(target) under `processed_logits` of `logits` (N, V) as logit - logsumexp (no (N, V) log-softmax
    kept), with the OUTSIDE_LOG_PROB floor, and the entropy of the processed distribution (0 log 0 = 0) if asked.
    Returns ((N,), (N,) or None)."""
    logits = processed_logits(logits.float(), temperature, top_p, top_k)  # (N, V), -inf outside top-k / top-p
    lse = logits.logsumexp(-1)  # (N,)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse  # (N,)
    if top_p < 1.0 or top_k > 0:  # outside the set: probability 0, a finite floor without gradient
        logp = torch.where(torch.isinf(logp), OUTSIDE_LOG_PROB, logp)
    if not with_entropy:
        return logp, None
    logp_all = logits - lse[:, None]  # (N, V)
    probs = logp_all.exp()
    # 0 log 0 = 0; the -inf entries are zeroed *before* the product so that its backward is 0, not 0 * inf = nan
    entropy = -(probs * logp_all.masked_fill(probs == 0, 0.0)).sum(-1)  # (N,)
    return logp, entropy


def _chunked_log_probs(
    hidden: Tensor,
    targets: Tensor,
    head: torch.nn.Module,
    softcap: float | None,
    *,
    temperature: float,
    top_p: float,
    top_k: int,
    with_entropy: bool,
    chunk: int,
) -> tuple[Tensor, Tensor | None]:
    """`_token_log_probs` of head(hidden) (N, H) -> (N,), `chunk` rows at a time: at most one chunk's (chunk, V)
    logits exist at once. Under grad each chunk is checkpointed (recomputed in the backward), so the backward does
    not keep every chunk's logits either; a batch that fits one chunk is not (nothing to save, a recompute to lose).
    """

    def one(h: Tensor, t: Tensor) -> tuple[Tensor, ...]:
        logits = head(h)  # (c, V) in the head's (autocast) dtype, as the model's forward computes it
        if softcap is not None:  # the model's final logit soft-capping, in its own dtype, as its forward does
            logits = torch.tanh(logits / softcap) * softcap
        logp, ent = _token_log_probs(logits, t, temperature, top_p, top_k, with_entropy)
        return (logp,) if ent is None else (logp, ent)

    grad = torch.is_grad_enabled() and hidden.shape[0] > chunk
    outs = [
        checkpoint(one, hidden[i : i + chunk], targets[i : i + chunk], use_reentrant=False)
        if grad
        else one(hidden[i : i + chunk], targets[i : i + chunk])
        for i in range(0, hidden.shape[0], chunk)
    ]
    logp = torch.cat([o[0] for o in outs])  # (N,)
    return logp, torch.cat([o[1] for o in outs]) if with_entropy else None


def _full_logits_log_probs(
    model, rollout: Rollout, *, temperature: float, top_p: float, top_k: int, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """The straightforward path: the model's whole forward, (B, P + T, V) logits, then `_token_log_probs` on the
    response positions: for models `_split_head` cannot split."""
    p = rollout.prompt_len
    logits = model(
        input_ids=rollout.input_ids,
        attention_mask=rollout.attention_mask,
        position_ids=_position_ids(rollout.attention_mask),
    ).logits  # (B, P + T, V)
    logits = logits[:, p - 1 : -1]  # (B, T, V): position t predicts response token t
    b, t, v = logits.shape
    logp, ent = _token_log_probs(
        logits.reshape(b * t, v), rollout.response_ids.reshape(-1), temperature, top_p, top_k, with_entropy
    )
    return logp.view(b, t), None if ent is None else ent.view(b, t)


def response_log_probs(
    model: transformers.PreTrainedModel,
    rollout: Rollout,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Per-token log pi(y_t | x, y_<t) of the rollout's response tokens under `model`, and optionally the entropy.

    pi is the sampling distribution, `processed_logits` with the sampler's temperature, top_k and top_p, so on-policy
    the result equals the sampler's log-probs up to numerics. A token outside this model's top-k / top-p set has
    probability 0: its log-prob is `OUTSIDE_LOG_PROB` (finite, no gradient), so its token ratio is clamped to e^-20.
    Returns ((B, T) log-probs, (B, T) entropy of the processed distribution or None); 0 on padding.

    The (B, T, V) logits are never materialised (TRL's selective log-softmax, Liger's chunked loss): the decoder body
    gives the last hidden states, and the lm_head, the sampling transform and logit - logsumexp run on the response
    positions only, `LOG_PROB_CHUNK_BYTES` of fp32 logits at a time, each chunk checkpointed under grad; peak memory
    no longer grows with B x T x V (benchmarks/results/logprob_memory.md). Models whose logits are not plainly
    lm_head(hidden) (`_split_head`) take the full-logits path, with the same values.
    """
    split = _split_head(model)
    if split is None:
        logp, entropy = _full_logits_log_probs(
            model, rollout, temperature=temperature, top_p=top_p, top_k=top_k, with_entropy=with_entropy
        )
    else:
        body, head, softcap = split
        p, (b, t) = rollout.prompt_len, rollout.response_mask.shape
        hidden = _COMPILED.get(body, body)(
            input_ids=rollout.input_ids,
            attention_mask=rollout.attention_mask,
            position_ids=_position_ids(rollout.attention_mask),
            use_cache=False,
        )[0]  # (B, P + T, H): the last hidden state
        hidden = hidden[:, p - 1 : -1].reshape(b * t, -1)  # (B T, H): position t predicts response token t
        chunk = max(1, LOG_PROB_CHUNK_BYTES // (4 * head.weight.shape[0]))
        logp, entropy = _chunked_log_probs(
            hidden,
            rollout.response_ids.reshape(-1),
            head,
            softcap,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            with_entropy=with_entropy,
            chunk=chunk,
        )
        logp, entropy = logp.view(b, t), None if entropy is None else entropy.view(b, t)
    logp = logp * rollout.response_mask
    return logp, None if entropy is None else entropy * rollout.response_mask


def decode_responses(tokenizer: transformers.PreTrainedTokenizerBase, rollout: Rollout) -> list[str]:
    """Response strings without special tokens (one per row)."""
    ids = rollout.response_ids.masked_fill(rollout.response_mask == 0, tokenizer.pad_token_id)
    return tokenizer.batch_decode(ids.tolist(), skip_special_tokens=True)


class HFEngine:
    """`vespo.rollout.sample` on a Hugging Face model: the learner's own (`shared`: a weight sync is a no-op), or a
    copy in `settings.dtype` (`from_model` in the sync loop, `from_path` in an async sampler process)."""

    def __init__(self, model, tokenizer, settings: SamplingSettings, *, shared: bool = False):
        self.model, self.tokenizer, self.settings, self.shared = model, tokenizer, settings, shared

    @classmethod
    def from_path(cls, policy_path: str, settings: SamplingSettings) -> HFEngine:
        """A private copy loaded from disk (an async sampler process)."""
        from vespo.models import load_policy

        model, tokenizer = load_policy(policy_path, dtype=getattr(torch, settings.dtype))
        return cls(model.eval().requires_grad_(False), tokenizer, settings)

    @classmethod
    def from_model(cls, model, tokenizer, settings: SamplingSettings) -> HFEngine:
        """The learner's model itself when `settings.dtype` is its own, else a cast copy synced by `load`."""
        if getattr(torch, settings.dtype) == next(model.parameters()).dtype:
            return cls(model, tokenizer, settings, shared=True)
        copy = deepcopy(model).to(getattr(torch, settings.dtype)).eval().requires_grad_(False)
        return cls(copy, tokenizer, settings)

    @torch.no_grad()
    def load(self, named: list[tuple[str, Tensor]]) -> None:
        if self.shared:
            return
        params = dict(self.model.named_parameters())
        for name, t in named:
            params[name].copy_(t)  # casts to the engine's dtype

    def generate(self, prompts: list[str], generator: torch.Generator) -> Rollout:
        s = self.settings
        self.model.eval()
        return sample(
            self.model,
            self.tokenizer,
            prompts,
            n=s.n,
            max_new_tokens=s.max_new_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            generator=generator,
            logit_noise_std=s.logit_noise_std,
        )

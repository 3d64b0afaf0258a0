"""Chunked log-probs (`vespo.rollout.hf.response_log_probs`) against the straightforward full-logits path written
out here: values, entropy and gradients w.r.t. every parameter to 1e-6 in fp32, a bf16 check, top_p / top_k /
temperature, padding rows, several chunks, LoRA, the embedded tiny Llama, soft-capped logits, and the fallback."""

import pytest
import torch
import transformers

import vespo.rollout.hf as hf
from vespo.embedded.task import build_tiny_model, build_tokenizer
from vespo.rollout import Rollout, response_log_probs

V = 97  # a vocabulary the chunks cut into odd pieces
SETTINGS = [  # (temperature, top_p, top_k)
    (1.0, 1.0, 0),
    (0.7, 0.9, 0),
    (1.3, 1.0, 5),
    (1.0, 0.8, 7),
]


def reference(model, rollout, *, temperature=1.0, top_p=1.0, top_k=0):
    """The (B, T, V) way: the model's own logits, log-softmax over V, gather; entropy from the full distribution."""
    p = rollout.prompt_len
    logits = (
        model(
            input_ids=rollout.input_ids,
            attention_mask=rollout.attention_mask,
            position_ids=(rollout.attention_mask.cumsum(-1) - 1).clamp(min=0),
        )
        .logits[:, p - 1 : -1]
        .float()
    )  # (B, T, V)
    logits = logits / temperature
    if top_k > 0:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop_sorted = probs.cumsum(-1) - probs >= top_p  # the mass before this token already reaches top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    logp_all = logits.log_softmax(-1)  # (B, T, V)
    logp = logp_all.gather(-1, rollout.response_ids[..., None]).squeeze(-1)
    logp = torch.where(torch.isinf(logp), hf.OUTSIDE_LOG_PROB, logp) * rollout.response_mask
    probs = logp_all.exp()
    entropy = -(probs * logp_all.masked_fill(probs == 0, 0.0)).sum(-1) * rollout.response_mask  # 0 log 0 = 0
    return logp, entropy


def llama(dtype=torch.float32, seed=0, **overrides) -> transformers.PreTrainedModel:
    cfg = dict(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**(cfg | overrides)))
    with torch.no_grad():  # logits of a few units, so that top-k / top-p cut real mass
        model.get_output_embeddings().weight.mul_(8.0)
    return model.to(dtype).eval()


def rollout_of(vocab: int, *, rows=5, prompt=4, response=9, seed=1) -> Rollout:
    """Left-padded prompts, right-padded responses of lengths 9, 5, 1, 0 (a padding row) and 7."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (rows, prompt + response), generator=g)
    attn = torch.ones_like(ids)
    attn[1, :2] = attn[3, :1] = 0
    lengths = torch.tensor([response, 5, 1, 0, 7])[:rows]
    resp_mask = (torch.arange(response)[None] < lengths[:, None]).long()
    attn[:, prompt:] = resp_mask
    ids = ids.masked_fill(attn == 0, 0)
    return Rollout(ids, attn, resp_mask, torch.zeros(rows, response))


@pytest.fixture
def small_chunks(monkeypatch):
    """7 positions per chunk: a (5 x 9)-position batch runs in 7 chunks, the last one partial."""
    monkeypatch.setattr(hf, "LOG_PROB_CHUNK_BYTES", 4 * V * 7)
    return 7


def assert_grads_close(got: dict, want: dict, tol: float = 1e-6) -> None:
    """Every parameter's gradient within `tol` of the reference's, relative to its largest entry (fp32 sums of
    different orders differ in the last bits of the large entries)."""
    assert got.keys() == want.keys()
    for name, g in want.items():
        scale = max(1.0, g.abs().max().item())
        err = (got[name].float() - g.float()).abs().max().item()
        assert err <= tol * scale, (name, err, scale)


def head_rows(model) -> list[int]:
    """Records the number of rows of every lm_head call (to see the chunks)."""
    seen = []
    model.get_output_embeddings().register_forward_hook(lambda m, args, out: seen.append(args[0].shape[:-1].numel()))
    return seen


def grads(model, logp, entropy, rollout) -> dict[str, torch.Tensor]:
    w = torch.linspace(-1, 1, logp.numel()).view_as(logp) / logp.numel()  # weighs every position differently
    model.zero_grad()
    ((logp * w).sum() + 0.3 * (entropy * w.flip(0)).sum()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize(("temperature", "top_p", "top_k"), SETTINGS)
def test_fp32_values_entropy_and_gradients_match_the_full_logits_path(small_chunks, tie, temperature, top_p, top_k):
    model = llama(tie_word_embeddings=tie)
    rollout = rollout_of(V)
    kw = dict(temperature=temperature, top_p=top_p, top_k=top_k)
    rows = head_rows(model)
    logp, ent = response_log_probs(model, rollout, with_entropy=True, **kw)
    assert rows == [7] * 6 + [3], rows  # 45 response positions in 7 chunks; the (B, P + T, V) logits never exist
    got = grads(model, logp, ent, rollout)
    ref_logp, ref_ent = reference(model, rollout, **kw)
    want = grads(model, ref_logp, ref_ent, rollout)
    torch.testing.assert_close(logp, ref_logp, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent, ref_ent, atol=1e-6, rtol=1e-6)
    assert (logp[rollout.response_mask == 0] == 0).all() and (ent[rollout.response_mask == 0] == 0).all()
    assert len(got) == len(list(model.parameters()))
    assert_grads_close(got, want)
    if top_k or top_p < 1:  # the floor is reached (a token outside the set) and its gradient is 0, not nan
        assert (logp == hf.OUTSIDE_LOG_PROB).any()
        assert all(torch.isfinite(g).all() for g in got.values())


@pytest.mark.parametrize("autocast", [False, True], ids=["bf16-weights", "fp32-weights-autocast-bf16"])
@pytest.mark.parametrize(("temperature", "top_p", "top_k"), SETTINGS)
def test_bf16_matches_the_full_logits_path(small_chunks, autocast, temperature, top_p, top_k):
    """The lm_head on fewer rows gives the same bf16 logits (measured: identical here), then the same fp32 math:
    log-probs and entropy agree to fp32 rounding (<= 1.5e-6 measured), gradients to bf16 rounding of the parameter
    gradients (<= 5e-4 of the largest entry measured; bf16's epsilon is 7.8e-3)."""
    model = llama(dtype=torch.float32 if autocast else torch.bfloat16)
    rollout = rollout_of(V)
    kw = dict(temperature=temperature, top_p=top_p, top_k=top_k)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logp, ent = response_log_probs(model, rollout, with_entropy=True, **kw)
        got = grads(model, logp, ent, rollout)
        ref_logp, ref_ent = reference(model, rollout, **kw)
        want = grads(model, ref_logp, ref_ent, rollout)
    assert logp.dtype == ent.dtype == torch.float32
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    assert_grads_close(got, want, tol=2e-3)


def test_one_chunk_without_checkpointing_matches_too():
    """The default chunk holds this whole batch: one chunk, no recompute, same values and gradients."""
    model, rollout = llama(), rollout_of(V)
    rows = head_rows(model)
    logp, ent = response_log_probs(model, rollout, temperature=0.7, top_p=0.9, with_entropy=True)
    assert rows == [5 * 9]
    got = grads(model, logp, ent, rollout)
    ref_logp, ref_ent = reference(model, rollout, temperature=0.7, top_p=0.9)
    want = grads(model, ref_logp, ref_ent, rollout)
    torch.testing.assert_close(logp, ref_logp, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent, ref_ent, atol=1e-6, rtol=1e-6)
    assert_grads_close(got, want)


def test_values_under_no_grad_equal_those_under_grad(small_chunks):
    model, rollout = llama(), rollout_of(V)
    logp, ent = response_log_probs(model, rollout, top_k=5, with_entropy=True)
    with torch.no_grad():
        logp0, ent0 = response_log_probs(model, rollout, top_k=5, with_entropy=True)
    assert torch.equal(logp.detach(), logp0) and torch.equal(ent.detach(), ent0)
    assert not logp0.requires_grad
    logp1, ent1 = response_log_probs(model, rollout, top_k=5)
    assert ent1 is None and torch.equal(logp1.detach(), logp0)


def test_default_chunk_holds_at_most_64_mib_of_fp32_logits():
    assert hf.LOG_PROB_CHUNK_BYTES <= 128 * 2**20
    v = 49152  # SmolLM2
    assert (hf.LOG_PROB_CHUNK_BYTES // (4 * v)) * 4 * v <= 128 * 2**20


def test_the_embedded_tiny_llama_is_split_and_matches():
    tok = build_tokenizer()
    model = build_tiny_model(tok)
    assert hf._split_head(model) is not None
    rollout = rollout_of(len(tok))
    logp, ent = response_log_probs(model, rollout, temperature=0.7, top_p=0.9, with_entropy=True)
    ref_logp, ref_ent = reference(model, rollout, temperature=0.7, top_p=0.9)
    torch.testing.assert_close(logp, ref_logp, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent, ref_ent, atol=1e-6, rtol=1e-6)


def test_lora_model_is_split_and_its_adapter_gradients_match(small_chunks):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        llama(),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"], init_lora_weights=False),
    )
    split = hf._split_head(model)
    assert split is not None and isinstance(split[1], peft.tuners.lora.Linear)  # the adapted head is used
    rollout = rollout_of(V)
    logp, ent = response_log_probs(model, rollout, top_k=5, with_entropy=True)
    got = grads(model, logp, ent, rollout)
    ref_logp, ref_ent = reference(model, rollout, top_k=5)
    want = grads(model, ref_logp, ref_ent, rollout)
    torch.testing.assert_close(logp, ref_logp, atol=1e-6, rtol=1e-6)
    assert any("lora" in name for name in got)
    assert_grads_close(got, want)


def test_final_logit_softcapping_is_applied(small_chunks):
    """Gemma 2 caps its logits with tanh in its forward: the chunked path applies the same cap."""
    cfg = transformers.Gemma2Config(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        final_logit_softcapping=2.0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(cfg).eval()
    split = hf._split_head(model)
    assert split is not None and split[2] == 2.0
    rollout = rollout_of(V)
    logp, ent = response_log_probs(model, rollout, top_p=0.9, with_entropy=True)
    ref_logp, ref_ent = reference(model, rollout, top_p=0.9)
    torch.testing.assert_close(logp, ref_logp, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent, ref_ent, atol=1e-6, rtol=1e-6)


class Wrapped(torch.nn.Module):
    """A causal LM behind a wrapper with no separable lm_head (as a compiled or custom model may be)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, **kw):
        return self.inner(**kw)


def test_a_model_without_a_separable_head_takes_the_full_logits_path(small_chunks):
    inner = llama()
    model = Wrapped(inner)
    assert hf._split_head(model) is None
    rows = head_rows(inner)
    rollout = rollout_of(V)
    logp, ent = response_log_probs(model, rollout, temperature=1.3, top_k=5, with_entropy=True)
    assert rows == [5 * 13]  # the model's own forward: every position at once
    ref_logp, ref_ent = reference(inner, rollout, temperature=1.3, top_k=5)
    torch.testing.assert_close(logp, ref_logp, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent, ref_ent, atol=1e-6, rtol=1e-6)


def test_a_logit_scale_the_split_cannot_vouch_for_falls_back():
    cfg = transformers.CohereConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        logit_scale=0.5,
        pad_token_id=0,
    )
    model = transformers.CohereForCausalLM(cfg).eval()
    assert hf._split_head(model) is None
    rollout = rollout_of(V)
    logp, _ = response_log_probs(model, rollout)
    torch.testing.assert_close(logp, reference(model, rollout)[0], atol=1e-6, rtol=1e-6)


def test_torch_compile_runs_the_body_compiled_for_log_probs_only():
    """`torch_compile` (TRL's option): `response_log_probs` calls the compiled decoder body (seen by the tracer), with
    the same values and gradients; the model's own forward (generation) stays eager; the state_dict is unchanged. The
    eager backend traces with Dynamo without generating kernels (inductor's compile takes minutes on 2 CPU cores)."""
    model, rollout = llama(), rollout_of(V)
    keys = list(model.state_dict())
    want_logp, _ = response_log_probs(model, rollout)
    want = grads(model, want_logp, torch.zeros_like(want_logp), rollout)
    traced = []

    def backend(gm, example_inputs):
        traced.append(gm)
        return gm.forward

    assert hf.compile_log_probs(model, backend=backend)
    try:
        logp, _ = response_log_probs(model, rollout)
        assert traced, "the decoder body was not run through torch.compile"
        n = len(traced)
        model(input_ids=rollout.input_ids, attention_mask=rollout.attention_mask)  # the model's own forward
        assert len(traced) == n  # ... is not compiled
        torch.testing.assert_close(logp, want_logp, atol=1e-6, rtol=1e-6)
        assert_grads_close(grads(model, logp, torch.zeros_like(logp), rollout), want)
        assert list(model.state_dict()) == keys
    finally:
        hf._COMPILED.clear()
        torch._dynamo.reset()
    assert not hf.compile_log_probs(_unsplittable())  # a model on the full-logits path is left alone


def _unsplittable():
    model = llama()
    model.config.model_type = "not-on-the-allow-list"
    return model

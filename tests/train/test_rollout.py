"""Rollout: sampler log-probs match the trainer's recomputation on-policy, layout/masks, seeding, text generation."""

import pytest
import torch

from vespo.embedded.task import build_tiny_model, build_tokenizer
from vespo.rollout import decode_responses, response_log_probs, sample
from vespo.rollout.hf import top_p_filter


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    return build_tiny_model(tok), tok


def test_sample_layout_masks_and_log_probs_match_recomputation(tiny):
    model, tok = tiny
    r = sample(
        model,
        tok,
        ["3+8+5=", "1+2="],
        n=3,
        max_new_tokens=10,
        temperature=0.7,
        generator=torch.Generator().manual_seed(0),
    )
    assert r.input_ids.shape[0] == 6 and r.prompt_len == len(tok("3+8+5=").input_ids)
    # rows 3..5 repeat the shorter prompt, left-padded by one pad token
    assert (r.input_ids[3:, 0] == tok.pad_token_id).all() and (r.attention_mask[3:, 0] == 0).all()
    # response mask is a prefix of ones ending at <eos> (inclusive) or at max_new_tokens
    for row_ids, row_mask in zip(r.response_ids, r.response_mask, strict=True):
        length = int(row_mask.sum())
        assert row_mask[:length].all() and not row_mask[length:].any()
        if length < r.response_mask.shape[1]:
            assert row_ids[length - 1] == tok.eos_token_id
    logp, ent = response_log_probs(model, r, temperature=0.7, with_entropy=True)
    torch.testing.assert_close(logp, r.rollout_log_prob, atol=1e-5, rtol=0)
    assert (logp[r.response_mask == 0] == 0).all() and (ent[r.response_mask.bool()] > 0).all()


def test_preallocated_kv_cache_samples_exactly_what_the_growing_cache_does(tiny, monkeypatch):
    """The preallocated cache (`hf._PreallocatedLayer`) is a faster layout of the same keys and values: the same
    seed gives the same tokens and bit-identical sampler log-probs as transformers' own `DynamicLayer`."""
    from vespo.rollout import hf

    model, tok = tiny
    kinds = []
    real = hf._preallocate
    monkeypatch.setattr(hf, "_preallocate", lambda cache, n: (real(cache, n), kinds.extend(map(type, cache.layers))))

    def run():
        return sample(model, tok, ["3+8+5=", "1+2=", "9="], n=4, max_new_tokens=24, temperature=1.3,
                      generator=torch.Generator().manual_seed(7))  # fmt: skip

    fast = run()
    layers = []
    monkeypatch.setattr(hf, "_preallocate", lambda cache, n: layers.extend(cache.layers))  # the growing cache
    slow = run()
    assert kinds and all(kind is hf._PreallocatedLayer for kind in kinds)
    assert len(layers) == len(kinds) and all(type(x).__name__ == "DynamicLayer" for x in layers)
    assert fast.response_mask.shape[1] > 10  # the cache grew over many decoded tokens
    assert torch.equal(fast.input_ids, slow.input_ids) and torch.equal(fast.response_mask, slow.response_mask)
    assert torch.equal(fast.rollout_log_prob, slow.rollout_log_prob)


def test_preallocated_layer_refuses_to_write_past_its_room():
    from transformers.cache_utils import DynamicLayer

    from vespo.rollout.hf import _PreallocatedLayer

    grown = DynamicLayer()
    grown.update(torch.ones(2, 1, 3, 4), torch.ones(2, 1, 3, 4))
    layer = _PreallocatedLayer(grown, capacity=5)
    keys, values = layer.update(torch.full((2, 1, 2, 4), 2.0), torch.full((2, 1, 2, 4), 3.0))
    assert keys.shape == (2, 1, 5, 4) and layer.get_seq_length() == 5
    assert (keys[:, :, :3] == 1).all() and (keys[:, :, 3:] == 2).all() and (values[:, :, 3:] == 3).all()
    with pytest.raises(RuntimeError, match="holds 5 positions; 6 were written"):
        layer.update(torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4))


def test_logit_noise_makes_a_controlled_mismatch(tiny):
    model, tok = tiny
    r = sample(
        model, tok, ["1+1="], n=8, max_new_tokens=8, generator=torch.Generator().manual_seed(0), logit_noise_std=0.5
    )
    logp, _ = response_log_probs(model, r)
    gap = (logp - r.rollout_log_prob).abs()[r.response_mask.bool()]
    assert 0.01 < gap.mean() < 2.0


def test_top_p_keeps_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(top_p_filter(logits, 0.7))
    assert kept.tolist() == [[True, True, False, False]]
    assert torch.isfinite(top_p_filter(logits, 1.0)).all()


def _records(*prompts):
    return [{"prompt": p, "answer": "0"} for p in prompts]


def test_evaluation_samples_through_the_engine_seeded_and_shaped(tiny):
    """Evaluation generates with the loops' HF engine (`build_engine`) on the model itself: seeded per chunk, one
    group of n per record, and the model's train/eval mode as it was."""
    from vespo.evaluation import sample_completions
    from vespo.rollout import HFEngine, SamplingSettings

    model, tok = tiny
    model.train()
    records = _records("1+1=", "2+2+2=", "3=")
    a = sample_completions(model, tok, records, n=2, max_new_tokens=6, seed=4, chunk=2, progress=False)
    b = sample_completions(model, tok, records, n=2, max_new_tokens=6, seed=4, chunk=2, progress=False)
    assert a == b and [len(x) for x in a] == [2, 2, 2] and all(isinstance(s, str) for x in a for s in x)
    assert model.training
    # the first chunk is exactly the engine's generation under the chunk's seed
    engine = HFEngine.from_model(model, tok, SamplingSettings(n=2, max_new_tokens=6))
    texts = decode_responses(tok, engine.generate(["1+1=", "2+2+2="], torch.Generator().manual_seed(4)))
    assert a[:2] == [texts[:2], texts[2:]]


def test_evaluation_loads_a_local_path(tiny, tmp_path):
    from vespo.evaluation import sample_completions

    model, tok = tiny
    model.save_pretrained(tmp_path)
    kw = {"n": 2, "max_new_tokens": 4, "seed": 0, "progress": False}
    assert sample_completions(str(tmp_path), tok, _records("1+1="), **kw) == sample_completions(
        model, tok, _records("1+1="), **kw
    )


def test_decode_drops_padding_and_special_tokens(tiny):
    model, tok = tiny
    r = sample(model, tok, ["1="], n=4, max_new_tokens=5, generator=torch.Generator().manual_seed(1))
    for text, ids, m in zip(decode_responses(tok, r), r.response_ids, r.response_mask, strict=True):
        assert text == tok.decode(ids[m.bool()].tolist(), skip_special_tokens=True)


def test_bad_sampling_args_raise(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="temperature"):
        sample(model, tok, ["1="], n=1, max_new_tokens=2, temperature=0.0)


@pytest.mark.parametrize(("top_p", "top_k"), [(0.9, 0), (1.0, 5), (0.9, 5)])
def test_on_policy_w_is_one_under_top_p_and_top_k(tiny, top_p, top_k):
    """Sampling truncation (issue 23.2): the sampler's log-probs are those of the distribution it sampled (temperature,
    top-k, top-p, renormalised) and the learner recomputes the same one, so on-policy every token's W = pi/mu is 1 and
    vespo's loss equals REINFORCE's. The full softmax would carry log(kept mass) < 0 per truncated step."""
    import vespo

    model, tok = tiny
    gen = torch.Generator().manual_seed(1)
    r = sample(model, tok, ["3+8+5=", "1+2="], n=8, max_new_tokens=8, temperature=1.3, top_p=top_p, top_k=top_k,
               generator=gen)  # fmt: skip
    mask = r.response_mask.bool()
    logp, ent = response_log_probs(model, r, temperature=1.3, top_p=top_p, top_k=top_k, with_entropy=True)
    torch.testing.assert_close(logp[mask], r.rollout_log_prob[mask], atol=1e-5, rtol=0)  # W == 1 per token
    full, _ = response_log_probs(model, r, temperature=1.3)
    assert (full[mask] - r.rollout_log_prob[mask]).min() < -0.05  # the truncation is active: log(kept mass) bias
    assert bool(torch.isfinite(ent).all()) and (ent[mask] > 0).all()
    adv = torch.randn(r.response_mask.shape[0], generator=gen)
    lp = logp.clone().requires_grad_(True)
    _, m = vespo.compute_policy_loss("vespo", log_prob=lp, old_log_prob=logp, advantages=adv,
                                     response_mask=r.response_mask, rollout_log_prob=r.rollout_log_prob)  # fmt: skip
    assert abs(m["is/log_w_max"].item()) < 1e-4 and abs(m["rollout_is/log_w_mean"].item()) < 1e-4


def test_token_outside_the_learners_top_k_has_probability_zero_not_nan(tiny):
    """Off-policy, a sampled token may fall outside the current model's top-k set: its log-prob is a finite floor
    without gradient (token ratio clamped to e^-20), never -inf or NaN."""
    from vespo.rollout.hf import OUTSIDE_LOG_PROB

    model, tok = tiny
    r = sample(model, tok, ["1+2="], n=16, max_new_tokens=6, top_k=20, generator=torch.Generator().manual_seed(2))
    logp, _ = response_log_probs(model, r, top_k=1)  # a stricter learner set than the sampler's
    mask = r.response_mask.bool()
    assert (logp[mask] == OUTSIDE_LOG_PROB).any() and (logp[mask] == 0).any()  # outside, and the only token kept
    assert bool(torch.isfinite(logp).all())


def test_one_engine_for_every_loop_shares_or_casts_the_learners_weights(tiny):
    """`build_engine`: the sync loop's HF engine is the learner itself in its own dtype (a weight sync is a no-op), a
    cast copy otherwise, whose `load` brings it to the learner's current weights; its samples equal `sample`'s."""
    from copy import deepcopy

    from vespo.rollout import SamplingSettings, build_engine

    model, tok = deepcopy(tiny[0]), tiny[1]  # its weights are moved below
    settings = SamplingSettings(n=2, max_new_tokens=5, temperature=0.9, top_k=5)
    shared = build_engine("hf", settings, policy_path="unused", model=model, tokenizer=tok)
    assert shared.model is model
    got = shared.generate(["1+2=", "3+4="], torch.Generator().manual_seed(3))
    want = sample(model, tok, ["1+2=", "3+4="], n=2, max_new_tokens=5, temperature=0.9, top_k=5,
                  generator=torch.Generator().manual_seed(3))  # fmt: skip
    assert torch.equal(got.input_ids, want.input_ids) and torch.equal(got.rollout_log_prob, want.rollout_log_prob)
    cast = build_engine("hf", SamplingSettings(dtype="bfloat16"), policy_path="unused", model=model, tokenizer=tok)
    assert cast.model is not model and next(cast.model.parameters()).dtype == torch.bfloat16
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    cast.load(list(model.named_parameters()))
    for (name, p), q in zip(model.named_parameters(), cast.model.parameters(), strict=True):
        assert torch.equal(q, p.to(torch.bfloat16)), name


def test_vllm_engine_is_refused_in_one_line_where_it_cannot_run():
    """sync and async alike: without vLLM and CUDA, `--sampler-engine vllm` is refused before any compute (by the
    host check `vespo train` runs first: the config itself is valid)."""
    from vespo.train.config import ConfigError
    from vespo.train.config_io import parse_args
    from vespo.train.host import check_host

    for mode in ([], ["--async", "--max-staleness", "8"]):
        with pytest.raises(ConfigError, match="sampler_engine=vllm needs vLLM installed"):
            check_host(parse_args(["--sampler-engine", "vllm", *mode]))

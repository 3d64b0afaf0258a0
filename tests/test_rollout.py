"""Rollout: sampler log-probs match the trainer's recomputation on-policy, layout/masks, seeding, text generation."""

import pytest
import torch

from vespo.embedded.task import build_tiny_model, build_tokenizer
from vespo.rollout import decode_responses, generate_texts, response_log_probs, sample
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


def test_generate_texts_is_seeded_and_shaped(tiny):
    model, tok = tiny
    a = generate_texts(model, tok, ["1+1=", "2+2+2=", "3="], n=2, max_new_tokens=6, seed=4, batch_size=4)
    b = generate_texts(model, tok, ["1+1=", "2+2+2=", "3="], n=2, max_new_tokens=6, seed=4, batch_size=4)
    assert a == b and [len(x) for x in a] == [2, 2, 2] and all(isinstance(s, str) for x in a for s in x)


def test_generate_texts_loads_a_local_path(tiny, tmp_path):
    model, tok = tiny
    model.save_pretrained(tmp_path)
    assert generate_texts(str(tmp_path), tok, ["1+1="], n=2, max_new_tokens=4, seed=0) == generate_texts(
        model, tok, ["1+1="], n=2, max_new_tokens=4, seed=0
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

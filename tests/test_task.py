"""The embedded task: local tokenizer/model round trips through the real `from_pretrained` path, task arithmetic."""

import random

import pytest
import torch
import transformers

from vespo.task import arithmetic_problems, arithmetic_split, build_tiny_model, build_tokenizer, solution_text


def test_tokenizer_encodes_characters_and_boxed_as_one_token():
    tok = build_tokenizer()
    ids = tok("12 \\boxed{3}").input_ids
    assert tok.convert_ids_to_tokens(ids) == ["<bos>", "1", "2", " ", "\\boxed", "{", "3", "}"]
    assert tok.decode(ids, skip_special_tokens=True) == "12 \\boxed{3}"
    assert tok.padding_side == "left" and tok.pad_token_id != tok.eos_token_id


def test_tokenizer_and_model_round_trip_through_auto_classes(tmp_path):
    tok = build_tokenizer()
    model = build_tiny_model(tok)
    assert 50_000 < sum(p.numel() for p in model.parameters()) < 1_000_000
    tok.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path)
    tok2 = transformers.AutoTokenizer.from_pretrained(tmp_path)
    model2 = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    text = "3+8+5=11,16 \\boxed{16}\nWhat?"
    assert tok2(text).input_ids == tok(text).input_ids
    assert tok2.decode(tok2(text).input_ids, skip_special_tokens=True) == text
    assert (tok2.pad_token_id, tok2.eos_token_id, tok2.padding_side) == (tok.pad_token_id, tok.eos_token_id, "left")
    ids = torch.tensor([tok(text).input_ids])
    torch.testing.assert_close(model2(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_tiny_model_is_seeded_and_overridable():
    tok = build_tokenizer()
    a, b, c = build_tiny_model(tok, seed=1), build_tiny_model(tok, seed=1), build_tiny_model(tok, seed=2)
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert build_tiny_model(tok, num_hidden_layers=1).config.num_hidden_layers == 1
    with pytest.raises(ValueError, match="unknown LlamaConfig fields"):
        build_tiny_model(tok, hiden_size=3)


def test_arithmetic_problems_and_solution_text():
    probs = arithmetic_problems(50, seed=3, num_operands=3, max_operand=9)
    assert probs == arithmetic_problems(50, seed=3, num_operands=3, max_operand=9)
    for p in probs:
        xs = [int(x) for x in p.prompt.rstrip("=").split("+")]
        assert len(xs) == 3 and all(0 <= x <= 9 for x in xs) and p.answer == str(sum(xs))
    assert solution_text(type(probs[0])(prompt="3+8+5=", answer="16")) == "11,16 \\boxed{16}"
    with pytest.raises(ValueError, match="num_operands"):
        arithmetic_problems(3, seed=0, num_operands=1)


def test_arithmetic_split_is_fixed_disjoint_and_complete():
    train, held_out = arithmetic_split(num_operands=3, max_operand=9, eval_size=200)
    assert (len(train), len(held_out)) == (800, 200)
    assert {p.prompt for p in train}.isdisjoint({p.prompt for p in held_out})
    assert len({p.prompt for p in train + held_out}) == 1000  # every ordered triple once
    assert arithmetic_split(num_operands=3, max_operand=9, eval_size=200) == (train, held_out)
    assert all(str(sum(map(int, p.prompt[:-1].split("+")))) == p.answer for p in held_out)
    with pytest.raises(ValueError, match="eval_size"):
        arithmetic_split(num_operands=2, max_operand=1, eval_size=4)


def test_noisy_solution_text_is_wrong_only_in_the_box():
    import random

    p = type(arithmetic_split(num_operands=3, max_operand=9, eval_size=1)[1][0])(prompt="3+8+5=", answer="16")
    rng = random.Random(0)
    for _ in range(20):
        text = solution_text(p, noisy_rng=rng)
        assert text.startswith("11,16 \\boxed{") and text != "11,16 \\boxed{16}"
        assert 1 <= abs(int(text.split("{")[1].rstrip("}")) - 16) <= 3


def test_chain_problems_answer_is_the_last_digit_of_the_sum():
    from vespo.task import chain_problems

    probs = chain_problems(50, seed=3, num_operands=7)
    assert probs == chain_problems(50, seed=3, num_operands=7)
    for p in probs:
        assert p.prompt.startswith("(") and p.prompt.endswith(")%10=")
        digits = [int(x) for x in p.prompt[1:-5].split("+")]
        assert len(digits) == 7 and all(0 <= d <= 9 for d in digits)
        assert p.answer == str(sum(digits) % 10)
    with pytest.raises(ValueError, match="num_operands >= 2"):
        chain_problems(1, seed=0, num_operands=1)


def test_chain_solution_writes_running_sums_mod_10_and_has_the_advertised_length():
    from vespo.rewards import math_reward
    from vespo.task import Problem, chain_response_tokens

    p = Problem("(3+8+5+9)%10=", "5")  # partial sums 3, 11, 16, 25 -> 3, 1, 6, 5
    assert solution_text(p) == "3,1,6,5, \\boxed{5}"
    tok = build_tokenizer()
    for k in (5, 125):  # ~16 and 256 response tokens (+ <eos>)
        text = solution_text(Problem("(" + "+".join(["7"] * k) + ")%10=", str(7 * k % 10)))
        assert len(tok(text, add_special_tokens=False).input_ids) + 1 == chain_response_tokens(k)
    assert chain_response_tokens(5) == 16 and chain_response_tokens(125) == 256
    # graded by the same math reward: right box scores 1, the noisy demonstrations' box scores 0
    rng = random.Random(0)
    noisy = [solution_text(p, noisy_rng=rng) for _ in range(30)]
    assert math_reward([solution_text(p)], ["5"]) == [1.0]
    assert math_reward(noisy, ["5"] * 30) == [0.0] * 30
    assert all(n.startswith("3,1,6,5, ") for n in noisy)  # only the box is wrong


def test_embedded_split_chain_is_fixed_and_disjoint():
    from vespo.task import embedded_split

    train, held = embedded_split("chain", num_operands=3, max_operand=9, eval_size=50)
    assert (train, held) == embedded_split("chain", num_operands=3, max_operand=9, eval_size=50)
    assert len(held) == 50 and not {p.prompt for p in train} & {p.prompt for p in held}
    assert embedded_split("arithmetic", num_operands=2, max_operand=9, eval_size=5) == arithmetic_split(
        num_operands=2, max_operand=9, eval_size=5
    )
    with pytest.raises(ValueError, match="task must be"):
        embedded_split("chains", num_operands=3, max_operand=9, eval_size=5)

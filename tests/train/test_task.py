"""The embedded task: local tokenizer/model round trips through the real `from_pretrained` path, task arithmetic."""

import random

import pytest
import torch
import transformers

from vespo.embedded.task import (
    Problem,
    arithmetic_problems,
    arithmetic_split,
    build_tiny_model,
    build_tokenizer,
    embedded_split,
    solution_text,
)


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


def test_chain_problems_follow_the_lagged_running_sum():
    from vespo.embedded.task import CHAIN_LAG, chain_problems

    # seeds 2 9 1: x3 = 1 + 2 = 3, x4 = 3 + 9 = 12 -> 2, x5 = 2 + 1 = 3 (each step: previous + three back, mod 10)
    assert CHAIN_LAG == 3
    p = chain_problems(1, seed=0, num_operands=3)[0]
    assert p.prompt.startswith("3 steps: =") and len(p.prompt.split("=")) == 4
    assert solution_text(Problem("3 steps: =2 =9 =1 ", "3")) == "23 92 13 \\boxed{3}"
    probs = chain_problems(50, seed=3, num_operands=7)
    assert probs == chain_problems(50, seed=3, num_operands=7)
    for q in probs:  # the answer is the last running digit the solution writes, and the box repeats it
        steps = solution_text(q).split()
        assert len(steps) == 8 and steps[-2][1] == q.answer and steps[-1] == f"\\boxed{{{q.answer}}}"
    with pytest.raises(ValueError, match="num_operands >= 2"):
        chain_problems(1, seed=0, num_operands=1)


def test_chain_solution_has_the_advertised_length_and_fixed_offset_dependencies():
    from vespo.embedded.task import chain_problems, chain_response_tokens

    tok = build_tokenizer()
    assert chain_response_tokens(20) == 65 and chain_response_tokens(84) == 257
    for k in (2, 20, 84):
        p = chain_problems(1, seed=k, num_operands=k)[0]
        prompt = tok(p.prompt, add_special_tokens=False).input_ids
        target = tok(solution_text(p), add_special_tokens=False).input_ids
        assert len(target) + 1 == chain_response_tokens(k)  # + <eos>
        # every step's addend is a copy of the running digit 8 tokens back, prompt seeds included: the offsets a
        # small model must learn do not grow with the length
        text = tok.convert_ids_to_tokens(prompt + target)
        first = len(prompt)
        for t in range(k):
            addend, value, prev = text[first + 3 * t], text[first + 3 * t + 1], text[first + 3 * t - 2]
            assert addend == text[first + 3 * t - 8]
            assert int(value) == (int(prev) + int(addend)) % 10


def test_chain_noisy_demonstrations_are_wrong_only_in_the_box():
    from vespo.rewards import math_reward

    p = Problem("3 steps: =2 =9 =1 ", "3")
    rng = random.Random(0)
    noisy = [solution_text(p, noisy_rng=rng) for _ in range(30)]
    assert math_reward([solution_text(p)], ["3"]) == [1.0]
    assert math_reward(noisy, ["3"] * 30) == [0.0] * 30
    assert all(n.startswith("23 92 13 \\boxed{") for n in noisy)


def test_embedded_split_chain_is_fixed_and_disjoint():
    from vespo.embedded.task import embedded_split

    train, held = embedded_split("chain", num_operands=3, max_operand=9, eval_size=50)
    assert (train, held) == embedded_split("chain", num_operands=3, max_operand=9, eval_size=50)
    assert len(held) == 50 and not {p.prompt for p in train} & {p.prompt for p in held}
    with pytest.raises(ValueError, match="task must be"):
        embedded_split("chains", num_operands=3, max_operand=9, eval_size=5)


@pytest.mark.parametrize("task", ["arithmetic", "chain", "scratchpad"])
def test_eval_size_picks_from_a_fixed_pool_and_never_moves_the_training_set(task):
    """eval_size is how many held-out prompts an evaluation uses: the training set (and so the warm start) is the
    same for every eval_size, the held-out prompts are prefixes of one pool, and past the pool is a clear error."""
    from vespo.embedded.task import held_out_pool

    shape = {"num_operands": 3, "max_operand": 9}
    pool = held_out_pool(task, **shape)
    train_small, held_small = embedded_split(task, **shape, eval_size=10)
    train_big, held_big = embedded_split(task, **shape, eval_size=pool)
    assert train_small == train_big and held_big[:10] == held_small and len(held_big) == pool
    assert not {p.prompt for p in train_big} & {p.prompt for p in held_big}
    with pytest.raises(ValueError, match=f"eval_size must be in \\[1, {pool}\\]"):
        embedded_split(task, **shape, eval_size=pool + 1)
    if task == "arithmetic":  # the old default held-out set (eval_size 200) is the pool's first 200
        assert held_big[:200] == arithmetic_split(**shape, eval_size=200)[1]


def test_scratchpad_problems_and_free_length_solutions():
    """Free-length sums: the prompt is "sum a+b+...=", a full solution writes every running sum but the last before
    the box, `keep` < 1 drops some (in order), every such solution grades 1 and a noisy one 0; the length bound
    holds."""
    from vespo.embedded.task import SCRATCHPAD, scratchpad_problems, scratchpad_response_tokens
    from vespo.rewards import math_reward

    problems = scratchpad_problems(50, seed=3, num_operands=5, max_operand=9)
    assert problems == scratchpad_problems(50, seed=3, num_operands=5, max_operand=9)
    p = Problem("sum 6+6+0+4+8=", "24")
    assert solution_text(p) == "12,12,16,\\boxed{24}"
    assert solution_text(p, keep=0.0, step_rng=random.Random(0)) == "\\boxed{24}"
    tok = build_tokenizer()
    assert len(tok(solution_text(p), add_special_tokens=False).input_ids) + 1 == scratchpad_response_tokens(5, 9)
    rng, lengths = random.Random(0), set()
    for q in problems:
        assert q.prompt.startswith(SCRATCHPAD) and q.prompt.endswith("=")
        xs = [int(x) for x in q.prompt.removeprefix(SCRATCHPAD).rstrip("=").split("+")]
        assert len(xs) == 5 and q.answer == str(sum(xs))
        text = solution_text(q, keep=0.5, step_rng=rng)
        steps = [int(x) for x in text.split("\\boxed")[0].split(",") if x]
        running = [sum(xs[: i + 1]) for i in range(1, 4)]
        assert all(s in running for s in steps) and steps == sorted(steps)  # a subsequence of the running sums
        assert math_reward([text], answer=[q.answer]) == [1.0]
        lengths.add(len(steps))
    assert {0, 3} < lengths  # none, some and all steps occur: the length is free
    wrong = solution_text(p, noisy_rng=random.Random(1))
    assert math_reward([wrong], answer=["24"]) == [0.0]


def test_scratchpad_demonstrations_err_more_when_they_show_less_work():
    from vespo.embedded.task import scratchpad_noise

    assert [scratchpad_noise(0.5, k) for k in (0.0, 0.5, 1.0)] == [0.75, 0.5, 0.25]
    assert sum(scratchpad_noise(0.4, k) for k in (0.0, 0.5, 1.0)) / 3 == pytest.approx(0.4)  # label_noise on average
    assert scratchpad_noise(0.9, 0.0) == 1.0


def test_embedded_split_scratchpad_is_fixed_and_disjoint():
    train, held = embedded_split("scratchpad", num_operands=4, max_operand=9, eval_size=50)
    again = embedded_split("scratchpad", num_operands=4, max_operand=9, eval_size=50)
    assert (train, held) == again and len(held) == 50
    assert not {p.prompt for p in held} & {p.prompt for p in train}
    with pytest.raises(ValueError, match="scratchpad"):
        embedded_split("nope", num_operands=4, max_operand=9, eval_size=5)

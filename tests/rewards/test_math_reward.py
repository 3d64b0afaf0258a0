"""Math reward: Math-Verify grading, fallbacks, timeouts counted, pool path equal to the in-process path."""

import pytest
from math_verify.errors import TimeoutException

from vespo.rewards import PROMPT_SUFFIX, grade_math, math_reward, score_math
from vespo.rewards import math_grader as math_mod


@pytest.mark.parametrize(
    ("completion", "answer", "score", "prediction"),
    [
        ("so the result is \\boxed{\\frac{1}{2}}.", "0.5", 1.0, "\\frac{1}{2}"),  # symbolic equivalence
        ("The final answer is 34", "34", 1.0, "34"),  # plain-answer fallback
        ("\\boxed{(x+1)^2}", "x^2+2x+1", 1.0, "(x+1)^2"),
        ("\\boxed{35}", "34", 0.0, "35"),
        ("I have no idea.", "34", 0.0, ""),
    ],
)
def test_grade_math(completion, answer, score, prediction):
    grade = grade_math(completion, answer)
    assert (grade.score, grade.prediction, grade.timed_out) == (score, prediction, False)


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("first \\boxed{3}, then \\boxed{7}", "7"),  # several different boxes
        ("\\boxed{3} \\boxed{3.0}", "3"),  # even when they agree in value
        ("The final answer is 3 or 7", "3"),  # Math-Verify alone reads "3" here
        ("\\boxed{3}\n\nor maybe 7", "3"),  # a disjunction right after the box
        ("\\boxed{3} or 7", "3"),
        ("\\boxed{3 \\text{ or } 7}", "3"),
        ("\\boxed{3 \\lor 7}", "3"),
        ("\\boxed{x = 3 \\vee x = 7}", "3"),
        ("\\boxed{3, 3}", "3"),  # a list where one value is asked
        ("\\boxed{3; 7}", "7"),
        ("\\boxed{3 \\text{ and } 7}", "7"),
    ],
)
def test_hedged_answers_score_zero(completion, answer):
    grade = grade_math(completion, answer)
    assert grade.score == 0.0 and grade.error.startswith("hedged: "), grade


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("\\boxed{7} and again \\boxed{7}", "7"),  # the same box twice is one answer
        ("\\boxed{(3, 7)}", "(3, 7)"),  # a tuple answer, as asked
        ("\\boxed{3, 7}", "3, 7"),  # a list answer where the ground truth is a list
        ("\\boxed{1,000}", "1000"),  # a thousands separator is one value
        ("\\boxed{\\text{Monday or Tuesday}}", "\\text{Monday or Tuesday}"),  # the gold itself says "or"
        ("The order is fixed, so \\boxed{7}.", "7"),  # "order" is not "or"
    ],
)
def test_unhedged_answers_still_score(completion, answer):
    assert grade_math(completion, answer).score == 1.0


def test_math_reward_trl_signature_and_chat_messages():
    completions = ["\\boxed{2}", [{"role": "assistant", "content": "It is \\boxed{5}"}], "\\boxed{4}"]
    assert math_reward(completions, answer=["2", "5", "3"], problem_id=[0, 1, 2]) == [1.0, 1.0, 0.0]


def test_timeouts_score_zero_and_are_counted(monkeypatch):
    real_parse = math_mod.parse

    def slow_parse(text, **kwargs):
        if "HANG" in text:
            raise TimeoutException("simulated pathological expression")
        return real_parse(text, **kwargs)

    monkeypatch.setattr(math_mod, "parse", slow_parse)
    # fractions go through Math-Verify (plain integers take the fast path and never parse)
    scores = score_math(["\\boxed{1/2} HANG", "\\boxed{1/2}", "nothing"], ["1/2"] * 3, num_workers=0)
    assert scores.scores == [0.0, 1.0, 0.0]
    assert scores.metrics() == {"reward/math/accuracy": 1 / 3, "reward/math/timeouts": 1.0, "reward/math/unparsed": 1.0}


def test_alarm_really_interrupts_a_hung_grader(monkeypatch):
    """Math-Verify's SIGALRM limit fires in-process: a parse that would sleep 60 s times out after ~1 s."""
    import time

    from math_verify.utils import timeout

    def hung_parse(text, *, parsing_timeout, **kwargs):
        return timeout(parsing_timeout)(time.sleep)(60)

    monkeypatch.setattr(math_mod, "parse", hung_parse)
    grade = grade_math("x", "1", timeout_s=1)
    assert grade.timed_out and grade.score == 0.0  # without the alarm the parse returns (None) after 60 s, untimed


def test_pool_path_matches_in_process_path():
    completions = [f"\\boxed{{{i}}}" for i in range(12)]
    answers = [str(i if i % 3 else i + 1) for i in range(12)]
    in_process = score_math(completions, answers, num_workers=0).scores
    assert in_process == [0.0 if i % 3 == 0 else 1.0 for i in range(12)]
    assert score_math(completions, answers, num_workers=2).scores == in_process


def test_bad_input_raises():
    with pytest.raises(ValueError, match="completions"):
        score_math(["a"], ["1", "2"])
    with pytest.raises(ValueError, match="timeout_s"):
        grade_math("a", "1", timeout_s=0)
    with pytest.raises(ValueError, match="chat messages"):
        math_reward([42], answer=["1"])


def test_prompt_suffix_is_the_papers():
    assert PROMPT_SUFFIX == "Please reason step by step, and put your final answer within \\boxed{}."


def test_integer_fast_path_agrees_with_math_verify():
    """Boxed plain integers against plain-integer gold skip Math-Verify (the embedded tasks' whole reward); on every
    form below the fast path and Math-Verify give the same score, and anything else still goes to Math-Verify."""
    import random

    import vespo.rewards.math_grader as m

    rng = random.Random(0)
    big = "123456789012345678901234567890"
    cases = [("11,16 \\boxed{16}", "16"), ("\\boxed{-3}", "-3"), ("\\boxed{-3}", "3"), ("\\boxed{ 16 }", "16"),
             ("\\boxed{16}\\boxed{16}", "16"), (f"so \\boxed{{{big}}}", big),
             ("\\boxed{0}", "0"), ("\\boxed{-0}", "0"), ("12,\\boxed{17}", "18"), ("\\boxed{16}.", "16")]  # fmt: skip
    for _ in range(200):
        gold = rng.randint(-50, 300)
        pred = gold + rng.choice((0, 0, 1, -1, 10))
        steps = ",".join(str(rng.randint(0, 99)) for _ in range(rng.randint(0, 3)))
        cases.append((f"{steps} \\boxed{{{pred}}}", str(gold)))
    for completion, gold in cases:
        fast = m._integer_grade(completion, gold)
        assert fast is not None, completion
        slow_pred = m.parse(completion)
        slow = float(bool(slow_pred) and m.verify(m.parse(m._gold_text(gold)), slow_pred))
        assert fast.score == slow, (completion, gold, fast.score, slow)
    for other in [("\\boxed{1/2}", "0.5"), ("\\boxed{16}", "16.0"), ("answer 16", "16"), ("\\boxed{x}", "3")]:
        assert m._integer_grade(*other) is None

"""Code reward: code extraction, the three test formats, output comparison, pass fraction in metrics."""

import json

import pytest

from vespo.rewards import code_reward, score_code
from vespo.rewards.code import extract_code, parse_tests, stdout_matches

ADD_STDIO = [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10\n"}]


def test_extract_code_prefers_last_python_block():
    text = "Idea:\n```\nnot this\n```\n```python\nx = 1\n```\nthen\n```python\nprint(2)\n```"
    assert extract_code(text) == "print(2)\n"
    assert extract_code("```\nprint(3)\n```") == "print(3)\n"
    assert extract_code("print(4)") == "print(4)"


def test_stdout_matches():
    assert stdout_matches("3 \n\n", "3")
    assert stdout_matches("0.3333333333", "0.333333333")
    assert not stdout_matches("3 4", "3")
    assert not stdout_matches("abc", "abd")


def test_three_formats_and_pass_fraction():
    completions = [
        "```python\na, b = map(int, input().split())\nprint(a + b)\n```",  # stdio, passes both
        "a, b = map(int, input().split())\nprint(a * b if a == 5 else a + b)",  # stdio, passes 1 of 2
        "class Solution:\n    def add(self, a, b):\n        return [a, b]",  # LiveCodeBench call format
        "def add(a, b):\n    return a - b",  # assertion test fails
    ]
    tests = [
        ADD_STDIO,
        json.dumps(ADD_STDIO),  # JSON strings are decoded
        [{"fn_name": "add", "input": "1\n2", "output": "[1, 2]"}],
        [{"assert": "assert add(1, 2) == 3"}],
    ]
    scores = score_code(completions, tests)
    assert scores.scores == [1.0, 0.0, 1.0, 0.0]
    assert [g.pass_fraction for g in scores.grades] == [1.0, 0.5, 1.0, 0.0]
    assert scores.grades[3].error.startswith("AssertionError")
    assert scores.metrics() == {
        "reward/code/accuracy": 0.5,
        "reward/code/pass_fraction": 0.625,
        "reward/code/timeouts": 0.0,
    }
    assert code_reward(completions[:1], tests=tests[:1], extra_column=["x"]) == [1.0]


def test_syntax_error_scores_zero():
    assert code_reward(["def broken(:"], tests=[ADD_STDIO]) == [0.0]


def test_parse_tests_rejects_bad_input():
    with pytest.raises(ValueError, match="non-empty list"):
        parse_tests([])
    with pytest.raises(ValueError, match="share fn_name"):
        parse_tests([{"fn_name": "a", "input": [], "output": 1}, {"fn_name": "b", "input": [], "output": 1}])
    with pytest.raises(ValueError, match="stdio"):
        parse_tests([{"input": "1", "output": "1"}, {"assert": "pass"}])
    with pytest.raises(ValueError, match="test lists"):
        score_code(["x"], [])

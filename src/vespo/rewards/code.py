"""Code reward: run the completion's program on the problem's test cases in the sandbox; 1.0 only if all pass.

Test cases (one homogeneous list per problem; JSON strings are decoded):

* stdin/stdout: ``{"input": "1 2\\n", "output": "3\\n"}`` (LiveCodeBench stdin problems, Eurus/PRIME code data);
* function call: ``{"fn_name": "twoSum", "input": [[2, 7], 9], "output": [0, 1]}`` — ``input`` is the argument
  list, or LiveCodeBench's newline-separated JSON arguments; ``Solution().fn_name`` is used when defined;
* assertion code: ``{"assert": "def check(f): ...\\ncheck(add)"}`` (HumanEval+/MBPP+ ``test`` fields).

The pass fraction is kept per completion for metrics (`CodeScores.metrics`).
"""

from __future__ import annotations

import json
import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from vespo.rewards.math import completion_text
from vespo.rewards.sandbox import SandboxLimits, run_in_sandbox

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class CodeGrade:
    """One graded program: score (1.0 iff every test passed), pass fraction, and the first failure for logging."""

    score: float
    pass_fraction: float
    timed_out: bool = False
    error: str | None = None


@dataclass
class CodeScores:
    """A graded batch plus the aggregate metrics the trainer logs."""

    grades: list[CodeGrade] = field(default_factory=list)

    @property
    def scores(self) -> list[float]:
        return [g.score for g in self.grades]

    def metrics(self, prefix: str = "reward/code/") -> dict[str, float]:
        """Logged values: all-pass rate, mean pass fraction, wall-clock timeouts."""
        n = max(len(self.grades), 1)
        return {
            f"{prefix}accuracy": sum(self.scores) / n,
            f"{prefix}pass_fraction": sum(g.pass_fraction for g in self.grades) / n,
            f"{prefix}timeouts": float(sum(g.timed_out for g in self.grades)),
        }


def extract_code(completion: str) -> str:
    """The last fenced Python block (```python or bare ```), else the whole completion."""
    blocks = _FENCE.findall(completion)
    python_blocks = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    chosen = python_blocks or [body for lang, body in blocks if not lang]
    return chosen[-1] if chosen else completion


def parse_tests(tests) -> tuple[str, list, list, str | None]:
    """Normalise a problem's tests to ``(mode, sandbox_cases, expected_outputs, fn_name)``."""
    if isinstance(tests, str):
        tests = json.loads(tests)
    if isinstance(tests, dict):
        tests = [tests]
    if not isinstance(tests, list) or not tests or not all(isinstance(t, dict) for t in tests):
        raise ValueError("tests must be a non-empty list of test-case dicts (see vespo.rewards.code docstring)")
    if all("assert" in t for t in tests):
        return "assert", [t["assert"] for t in tests], ["passed"] * len(tests), None
    if all("fn_name" in t and "input" in t and "output" in t for t in tests):
        names = {t["fn_name"] for t in tests}
        if len(names) != 1:
            raise ValueError(f"function-call tests of one problem must share fn_name, got {sorted(names)}")
        args = [_call_args(t["input"]) for t in tests]
        return "call", args, [_json_value(t["output"]) for t in tests], names.pop()
    if all("input" in t and "output" in t for t in tests):
        return "stdio", [str(t["input"]) for t in tests], [str(t["output"]) for t in tests], None
    raise ValueError("a problem's tests must all be stdio {input, output}, call {fn_name, input, output} or {assert}")


def _call_args(value) -> list:
    """Argument list from a list, or from LiveCodeBench's newline-separated JSON values."""
    if isinstance(value, list):
        return value
    return [json.loads(line) for line in str(value).splitlines() if line.strip()]


def _json_value(value):
    return json.loads(value) if isinstance(value, str) else value


def stdout_matches(actual: str, expected: str, *, rel_tol: float = 1e-6) -> bool:
    """Token-wise comparison ignoring whitespace layout; numeric tokens may differ by ``rel_tol``."""
    got, want = actual.split(), expected.split()
    return len(got) == len(want) and all(g == w or _close(g, w, rel_tol) for g, w in zip(got, want, strict=True))


def _close(a: str, b: str, rel_tol: float) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=rel_tol)
    except ValueError:
        return False


def _output_matches(mode: str, actual: str | None, expected) -> bool:
    if actual is None:
        return False
    if mode == "stdio":
        return stdout_matches(actual, expected)
    if mode == "call":
        return json.loads(actual) == json.loads(json.dumps(expected))  # tuples -> lists on both sides
    return actual == expected


def grade_code(completion: str, tests, *, limits: SandboxLimits | None = None) -> CodeGrade:
    """Run the completion's code on every test case in one sandbox and grade the outputs."""
    mode, cases, expected, fn_name = parse_tests(tests)
    run = run_in_sandbox(extract_code(completion), cases, mode=mode, fn_name=fn_name, limits=limits)
    passed = [_output_matches(mode, out, want) for out, want in zip(run.outputs, expected, strict=True)]
    first_error = next((e for e in run.errors if e), None)
    fraction = sum(passed) / len(passed)
    return CodeGrade(score=float(all(passed)), pass_fraction=fraction, timed_out=run.timed_out, error=first_error)


def score_code(
    completions: list[str], tests: list, *, limits: SandboxLimits | None = None, num_workers: int = 2
) -> CodeScores:
    """Grade a batch; sandboxes are subprocesses, so a thread pool runs ``num_workers`` of them at once."""
    if len(completions) != len(tests):
        raise ValueError(f"got {len(completions)} completions but {len(tests)} test lists")
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    with ThreadPoolExecutor(num_workers) as pool:
        grades = pool.map(lambda c, t: grade_code(c, t, limits=limits), completions, tests)
        return CodeScores(list(grades))


def code_reward(completions: list, tests: list, **kwargs) -> list[float]:
    """TRL-style reward: 1.0 when the program passes all of its problem's ``tests``, else 0.0."""
    return score_code([completion_text(c) for c in completions], tests).scores

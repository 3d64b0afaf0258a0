"""Code reward: run the completion's program on the problem's test cases in the sandbox; 1.0 only if all pass.

Test cases (one homogeneous list per problem; JSON strings are decoded):

* stdin/stdout: ``{"input": "1 2\\n", "output": "3\\n"}`` (LiveCodeBench stdin problems, Eurus/PRIME code data);
* function call: ``{"fn_name": "twoSum", "input": [[2, 7], 9], "output": [0, 1]}`` — ``input`` is the argument
  list, or LiveCodeBench's newline-separated JSON arguments; ``Solution().fn_name`` is used when defined;
* assertion code: ``{"assert": "def check(f): ...\\ncheck(add)"}`` (HumanEval+/MBPP+ ``test`` fields), optionally
  with ``"entry_point"`` (the function under test) and ``"setup"`` (trusted helper code the test relies on, e.g.
  HumanEval's prompt). The test runs in a trusted checker; the program's functions are called through a proxy.
  Test and program may import the standard library and `SandboxLimits.packages` (numpy by default), nothing else.

Comparison (stdio and call; assertion tests compare with their own Python code on plain data): integers exactly,
floats within ``rel_tol``/``abs_tol`` 1e-6, everything else exactly. Stdout is compared token by token: an ASCII
integer token only equals the same integer, a token is read as a float only when the expected token is one.

The pass fraction is kept per completion for metrics (`CodeScores.metrics`). Nothing a program does makes grading
raise: any failure inside a case fails that case.
"""

from __future__ import annotations

import json
import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from vespo.rewards.batch import Scores
from vespo.rewards.math import completion_text
from vespo.rewards.sandbox import SandboxLimits, run_in_sandbox

MAX_COMPLETION_CHARS = 1 << 22
"""Longer completions fail without running (the cap keeps extraction and the sandbox's compile bounded)."""
_LANG = re.compile(r"[ \t]*([A-Za-z0-9_+-]*)")  # greedy over disjoint classes: one pass, nothing to backtrack
_BLANKS = re.compile(r"[ \t]*")


@dataclass(frozen=True)
class CodeGrade:
    """One graded program: score (1.0 iff every test passed), pass fraction, and the first failure for logging."""

    score: float
    pass_fraction: float
    timed_out: bool = False
    error: str | None = None


class CodeScores(Scores[CodeGrade]):
    """A graded batch of programs."""

    def metrics(self, prefix: str = "reward/code/") -> dict[str, float]:
        """All-pass rate, wall-clock timeouts and the mean pass fraction."""
        pass_fraction = sum(g.pass_fraction for g in self.grades) / max(len(self.grades), 1)
        return super().metrics(prefix) | {f"{prefix}pass_fraction": pass_fraction}


def extract_code(completion: str) -> str:
    """The last fenced Python block (```python or bare ```), else the whole completion; linear time."""
    blocks = list(_fenced_blocks(completion))
    python_blocks = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    chosen = python_blocks or [body for lang, body in blocks if not lang]
    return chosen[-1] if chosen else completion


def _fenced_blocks(text: str):
    """``(lang, body)`` of each block opened by three backticks, an optional language word and a newline, and closed
    by the next three backticks. Each character is scanned a bounded number of times: an opener's header is a run
    without backticks (so headers never overlap), and a body is skipped with one ``find``."""
    pos = 0
    while (start := text.find("```", pos)) >= 0:
        lang = _LANG.match(text, start + 3)
        newline = _BLANKS.match(text, lang.end()).end()
        if not text.startswith("\n", newline):
            pos = start + 1  # not an opener here; a longer backtick run may hold one one character later
            continue
        close = text.find("```", newline + 1)
        if close < 0:
            return
        yield lang.group(1), text[newline + 1 : close]
        pos = close + 3


def parse_tests(tests) -> tuple[str, list, list, str | None]:
    """Normalise a problem's tests to ``(mode, sandbox_cases, expected_outputs, fn_name)``."""
    if isinstance(tests, str):
        tests = json.loads(tests)
    if isinstance(tests, dict):
        tests = [tests]
    if not isinstance(tests, list) or not tests or not all(isinstance(t, dict) for t in tests):
        raise ValueError("tests must be a non-empty list of test-case dicts (see vespo.rewards.code docstring)")
    if all("assert" in t for t in tests):
        cases = [{"test": t["assert"], "setup": t.get("setup"), "entry_point": t.get("entry_point")} for t in tests]
        if not all(isinstance(c["test"], str) and isinstance(c["setup"] or "", str) for c in cases) or not all(
            c["entry_point"] is None or str(c["entry_point"]).isidentifier() for c in cases
        ):
            raise ValueError(
                "assertion tests need a string 'assert', optional string 'setup' and identifier 'entry_point'"
            )
        return "assert", cases, ["passed"] * len(tests), None
    if all("fn_name" in t and "input" in t and "output" in t for t in tests):
        if not all(isinstance(t["fn_name"], str) and t["fn_name"].isidentifier() for t in tests):
            raise ValueError("function-call tests need an identifier 'fn_name'")
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


_INT = re.compile(r"([+-]?)0*([0-9]+)", re.ASCII)
_FLOAT = re.compile(r"[+-]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)


def stdout_matches(actual: str, expected: str, *, rel_tol: float = 1e-6) -> bool:
    """Token-wise comparison ignoring whitespace layout; see the module docstring for numbers."""
    got, want = actual.split(), expected.split()
    return len(got) == len(want) and all(_token_matches(g, w, rel_tol) for g, w in zip(got, want, strict=True))


def _token_matches(got: str, want: str, rel_tol: float) -> bool:
    if got == want:
        return True
    if want_int := _INT.fullmatch(want):  # integers exactly: 999999437 is not 999999937, 1e9 is not 1000000000
        got_int = _INT.fullmatch(got)  # compared as digit strings: no conversion limit, no cost in the length
        return got_int is not None and _int_digits(got_int) == _int_digits(want_int)
    if _FLOAT.fullmatch(want) and _FLOAT.fullmatch(got):  # ASCII decimal notation only (no 1_000, no other digits)
        return math.isclose(float(got), float(want), rel_tol=rel_tol, abs_tol=rel_tol)
    return False


def _int_digits(match: re.Match) -> tuple[str, str]:
    sign, digits = match.groups()
    return ("-" if sign == "-" and digits != "0" else "", digits)


def values_match(got, want, *, rel_tol: float = 1e-6) -> bool:
    """Structural equality of plain data: ints and bools exactly, floats within tolerance, tuples equal lists."""
    if type(want) is float:
        if type(got) is int:
            try:
                got = float(got)
            except OverflowError:  # an int past float range is not close to any float
                return False
        return type(got) is float and math.isclose(got, want, rel_tol=rel_tol, abs_tol=rel_tol)
    if type(want) in (list, tuple):
        return (
            type(got) in (list, tuple)
            and len(got) == len(want)
            and all(values_match(g, w, rel_tol=rel_tol) for g, w in zip(got, want, strict=True))
        )
    if type(want) is dict:
        return (
            type(got) is dict
            and got.keys() == want.keys()
            and all(values_match(got[k], want[k], rel_tol=rel_tol) for k in want)
        )
    return type(got) is type(want) and got == want


def _output_matches(mode: str, actual, expected) -> bool:
    if actual is None:
        return False
    if mode == "stdio":
        return stdout_matches(actual, expected)
    if mode == "call":
        return values_match(actual, expected)
    return actual == expected


def grade_code(completion: str, tests, *, limits: SandboxLimits | None = None) -> CodeGrade:
    """Run the completion's code on every test case in one sandbox and grade the outputs.

    Raises only for bad ``tests`` (the dataset's fault) or `SandboxUnavailable` (the host's); whatever the program
    does, including outputs that break a comparison, fails its cases."""
    mode, cases, expected, fn_name = parse_tests(tests)
    if len(completion) > MAX_COMPLETION_CHARS:
        return CodeGrade(score=0.0, pass_fraction=0.0, error=f"completion over {MAX_COMPLETION_CHARS} characters")
    run = run_in_sandbox(extract_code(completion), cases, mode=mode, fn_name=fn_name, limits=limits)
    errors = list(run.errors)
    passed = []
    for i, (out, want) in enumerate(zip(run.outputs, expected, strict=True)):
        try:
            passed.append(_output_matches(mode, out, want))
        except Exception as exc:  # noqa: BLE001 - e.g. RecursionError on a deep value: this case fails
            passed.append(False)
            errors[i] = errors[i] or f"comparison failed: {type(exc).__name__}"
    first_error = next((e for e in errors if e), None)
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

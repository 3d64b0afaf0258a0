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
Everything the grader does with a program's output is linear in its length (str methods, no backtracking regex) and
splits stdout a block of tokens at a time, so a 4M-character output costs it well under a second and a few MB.

The pass fraction is kept per completion for metrics (`CodeScores.metrics`). Nothing a program does makes grading
raise: any failure inside a case fails that case. A failure of the host raises `GraderHostError` (see `sandbox`).
"""

from __future__ import annotations

import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import zip_longest

from vespo.data.records import parse_tests
from vespo.rewards.batch import GraderHostError, Scores
from vespo.rewards.math_grader import completion_text
from vespo.sandbox import SandboxLimits, run_in_sandbox

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


_TOKEN_BLOCK = 1 << 14


def stdout_matches(actual: str, expected: str, *, rel_tol: float = 1e-6) -> bool:
    """Token-wise comparison ignoring whitespace layout; see the module docstring for numbers."""
    pairs = zip_longest(_tokens(actual), _tokens(expected))
    return all(g is not None and w is not None and _token_matches(g, w, rel_tol) for g, w in pairs)


def _tokens(text: str):
    """``text.split()``, a block of tokens at a time: a string object per token for the whole output at once would
    cost ~60 bytes per token (+150 MB for 1.3 M two-character tokens on each side)."""
    while len(parts := text.split(None, _TOKEN_BLOCK)) > _TOKEN_BLOCK:
        text = parts.pop()
        yield from parts
    yield from parts


def _token_matches(got: str, want: str, rel_tol: float) -> bool:
    if got == want:
        return True
    if (want_int := _int_digits(want)) is not None:  # integers exactly: 999999437 is not 999999937, 1e9 is not 10**9
        return _int_digits(got) == want_int  # compared as digit strings: no conversion limit, no cost in the length
    if _is_decimal(want) and _is_decimal(got):  # ASCII decimal notation only (no 1_000, no other digits)
        return math.isclose(float(got), float(want), rel_tol=rel_tol, abs_tol=rel_tol)
    return False


def _int_digits(token: str) -> tuple[str, str] | None:
    """``(sign, digits)`` of an ASCII integer token ``[+-]?[0-9]+``, without leading zeros or the sign of zero; else
    None. str methods only: the regex ``([+-]?)0*([0-9]+)`` backtracked quadratically on ``"0" * n + "x"``."""
    digits = _unsigned(token)
    if not (digits.isascii() and digits.isdigit()):  # ASCII isdigit() is exactly [0-9]
        return None
    digits = digits.lstrip("0") or "0"
    return ("-" if token[:1] == "-" and digits != "0" else "", digits)


def _is_decimal(token: str) -> bool:
    """ASCII ``[+-]?([0-9]+.[0-9]*|.[0-9]+|[0-9]+)([eE][+-]?[0-9]+)?``, checked with str methods (linear)."""
    if not token.isascii():
        return False
    mantissa, e, exponent = token.lower().partition("e")
    whole, _, fraction = _unsigned(mantissa).partition(".")
    digits = all(part.isdigit() for part in (whole, fraction) if part)
    return bool(whole or fraction) and digits and (not e or _unsigned(exponent).isdigit())


def _unsigned(token: str) -> str:
    return token[1:] if token[:1] in ("+", "-") else token


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

    Raises only for bad ``tests`` (the dataset's fault) or `GraderHostError` (the host's, e.g. a full disk or
    `SandboxUnavailable`); whatever the program does, including outputs that break a comparison, fails its cases."""
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
        try:
            return CodeScores(list(grades))
        except GraderHostError:  # raise now: the programs still queued would meet the same host
            pool.shutdown(cancel_futures=True)
            raise


def code_reward(completions: list, tests: list, **kwargs) -> list[float]:
    """TRL-style reward: 1.0 when the program passes all of its problem's ``tests``, else 0.0."""
    return score_code([completion_text(c) for c in completions], tests).scores

"""Math reward: the final answer graded against the ground truth with Math-Verify (parse + verify).

Math-Verify (https://github.com/huggingface/Math-Verify) extracts the last ``\\boxed{...}`` (falling back to
plain answers such as "The final answer is 3") and checks symbolic equivalence with sympy. Its own time limits are
SIGALRM-based, so they only work in a process's main thread: small batches are graded in-process on the main thread,
large batches (or calls from other threads) in a process pool whose workers grade on their main thread, with a
hard per-item deadline as a backstop. A timeout scores 0 and is counted.

Hedged answers score 0 before Math-Verify sees them (`hedge`): several different ``\\boxed{}``, a disjunction
("or", ``\\lor``, ``\\vee``) in the final answer or right after it, or several values where the ground truth is one.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import re
import threading
from dataclasses import dataclass

from math_verify import parse, verify
from math_verify.errors import TimeoutException

from vespo.rewards.batch import Scores

PROMPT_SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."
"""The paper's instruction appended to every math question (VESPO Sec. 4 setup; official preprocess_datasets.py)."""

INPROCESS_MAX_BATCH = 256
"""Batches up to this size are graded in-process (Math-Verify takes ~2 ms per short completion)."""

_BACKSTOP_GRACE_S = 5.0  # extra wall time a pool worker gets beyond its own SIGALRM limits before it is killed


@dataclass(frozen=True)
class MathGrade:
    """One graded completion: score (1.0 or 0.0), the parsed prediction for logging, and why it may have failed."""

    score: float
    prediction: str
    timed_out: bool = False
    error: str | None = None


class MathScores(Scores[MathGrade]):
    """A graded batch of math completions."""

    def metrics(self, prefix: str = "reward/math/") -> dict[str, float]:
        """Accuracy, timeouts and completions with no extractable answer."""
        unparsed = sum(g.prediction == "" and not g.timed_out for g in self.grades)
        return super().metrics(prefix) | {f"{prefix}unparsed": float(unparsed)}


def _gold_text(answer: str) -> str:
    """Wrap a bare ground truth in ``\\boxed{}`` so LaTeX such as ``\\frac{1}{2}`` parses as math, not as text."""
    answer = str(answer).strip()
    return answer if "\\boxed" in answer or "$" in answer else f"\\boxed{{{answer}}}"


_DISJUNCTION = re.compile(r"\bor\b|\\lor\b|\\vee\b", re.IGNORECASE)
_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(,\d{3})+(?![\d,])")
_AFTER_BOX_CHARS = 200  # text after the last box still read as part of the answer ("\boxed{3} or maybe 7")


def _boxed(text: str) -> list[tuple[str, int]]:
    """(content, end offset) of every ``\\boxed{...}`` / ``\\fbox{...}``, braces balanced."""
    found = []
    for match in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                found.append((text[start:i].strip(), i + 1))
                break
        else:  # unclosed: every later box is inside it
            break
    return found


def _top_level_values(expr: str) -> int:
    """How many comma/semicolon/"and"-separated values an answer lists outside brackets (1,000 is one value)."""
    expr = _THOUSANDS.sub("0", re.sub(r"\\(text|mathrm)\{\s*and\s*\}|\band\b", ",", expr))
    depth, count = 0, 1
    for ch in expr:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch in ",;" and depth == 0:
            count += 1
    return count


def hedge(completion: str, answer: str) -> str | None:
    """Why ``completion`` hedges between answers (it then scores 0), or None. Applies only where the ground truth
    itself does not: a gold answer listing several values may be given as a list, one containing "or" may say "or"."""
    boxes = _boxed(completion)
    if len({content for content, _ in boxes}) > 1:
        return "several different boxed answers"
    if boxes:
        final = boxes[-1][0] + " " + completion[boxes[-1][1] : boxes[-1][1] + _AFTER_BOX_CHARS]
    else:
        final = next((line for line in reversed(completion.splitlines()) if line.strip()), "")
    if _DISJUNCTION.search(final) and not _DISJUNCTION.search(answer):
        return "a disjunction in the final answer"
    if boxes and _top_level_values(boxes[-1][0]) > 1 and _top_level_values(str(answer)) == 1:
        return "several values where one is asked"
    return None


_INTEGER = re.compile(r"-?\d{1,30}")


def _integer_grade(completion: str, answer: str) -> MathGrade | None:
    """The grade of a boxed plain integer against a plain-integer gold answer, without Math-Verify (which parses
    both to the same integers: equal values score 1), or None for anything else. About 100x cheaper; the embedded
    tasks' answers all take this path."""
    boxes = _boxed(completion)
    if not boxes or not _INTEGER.fullmatch(str(answer).strip()) or not _INTEGER.fullmatch(boxes[-1][0]):
        return None
    return MathGrade(score=float(int(boxes[-1][0]) == int(str(answer).strip())), prediction=boxes[-1][0])


def grade_math(completion: str, answer: str, *, timeout_s: int = 5) -> MathGrade:
    """Grade one completion against its ground truth; never raises.

    Must run on a thread's main interpreter thread for ``timeout_s`` to be enforced (Math-Verify uses SIGALRM).
    """
    if timeout_s < 1:
        raise ValueError(f"timeout_s must be a whole number of seconds >= 1 (SIGALRM), got {timeout_s}")
    hedged = hedge(completion, answer)
    if hedged is not None:
        return MathGrade(score=0.0, prediction="", error=f"hedged: {hedged}")
    fast = _integer_grade(completion, answer)
    if fast is not None:
        return fast
    try:
        gold = parse(_gold_text(answer), parsing_timeout=timeout_s, raise_on_error=True)
        pred = parse(completion, parsing_timeout=timeout_s, raise_on_error=True)
        prediction = str(pred[-1]) if pred else ""
        ok = bool(pred) and bool(gold) and verify(gold, pred, timeout_seconds=timeout_s, raise_on_error=True)
        return MathGrade(score=1.0 if ok else 0.0, prediction=prediction)
    except TimeoutException:
        return MathGrade(score=0.0, prediction="", timed_out=True)
    except Exception as exc:  # a malformed answer must cost one sample, not the training step
        return MathGrade(score=0.0, prediction="", error=f"{type(exc).__name__}: {exc}"[:200])


def _grade_pair(args: tuple[str, str, int]) -> MathGrade:
    return grade_math(args[0], args[1], timeout_s=args[2])


_pool: multiprocessing.pool.Pool | None = None
_pool_lock = threading.Lock()


def _get_pool(num_workers: int) -> multiprocessing.pool.Pool:
    """A persistent worker pool, forked so workers need no re-import of ``__main__`` (unlike spawn/forkserver)."""
    global _pool
    with _pool_lock:
        if _pool is None or getattr(_pool, "_vespo_workers", None) != num_workers:
            _shutdown_pool()
            _pool = multiprocessing.get_context("fork").Pool(num_workers)
            _pool._vespo_workers = num_workers
        return _pool


def _shutdown_pool() -> None:
    global _pool
    if _pool is not None:
        _pool.terminate()
        _pool.join()
        _pool = None


atexit.register(_shutdown_pool)


def score_math(
    completions: list[str], answers: list[str], *, timeout_s: int = 5, num_workers: int | None = None
) -> MathScores:
    """Grade a batch. ``num_workers=0`` forces in-process grading; ``None`` picks in-process for small batches."""
    if len(completions) != len(answers):
        raise ValueError(f"got {len(completions)} completions but {len(answers)} answers")
    items = [(str(c), str(a), timeout_s) for c, a in zip(completions, answers, strict=True)]
    on_main = threading.current_thread() is threading.main_thread()
    if num_workers is None:
        num_workers = 0 if on_main and len(items) <= INPROCESS_MAX_BATCH else min(8, os.cpu_count() or 1)
    if num_workers == 0:
        if not on_main:
            raise ValueError("in-process math grading needs the main thread (SIGALRM timeouts); pass num_workers>=1")
        return MathScores([_grade_pair(item) for item in items])
    return MathScores(_grade_in_pool(items, num_workers, timeout_s))


def _grade_in_pool(items: list[tuple[str, str, int]], num_workers: int, timeout_s: int) -> list[MathGrade]:
    pool = _get_pool(num_workers)
    pending = [pool.apply_async(_grade_pair, (item,)) for item in items]
    # parse(gold) + parse(pred) + verify each get timeout_s; a worker past all three is stuck outside Python.
    deadline = 3 * timeout_s + _BACKSTOP_GRACE_S
    grades: list[MathGrade] = []
    for i, res in enumerate(pending):
        try:
            grades.append(res.get(timeout=deadline))
        except multiprocessing.TimeoutError:
            # A worker ignored its alarm: kill the pool, count this item as a timeout and regrade the rest afresh.
            _shutdown_pool()
            grades.append(MathGrade(score=0.0, prediction="", timed_out=True))
            return grades + _grade_in_pool(items[i + 1 :], num_workers, timeout_s)
    return grades


def math_reward(completions: list, answer: list[str], **kwargs) -> list[float]:
    """TRL-style reward: 1.0 when the completion's final answer equals ``answer`` (Math-Verify), else 0.0.

    ``completions`` are strings or chat messages (``[{"role": "assistant", "content": ...}]``); other dataset columns
    arrive as ``kwargs`` and are ignored.
    """
    return score_math([completion_text(c) for c in completions], answer).scores


def completion_text(completion: str | list[dict]) -> str:
    """The text of a completion given as a string or as TRL conversational messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and all(isinstance(m, dict) and "content" in m for m in completion):
        return "".join(str(m["content"]) for m in completion)
    raise ValueError(f"a completion must be a string or a list of chat messages, got {type(completion).__name__}")

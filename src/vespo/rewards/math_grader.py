"""Math reward: the final answer graded against the ground truth with Math-Verify (parse + verify).

Math-Verify (https://github.com/huggingface/Math-Verify) extracts the last ``\\boxed{...}`` (falling back to
plain answers such as "The final answer is 3") and checks symbolic equivalence with sympy. Only the last
`TAIL_CHARS` characters of a completion are graded, and one deadline (``timeout_s``, a SIGALRM timer, so only on a
process's main thread) covers the whole grade of an answer: hedge detection, the integer fast path, both parses and
the comparison. Small batches are graded in-process on the main thread, large batches (or calls from other threads)
in a process pool whose workers grade on their main thread, with a hard per-item backstop; a worker that dies or a
pool that cannot start raises `GraderHostError`. A timeout scores 0 and is counted.

Hedged answers score 0 before Math-Verify sees them (`hedge`): several different ``\\boxed{}``, a disjunction
("or", ``\\lor``, ``\\vee``) in the final answer or right after it, or several values where the ground truth is one.
Box extraction and hedge detection take linear time (one brace-matching pass, no backtracking regex).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import multiprocessing
import os
import re
import threading
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import math_verify.grader
import math_verify.parser
from math_verify import parse, verify
from math_verify.errors import TimeoutException

from vespo.deadline import deadline as _deadline
from vespo.rewards.batch import GraderHostError, Scores

INPROCESS_MAX_BATCH = 256
"""Batches up to this size are graded in-process (Math-Verify takes ~2 ms per short completion)."""

TAIL_CHARS = 4096
"""Only a completion's last this many characters are graded (the final answer is at the end; veRL's math_dapo reads
300): a box, hedge or plain answer before them is not seen, and the grader's work per answer is bounded."""

_BACKSTOP_GRACE_S = 5.0  # extra wall time a pool worker gets beyond its own deadline before it is killed

# One alarm of ours covers a whole grade, so Math-Verify gets no limit of its own (its alarm would cancel ours);
# its one-time "timeout is disabled" warning would mislead.
math_verify.parser.TIMEOUT_WARNING_SHOWN = math_verify.grader.TIMEOUT_WARNING_SHOWN = True


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
# A number with thousands separators; never starting right after "7," (only a separator comma precedes a start
# there, and such a comma already counts as two values), so each character is scanned from one start: linear.
_THOUSANDS = re.compile(r"(?<![\d.])(?<!\d,)\d{1,3}(,\d{3})+(?![\d,])")
_AFTER_BOX_CHARS = 200  # text after the last box still read as part of the answer ("\boxed{3} or maybe 7")
_BOX_OR_BRACE = re.compile(r"\\(?:boxed|fbox)\s*\{|[{}]")


def _boxed(text: str) -> list[tuple[int, int]]:
    """(content start, closing brace) of every ``\\boxed{...}`` / ``\\fbox{...}`` in order of opening, braces
    balanced, in one pass with a stack; an unclosed box drops itself and every later box (they are inside it)."""
    opened: list[int] = []  # per open brace: the content start of its box, or -1 for a plain brace
    spans = []
    for token in _BOX_OR_BRACE.finditer(text):
        if token.group() != "}":
            opened.append(-1 if token.group() == "{" else token.end())
        elif opened and (start := opened.pop()) >= 0:
            spans.append((start, token.start()))
    unclosed = min((start for start in opened if start >= 0), default=len(text))
    return sorted(span for span in spans if span[0] < unclosed)


def _content(text: str, span: tuple[int, int]) -> str:
    """A box's content, stripped."""
    return text[span[0] : span[1]].strip()


def boxed_answer(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in the last `TAIL_CHARS` characters of ``text``, or None."""
    text = text[-TAIL_CHARS:]
    spans = _boxed(text)
    return _content(text, spans[-1]) if spans else None


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
    itself does not: a gold answer listing several values may be given as a list, one containing "or" may say "or".
    Linear in the length of both."""
    spans = _boxed(completion)
    # A box inside another always differs from it; boxes that do not nest hold disjoint text, so the set is linear.
    nested = any(inner[0] < outer[1] for outer, inner in zip(spans, spans[1:], strict=False))
    if nested or len({_content(completion, span) for span in spans}) > 1:
        return "several different boxed answers"
    if spans:
        last, after = _content(completion, spans[-1]), spans[-1][1] + 1
        final = last + " " + completion[after : after + _AFTER_BOX_CHARS]
    else:
        final = next((line for line in reversed(completion.splitlines()) if line.strip()), "")
    if _DISJUNCTION.search(final) and not _DISJUNCTION.search(answer):
        return "a disjunction in the final answer"
    if spans and _top_level_values(last) > 1 and _top_level_values(str(answer)) == 1:
        return "several values where one is asked"
    return None


_INTEGER = re.compile(r"-?\d{1,30}")


def _integer_grade(completion: str, answer: str) -> MathGrade | None:
    """The grade of a boxed plain integer against a plain-integer gold answer, without Math-Verify (which parses
    both to the same integers: equal values score 1), or None for anything else. About 100x cheaper; the embedded
    tasks' answers all take this path."""
    spans = _boxed(completion)
    last = _content(completion, spans[-1]) if spans else ""
    if not _INTEGER.fullmatch(last) or not _INTEGER.fullmatch(str(answer).strip()):
        return None
    return MathGrade(score=float(int(last) == int(str(answer).strip())), prediction=last)


def deadline(seconds: float):
    """`vespo.deadline.deadline` raising Math-Verify's TimeoutException (a BaseException, so no ``except Exception``
    in sympy swallows it) in this main thread once ``seconds`` have passed."""
    return _deadline(seconds, TimeoutException)


def grade_math(completion: str, answer: str, *, timeout_s: float = 5) -> MathGrade:
    """Grade one completion (its last `TAIL_CHARS` characters) against its ground truth within ``timeout_s`` seconds
    in all; never raises for any answer.

    Must run on a thread's main interpreter thread (the deadline is SIGALRM); `score_math` grades from any thread.
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s}")
    if threading.current_thread() is not threading.main_thread():
        raise ValueError("grade_math needs the main thread (SIGALRM deadline); use score_math from other threads")
    try:
        with deadline(timeout_s):
            return _grade(str(completion)[-TAIL_CHARS:], str(answer))
    except TimeoutException:
        return MathGrade(score=0.0, prediction="", timed_out=True)


def _grade(completion: str, answer: str) -> MathGrade:
    """`grade_math`'s body, run under its deadline: hedges, the integer fast path, then Math-Verify with no limit."""
    hedged = hedge(completion, answer)
    if hedged is not None:
        return MathGrade(score=0.0, prediction="", error=f"hedged: {hedged}")
    fast = _integer_grade(completion, answer)
    if fast is not None:
        return fast
    try:
        gold = parse(_gold_text(answer), parsing_timeout=None, raise_on_error=True)
        pred = parse(completion, parsing_timeout=None, raise_on_error=True)
        prediction = str(pred[-1]) if pred else ""
        ok = bool(pred) and bool(gold) and verify(gold, pred, timeout_seconds=None, raise_on_error=True)
        return MathGrade(score=1.0 if ok else 0.0, prediction=prediction)
    except Exception as exc:  # a malformed answer must cost one sample, not the training step
        return MathGrade(score=0.0, prediction="", error=f"{type(exc).__name__}: {exc}"[:200])


def _grade_pair(args: tuple[str, str, float]) -> MathGrade:
    return grade_math(args[0], args[1], timeout_s=args[2])


_pool: concurrent.futures.ProcessPoolExecutor | None = None
_pool_workers = 0
_pool_lock = threading.Lock()


def _get_pool(num_workers: int) -> concurrent.futures.ProcessPoolExecutor:
    """A persistent worker pool, forked so workers need no re-import of ``__main__`` (unlike spawn/forkserver).
    Unlike ``multiprocessing.Pool``, it reports a worker that dies (BrokenProcessPool) instead of losing its task."""
    global _pool, _pool_workers
    with _pool_lock:
        if _pool is None or _pool_workers != num_workers:
            _shutdown_pool()
            context = multiprocessing.get_context("fork")
            _pool = _host_call(concurrent.futures.ProcessPoolExecutor, num_workers, mp_context=context)
            _pool_workers = num_workers
        return _pool


def _host_call(fn, *args, **kwargs):
    """``fn(...)`` on the worker pool, with a host failure raised as GraderHostError: workers that cannot start
    (EMFILE, ENOMEM, EAGAIN) or one that died (killed, out of memory)."""
    try:
        return fn(*args, **kwargs)
    except concurrent.futures.TimeoutError:  # an OSError since Python 3.11, but the backstop's, not the host's
        raise
    except (OSError, BrokenProcessPool) as exc:
        _shutdown_pool()
        what = "a worker process died" if isinstance(exc, BrokenProcessPool) else "cannot start worker processes"
        raise GraderHostError(f"math grader: {what} ({exc})") from exc


def _shutdown_pool() -> None:
    """Stop the pool now, killing any worker still grading (one stuck outside Python would never exit)."""
    global _pool
    if _pool is not None:
        workers = list((_pool._processes or {}).values())  # no public way to kill them before Python 3.14
        _pool.shutdown(wait=False, cancel_futures=True)
        for worker in workers:
            worker.kill()
            worker.join()
        _pool = None


atexit.register(_shutdown_pool)


def score_math(
    completions: list[str], answers: list[str], *, timeout_s: float = 5, num_workers: int | None = None
) -> MathScores:
    """Grade a batch. ``num_workers=0`` forces in-process grading; ``None`` picks in-process for small batches.
    Raises GraderHostError if the worker pool cannot start or a worker dies."""
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


def _grade_in_pool(items: list[tuple[str, str, float]], num_workers: int, timeout_s: float) -> list[MathGrade]:
    # Each worker enforces its own deadline; one still running past it plus a grace is stuck outside Python.
    backstop = timeout_s + _BACKSTOP_GRACE_S
    grades: list[MathGrade] = []
    while len(grades) < len(items):
        pool = _get_pool(num_workers)
        pending = [_host_call(pool.submit, _grade_pair, item) for item in items[len(grades) :]]
        for future in pending:
            try:
                grades.append(_host_call(future.result, timeout=backstop))
            except concurrent.futures.TimeoutError:
                # A worker ignored its alarm: kill the pool, count this item as a timeout and regrade the rest afresh.
                _shutdown_pool()
                grades.append(MathGrade(score=0.0, prediction="", timed_out=True))
                break
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

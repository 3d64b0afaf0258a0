"""Rewards for reasoning-gym tasks: each task's own verifier (`score_answer`) on the completion's final answer.

The answer is the content of the last ``\\boxed{}`` (the default prompt asks for one), or else of the last
``<answer>...</answer>`` (reasoning-gym's own format), or, for prompts that ask for the answer alone
(``format=direct``), the completion's first line; otherwise the verifier gets None. Verifiers may give partial
credit in [0, 1] (reasoning-gym's default gives len(gold)/len(answer) when the gold answer is inside a longer one).
A verifier that raises, returns a non-number or overruns its deadline scores 0 and is counted, never a crashed step.
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass

from vespo.data.reasoning_gym import task_entry
from vespo.rewards.batch import RewardList, Scores
from vespo.rewards.math_grader import TAIL_CHARS, TimeoutException, boxed_answer, completion_text, deadline

TIMEOUT_S = 5.0
"""Wall-clock limit per verifier call (SIGALRM in the main thread; threads run without one)."""
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def task_answer(completion: str, form: str = "boxed") -> str | None:
    """The final answer of a completion: the last ``\\boxed{}`` content, else the last ``<answer>`` tag content; for
    the ``direct`` format, else its first non-empty line, from after its last "=" if it has one ("3 + 4 = 7" gives
    7), a trailing period dropped; else None."""
    boxed = boxed_answer(completion)
    if boxed is not None:
        return boxed
    tags = _ANSWER_TAG.findall(completion[-TAIL_CHARS:])
    if tags:
        return tags[-1].strip()
    if form == "direct":
        line = next((line.strip() for line in completion[:TAIL_CHARS].splitlines() if line.strip()), "")
        return line.rpartition("=")[2].strip().removesuffix(".").strip() or None
    return None


@dataclass(frozen=True)
class TaskGrade:
    score: float
    prediction: str | None
    error: str | None = None
    timed_out: bool = False


class TaskScores(Scores[TaskGrade]):
    """A graded batch of reasoning-gym completions."""

    def metrics(self, prefix: str = "reward/task/") -> dict[str, float]:
        """Mean score, timeouts, verifier errors and completions with no extractable answer."""
        errors = sum(g.error is not None and not g.timed_out for g in self.grades)
        unparsed = sum(g.prediction is None for g in self.grades)
        return super().metrics(prefix) | {
            f"{prefix}verifier_errors": float(errors),
            f"{prefix}unparsed": float(unparsed),
        }


def grade_task(completion: str, item: str, *, timeout_s: float | None = None) -> TaskGrade:
    """Grade one completion with the verifier of the task ``item`` addresses, within ``timeout_s`` (default
    `TIMEOUT_S`); never raises for any completion."""
    timeout_s = TIMEOUT_S if timeout_s is None else timeout_s
    ds, entry, form = task_entry(item)
    answer = task_answer(completion_text(completion), form)
    try:
        if threading.current_thread() is threading.main_thread():
            with deadline(timeout_s):
                score = ds.score_answer(answer=answer, entry=entry)
        else:
            score = ds.score_answer(answer=answer, entry=entry)
        score = float(score)
    except TimeoutException:
        return TaskGrade(0.0, answer, f"verifier took over {timeout_s} s", timed_out=True)
    except Exception as exc:  # noqa: BLE001 - a third-party verifier's failure is a failed sample, counted
        return TaskGrade(0.0, answer, f"{type(exc).__name__}: {exc}")
    if not math.isfinite(score):
        return TaskGrade(0.0, answer, f"verifier returned {score}")
    return TaskGrade(min(max(score, 0.0), 1.0), answer)


def score_tasks(completions: list[str], items: list[str]) -> TaskScores:
    """Grades of `completions` against the tasks their records address (``rg_item``), in order."""
    if len(completions) != len(items):
        raise ValueError(f"got {len(completions)} completions but {len(items)} task items")
    return TaskScores([grade_task(c, i) for c, i in zip(completions, items, strict=True)])


def reasoning_gym_reward(completions: list, rg_item: list[str], **kwargs) -> list[float]:
    """TRL-style reward for reasoning-gym records: the task's own verifier score of each completion's final answer
    (a list of floats that also carries the batch's `TaskScores.metrics`)."""
    scores = score_tasks([completion_text(c) for c in completions], rg_item)
    return RewardList(scores.scores, scores.metrics())

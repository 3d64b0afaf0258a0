"""Attacks on the math grader: each is graded within its documented bound (linear box and hedge scans, only the last
`TAIL_CHARS` characters read, one deadline per answer), and a worker pool that fails raises GraderHostError.

Issue 27 measured the grader before: nested boxes of 80 KB took 110 s in `hedge`, a 40 KB ``\\boxed{1,000,...}``
7.5 s, and one answer could spend Math-Verify's limit three times over (gold parse, prediction parse, comparison).
"""

import errno
import os
import threading
import time

import pytest
from _clock import cpu_seconds
from math_verify.utils import timeout as math_verify_timeout

from vespo.rewards import GraderHostError, grade_math, score_math
from vespo.rewards import math_grader as math_mod

FAST_S = 1.0  # CPU seconds: extraction bombs are linear work on at most TAIL_CHARS characters (milliseconds)


@pytest.fixture(scope="module", autouse=True)
def _warm_math_verify():
    """Math-Verify's first parse builds its grammar (about a second): paid before anything is timed."""
    grade_math("\\boxed{\\frac{1}{2}}", "0.5")


@pytest.fixture
def fresh_pool():
    """The next worker pool is forked from this test's (patched) module, and none outlives the test."""
    math_mod._shutdown_pool()
    yield
    math_mod._shutdown_pool()


_timed = cpu_seconds  # in-process work; the deadlines below are tested by the grades they mark, not by a clock


def test_nested_boxes_80kb():
    depth = 80_000 // 8
    bomb = "\\boxed{" * depth + "1" + "}" * depth
    verdict, elapsed = _timed(math_mod.hedge, bomb, "1")  # the whole text, no cap: the scan itself is linear
    assert verdict == "several different boxed answers" and elapsed < FAST_S
    grade, elapsed = _timed(grade_math, bomb, "1")
    assert grade.score == 0.0 and not grade.timed_out and elapsed < FAST_S
    inside_tail = "\\boxed{" * 400 + "1" + "}" * 400
    grade, elapsed = _timed(grade_math, inside_tail, "1")
    assert grade.error == "hedged: several different boxed answers" and elapsed < FAST_S


def test_thousands_separators_48kb():
    bomb = "\\boxed{1" + ",000" * 12_000 + ",00}"  # the separator regex once tried a match from every comma
    verdict, elapsed = _timed(math_mod.hedge, bomb, "1")
    assert verdict == "several values where one is asked" and elapsed < FAST_S
    grade, elapsed = _timed(grade_math, bomb, "1")
    assert grade.score == 0.0 and not grade.timed_out and elapsed < FAST_S
    assert math_mod._top_level_values("1" + ",000" * 12_000) == 1  # still one value


def test_hedge_bomb_40kb():
    """Alternately nested \\fbox and \\boxed, closed with disjunctions: both hedge rules fire, from the tail alone."""
    bomb = "\\fbox{\\boxed{" * 2_000 + "3" + "} or 7}" * 2_000
    verdict, elapsed = _timed(math_mod.hedge, bomb, "3")
    assert verdict == "several different boxed answers" and elapsed < FAST_S
    grade, elapsed = _timed(grade_math, bomb, "3")
    assert grade.error == "hedged: a disjunction in the final answer" and elapsed < FAST_S


@pytest.mark.parametrize("num_workers", [0, 1])
def test_one_deadline_covers_hedge_parses_and_comparison(monkeypatch, fresh_pool, num_workers):
    """Hedge detection, both parses and the comparison each take 90% of the limit (and stay within any limit
    Math-Verify is given itself): together they get timeout_s, not four times it. In-process and in a pool worker."""
    budget = 1

    def slow(real, limit_kwarg=None):
        def call(*args, **kwargs):
            math_verify_timeout(kwargs.get(limit_kwarg))(time.sleep)(0.9 * budget)
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(math_mod, "hedge", slow(math_mod.hedge))
    monkeypatch.setattr(math_mod, "parse", slow(math_mod.parse, "parsing_timeout"))
    monkeypatch.setattr(math_mod, "verify", slow(math_mod.verify, "timeout_seconds"))
    scores = score_math(["\\boxed{\\frac{1}{2}}"], ["0.5"], timeout_s=budget, num_workers=num_workers)
    # each stage alone stays within the budget: only one deadline over all of them times the grade out
    assert scores.grades[0].timed_out and scores.metrics()["reward/math/timeouts"] == 1.0


def test_only_the_tail_is_graded(monkeypatch):
    """Math-Verify's own extraction is superlinear on long text (20 KB of "\\(" cost its whole 5 s limit before the
    answer was read); it now sees the last TAIL_CHARS characters only."""
    seen, real_parse = [], math_mod.parse

    def parse(text, **kwargs):
        seen.append(len(text))
        return real_parse(text, **kwargs)

    monkeypatch.setattr(math_mod, "parse", parse)
    grade = grade_math("\\(" * 10_000 + " so \\boxed{\\frac{1}{2}}", "0.5")
    assert grade.score == 1.0 and seen and max(seen) <= math_mod.TAIL_CHARS, seen  # Math-Verify sees the tail only
    # a box further back than TAIL_CHARS is not read, so it is no second answer
    assert grade_math("\\boxed{3}" + " " * math_mod.TAIL_CHARS + "\\boxed{7}", "7").score == 1.0


def test_dead_worker_raises_grader_host_error(monkeypatch, fresh_pool):
    real = math_mod.grade_math

    def grade_or_die(completion, answer, *, timeout_s):
        if completion == "DIE":
            os._exit(137)  # as if the OOM killer took the worker
        return real(completion, answer, timeout_s=timeout_s)

    monkeypatch.setattr(math_mod, "grade_math", grade_or_die)
    monkeypatch.setattr(math_mod, "_BACKSTOP_GRACE_S", 0.5)  # a lost task must not pass as a timeout either
    with pytest.raises(GraderHostError, match="math grader: a worker process died"):
        score_math(["\\boxed{1}", "DIE", "\\boxed{2}"], ["1", "2", "2"], timeout_s=1, num_workers=2)
    assert score_math(["\\boxed{1}", "\\boxed{2}"], ["1", "3"], num_workers=2).scores == [1.0, 0.0]  # a fresh pool


@pytest.mark.parametrize(("call", "code"), [("fork", errno.ENOMEM), ("pipe", errno.EMFILE)])
def test_pool_that_cannot_start_raises_grader_host_error(monkeypatch, fresh_pool, call, code):
    def fail(*args):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, call, fail)
    with pytest.raises(GraderHostError, match="math grader: cannot start worker processes"):
        score_math(["\\boxed{1}"], ["1"], num_workers=2)


def test_stuck_worker_is_killed_and_counted(monkeypatch, fresh_pool):
    """A worker past its deadline plus the grace (stuck where no alarm reaches) is killed; the rest is regraded."""
    real = math_mod.grade_math

    def grade_or_hang(completion, answer, *, timeout_s):
        if completion == "HANG":
            time.sleep(60)  # the real grade_math's alarm is not armed here
        return real(completion, answer, timeout_s=timeout_s)

    monkeypatch.setattr(math_mod, "grade_math", grade_or_hang)
    monkeypatch.setattr(math_mod, "_BACKSTOP_GRACE_S", 0.5)
    completions = ["\\boxed{1}", "HANG", "\\boxed{2}", "\\boxed{3}"]
    scores = score_math(completions, ["1", "1", "2", "4"], timeout_s=1, num_workers=2)
    # not killed, the hung task would finish after 60 s as an untimed wrong answer: the timeout count says it was
    assert scores.scores == [1.0, 0.0, 1.0, 0.0] and scores.metrics()["reward/math/timeouts"] == 1.0


def test_off_the_main_thread_grade_math_refuses_and_score_math_uses_the_pool(fresh_pool):
    """No SIGALRM deadline off the main thread: grading there unbounded (or scoring 0) would be wrong."""
    results = {}

    def grade_from_thread():
        try:
            grade_math("\\boxed{\\frac{1}{2}}", "0.5")
        except ValueError as exc:
            results["error"] = str(exc)
        results["scores"] = score_math(["\\boxed{\\frac{1}{2}}", "\\boxed{3}"], ["0.5", "4"]).scores

    thread = threading.Thread(target=grade_from_thread)
    thread.start()
    thread.join()
    assert "main thread" in results.get("error", "") and results["scores"] == [1.0, 0.0]

"""The code grader's own cost and failure modes under attack (issue 27: nothing lost, nothing hung).

Each test was run first against the grader before the fix, where it failed: a comparison that hung the process
(quadratic regex backtracking), a reply line the reader let through (+1 GB for one case), a checker without memory
limits (1.8 GB), a broken case that failed the next one, and host failures (disk full, no file descriptors, a
checker or sandbox that cannot start) scored as wrong answers instead of raised.
"""

import errno
import os
import re
import resource
import subprocess
import threading
import time
from pathlib import Path
from unittest.mock import patch

import pytest
from _optional import require
from hypothesis import given
from hypothesis import strategies as st

from vespo.rewards import GraderHostError, SandboxLimits, code_reward, grade_code
from vespo.rewards import code_grader as code_mod
from vespo.rewards.code_grader import _int_digits, _is_decimal, stdout_matches
from vespo.sandbox import runner as sandbox_mod
from vespo.sandbox._wire import WireError, count_values

ADD_STDIO = [{"input": "1 2\n", "output": "3\n"}]
ADD = "a, b = map(int, input().split())\nprint(a + b)"
ADD_ASSERT = [{"assert": "assert add(1, 2) == 3", "entry_point": "add"}]
ADD_FN = "def add(a, b):\n    return a + b\n"


def _memory_kb(field: str, pid: int | str = "self") -> int:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(status[field].split()[0])


def _grader_cost(program: str, tests: list, limits: SandboxLimits | None = None):
    """Grade one program; the grader's CPU seconds and peak-RSS growth in MB (VmHWM, reset before)."""
    Path("/proc/self/clear_refs").write_text("5")
    cpu, rss = time.process_time(), _memory_kb("VmRSS")
    grade = grade_code(program, tests, limits=limits)
    return grade, time.process_time() - cpu, (_memory_kb("VmHWM") - rss) >> 10


# ---- 2: every comparison is linear in the output -----------------------------------------------------------


@pytest.mark.parametrize("size", [40_000, 4_000_000])  # old: 40k chars 10 s (quadratic), 4M chars ~29 hours
@pytest.mark.parametrize(
    ("token", "want"),
    [
        ("0{}x", "7"),  # leading zeros, then not a digit: the old integer regex tried every split of the zeros
        ("-0{}+", "-7"),
        ("1{}.5.", "1.5"),
        ("1{}e5e", "1.5"),
        (".{}x", "0.5"),
    ],
)
def test_hostile_tokens_compare_in_linear_time(size, token, want):
    got = token.format("0" * size)
    start = time.process_time()
    assert not stdout_matches(got, want)
    assert time.process_time() - start < 1.0  # measured 0.06 s at 4 M


REFERENCE_INT = re.compile(r"([+-]?)0*([0-9]+)", re.ASCII)  # the old patterns: what the str checks must accept
REFERENCE_FLOAT = re.compile(r"[+-]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)


@given(st.text(alphabet="0012+-.eEx \u0661\u00b2_", max_size=12))
def test_token_checks_keep_the_old_semantics(token):
    match = REFERENCE_INT.fullmatch(token)
    old = None if match is None else ("-" if match[1] == "-" and match[2] != "0" else "", match[2])
    assert _int_digits(token) == old
    assert _is_decimal(token) == bool(REFERENCE_FLOAT.fullmatch(token))


@given(st.text(alphabet="ab \n\t\u3000\x1c", max_size=20))
def test_tokens_are_split_exactly_as_str_split(text):
    with patch.object(code_mod, "_TOKEN_BLOCK", 2):
        assert list(code_mod._tokens(text)) == text.split()
        assert stdout_matches(text, " ".join(text.split())) and not stdout_matches(text, text + " c")


# ---- 6: the grader's and the checker's memory -------------------------------------------------------------


def test_reader_caps_a_reply_line_the_program_writes_itself():
    """A stdio program writes its own 45 MB reply line (15 M tokens) past the sandbox's 4 M-character cap: the
    reader refuses it before parsing (old: accepted, then split into tokens: +1,076 MB, 5.6 s of grader CPU)."""
    program = "import os; os.write(4, b'{\"output\": \"' + b'00 ' * 15_000_000 + b'\"}\\n')"
    grade, cpu, peak_mb = _grader_cost(program, [{"input": "", "output": "1\n"}])
    assert peak_mb < 150, peak_mb  # measured +86 MB: the 45 MB buffer, then its text and one scanned string
    assert cpu < 2.0, cpu
    assert grade.score == 0.0 and "over 4000000 characters" in grade.error


def test_largest_honest_stdout_costs_the_grader_under_the_documented_bound():
    """4 M characters of two-digit tokens, equal to the expected output, pass; tokens are split a block at a time
    (old: both sides split at once, +190 MB)."""
    output = "00 " * 1_333_000
    grade, cpu, peak_mb = _grader_cost("print('00 ' * 1_333_000)", [{"input": "", "output": output}])
    assert peak_mb < 100, peak_mb
    assert cpu < 3.0, cpu
    assert grade.score == 1.0, grade.error


def test_count_values_caps_decoded_string_length():
    assert count_values('{"o": "' + "\\ud83d\\ude00" * 5 + '"}', 10, max_chars=5) <= 10  # 60 bytes, 5 chars
    with pytest.raises(WireError, match="over 5 characters"):
        count_values('{"o": "123456"}', 10, max_chars=5)


class _CheckerPeak:
    """The largest peak RSS (VmHWM, MB) any checker of this process reached, sampled every 10 ms."""

    def __init__(self):
        self.mb, self.stop = 0, threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self.stop.wait(0.01):
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    if b"\0_checker\0" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        self.mb = max(self.mb, _memory_kb("VmHWM", pid) >> 10)
                except (OSError, KeyError, ValueError):
                    pass

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def test_checker_memory_is_capped_and_the_next_case_runs_in_a_fresh_checker():
    """``[[0.0]] * 100000`` (a 0.7 MB reply) against 2,000 expected floats makes ``np.allclose`` build 1.6 GB
    arrays in the trusted checker (old: no limit, 1.4-1.8 GB). Now it hits the checker's address-space limit
    (``memory_mb``), fails that case, and the next case passes in a fresh checker."""
    require("numpy")
    expected = [i / 7 for i in range(2000)]
    hostile = {"assert": f"import numpy as np\nassert np.allclose(f(), {expected!r})", "entry_point": "f"}
    honest = {"assert": "assert g() == 1"}
    program = "def f():\n    return [[0.0]] * 100000\n\ndef g():\n    return 1\n"
    limits = SandboxLimits(memory_mb=512, wall_s=30.0, test_timeout_s=20.0)
    with _CheckerPeak() as checker:
        grade = grade_code(program, [hostile, honest], limits=limits)
    assert checker.mb < 512, checker.mb
    assert grade.pass_fraction == 0.5 and grade.error.startswith("MemoryError"), grade


def test_checker_cpu_is_capped():
    """Trusted test code looping on the candidate's value is stopped by the checker's CPU limit (``cpu_s``), not
    only by the case's wall clock (old: it ran until the 40 s deadline; now about 1 s)."""
    limits = SandboxLimits(cpu_s=1, wall_s=90.0, test_timeout_s=40.0)
    tests = [{"assert": "for _ in range(f()):\n    pass", "entry_point": "f"}, {"assert": "assert f() > 1"}]
    grade = grade_code("def f():\n    return 10**12\n", tests, limits=limits)
    assert grade.pass_fraction == 0.5 and not grade.timed_out, grade  # uncapped, the case runs into its 40 s limit


# ---- 7: a broken case never affects the next; host failures raise ------------------------------------------


def test_a_case_that_breaks_the_checker_channel_does_not_fail_the_next():
    """The candidate writes a garbage line on its reply channel: that case fails, the next (correct) one passes
    (old: the checker had quit, so the next case failed too)."""
    program = "import os\ndef bad():\n    os.write(4, b'garbage\\n')\n    return 1\n\ndef g():\n    return 1\n"
    tests = [{"assert": "bad()", "entry_point": "bad"}, {"assert": "assert g() == 1"}]
    grade = grade_code(program, tests)
    assert grade.pass_fraction == 0.5 and "malformed" in grade.error, grade


@pytest.mark.parametrize(
    ("program", "tests"),
    [
        ("import os\nos._exit(3)", ADD_STDIO),  # dies in its case
        ("import os\nos._exit(3)", ADD_ASSERT),  # dies while loading, before its ready message
        ("import os\ndef add(a, b):\n    os.close(3)\n    os.close(4)\n    return 3", ADD_ASSERT),  # closes its channel
        ("import os, signal\ndef add(a, b):\n    os.killpg(0, signal.SIGKILL)", ADD_ASSERT),
        ("x = bytearray(1 << 40)", ADD_STDIO),  # over its memory limit
    ],
)
def test_a_program_that_breaks_itself_is_a_wrong_answer_not_a_host_failure(program, tests):
    assert grade_code(program, tests).score == 0.0


@pytest.fixture
def probed():
    """The namespace probe's answer, cached before a test breaks what the probe would use."""
    assert sandbox_mod.namespaces_work() is not None


def _one_line_host_error(info: pytest.ExceptionInfo, *words: str) -> None:
    message = str(info.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_a_full_temp_dir_raises_grader_host_error(monkeypatch, probed):
    """ENOSPC creating the sandbox's work dir (old: every program scored 0.0 and code_reward returned)."""

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(sandbox_mod.tempfile, "mkdtemp", full)
    with pytest.raises(GraderHostError) as info:
        code_reward([ADD], tests=[ADD_STDIO])
    _one_line_host_error(info, "ENOSPC", "work dir", "TMPDIR")


def test_running_out_of_file_descriptors_raises_grader_host_error(probed):
    """A real EMFILE: a grader process whose descriptors are all in use (old: the case scored 0.0)."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
            hogs = []
            while True:
                try:
                    hogs.append(os.open(os.devnull, os.O_RDONLY))
                except OSError:
                    break
            try:
                result = f"returned {grade_code(ADD, ADD_STDIO)}"
            except GraderHostError as exc:
                result = f"GraderHostError {exc}"
            os.write(write, result.encode()[:4000])
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read, "rb") as pipe:
        result = pipe.read().decode()
    assert result.startswith("GraderHostError") and "EMFILE" in result and "ulimit -n" in result, result


@pytest.mark.parametrize("failure", ["cannot_fork", "exits_at_start"])
def test_a_checker_that_cannot_start_raises_grader_host_error(monkeypatch, probed, failure):
    """Old: every assertion case scored 0.0 (the verdict channel was simply dead). The batch stops at the first
    failure instead of starting every queued program against the same host."""
    popen, checkers = subprocess.Popen, []

    def fake(argv, **kwargs):
        if "_checker" not in argv:
            return popen(argv, **kwargs)
        checkers.append(argv)
        if failure == "cannot_fork":
            raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))
        return popen([argv[0], "-c", "pass"], **kwargs)

    monkeypatch.setattr(sandbox_mod.subprocess, "Popen", fake)
    with pytest.raises(GraderHostError) as info:
        code_reward([ADD_FN] * 20, tests=[ADD_ASSERT] * 20)
    _one_line_host_error(info, "EAGAIN" if failure == "cannot_fork" else "checker exited before it was ready")
    if failure == "exits_at_start":
        assert len(checkers) <= 4, len(checkers)  # the two workers' programs, not all 20


def test_a_sandbox_that_dies_before_the_program_runs_raises_grader_host_error(monkeypatch, probed):
    """The sandbox process exits before its confinement report, so no program ran: the host failed (old: 0.0)."""
    popen = subprocess.Popen

    def fake(argv, **kwargs):
        return popen([argv[0], "-c", "pass"] if "_sandbox_child" in argv else argv, **kwargs)

    monkeypatch.setattr(sandbox_mod.subprocess, "Popen", fake)
    with pytest.raises(GraderHostError) as info:
        code_reward([ADD], tests=[ADD_STDIO])
    _one_line_host_error(info, "sandbox died before running the program")

"""Running the `vespo` command in tests: one call (`vespo`), or a running process whose stderr is read as it comes
(`Running`, to send SIGINT at the right moment), and the processes below a pid."""

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from _clock import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]


def vespo(*argv, **kw):
    return subprocess.run([sys.executable, "-m", "vespo", *argv], capture_output=True, text=True, timeout=600, **kw)


def sigint_default() -> None:
    """`preexec_fn` of a process the tests Ctrl-C: SIGINT at its default, as in a terminal. A suite started in the
    background by a non-interactive shell (`cmd &`, as CI scripts do) inherits SIGINT ignored, and Python then never
    raises KeyboardInterrupt, so the command under test would never see the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def sigint_ignored() -> None:
    """`preexec_fn` of a process started as `cmd &` starts it: SIGINT ignored (POSIX), which its children inherit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Running:
    """A `vespo` subprocess whose stderr is read as it comes (to send SIGINT at the right moment); `background`: with
    SIGINT ignored, as `cmd &` starts it."""

    def __init__(self, *argv, cwd=None, env=None, background=False):
        self.proc = subprocess.Popen([sys.executable, "-m", "vespo", *argv], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=cwd, env=env,
                                     preexec_fn=sigint_ignored if background else sigint_default)  # fmt: skip
        self.err = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for chunk in iter(lambda: self.proc.stderr.read(1), ""):
            self.err += chunk

    def wait_for(self, predicate, timeout=HANG_GUARD_S):
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.proc.poll() is None, f"exited early ({self.proc.returncode}): {self.err[-2000:]}"
            assert time.monotonic() < deadline, f"timed out waiting: {self.err[-2000:]}"
            time.sleep(0.1)

    def interrupt(self, sig=signal.SIGINT) -> int:
        """`sig` (SIGINT) to this process only (not its group: it must pass it on itself); its exit code. That it
        stopped promptly is read from what it left (cells or SFT steps unfinished, nothing written), not from a
        clock."""
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=HANG_GUARD_S)
        self._reader.join(timeout=HANG_GUARD_S)
        return code


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

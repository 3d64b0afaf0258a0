"""Run untrusted Python in a confined child process and report what it produced on each test input.

Confinement (strongest available is used; `isolation_report()` says which):

* a separate process in its own session, started with ``python -I`` and a scrubbed environment (no secrets, no
  ``PYTHON*`` variables), working in a fresh temporary directory that is deleted afterwards;
* resource limits (setrlimit): CPU time, address space, file size, process count, open files, no core dumps; a
  wall-clock limit enforced by the grader, which kills the process group and every process of the sandbox uid;
* as root: a new network namespace (no interfaces up, so no network at all) and a private mount namespace with empty
  tmpfs over ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run/lock``; then a drop to a fresh unprivileged uid/gid per run,
  so the program can neither write outside its directory, read other users' files, nor signal the grader, and
  RLIMIT_NPROC (ignored for root) counts only this sandbox's processes;
* without root: socket creation is blocked inside the interpreter (bypassable with ctypes) and RLIMIT_NPROC counts
  all of the user's processes, so isolation is weaker; see docs/rewards.md.

Test outputs are compared by the caller (`vespo.rewards.code`); expected outputs never enter the sandbox.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from vespo.rewards import _sandbox_child

_CHILD = Path(_sandbox_child.__file__)
_MODES = ("stdio", "call", "assert")
_SAFE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits; defaults suit competitive-programming solutions (LiveCodeBench uses ~6 s per test)."""

    cpu_s: int = 10
    wall_s: float = 30.0
    test_timeout_s: float = 6.0
    memory_mb: int = 1024
    file_size_mb: int = 16
    max_processes: int = 16
    max_open_files: int = 64
    max_output_chars: int = 1_000_000

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {value}")


@dataclass(frozen=True)
class SandboxRun:
    """What the program produced: one output (or None) and one error (or None) per test case."""

    outputs: list[str | None]
    errors: list[str | None]
    timed_out: bool
    isolated: bool
    stdout: str
    stderr: str


def run_in_sandbox(
    program: str,
    cases: list,
    *,
    mode: str,
    fn_name: str | None = None,
    limits: SandboxLimits | None = None,
) -> SandboxRun:
    """Execute ``program`` once per case in a confined child process.

    ``mode`` is ``"stdio"`` (cases are stdin strings; output is captured stdout), ``"call"`` (cases are argument
    lists for ``fn_name``, a function or a ``Solution`` method; output is the JSON of its return value) or
    ``"assert"`` (cases are test code run after the program; output is ``"passed"`` when nothing raised).
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    if mode == "call" and not fn_name:
        raise ValueError("mode='call' needs fn_name")
    limits = limits or SandboxLimits()
    workdir = tempfile.mkdtemp(prefix="vespo-sandbox-")
    try:
        return _run(program, cases, mode, fn_name, limits, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run(program: str, cases: list, mode: str, fn_name: str | None, limits: SandboxLimits, workdir: str) -> SandboxRun:
    spec = {
        "program": program,
        "cases": cases,
        "mode": mode,
        "fn_name": fn_name,
        "limits": asdict(limits),
        "user_procs": _count_processes(os.getuid()),
    }
    Path(workdir, "spec.json").write_text(json.dumps(spec))
    env = {**_SAFE_ENV, "HOME": workdir, "TMPDIR": workdir}
    with open(Path(workdir, "stdout"), "wb") as out, open(Path(workdir, "stderr"), "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-I", str(_CHILD), "spec.json"],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            close_fds=True,
        )
        timed_out = False
        try:
            proc.wait(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_all(proc)
    result = _read_json(Path(workdir, "result.json"), limits.max_output_chars * (len(cases) + 1))
    runs = result.get("runs") or []
    if not isinstance(runs, list) or len(runs) != len(cases):
        missing = result.get("compile_error") or ("wall-clock timeout" if timed_out else "sandbox produced no result")
        runs = [{"error": missing}] * len(cases)
    return SandboxRun(
        outputs=[r.get("output") if isinstance(r, dict) and "error" not in r else None for r in runs],
        errors=[str(r.get("error"))[:500] if isinstance(r, dict) and "error" in r else None for r in runs],
        timed_out=timed_out,
        isolated=bool(result.get("isolated", False)),
        stdout=_read_text(Path(workdir, "stdout"), 10_000),
        stderr=_read_text(Path(workdir, "stderr"), 10_000),
    )


def _kill_all(proc: subprocess.Popen) -> None:
    """SIGKILL the process group, then (as root) every live process of the sandbox uid.

    Stragglers (e.g. a fork bomb that left its session) are killed by a helper that becomes the sandbox uid and
    calls kill(-1, SIGKILL): the kernel signals all of that uid's processes atomically with respect to fork().
    """
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    if os.geteuid() != 0:
        return
    uid = _sandbox_child.UID_BASE + proc.pid
    for _ in range(20):
        if not _pids_of_uid(uid):
            return
        reaper = f"import os, signal; os.setgid({uid}); os.setuid({uid}); os.kill(-1, signal.SIGKILL)"
        subprocess.run([sys.executable, "-I", "-S", "-c", reaper], env=_SAFE_ENV, check=False)
        time.sleep(0.05)
    raise RuntimeError(f"could not kill the processes of sandbox uid {uid}")


def _pids_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real uid is ``uid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path("/proc", entry, "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("Uid", "").split()[:1] == [str(uid)] and not fields.get("State", "").strip().startswith("Z"):
            pids.append(int(entry))
    return pids


def _count_processes(uid: int) -> int:
    """Processes (threads excluded) the user already runs: RLIMIT_NPROC headroom when we cannot switch uid."""
    return 0 if os.geteuid() == 0 else len(_pids_of_uid(uid))


def _read_text(path: Path, max_chars: int) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(max_chars).decode("utf-8", "replace")
    except OSError:
        return ""


def _read_json(path: Path, max_chars: int) -> dict:
    try:
        data = json.loads(_read_text(path, max_chars))
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}

"""Run untrusted Python in a confined process and collect, as plain data, what it produced on each test case.

The grader (this module) talks to the sandbox only through two pipes it created: requests in, one JSON line per
response out (`_wire`), read non-blocking with a deadline and a byte cap per message, so a hostile program can make
its own cases fail but can neither hang, crash nor mislead the grader. The grader never opens a file the sandbox could
have touched. Assertion tests run in a separate trusted checker (`_checker`) that calls into the sandbox the same way.
A failure of the host (no disk, file descriptors, memory or processes to start a sandbox or checker, a sandbox that
dies before the program runs, a checker that cannot start) raises `GraderHostError`: it is never scored as a case.

Confinement, strongest available first (`SandboxRun.isolated` says which applied):

* as root: new PID, mount, network, IPC and UTS namespaces; a read-only tmpfs root holding only the interpreter, its
  standard library, the system shared libraries and the top-level entries of the allow-listed distributions
  (`SandboxLimits.packages`; no other package, no project tree, home, caches, /etc), a fresh /proc, a
  size-limited tmpfs workdir; a fresh uid per sandbox; per-sandbox memory and process caps in a cgroup when one can
  be created (v2, else v1 memory + pids controllers);
* always: ``python -I -S`` with a scrubbed environment, setrlimit (CPU, address space, file size, processes, open
  files, no core dumps), ``no_new_privs`` and a seccomp filter (x86_64) denying sockets, SysV IPC, ptrace, mounts,
  namespaces, keyrings, BPF and similar; per-test and total wall-clock limits enforced here, outside the candidate.

See docs/guides/rewards.md for the threat model and what is not contained.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import importlib.metadata
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vespo.sandbox import _wire

_HERE = str(Path(__file__).resolve().parent)
# `python -I` puts no script directory on sys.path: import the helper from this directory, then drop the directory.
_BOOT = "import sys; sys.path.insert(0, sys.argv[1]); m = __import__(sys.argv[2]); del sys.path[0]; m.main()"
_MODES = ("stdio", "call", "assert")
_SAFE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "HOME": "/work",
    "TMPDIR": "/work",
    # BLAS libraries (numpy's OpenBLAS) start one thread per core at import: each counts against the process cap
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
_PYTHON = os.path.realpath(sys.executable)  # the base interpreter: inside the sandbox root, a venv is not visible
_serial = itertools.count()
UID_BASE = 2_000_000_000  # one fresh uid per sandbox: kill() permissions and RLIMIT_NPROC become per-sandbox
ALLOW_UNCONFINED_ENV = "VESPO_SANDBOX_ALLOW_UNCONFINED"
"""Set to 1 to run programs where the kernel refuses namespaces (weaker confinement, see docs/guides/rewards.md)."""
_WORKDIR_PREFIX = "vespo-sandbox-"  # + the grader's `_owner()` + "-": a dead grader's dirs are found by the sweep


class GraderHostError(RuntimeError):
    """The grading host failed (disk full, out of file descriptors, a checker that cannot start, a dead channel):
    never scored as a wrong answer; the trainer stops with one line and the last checkpoint kept."""


class SandboxUnavailable(GraderHostError):
    """The host cannot confine programs as required (raised before any program runs; a host setting, not a case)."""


class _BootFailed(GraderHostError):
    """The sandbox died or garbled its confinement report: nothing of the program had run, so the host failed."""


_HOST_ADVICE = {
    errno.ENOSPC: "free disk space in the temp dir or point TMPDIR at a larger disk",
    errno.EDQUOT: "free disk quota in the temp dir or point TMPDIR elsewhere",
    errno.EMFILE: "raise the open-file limit (ulimit -n) or lower num_workers",
    errno.ENFILE: "the system's file table is full (fs.file-max): run fewer processes",
    errno.ENOMEM: "the host is out of memory: free memory or lower num_workers",
    errno.EAGAIN: "the host refused a new process (ulimit -u, pids.max, memory): lower num_workers",
}


@contextlib.contextmanager
def _host(what: str):
    """Turn an OSError inside into GraderHostError: creating work dirs, pipes and processes fails only because the
    host ran out of something (disk, descriptors, memory, processes), never because of the program graded."""
    try:
        yield
    except OSError as exc:
        advice = _HOST_ADVICE.get(exc.errno, "check the host")
        name = errno.errorcode.get(exc.errno, type(exc).__name__)
        raise GraderHostError(f"code grader: cannot {what}: {_describe(exc)} ({name}); {advice}") from exc


_DISTRIBUTION = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")


@functools.cache
def _default_packages() -> tuple[str, ...]:
    """``("numpy",)`` where installed (EvalPlus tests use ``np.allclose``), else ``()``; looked up once."""
    try:
        importlib.metadata.distribution("numpy")
    except importlib.metadata.PackageNotFoundError:
        return ()
    return ("numpy",)


@functools.cache
def package_entries(packages: tuple[str, ...]) -> tuple[str, ...]:
    """The host paths the distributions install at top level (``numpy/``, ``numpy.libs/``, ``six.py``): what the
    sandbox binds read-only and the checker imports from. Metadata, scripts and other distributions stay out."""
    entries = {}
    for name in packages:
        if not _DISTRIBUTION.fullmatch(name):
            raise ValueError(
                f"SandboxLimits.packages: {name!r} is not a distribution name (accepted: names of installed "
                "distributions, e.g. 'numpy'; () for the standard library only)"
            )
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise ValueError(
                f"SandboxLimits.packages: distribution {name!r} is not installed in this environment (accepted: "
                "names of installed distributions, e.g. 'numpy'; () for the standard library only)"
            ) from None
        tops = {f.parts[0] for f in dist.files or ()} - {"..", "__pycache__"}
        home, found = os.path.realpath(dist.locate_file("")), []
        for top in sorted(tops):
            path = os.path.realpath(dist.locate_file(top))
            if top.endswith((".dist-info", ".egg-info", ".pth")) or not os.path.exists(path):
                continue
            if os.path.dirname(path) != home:  # a link out of site-packages would bind whatever it points to
                raise ValueError(
                    f"SandboxLimits.packages: {name!r} installs {top!r} as a link to {path}; accepted: "
                    "distributions whose top-level entries are real files and directories in their install directory"
                )
            found.append(path)
        if not found:
            raise ValueError(
                f"SandboxLimits.packages: distribution {name!r} installs no top-level package or module (an "
                "editable or metadata-only install cannot be bound; accepted: regularly installed distributions)"
            )
        for path in found:
            other = entries.setdefault(os.path.basename(path), path)
            if other != path:
                raise ValueError(
                    f"SandboxLimits.packages: {other} and {path} are both named {os.path.basename(path)!r}; "
                    "list only one of the distributions that install them"
                )
    return tuple(entries.values())


@dataclass(frozen=True)
class SandboxLimits:
    """Per-program limits; defaults suit competitive-programming solutions (LiveCodeBench uses ~6 s per test)."""

    cpu_s: int = 10
    """CPU seconds of the sandbox process and, separately, of the assertion checker (each restarted after a failure)."""
    wall_s: float = 30.0
    test_timeout_s: float = 6.0
    memory_mb: int = 1024
    """Memory of the sandbox (its cgroup, and address space per process) and address space of the checker."""
    file_size_mb: int = 16
    disk_mb: int = 64
    max_processes: int = 16
    max_open_files: int = 64
    max_output_chars: int = 4_000_000
    """Characters of stdout per case; the grader's reader enforces it too (the program can write its own reply)."""
    max_output_values: int = 1_000_000
    """Cap on the values (strings, numbers, containers) in one reply, checked on the raw text before parsing."""
    packages: tuple[str, ...] = field(default_factory=_default_packages)
    """Installed distributions whose top-level packages the program and the checker may import (read-only);
    ``()``: the standard library only. Default: numpy where installed (EvalPlus tests compare with np.allclose)."""

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if name != "packages" and value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {value}")
        if not isinstance(self.packages, (tuple, list)) or not all(isinstance(p, str) for p in self.packages):
            raise ValueError(f"SandboxLimits.packages must be a tuple of distribution names, got {self.packages!r}")
        object.__setattr__(self, "packages", tuple(self.packages))
        package_entries(self.packages)  # a missing or invalid distribution fails here, before any program runs

    @property
    def max_message_bytes(self) -> int:
        """Cap on one response line: the output cap with worst-case JSON escaping (12 bytes per astral char)."""
        return 12 * self.max_output_chars + 4096


@dataclass(frozen=True)
class SandboxRun:
    """What the program produced: one output (plain data, or None) and one error (or None) per test case."""

    outputs: list
    errors: list[str | None]
    timed_out: bool
    isolated: bool
    """Namespaces and the interpreter-only root applied (reported by the sandbox before the program ran)."""
    cgroup: bool
    """Memory and processes were capped per sandbox by a cgroup (else per process by setrlimit)."""


def run_in_sandbox(
    program: str,
    cases: list,
    *,
    mode: str,
    fn_name: str | None = None,
    limits: SandboxLimits | None = None,
) -> SandboxRun:
    """Run ``program`` on each case; never raises because of what the program does.

    ``mode`` is ``"stdio"`` (cases are stdin strings; output is the captured stdout), ``"call"`` (cases are argument
    lists for ``fn_name``, a function or a ``Solution`` method; output is its return value as plain data) or
    ``"assert"`` (cases are ``{"test", "setup", "entry_point"}`` dicts run by the trusted checker; output is
    ``"passed"``). After a timeout or a broken channel the sandbox (and checker) is restarted for the next case.
    Whatever goes wrong inside a case fails that case; only `GraderHostError` (the host failed, see the module
    docstring; `SandboxUnavailable`: it cannot confine programs) is raised.
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    if mode == "call" and not fn_name:
        raise ValueError("mode='call' needs fn_name")
    limits = limits or SandboxLimits()
    end = time.monotonic() + limits.wall_s
    outputs, errors, timed_out, isolated, cgroup, session = [], [], False, False, False, None
    try:
        for case in cases:
            output = error = None
            try:
                if time.monotonic() >= end:
                    raise TimeoutError("wall-clock timeout")
                deadline = min(time.monotonic() + limits.test_timeout_s, end)
                if session is None:
                    session = _Session(program, mode, fn_name, limits, deadline)
                isolated, cgroup = session.isolated, session.cgroup is not None
                output = session.ask(case, fn_name, deadline)
            except _CaseFailed as exc:
                error = str(exc)
                if exc.restart:
                    session.close()
                    session = None
            except GraderHostError:
                raise
            except Exception as exc:  # noqa: BLE001 - timeouts, broken channels, anything: this case fails
                error = _describe(exc)
                timed_out = timed_out or time.monotonic() >= end
                if session is not None and session.load_error is None:
                    session.close()
                    session = None
            outputs.append(output)
            errors.append(error)
    finally:
        if session is not None:
            session.close()
    return SandboxRun(outputs=outputs, errors=errors, timed_out=timed_out, isolated=isolated, cgroup=cgroup)


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"[:500] if str(exc) else type(exc).__name__
    except Exception:  # noqa: BLE001 - e.g. an int too long to print
        return type(exc).__name__


_probe_lock = threading.Lock()
_probed: list[bool] = []  # the probe's answer, once it gave a definite one


def namespaces_work() -> bool | None:
    """Whether sandboxes can build their namespaces and private root here (False e.g. where user namespaces exist
    but may not mount); None when the probe could not tell (a timeout, fork refused), and then it is asked again
    next time: only a definite answer is kept for the process."""
    with _probe_lock:
        if _probed:
            return _probed[0]
        limits = SandboxLimits(wall_s=20.0, test_timeout_s=20.0)
        deadline = time.monotonic() + limits.test_timeout_s
        session = None
        try:
            session = _Session("", "stdio", None, limits, deadline, namespaces=True)
            answer = session.isolated and session.ask("", None, deadline) == ""
        except (_BootFailed, _wire.WireError):  # the sandbox died while confining itself (mounts refused): definite
            answer = False
        except Exception:  # noqa: BLE001 - a timeout or a refused fork says nothing about this host
            return None
        finally:
            if session is not None:
                session.close()
        _probed.append(answer)
        return answer


_warned: list[bool] = []


def _allow_unconfined() -> bool:
    """The caller's opt-in (``VESPO_SANDBOX_ALLOW_UNCONFINED=1``) to run programs without namespaces; warns once."""
    allowed = os.environ.get(ALLOW_UNCONFINED_ENV) == "1"
    if allowed and not _warned:
        _warned.append(True)
        warnings.warn(
            f"{ALLOW_UNCONFINED_ENV}=1: code sandboxes may run without namespaces, where a program can read every "
            "file its uid can and leave files in /tmp and /dev/shm (docs/guides/rewards.md)",
            RuntimeWarning,
            stacklevel=3,
        )
    return allowed


_REFUSED = (
    "code sandbox: this host refuses the namespaces the sandbox needs (e.g. a container without CAP_SYS_ADMIN, or "
    f"user.max_user_namespaces=0), and without them a program can read every file its uid can; run where namespaces "
    f"work, or set {ALLOW_UNCONFINED_ENV}=1 to accept the weaker confinement (docs/guides/rewards.md)"
)


class _CaseFailed(Exception):
    """The program answered, with an error; the sandbox stays usable unless ``restart`` (the case left the checker
    out of step with the sandbox or short of memory: both are restarted, so the next case starts clean)."""

    def __init__(self, message: str, restart: bool = False):
        super().__init__(message)
        self.restart = restart


class _Session:
    """One sandbox process (and, for assertion tests, one checker) serving the cases of one program."""

    def __init__(
        self,
        program: str,
        mode: str,
        fn_name: str | None,
        limits: SandboxLimits,
        deadline: float,
        namespaces: bool | None = None,
    ):
        with _host("sweep the leftovers of dead graders"):
            _sweep_once()
        self.mode, self.limits, self.load_error, self.allow_unconfined = mode, limits, None, _allow_unconfined()
        works = namespaces_work() if namespaces is None else namespaces
        if works is False and not self.allow_unconfined:
            raise SandboxUnavailable(_REFUSED)
        self.namespaces = works is not False  # unknown: try, the sandbox refuses to run unconfined unless allowed
        self.proc = self.checker = self.cgroup = self.reader = None
        # cwd only without namespaces, else stays empty; named after the grader so a sweep can tell whose it is
        with _host("create a sandbox work dir"):
            self.workdir = tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{_owner()}-")
        self.request_w = -1
        try:
            self._start(program, limits, deadline)
        except BaseException:
            self.close()
            raise

    def _start(self, program: str, limits: SandboxLimits, deadline: float) -> None:
        request_r = response_w = -1
        try:
            with _host("create the pipes to a sandbox"):
                request_r, self.request_w = os.pipe()
                response_r, response_w = os.pipe()
            # stdio: the output cap holds here too, since the program can write its own reply line
            max_chars = limits.max_output_chars if self.mode == "stdio" else None
            self.reader = _wire.Reader(response_r, limits.max_message_bytes, limits.max_output_values, max_chars)
            with _host("start a sandbox process"):
                self.proc = subprocess.Popen(
                    [_PYTHON, "-I", "-S", "-c", _BOOT, _HERE, "_sandbox_child", _owner()],
                    stdin=request_r,
                    stdout=response_w,
                    stderr=subprocess.DEVNULL,
                    cwd=self.workdir,
                    env=_SAFE_ENV,
                    start_new_session=True,
                    close_fds=True,
                )
        finally:
            for fd in (request_r, response_w):
                if fd >= 0:
                    os.close(fd)
        if self.mode == "assert":  # started alongside the sandbox: the two interpreters boot in parallel
            self._start_checker(limits)
        self.cgroup = _Cgroup.create(f"vespo-{_owner()}-{next(_serial)}", limits, self.proc.pid)
        os.set_blocking(self.request_w, False)  # a sandbox that stops reading cannot stall the grader's writes
        spec = {
            "program": program,
            "mode": self.mode,
            "limits": asdict(limits),
            "packages": list(package_entries(limits.packages)),
            "uid": UID_BASE + self.proc.pid,
            "user_procs": 0 if os.geteuid() == 0 else _count_processes(os.getuid()),
            "namespaces": self.namespaces,
            "allow_unconfined": self.allow_unconfined,
            "grader": os.getpid(),
        }
        # Sent and answered before the program runs, so the report is the sandbox's own word (everything after may be
        # the program's), and a sandbox that dies or garbles it here is the host's failure, not a wrong answer.
        try:
            _wire.send(self.request_w, spec, deadline)
            confined = self.reader.read(deadline)
            if set(confined) != {"confined", "seccomp"} or not all(type(v) is bool for v in confined.values()):
                raise _wire.WireError("malformed confinement report")
        except TimeoutError:
            raise
        except (OSError, _wire.WireError) as exc:
            raise _BootFailed(
                f"code grader: the sandbox died before running the program ({_describe(exc)}); the host refused "
                "its namespaces, mounts or memory: check vespo.sandbox.namespaces_work() (docs/guides/rewards.md)"
            ) from exc
        self.isolated, self.names = confined["confined"], []
        if not self.isolated and not self.allow_unconfined:
            self.load_error = "refused to run without namespaces (the kernel refused them for this sandbox)"
            return
        ready = self.reader.read(deadline)
        if set(ready) == {"load_error"} and type(ready["load_error"]) is str:
            self.load_error = ready["load_error"][:500]
        elif _valid_ready(ready, self.mode):
            self.names = ready.get("names", [])
        else:
            self.load_error = "malformed ready message from the sandbox"
        if self.checker is not None and self.load_error is None:
            self._checker_ready(deadline)

    def _start_checker(self, limits: SandboxLimits) -> None:
        with _host("start the trusted checker"):
            self.checker = subprocess.Popen(
                [
                    _PYTHON,
                    "-I",
                    "-S",
                    "-c",
                    _BOOT,
                    _HERE,
                    "_checker",
                    str(self.request_w),
                    str(self.reader.fd),
                    str(limits.max_message_bytes),
                    str(limits.max_output_values),
                    str(os.getpid()),
                    str(limits.memory_mb),
                    str(limits.cpu_s),
                    json.dumps(package_entries(limits.packages)),
                    _owner(),  # last: the sweep reads it there
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                cwd=self.workdir,
                env=_SAFE_ENV,
                start_new_session=True,
                pass_fds=(self.request_w, self.reader.fd),
            )
        self.verdicts = _wire.Reader(self.checker.stdout.fileno(), 1 << 20)
        os.set_blocking(self.checker.stdin.fileno(), False)

    def _checker_ready(self, deadline: float) -> None:
        """The checker's first line says it started (limits set, packages allowed); without it, no case of any
        program could pass, so that is the host's failure (a timeout is not: it fails the case, as a slow one)."""
        try:
            ready = self.verdicts.read(deadline) == {"ready": True}
        except _wire.WireError:
            ready = False
        if not ready:
            raise GraderHostError(
                "code grader: the trusted checker exited before it was ready (a broken install, or "
                "SandboxLimits.memory_mb too small for its interpreter); no assertion test can run"
            )

    def ask(self, case, fn_name: str | None, deadline: float):
        """The program's output for one case; raises _CaseFailed (program error), TimeoutError or WireError."""
        if self.load_error is not None:
            raise _CaseFailed(self.load_error)
        if self.mode == "assert":
            request = {
                "test": case["test"],
                "setup": case.get("setup"),
                "entry_point": case.get("entry_point"),
                "names": self.names,
            }
            _wire.send(self.checker.stdin.fileno(), request, deadline)
            reply = self.verdicts.read(deadline)
            if reply == {"passed": True}:
                return "passed"
            if set(reply) == {"error", "restart"} and type(reply["error"]) is str and reply["restart"] is True:
                raise _CaseFailed(reply["error"][:500], restart=True)
        elif self.mode == "stdio":
            _wire.send(self.request_w, {"op": "run", "stdin": case}, deadline)
            reply = self.reader.read(deadline)
            if set(reply) == {"output"} and type(reply["output"]) is str:
                return reply["output"]
        else:
            _wire.send(
                self.request_w,
                {"op": "call", "name": fn_name, "args": _wire.encode(list(case)), "kwargs": {"dict": []}},
                deadline,
            )
            reply = self.reader.read(deadline)
            if set(reply) == {"value"}:  # compared with JSON data only: nothing the program chose gets hashed
                return _wire.decode(reply["value"], hashing=False)
        if set(reply) in ({"error"}, {"error", "type"}) and all(type(v) is str for v in reply.values()):
            raise _CaseFailed(reply["error"][:500])
        raise _wire.WireError("malformed reply")

    def close(self) -> None:
        """Kill the checker and everything of the sandbox, release pipes, cgroup and workdir; never raises."""
        for proc in (self.checker, self.proc):
            if proc is not None:
                _quietly(os.killpg, proc.pid, signal.SIGKILL)
                _quietly(proc.wait, 10)
        if self.checker is not None:
            _quietly(self.checker.stdin.close)
            _quietly(self.checker.stdout.close)
        for fd in (self.request_w, -1 if self.reader is None else self.reader.fd):
            if fd >= 0:
                _quietly(os.close, fd)
        emptied = self.cgroup is not None and self.cgroup.kill_and_remove()
        if os.geteuid() == 0 and not emptied and self.proc is not None:
            _kill_uid(UID_BASE + self.proc.pid)
        _remove_tree(self.workdir)


def _valid_ready(ready: dict, mode: str) -> bool:
    """``{"ready": true}``, plus for call/assert programs ``"names"``: a list of at most 10,000 identifiers."""
    if mode == "stdio":
        return ready == {"ready": True}
    names = ready.get("names")
    return (
        set(ready) == {"ready", "names"}
        and ready["ready"] is True
        and type(names) is list
        and len(names) <= 10_000
        and all(type(n) is str and n.isidentifier() for n in names)
    )


class _Cgroup:
    """Per-sandbox memory and process caps: cgroup v2 when memory and pids are delegated to us, else v1. Named
    ``vespo-<grader pid>-<serial>``, so a sweep can tell a dead grader's groups from a live one's."""

    def __init__(self, dirs: list[Path]):
        self.dirs = dirs

    @staticmethod
    def parents() -> tuple[list[Path], list[Path]]:
        """Where this process may create groups: v2 candidates, and the v1 memory and pids parents."""
        own = dict(line.split(":", 2)[1:] for line in Path("/proc/self/cgroup").read_text().splitlines())
        v2 = [Path(mount + own.get("", "/").rstrip("/")) for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")]
        v1 = [Path(f"/sys/fs/cgroup/{c}" + own[c].rstrip("/")) for c in ("memory", "pids") if c in own]
        return v2, v1

    @classmethod
    def create(cls, name: str, limits: SandboxLimits, pid: int) -> _Cgroup | None:
        if os.geteuid() != 0:
            return None
        memory, pids = limits.memory_mb << 20, str(limits.max_processes + 1)
        try:
            v2, v1 = cls.parents()
            for parent in v2:
                if {"memory", "pids"} <= set(_read_small(parent / "cgroup.subtree_control").split()):
                    group = cls([parent / name])
                    group.dirs[0].mkdir()
                    group._write("memory.max", str(memory))
                    group._write("memory.swap.max", "0")
                    group._write("pids.max", pids)
                    break
            else:
                if len(v1) != 2 or not all(p.is_dir() for p in v1):
                    return None
                mem, pid_dir = (p / name for p in v1)
                group = cls([mem, pid_dir])
                mem.mkdir()
                pid_dir.mkdir()
                group._write("memory.limit_in_bytes", str(memory))
                group._write("memory.memsw.limit_in_bytes", str(memory))
                group._write("pids.max", pids)
            group._write("cgroup.procs", str(pid))
            return group
        except (OSError, KeyError, ValueError):
            return None

    def _write(self, name: str, value: str) -> None:
        for d in self.dirs:
            if (d / name).exists():
                (d / name).write_text(value)

    def kill_and_remove(self) -> bool:
        """SIGKILL every member until the group can be removed, then wait until those processes are gone (a killed
        process leaves the group before it has finished tearing down); True when removed."""
        _quietly(self._write, "cgroup.kill", "1")  # v2 (Linux 5.14+) only
        left, killed = list(self.dirs), set()
        for _ in range(400):
            for pid in {int(p) for d in left for p in _read_small(d / "cgroup.procs").split()}:
                killed.add(pid)
                _quietly(os.kill, pid, signal.SIGKILL)
            for d in list(left):
                try:
                    os.rmdir(d)
                    left.remove(d)
                except OSError:
                    pass
            if not left:
                _wait_gone(killed)
                return True
            time.sleep(0.005)
        return False


def _wait_gone(pids: set[int], timeout_s: float = 5.0) -> None:
    """Wait (bounded) until none of ``pids`` is a live process any more (gone, or a zombie)."""
    end = time.monotonic() + timeout_s
    while pids and time.monotonic() < end:
        pids = {p for p in pids if _live(p)}
        if pids:
            time.sleep(0.002)


def _live(pid: int) -> bool:
    state = _read_small(Path(f"/proc/{pid}/stat")).rpartition(")")[2].split()[:1]
    return bool(state) and state[0] not in ("Z", "X")


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (any user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner() -> str:
    """``<pid namespace inode>-<pid>`` of this grader: names its cgroups, work dirs and sandbox command lines, so a
    sweep judges only graders of its own PID namespace (where a pid means the same process) and only dead ones."""
    return f"{os.stat('/proc/self/ns/pid').st_ino}-{os.getpid()}"


def _dead_owner(tag: str | None) -> bool:
    namespace, _, pid = (tag or "").partition("-")
    return namespace == _owner().partition("-")[0] and pid.isdigit() and not _alive(int(pid))


_sweep_lock = threading.Lock()
_swept: list[bool] = []


def _sweep_once() -> None:
    """Before this process's first sandbox: remove what sandboxes of dead graders left (a grader killed by SIGKILL
    cannot clean up; its sandboxes die with it, but its cgroups and work dirs stay): sandbox and checker processes,
    cgroups and work dirs whose owner tag (`_owner`) names a dead grader of this PID namespace."""
    with _sweep_lock:
        if _swept:
            return
        _swept.append(True)
    tag = r"(\d+-\d+)"
    for entry in filter(str.isdigit, os.listdir("/proc")):
        argv = _read_small(Path(f"/proc/{entry}/cmdline")).split("\0")
        if argv[4:6] == [_BOOT, _HERE] and argv[6:7] in (["_sandbox_child"], ["_checker"]):
            if _dead_owner(argv[7] if argv[6] == "_sandbox_child" else argv[-2]):
                _quietly(os.killpg, int(entry), signal.SIGKILL)  # its group: the sandbox's own processes too
                if os.geteuid() == 0 and argv[6] == "_sandbox_child":
                    _kill_uid(UID_BASE + int(entry))
    for path in Path(tempfile.gettempdir()).glob(f"{_WORKDIR_PREFIX}*"):
        owner = re.fullmatch(rf"{_WORKDIR_PREFIX}{tag}-.*", path.name)
        try:
            mine = path.lstat().st_uid == os.geteuid()
        except OSError:
            continue
        if owner and mine and _dead_owner(owner[1]):
            _remove_tree(str(path))
    if os.geteuid() != 0:
        return
    try:
        v2, v1 = _Cgroup.parents()
    except (OSError, ValueError):
        return
    for parent in v2 + v1:
        for group in parent.glob("vespo-*"):
            owner = re.fullmatch(rf"vespo-{tag}-\d+", group.name)
            if owner and _dead_owner(owner[1]):
                _Cgroup([group]).kill_and_remove()


def _uid_of(pid: int) -> int | None:
    for line in _read_small(Path(f"/proc/{pid}/status")).splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return None


def _kill_uid(uid: int) -> None:
    """SIGKILL every live process of the sandbox uid (e.g. a fork bomb that left the session), from a helper running
    as that uid: kill(-1) is atomic with respect to fork(). Gives up quietly after ~1 s."""
    reaper = f"import os, signal; os.setgid({uid}); os.setuid({uid}); os.kill(-1, signal.SIGKILL)"
    for _ in range(20):
        if not _pids_of_uid(uid):
            return
        try:
            subprocess.run([_PYTHON, "-I", "-S", "-c", reaper], env=_SAFE_ENV, check=False, timeout=5)
        except (OSError, subprocess.SubprocessError):
            pass
        time.sleep(0.05)


def _pids_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real uid is ``uid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        status = _read_small(Path("/proc", entry, "status"))
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("Uid", "").split()[:1] == [str(uid)] and not fields.get("State", "").strip().startswith("Z"):
            pids.append(int(entry))
    return pids


def _count_processes(uid: int) -> int:
    """Processes (threads excluded) the user already runs: RLIMIT_NPROC headroom when we cannot switch uid."""
    return len(_pids_of_uid(uid))


def _read_small(path: Path, max_bytes: int = 1 << 16) -> str:
    """A kernel or grader-owned file, opened without following links or blocking; '' on any error."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        return os.read(fd, max_bytes).decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _quietly(fn, *args) -> None:
    """Cleanup step that must not stop the next one (or the batch)."""
    try:
        fn(*args)
    except Exception:  # noqa: BLE001
        pass


def _remove_tree(path: str) -> None:
    """Delete a directory however deep or odd the sandbox made it (``rm`` walks without recursion); never raises."""
    try:
        os.rmdir(path)  # the usual case: namespaces kept the sandbox's files on its own tmpfs
        return
    except OSError:
        pass
    rm = ["rm", "-rf", "--one-file-system", "--", path]
    for argv in (rm, ["chmod", "-R", "u+rwx", "--", path], rm):  # chmod only for dirs the program made unreadable
        try:
            subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            pass
        if not os.path.lexists(path):
            return

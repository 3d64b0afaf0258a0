"""Run untrusted Python in a confined process and collect, as plain data, what it produced on each test case.

The grader (this module; the limits are `limits`, the host's process, cgroup and clean-up work `_procs`) talks to the
sandbox only through two pipes it created: requests in, one JSON line per response out (`_wire`), read non-blocking
with a deadline and a byte cap per message, so a hostile program can make its own cases fail but can neither hang,
crash nor mislead the grader. The grader never opens a file the sandbox could have touched. Assertion tests run in a
separate trusted checker (`_checker`) that calls into the sandbox the same way. A failure of the host (no disk, file
descriptors, memory or processes to start a sandbox or checker, a sandbox that dies before the program runs, a checker
that cannot start) raises `GraderHostError`: it is never scored as a case.

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
import itertools
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from dataclasses import asdict, dataclass

from vespo.sandbox import _procs, _wire
from vespo.sandbox._procs import UID_BASE
from vespo.sandbox.limits import SandboxLimits, package_entries

_MODES = ("stdio", "call", "assert")

_serial = itertools.count()
ALLOW_UNCONFINED_ENV = "VESPO_SANDBOX_ALLOW_UNCONFINED"
"""Set to 1 to run programs where the kernel refuses namespaces (weaker confinement, see docs/guides/rewards.md)."""


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
            _procs.sweep_once()
        self.mode, self.limits, self.load_error, self.allow_unconfined = mode, limits, None, _allow_unconfined()
        works = namespaces_work() if namespaces is None else namespaces
        if works is False and not self.allow_unconfined:
            raise SandboxUnavailable(_REFUSED)
        self.namespaces = works is not False  # unknown: try, the sandbox refuses to run unconfined unless allowed
        self.proc = self.checker = self.cgroup = self.reader = None
        # cwd only without namespaces, else stays empty; named after the grader so a sweep can tell whose it is
        with _host("create a sandbox work dir"):
            self.workdir = tempfile.mkdtemp(prefix=f"{_procs.WORKDIR_PREFIX}{_procs.owner()}-")
        self.request_w = -1
        try:
            self._start(program, limits, deadline)
        except BaseException:
            self.close()
            raise

    def _start(self, program: str, limits: SandboxLimits, deadline: float) -> None:
        """Start the sandbox (and checker), hear its confinement report, then load the program."""
        self._start_sandbox(limits)
        if self.mode == "assert":  # started alongside the sandbox: the two interpreters boot in parallel
            self._start_checker(limits)
        self.cgroup = _procs.Cgroup.create(f"vespo-{_procs.owner()}-{next(_serial)}", limits, self.proc.pid)
        os.set_blocking(self.request_w, False)  # a sandbox that stops reading cannot stall the grader's writes
        self.isolated, self.names = self._confinement(program, limits, deadline), []
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

    def _popen(self, helper: str, *args: str, **io) -> subprocess.Popen:
        """One of this directory's helpers (`_sandbox_child`, `_checker`) in the base interpreter, isolated mode,
        scrubbed environment, its own session (killed as a group); `io` are its pipes."""
        return subprocess.Popen(
            [_procs.PYTHON, "-I", "-S", "-c", _procs.BOOT, _procs.HERE, helper, *args],
            stderr=subprocess.DEVNULL, cwd=self.workdir, env=_procs.SAFE_ENV, start_new_session=True, **io,
        )  # fmt: skip

    def _start_sandbox(self, limits: SandboxLimits) -> None:
        """The sandbox process, its request pipe (`request_w`) and response reader; the child's pipe ends closed."""
        request_r = response_w = -1
        try:
            with _host("create the pipes to a sandbox"):
                request_r, self.request_w = os.pipe()
                response_r, response_w = os.pipe()
            # stdio: the output cap holds here too, since the program can write its own reply line
            max_chars = limits.max_output_chars if self.mode == "stdio" else None
            self.reader = _wire.Reader(response_r, limits.max_message_bytes, limits.max_output_values, max_chars)
            with _host("start a sandbox process"):
                self.proc = self._popen("_sandbox_child", _procs.owner(), stdin=request_r, stdout=response_w)
        finally:
            for fd in (request_r, response_w):
                if fd >= 0:
                    os.close(fd)

    def _confinement(self, program: str, limits: SandboxLimits, deadline: float) -> bool:
        """Send the sandbox its program and limits; its reply, before the program runs, says whether it confined
        itself (the sandbox's own word: everything after may be the program's). A sandbox that dies or garbles it
        here is the host's failure (`_BootFailed`), not a wrong answer."""
        spec = {
            "program": program,
            "mode": self.mode,
            "limits": asdict(limits),
            "packages": list(package_entries(limits.packages)),
            "uid": UID_BASE + self.proc.pid,
            "user_procs": 0 if os.geteuid() == 0 else _procs.count_processes(os.getuid()),
            "namespaces": self.namespaces,
            "allow_unconfined": self.allow_unconfined,
            "grader": os.getpid(),
        }
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
        return confined["confined"]

    def _start_checker(self, limits: SandboxLimits) -> None:
        """The trusted checker of assertion tests: it reaches the sandbox through the grader's two pipe ends."""
        args = [
            str(self.request_w),
            str(self.reader.fd),
            str(limits.max_message_bytes),
            str(limits.max_output_values),
            str(os.getpid()),
            str(limits.memory_mb),
            str(limits.cpu_s),
            json.dumps(package_entries(limits.packages)),
            _procs.owner(),  # last: the sweep reads it there
        ]
        with _host("start the trusted checker"):
            self.checker = self._popen(
                "_checker", *args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                pass_fds=(self.request_w, self.reader.fd),
            )  # fmt: skip
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
                _procs.quietly(os.killpg, proc.pid, signal.SIGKILL)
                _procs.quietly(proc.wait, 10)
        if self.checker is not None:
            _procs.quietly(self.checker.stdin.close)
            _procs.quietly(self.checker.stdout.close)
        for fd in (self.request_w, -1 if self.reader is None else self.reader.fd):
            if fd >= 0:
                _procs.quietly(os.close, fd)
        emptied = self.cgroup is not None and self.cgroup.kill_and_remove()
        if os.geteuid() == 0 and not emptied and self.proc is not None:
            _procs.kill_uid(UID_BASE + self.proc.pid)
        _procs.remove_tree(self.workdir)


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

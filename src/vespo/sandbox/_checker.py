"""The trusted checker: runs assertion tests (HumanEval+/MBPP+ style) against a proxy of the sandboxed program.

Started by `vespo.sandbox` as ``python -I -S`` with the grader on fds 0/1 and the sandbox's request/response
pipes on the two fds named in argv. Test code may import the allow-listed packages (`_imports`), nothing else outside
the standard library. Test code runs here, never in the sandbox; each call of the candidate's functions
is sent to the sandbox as data and its return value comes back as plain data (`_wire.decode`), so every comparison
happens on trusted values with trusted code. The sandbox has no way to write to the grader's pipe.

The values are still the candidate's choice (``[[0.0]] * 100000`` makes ``np.allclose`` against 2,000 floats build
1.6 GB arrays), so the checker runs under its own address-space and CPU limits (``memory_mb``, ``cpu_s``): such a case
fails with MemoryError or the checker's death, and the grader restarts it before the next case.
"""

import builtins
import ctypes
import json
import os
import resource
import signal
import sys

import _imports
import _wire

PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4


class CandidateError(Exception):
    """The candidate's function raised (its type and message are in the text)."""


def _exception(name) -> type[Exception]:
    """The builtin exception class the candidate raised (a test may expect e.g. ValueError), else CandidateError.
    Only a name crosses the wire; only builtin ``Exception`` subclasses are raised for it."""
    kind = getattr(builtins, name, None) if type(name) is str else None
    return kind if isinstance(kind, type) and issubclass(kind, Exception) else CandidateError


class Checker:
    def __init__(self, request_fd: int, response_fd: int, max_bytes: int, max_values: int):
        self.request_fd, self.reader = request_fd, _wire.Reader(response_fd, max_bytes, max_values)
        self.broken = None
        self.out_of_memory = False

    def remote(self, name: str):
        """A stand-in for the candidate's ``name``: calling it runs the real function in the sandbox."""

        def call(*args, **kwargs):
            if self.broken:
                raise _wire.WireError(self.broken)
            message = {"op": "call", "name": name, "args": _wire.encode(list(args)), "kwargs": _wire.encode(kwargs)}
            try:
                _wire.send(self.request_fd, message)
                reply = self.reader.read(None)
                if set(reply) == {"value"}:
                    return _wire.decode(reply["value"])
                if not (set(reply) - {"type"} == {"error"} and type(reply["error"]) is str):
                    raise _wire.WireError("malformed reply")
            except (_wire.WireError, OSError, RecursionError, MemoryError, ValueError) as exc:
                self.broken = self.broken or f"{type(exc).__name__}: {exc}"[:500]  # a caught one still fails
                raise
            raise _exception(reply.get("type"))(reply["error"][:500])

        call.__name__ = call.__qualname__ = name
        return call

    def run(self, case: dict) -> dict:
        """The verdict on one case; ``"restart"`` when this process is no longer fit for the next case."""
        scope = {"__name__": "__main__"}
        try:
            if case.get("setup"):
                exec(compile(case["setup"], "<setup>", "exec"), scope)
            for name in case["names"]:  # the program's functions the trusted code does not define itself
                if name not in scope and not hasattr(builtins, name):
                    scope[name] = self.remote(name)
            if case.get("entry_point"):
                scope[case["entry_point"]] = self.remote(case["entry_point"])
            exec(compile(case["test"], "<test>", "exec"), scope)
        except BaseException as exc:  # noqa: BLE001 - a failing test, whatever it raised
            self.out_of_memory = isinstance(exc, MemoryError)  # a half-done import or cache may stay behind
            verdict = {"error": self.broken or f"{type(exc).__name__}: {exc}"[:500]}
        else:
            verdict = {"error": self.broken} if self.broken else {"passed": True}
        if self.broken or self.out_of_memory:
            verdict["restart"] = True
        return verdict


def main() -> None:
    # Not dumpable: /proc/<pid>/{fd,mem,environ} become root-only, so a sandbox running as the same user (the
    # unprivileged fallback) cannot reopen the verdict pipe through /proc or write into this process.
    libc = ctypes.CDLL(None)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    # argv[1:3]: bootstrap dir and module; argv[10]: the allow-listed package entries (JSON); argv[11]: the grader's
    # tag, for the sweep of a dead grader's leftovers
    request_fd, response_fd, max_bytes, max_values, grader_pid, memory_mb, cpu_s = map(int, sys.argv[3:10])
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20,) * 2)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    _imports.allow(json.loads(sys.argv[10]))
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # dies with the grader, even mid-test
    if os.getppid() != grader_pid:
        os._exit(1)
    checker = Checker(request_fd, response_fd, max_bytes, max_values)
    grader, verdicts = _wire.Reader(0, 1 << 30), os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # prints in test code go nowhere, not into the verdict channel
    os.dup2(null, 2)
    _wire.send(verdicts, {"ready": True})  # the grader treats a checker that never gets here as a host failure
    verdict = {}
    while "restart" not in verdict:  # e.g. a broken exchange left the sandbox channel out of step: both restart
        try:
            case = grader.read(None)
        except _wire.WireError:
            break
        verdict = checker.run(case)
        _wire.send(verdicts, verdict)
    os._exit(0)


if __name__ == "__main__":
    main()

"""Runs inside the sandbox process: confine itself, then execute the candidate program on each test input.

Started by `vespo.rewards.sandbox.run_tests` as ``python -I _sandbox_child.py spec.json`` with the sandbox directory as
working directory. Only the standard library is used. Order matters: namespaces and mounts need root, so they come
first; resource limits next; the uid/gid drop last, after which nothing can be undone. Expected outputs never enter
this process: it only reports what the program produced, and the grader compares.
"""

import ctypes
import io
import json
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
MS_BIND, MS_REC, MS_PRIVATE = 1 << 12, 1 << 14, 1 << 18
UID_BASE = 2_000_000_000  # one fresh uid per sandbox: RLIMIT_NPROC and kill() permissions become per-sandbox
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")


class TestTimeout(BaseException):
    """Raised by SIGALRM when one test input runs past its time limit."""


def _isolate_namespaces(tmpfs_mb: int) -> bool:
    """New network + mount namespace; private tmpfs over world-writable dirs. True when it worked (needs root)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET | CLONE_NEWNS) != 0:
        return False
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return False
    opts = f"size={tmpfs_mb}m,mode=1777".encode()
    for path in WORLD_WRITABLE:  # cwd keeps pointing at the sandbox dir even where /tmp is mounted over
        if os.path.isdir(path) and libc.mount(b"tmpfs", path.encode(), b"tmpfs", 0, opts) != 0:
            return False
    return _expose_python(libc)


def _expose_python(libc) -> bool:
    """Keep the interpreter's import path readable after the uid drop when it lives under a private dir.

    E.g. pyenv under ``/root`` (mode 0700): an empty tmpfs goes over ``/root`` and only the needed child
    (``/root/.pyenv``) is bind-mounted back, so the rest of the private directory stays hidden.
    """
    hidden: dict[str, set[str]] = {}  # blocking ancestor -> children that must be visible again
    for entry in filter(os.path.isdir, sys.path):
        parts = os.path.realpath(entry).split(os.sep)
        for depth in range(2, len(parts)):
            ancestor = os.sep.join(parts[:depth]) or os.sep
            if not os.stat(ancestor).st_mode & 0o001:
                hidden.setdefault(ancestor, set()).add(parts[depth])
                break
    for ancestor, children in hidden.items():
        fds = {child: os.open(os.path.join(ancestor, child), os.O_RDONLY | os.O_DIRECTORY) for child in children}
        if libc.mount(b"tmpfs", ancestor.encode(), b"tmpfs", 0, b"size=1m,mode=0755") != 0:
            return False
        for child, fd in fds.items():
            os.mkdir(os.path.join(ancestor, child))
            source = f"/proc/self/fd/{fd}".encode()
            if libc.mount(source, os.path.join(ancestor, child).encode(), None, MS_BIND | MS_REC, None) != 0:
                return False
            os.close(fd)
    return True


def _block_sockets() -> None:
    """Fallback without a network namespace: make socket creation raise (a ctypes call could still bypass it)."""
    import _socket
    import socket

    def refuse(*args, **kwargs):
        raise PermissionError("network access is disabled in the vespo sandbox")

    socket.socket = _socket.socket = socket.create_connection = refuse  # type: ignore[assignment]


def _apply_limits(limits: dict, extra_procs: int) -> None:
    mb = 1 << 20
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"] + extra_procs,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["max_open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _drop_privileges() -> None:
    uid = UID_BASE + os.getpid()
    os.chown(".", uid, uid)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _run_one(fn, timeout_s: float) -> dict:
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return {"output": fn()}
    except TestTimeout:
        return {"error": "timeout"}
    except SystemExit as exc:  # exit() inside a stdio program ends that test, not the harness
        return {"error": f"SystemExit({exc.code})"} if exc.code not in (None, 0) else {"output": None}
    except BaseException as exc:  # noqa: BLE001 - any failure of untrusted code is one failed test
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _stdio_runner(code, stdin_text: str, max_chars: int):
    def run():
        out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin_text.encode()), encoding="utf-8")
        sys.stdout = out
        try:
            exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise
        finally:
            sys.stdout, sys.stdin = sys.__stdout__, sys.__stdin__
        return out.buffer.getvalue().decode("utf-8", "replace")[:max_chars]

    return run


def _call_runner(code, fn_name: str, args: list, max_chars: int):
    def run():
        env = {"__name__": "__main__", "__builtins__": __builtins__}
        exec(code, env)
        owner = env["Solution"]() if "Solution" in env and hasattr(env["Solution"], fn_name) else None
        fn = getattr(owner, fn_name) if owner is not None else env[fn_name]
        return json.dumps(fn(*args))[:max_chars]

    return run


def _assert_runner(code, test_code: str):
    def run():
        env = {"__name__": "__main__", "__builtins__": __builtins__}
        exec(code, env)
        exec(compile(test_code, "<test>", "exec"), env)
        return "passed"

    return run


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    result = open("result.json", "w")  # opened before the drop; the program can only ever spoil its own result
    isolated = os.geteuid() == 0 and _isolate_namespaces(spec["limits"]["file_size_mb"])
    if not isolated:
        _block_sockets()
    _apply_limits(spec["limits"], extra_procs=0 if os.geteuid() == 0 else spec["user_procs"])
    if os.geteuid() == 0:
        _drop_privileges()
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TestTimeout()))
    max_chars = spec["limits"]["max_output_chars"]
    try:
        code = compile(spec["program"], "<solution>", "exec")
    except BaseException as exc:  # noqa: BLE001
        result.write(json.dumps({"isolated": isolated, "compile_error": f"{type(exc).__name__}: {exc}"[:500]}))
        return
    runs = []
    for case in spec["cases"]:
        if spec["mode"] == "stdio":
            fn = _stdio_runner(code, case, max_chars)
        elif spec["mode"] == "call":
            fn = _call_runner(code, spec["fn_name"], case, max_chars)
        else:
            fn = _assert_runner(code, case)
        runs.append(_run_one(fn, spec["limits"]["test_timeout_s"]))
    result.write(json.dumps({"isolated": isolated, "runs": runs}))
    result.flush()
    os._exit(0)  # skip interpreter teardown that the program may have booby-trapped (atexit, __del__)


if __name__ == "__main__":
    main()

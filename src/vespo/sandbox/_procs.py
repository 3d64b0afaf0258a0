"""The grading host's side of sandbox processes: how they are launched (interpreter, boot line, environment, uid),
their cgroups, and the clean-up of what they leave (processes of a sandbox uid, work dirs, cgroups, the sweep of a
dead grader's leftovers). No program is graded here; `vespo.sandbox.runner` drives the sandboxes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from vespo.sandbox.limits import SandboxLimits

HERE = str(Path(__file__).resolve().parent)
# `python -I` puts no script directory on sys.path: import the helper from this directory, then drop the directory.
BOOT = "import sys; sys.path.insert(0, sys.argv[1]); m = __import__(sys.argv[2]); del sys.path[0]; m.main()"
SAFE_ENV = {
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
PYTHON = os.path.realpath(sys.executable)  # the base interpreter: inside the sandbox root, a venv is not visible
UID_BASE = 2_000_000_000  # one fresh uid per sandbox: kill() permissions and RLIMIT_NPROC become per-sandbox
WORKDIR_PREFIX = "vespo-sandbox-"  # + the grader's `owner()` + "-": a dead grader's dirs are found by the sweep


class Cgroup:
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
    def create(cls, name: str, limits: SandboxLimits, pid: int) -> Cgroup | None:
        if os.geteuid() != 0:
            return None
        memory, pids = limits.memory_mb << 20, str(limits.max_processes + 1)
        try:
            v2, v1 = cls.parents()
            for parent in v2:
                if {"memory", "pids"} <= set(read_small(parent / "cgroup.subtree_control").split()):
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
        quietly(self._write, "cgroup.kill", "1")  # v2 (Linux 5.14+) only
        left, killed = list(self.dirs), set()
        for _ in range(400):
            for pid in {int(p) for d in left for p in read_small(d / "cgroup.procs").split()}:
                killed.add(pid)
                quietly(os.kill, pid, signal.SIGKILL)
            for d in list(left):
                try:
                    os.rmdir(d)
                    left.remove(d)
                except OSError:
                    pass
            if not left:
                wait_gone(killed)
                return True
            time.sleep(0.005)
        return False


def wait_gone(pids: set[int], timeout_s: float = 5.0) -> None:
    """Wait (bounded) until none of ``pids`` is a live process any more (gone, or a zombie)."""
    end = time.monotonic() + timeout_s
    while pids and time.monotonic() < end:
        pids = {p for p in pids if live(p)}
        if pids:
            time.sleep(0.002)


def live(pid: int) -> bool:
    state = read_small(Path(f"/proc/{pid}/stat")).rpartition(")")[2].split()[:1]
    return bool(state) and state[0] not in ("Z", "X")


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (any user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner() -> str:
    """``<pid namespace inode>-<pid>`` of this grader: names its cgroups, work dirs and sandbox command lines, so a
    sweep judges only graders of its own PID namespace (where a pid means the same process) and only dead ones."""
    return f"{os.stat('/proc/self/ns/pid').st_ino}-{os.getpid()}"


def dead_owner(tag: str | None) -> bool:
    namespace, _, pid = (tag or "").partition("-")
    return namespace == owner().partition("-")[0] and pid.isdigit() and not alive(int(pid))


_sweep_lock = threading.Lock()
_swept: list[bool] = []


def sweep_once() -> None:
    """Before this process's first sandbox: remove what sandboxes of dead graders left (a grader killed by SIGKILL
    cannot clean up; its sandboxes die with it, but its cgroups and work dirs stay): sandbox and checker processes,
    cgroups and work dirs whose owner tag (`owner`) names a dead grader of this PID namespace."""
    with _sweep_lock:
        if _swept:
            return
        _swept.append(True)
    tag = r"(\d+-\d+)"
    for entry in filter(str.isdigit, os.listdir("/proc")):
        argv = read_small(Path(f"/proc/{entry}/cmdline")).split("\0")
        if argv[4:6] == [BOOT, HERE] and argv[6:7] in (["_sandbox_child"], ["_checker"]):
            if dead_owner(argv[7] if argv[6] == "_sandbox_child" else argv[-2]):
                quietly(os.killpg, int(entry), signal.SIGKILL)  # its group: the sandbox's own processes too
                if os.geteuid() == 0 and argv[6] == "_sandbox_child":
                    kill_uid(UID_BASE + int(entry))
    for path in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        owner = re.fullmatch(rf"{WORKDIR_PREFIX}{tag}-.*", path.name)
        try:
            mine = path.lstat().st_uid == os.geteuid()
        except OSError:
            continue
        if owner and mine and dead_owner(owner[1]):
            remove_tree(str(path))
    if os.geteuid() != 0:
        return
    try:
        v2, v1 = Cgroup.parents()
    except (OSError, ValueError):
        return
    for parent in v2 + v1:
        for group in parent.glob("vespo-*"):
            owner = re.fullmatch(rf"vespo-{tag}-\d+", group.name)
            if owner and dead_owner(owner[1]):
                Cgroup([group]).kill_and_remove()


def uid_of(pid: int) -> int | None:
    for line in read_small(Path(f"/proc/{pid}/status")).splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return None


def kill_uid(uid: int) -> None:
    """SIGKILL every live process of the sandbox uid (e.g. a fork bomb that left the session), from a helper running
    as that uid: kill(-1) is atomic with respect to fork(). Gives up quietly after ~1 s."""
    reaper = f"import os, signal; os.setgid({uid}); os.setuid({uid}); os.kill(-1, signal.SIGKILL)"
    for _ in range(20):
        if not pids_of_uid(uid):
            return
        try:
            subprocess.run([PYTHON, "-I", "-S", "-c", reaper], env=SAFE_ENV, check=False, timeout=5)
        except (OSError, subprocess.SubprocessError):
            pass
        time.sleep(0.05)


def pids_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real uid is ``uid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        status = read_small(Path("/proc", entry, "status"))
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("Uid", "").split()[:1] == [str(uid)] and not fields.get("State", "").strip().startswith("Z"):
            pids.append(int(entry))
    return pids


def count_processes(uid: int) -> int:
    """Processes (threads excluded) the user already runs: RLIMIT_NPROC headroom when we cannot switch uid."""
    return len(pids_of_uid(uid))


def read_small(path: Path, max_bytes: int = 1 << 16) -> str:
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


def quietly(fn, *args) -> None:
    """Cleanup step that must not stop the next one (or the batch)."""
    try:
        fn(*args)
    except Exception:  # noqa: BLE001
        pass


def remove_tree(path: str) -> None:
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

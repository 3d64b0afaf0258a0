"""Hostile programs must score 0 and leave the host and the grader unharmed; the suite reports how many were contained.

Every program runs under tight limits (2 s CPU, 6 s wall, 256 MiB, 16 processes) set before it starts, so the fork
bomb cannot take down the machine. The test case asks for "ok", which no hostile program prints.
"""

import os
import socket
from pathlib import Path

import pytest

from vespo.rewards import SandboxLimits, grade_code, run_in_sandbox
from vespo.rewards.sandbox import UID_BASE

LIMITS = SandboxLimits(cpu_s=2, wall_s=6.0, test_timeout_s=3.0, memory_mb=256, file_size_mb=4, max_processes=16)
TEST = [{"input": "", "output": "ok"}]
SECRET = "vespo-test-secret-4e1f"


def _live_sandbox_processes() -> list[str]:
    """Non-zombie processes running under a sandbox uid (the grader's own children are never such)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        except (OSError, ValueError):
            continue
        uid = int(status["Uid"].split()[0])
        if uid >= UID_BASE and not status["State"].strip().startswith("Z"):
            found.append(f"{pid} uid={uid} {status['Name'].strip()}")
    return found


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """Host-side victims: a file to delete, a directory to write into, a listening socket to reach."""
    root = tmp_path_factory.mktemp("host")
    victim = root / "victim.txt"
    victim.write_text("keep me")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.setblocking(False)
    yield {"root": root, "victim": victim, "server": server, "port": server.getsockname()[1]}
    server.close()


def _hostile(host) -> dict[str, tuple[str, callable]]:
    """name -> (program, containment check run after grading)."""
    root, victim, port = host["root"], host["victim"], host["port"]
    outside = [root / "written.txt", Path("/work/main/pwned.txt"), Path("/tmp/vespo-pwned.txt")]

    def no_new_processes():
        return not _live_sandbox_processes()

    def server_untouched():
        try:
            host["server"].accept()[0].close()
            return False
        except BlockingIOError:
            return True

    return {
        "infinite_loop": ("while True:\n    pass", no_new_processes),
        "fork_bomb": (
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
            no_new_processes,
        ),
        "memory_bomb": ("chunks = []\nwhile True:\n    chunks.append(bytearray(64 << 20))", no_new_processes),
        "huge_output": ("import os\nwhile True:\n    os.write(1, b'x' * 65536)", no_new_processes),
        "write_outside": (
            "".join(f"try:\n    open({str(p)!r}, 'w').write('x')\nexcept OSError:\n    pass\n" for p in outside),
            lambda: not any(p.exists() for p in outside),
        ),
        "delete_outside": (f"import os\nos.remove({str(victim)!r})", lambda: victim.read_text() == "keep me"),
        "read_env": ("import os\nprint(dict(os.environ))", None),  # checked on the captured output below
        "open_socket": (
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')",
            server_untouched,
        ),
        "spawn_shell": (
            f"import os, subprocess\nos.system('touch {root}/shell.txt')\n"
            f"subprocess.run(['/bin/sh', '-c', 'rm -f {victim}'])",
            lambda: not (root / "shell.txt").exists() and victim.exists(),
        ),
        "kill_parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)", None),
    }


def test_hostile_programs_are_contained(host, monkeypatch, capsys):
    monkeypatch.setenv("VESPO_SECRET_TOKEN", SECRET)
    programs = _hostile(host)
    contained = {}
    for name, (program, check) in programs.items():
        grade = grade_code(program, TEST, limits=LIMITS)
        run = run_in_sandbox(program, [""], mode="stdio", limits=LIMITS) if name == "read_env" else None
        ok = grade.score == 0.0 and (check is None or check())
        if run is not None:
            printed = run.outputs[0]
            ok = ok and printed is not None and SECRET not in printed and "VESPO_SECRET_TOKEN" not in printed
        contained[name] = ok
    leftover = _live_sandbox_processes()
    with capsys.disabled():
        print(f"\nsandbox: {sum(contained.values())}/{len(contained)} hostile programs contained: {contained}")
    assert all(contained.values()), contained
    assert not leftover, f"sandbox processes survived: {leftover}"
    assert Path("/tmp").is_dir() and os.access("/tmp", os.W_OK)  # the grader's own /tmp still works


def test_sandbox_still_runs_honest_code_after_the_attacks():
    grade = grade_code("print('ok')", TEST, limits=LIMITS)
    assert (grade.score, grade.pass_fraction, grade.timed_out) == (1.0, 1.0, False)


def test_infinite_loop_reports_wall_clock_timeout():
    run = run_in_sandbox("while True: pass", ["", ""], mode="stdio", limits=SandboxLimits(cpu_s=30, wall_s=1.0))
    assert run.timed_out and run.outputs == [None, None]

"""Hostile programs must score 0 and leave the host and the grader unharmed; the suite reports how many were contained.

Every program runs under tight limits (2 s CPU, 6 s wall, 256 MiB, 16 processes) set before it starts, so the fork
bomb cannot take down the machine. The test case asks for "ok", which no hostile program prints.
"""

import json
import os
import signal
import socket
import tempfile
import time
import warnings
from pathlib import Path

import pytest
from _clock import HANG_GUARD_S

from vespo.rewards import SandboxLimits, code_reward, grade_code, run_in_sandbox, score_code
from vespo.sandbox import UID_BASE, SandboxUnavailable
from vespo.sandbox import _procs as procs
from vespo.sandbox import runner as sandbox_mod

LIMITS = SandboxLimits(cpu_s=2, wall_s=6.0, test_timeout_s=3.0, memory_mb=256, file_size_mb=4, max_processes=16)
TEST = [{"input": "", "output": "ok"}]
SECRET = "vespo-test-secret-4e1f"


def _live_sandbox_processes() -> list[str]:
    """Non-zombie processes running under a sandbox uid (the grader's own children are never such) whose sandbox has
    ended: its top process (pid = uid - UID_BASE) is gone. A running sandbox of another grader on this machine is not
    counted; a leaked one of anyone's is."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        except (OSError, ValueError):
            continue
        uid = int(status["Uid"].split()[0])
        if uid >= UID_BASE and not status["State"].strip().startswith("Z") and not procs.alive(uid - UID_BASE):
            found.append(f"{pid} uid={uid} {status['Name'].strip()}")
    return found


def _lasting(scan, wait_s: float = 30.0) -> list[str]:
    """What `scan` finds and still finds `wait_s` later: a leaked process stays, while one that another grader on this
    machine (a parallel test worker) is tearing down right now is gone within that time."""
    found = set(scan())
    deadline = time.monotonic() + wait_s
    while found and time.monotonic() < deadline:
        time.sleep(0.2)
        found &= set(scan())
    return sorted(found)


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
        return not _lasting(_live_sandbox_processes)

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


@pytest.mark.slow
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
    leftover = _lasting(_live_sandbox_processes)
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


# ---- Forgers: programs that try to make the grader say "pass" without solving the problem -------------------------

SQUARE_ASSERT = [
    {
        "assert": "def check(candidate):\n    assert candidate(3) == 9\n    assert candidate(31607) == 999002449\n"
        "\ncheck(square)\n",
        "entry_point": "square",
    }
]
SQUARE_CALL = [{"fn_name": "square", "input": [31607], "output": 999002449}]
SQUARE_STDIO = [{"input": "31607\n", "output": "999002449\n"}]
FORGE_LIMITS = SandboxLimits(cpu_s=4, wall_s=8.0, test_timeout_s=2.0, memory_mb=256, file_size_mb=4, disk_mb=16)
ANSWER = "999002449"
WRONG = "def square(x):\n    return 0\n"


def _forgers(tmp: Path) -> dict[str, tuple[str, list]]:
    """name -> (program, tests). Every one must score 0; honest behaviour would be ``return x * x``."""
    planted = [tmp / "answers.txt", Path.home() / ".cache" / "vespo-forger-answers.txt"]
    fd_forgery = b'{"passed": true}\n{"value": 999002449}\n{"output": "999002449\\n"}\n'
    return {
        # objects that compare equal to anything (the classic HumanEval forgery)
        "eq_anything": (
            "class Any:\n    __eq__ = lambda s, o: True\n    __ne__ = lambda s, o: False\n"
            "def square(x):\n    return Any()\n",
            SQUARE_ASSERT,
        ),
        "int_subclass_eq": (
            "class I(int):\n    __eq__ = lambda s, o: True\n    __hash__ = int.__hash__\n"
            "def square(x):\n    return I(0)\n",
            SQUARE_CALL,
        ),
        # write a verdict into every descriptor the harness might keep open
        "forge_on_fds": (
            f"import os\ndef square(x):\n    for fd in range(64):\n        try:\n"
            f"            os.write(fd, {fd_forgery!r})\n        except OSError:\n            pass\n"
            f"    return 0\n",
            SQUARE_ASSERT,
        ),
        "forge_at_import": (
            f"import os\nfor fd in range(64):\n    try:\n        os.write(fd, {fd_forgery!r})\n"
            f"    except OSError:\n        pass\nos._exit(0)\n",
            SQUARE_ASSERT,
        ),
        # patch the interpreter the test would run in
        "patch_builtins": (
            "import builtins, sys\nbuiltins.AssertionError = type('Q', (BaseException,), {})\n"
            "builtins.isinstance = lambda *a: True\nsys.modules['json'] = None\n" + WRONG,
            SQUARE_ASSERT,
        ),
        # special files where the old grader read its result: FIFOs, symlinks to secrets
        "fifo_and_symlinks": (
            "import os\nfor n in ('stdout', 'stderr', 'result.json'):\n    os.mkfifo(n)\n"
            "os.symlink('/etc/shadow', 'shadow')\nos.symlink('/proc/1/environ', 'env')\n" + WRONG,
            SQUARE_CALL,
        ),
        "deep_tree": ("import os\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\n" + WRONG, SQUARE_CALL),
        # garbage and forged messages on the reply channel
        "garbage_reply": (
            "import os\ndef square(x):\n    os.write(1, b'\\xff{not json\\n')\n"
            "    os.write(4, b'[' * 200000 + b'\\n')\n    return 0\n",
            SQUARE_CALL,
        ),
        "non_string_output": ("import os\nos.write(4, b'{\"output\": 999002449}\\n')\n", SQUARE_STDIO),
        # numbers that are not the integer asked for, though float() would accept them
        "near_integer": ("print(999002049)\n", SQUARE_STDIO),
        "numeral_forms": ("print('999_002_449')\n", SQUARE_STDIO),
        "arabic_indic_digits": (
            "print('\\u0669\\u0669\\u0669\\u0660\\u0660\\u0662\\u0664\\u0664\\u0669')\n",
            SQUARE_STDIO,
        ),
        "float_for_int": ("def square(x):\n    return 999002448.9999\n", SQUARE_CALL),
        # disarm the per-test timer, then stall
        "disarm_timer": (
            "import signal\nsignal.setitimer(signal.ITIMER_REAL, 0)\n"
            "signal.signal(signal.SIGALRM, signal.SIG_IGN)\ndef square(x):\n    while True:\n"
            "        pass\n",
            SQUARE_ASSERT,
        ),
        # look for the expected outputs on disk (project tree, caches, the grader's environment)
        "read_answers_on_disk": (
            "import os\ndef square(x):\n"
            f"    for p in {[str(p) for p in planted]!r} + ['/proc/%d/environ' % i for i in range(1, 400)]:\n"
            "        try:\n            t = open(p, errors='replace').read()\n        except OSError:\n"
            "            continue\n"
            f"        if {ANSWER!r} in t:\n            return x * x\n    return 0\n",
            SQUARE_CALL,
        ),
        # leave the answer in System V shared memory for the next sandbox (written here, read by the next run)
        "shm_channel": (
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "shm = libc.shmget(0x5E5E, 4096, 0o1666)\nprint('shmget', shm, ctypes.get_errno())\n",
            SQUARE_STDIO,
        ),
    }


def _sysv_shm() -> list[str]:
    return Path("/proc/sysvipc/shm").read_text().splitlines()[1:]


def test_forgers_score_zero_and_leave_nothing_behind(tmp_path, capsys):
    planted = [tmp_path / "answers.txt", Path.home() / ".cache" / "vespo-forger-answers.txt"]
    for p in planted:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(ANSWER)
    shm_before = _sysv_shm()
    try:
        forgers = _forgers(tmp_path)
        programs = [p for p, _ in forgers.values()] + ["def square(x):\n    return x * x\n"] * 2
        tests = [t for _, t in forgers.values()] + [SQUARE_ASSERT, SQUARE_CALL]
        grades = score_code(programs, tests, limits=FORGE_LIMITS, num_workers=2).grades
    finally:
        for p in planted:
            p.unlink()
    scores = dict(zip(forgers, (g.score for g in grades), strict=False))
    with capsys.disabled():
        print(f"\nforgers: {sum(s == 0 for s in scores.values())}/{len(scores)} score 0: {scores}")
    assert len(forgers) >= 12
    assert all(s == 0.0 for s in scores.values()), scores
    assert [g.score for g in grades[-2:]] == [1.0, 1.0]  # honest programs in the same batch still pass
    assert not _lasting(_live_sandbox_processes)
    assert _sysv_shm() == shm_before
    tag = procs.owner()  # this grader's work dirs and cgroups (other graders may share the machine)
    assert not list(Path(tempfile.gettempdir()).glob(f"vespo-sandbox-{tag}-*"))
    assert not [d for parent in _cgroup_parents() for d in parent.glob(f"vespo-{tag}-*")]


def _cgroup_parents() -> list[Path]:
    own = dict(line.split(":", 2)[1:] for line in Path("/proc/self/cgroup").read_text().splitlines())
    return [Path(f"/sys/fs/cgroup/{c}{own.get(c, '/')}") for c in ("memory", "pids")] + [Path("/sys/fs/cgroup")]


PROBE = """
import json, os, socket, time
facts = {"pids": len([p for p in os.listdir("/proc") if p.isdigit()]), "root": sorted(os.listdir("/"))}
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
facts["no_new_privs"], facts["seccomp"] = int(status["NoNewPrivs"]), int(status["Seccomp"])
facts["sockets"] = []
for family in (socket.AF_INET, socket.AF_UNIX):
    for make in (socket.socket, socket.SocketType):
        try:
            make(family, socket.SOCK_STREAM).close()
            facts["sockets"].append(family)
        except OSError:
            pass
written = 0
try:
    for i in range(64):
        with open(f"fill{i}", "wb") as f:
            for _ in range(4):
                f.write(b"x" * (1 << 20))
                written += 1
except OSError:
    pass
facts["disk_mb"] = written
alive = 0
kids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        try:
            block = b"x" * (150 << 20)
            time.sleep(1.0)
            os._exit(0)
        except MemoryError:
            os._exit(3)
    kids.append(pid)
for pid in kids:
    alive += os.waitpid(pid, 0)[1] == 0
facts["memory_holders"] = alive
print(json.dumps(facts))
"""


def test_containment_probe():
    """What a program sees and can take: host processes, files, sockets, disk, memory across processes."""
    limits = SandboxLimits(cpu_s=10, wall_s=20.0, test_timeout_s=15.0, memory_mb=256, file_size_mb=4, disk_mb=16)
    run = run_in_sandbox(PROBE, [""], mode="stdio", limits=limits)
    assert run.errors == [None], run.errors
    facts = json.loads(run.outputs[0])
    assert facts["no_new_privs"] == 1 and facts["seccomp"] == 2  # seccomp mode 2 = filter
    assert facts["sockets"] == []  # socket.SocketType is the same class: no bypass
    if not run.isolated:  # namespaces refused: rlimits, no_new_privs and seccomp only (docs/guides/rewards.md)
        return
    assert facts["pids"] <= 2  # a fresh PID namespace: no host process, no command line to read
    assert set(facts["root"]) <= {
        "bin",
        "dev",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "packages",
        "proc",
        "root",
        "sbin",
        "tmp",
        "usr",
        "work",
    }
    assert facts["disk_mb"] <= 16  # the workdir is a 16 MiB tmpfs
    # 4 processes x 150 MB each fit under the 256 MiB per-process RLIMIT_AS; the cgroup caps their sum at 256 MiB
    assert facts["memory_holders"] <= (1 if run.cgroup else 4)


def test_honest_large_outputs_score():
    """20 cases of 0.9 MB stdout, and a return value whose JSON escaping doubles its size, still pass."""
    big = [{"input": f"{i}\n", "output": "y" * 900_000 + "\n"} for i in range(20)]
    assert grade_code("input()\nprint('y' * 900_000)", big).score == 1.0
    weird = '"\\\n\u2028😀' * 150_000
    tests = [{"fn_name": "f", "input": [], "output": json.dumps(weird)}]  # call outputs are JSON text
    assert grade_code(f"def f():\n    return {weird!r}", tests).score == 1.0
    over = [{"fn_name": "f", "input": [], "output": '"z"'}]
    grade = grade_code("def f():\n    return 'z' * 50_000_000", over, limits=SandboxLimits(max_output_chars=1000))
    assert grade.score == 0.0 and "bytes" in grade.error


def test_cleanup_survives_a_deep_tree(tmp_path):
    """Deeper than Python's recursion limit (shutil.rmtree raised RecursionError), with an unreadable dir and a FIFO."""
    root = tmp_path / "deep"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY)
    for _ in range(1500):
        os.mkdir("d", dir_fd=fd)
        fd, old = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
    os.close(fd)
    os.mkfifo(root / "fifo")
    (root / "locked").mkdir(mode=0)
    procs.remove_tree(str(root))
    assert not root.exists()


def test_last_resort_mode_without_namespaces(monkeypatch):
    """Where the kernel refuses namespaces and the caller opted in: programs still grade, forgers still fail, seccomp
    and no_new_privs hold, and as root the program still runs under a fresh uid."""
    monkeypatch.setattr(sandbox_mod, "namespaces_work", lambda: False)
    monkeypatch.setenv(sandbox_mod.ALLOW_UNCONFINED_ENV, "1")
    monkeypatch.setattr(sandbox_mod, "_warned", [])
    # only modules the sandbox loaded before dropping root: a fresh uid may not read an interpreter under /root
    probe = (
        "import ctypes, os\nstatus = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())\n"
        "sock = 'open' if ctypes.CDLL(None).socket(1, 1, 0) >= 0 else 'refused'\n"
        "print(int(status['NoNewPrivs']), int(status['Seccomp']), sock, os.getuid() == 0)\n"
    )
    with pytest.warns(RuntimeWarning, match="without namespaces"):
        run = run_in_sandbox(probe, [""], mode="stdio", limits=LIMITS)
    assert not run.isolated and run.outputs == ["1 2 refused False\n"], (run.outputs, run.errors)
    forgers = _forgers(Path(tempfile.gettempdir()))
    programs = [forgers["eq_anything"][0], forgers["forge_on_fds"][0], "def square(x):\n    return x * x\n"]
    assert score_code(programs, [SQUARE_ASSERT] * 3, limits=FORGE_LIMITS).scores == [0.0, 0.0, 1.0]
    assert not _lasting(_live_sandbox_processes)


# ---- Programs that break the grader rather than fool it: every one must be one failed case, never a raise ----------

CALL_F = [{"fn_name": "f", "input": [], "output": 1.5}]
ASSERT_F = [{"assert": "assert f() == 1.5", "entry_point": "f"}]
STDIO_1 = [{"input": "", "output": "1\n"}]
REPLY = "import os; os.write(4, {!r})"  # a line the program writes itself on the sandbox's reply channel


@pytest.mark.parametrize(
    ("program", "tests"),
    [
        ("print('9' * 5000)", STDIO_1),  # an integer past int()'s digit limit where an integer is expected
        ("print('1' + '0' * 5000)", [{"input": "", "output": "1.5\n"}]),  # a float token of 5001 digits
        ("def f(): return 10**400", CALL_F),  # past float range where a float is expected
        ("def f(): return [1, {'a': 10**400}]", [{"fn_name": "f", "input": [], "output": [1, {"a": 1.5}]}]),
        ("def f(): return eval('[' * 500 + ']' * 500)", CALL_F),  # nested deeper than the decoder allows
        (REPLY.format(b'{"ready": true, "names": 5}\n'), CALL_F),  # a control message before the sandbox's own
        (REPLY.format(b'{"ready": true, "names": 5}\n'), ASSERT_F),
        (REPLY.format(b'{"ready": true, "names": ["a b", 1]}\n'), ASSERT_F),
        (REPLY.format(b'{"load_error": [1]}\n'), CALL_F),
        (REPLY.format(b'{"ready": [], "isolated": 7}\n'), CALL_F),
        (REPLY.format(b'{"confined": true, "seccomp": true}\n'), CALL_F),
        (REPLY.format(b"\xff\xfe{}\n"), CALL_F),  # not UTF-8
        (REPLY.format(b"[1]\n"), CALL_F),  # not an object
        ('def f():\n import os; os.write(4, b\'{"error": 5, "type": 7}\\n\')', CALL_F),
        ('def f():\n import os; os.write(4, b\'{"value": {"dict": [[[1], 2]]}}\\n\')', CALL_F),
        ('def f():\n import os; os.write(4, b\'{"value": {"bytes": "\\\\u20ac"}}\\n\')', CALL_F),
        ('def f():\n import os; os.write(4, b\'{"output": "1", "x": 1}\\n\')', STDIO_1),
    ],
)
def test_one_line_attacks_fail_their_case_and_never_raise(program, tests):
    assert grade_code(program, tests, limits=FORGE_LIMITS).score == 0.0


COLLIDING_SET = (  # 40,000 ints with one hash (multiples of 2**61 - 1): building the set is quadratic (minutes)
    "import json, os\ndef f():\n    v = {'set': [k * (2**61 - 1) for k in range(1, 40001)]}\n"
    "    os.write(4, (json.dumps({'value': v}) + '\\n').encode())\n    return 0\n"
)
COLLIDING_DICT = COLLIDING_SET.replace("'set': [k", "'dict': [[k").replace("for k in", ", 0] for k in")


@pytest.mark.parametrize(
    "program",
    [
        COLLIDING_SET,
        COLLIDING_DICT,
        # ~12 MB of empty lists: four million containers (over a GB once parsed and decoded, before the cap)
        "import os\ndef f():\n    os.write(4, b'{\"value\": [' + b'[],' * 4_000_000 + b'[]]}\\n')\n    return 0\n",
        # a million short strings: the value cap is counted without parsing them
        "import os\ndef f():\n    os.write(4, b'{\"value\": [' + b'\"a\",' * 2_000_000 + b'\"\"]}\\n')\n    return 0\n",
        # a million tuples of one element (each node tagged)
        "def f():\n    return [(0,)] * 700_000\n",
    ],
    ids=["colliding_set", "colliding_dict", "empty_lists", "strings", "tuples"],
)
def test_crafted_replies_cost_bounded_time_and_memory(program):
    """Decoding is capped in bytes, values and depth before any parsing, and hashes nothing the program chose."""
    limits = SandboxLimits(cpu_s=10, wall_s=20.0, test_timeout_s=15.0, memory_mb=512, max_output_chars=1_000_000)
    Path("/proc/self/clear_refs").write_text("5")  # restart the peak-RSS count (VmHWM) here
    cpu, rss = time.process_time(), _memory_kb("VmRSS")
    grade = grade_code(program, [{"fn_name": "f", "input": [], "output": [1]}], limits=limits)
    cpu, peak_mb = time.process_time() - cpu, (_memory_kb("VmHWM") - rss) >> 10
    assert grade.score == 0.0 and grade.error
    assert cpu < 2.0, (cpu, grade.error)  # the grader's own CPU; the sandbox building its reply is not counted
    assert peak_mb < 200, (peak_mb, grade.error)  # the reply is capped at 12 MB here


def _memory_kb(field: str) -> int:
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(status[field].split()[0])


# ---- The sandbox's lifetime is the grader's -------------------------------------------------------------------


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _running(pids: set[int]) -> set[int]:
    return {p for p in pids if procs.live(p)}


@pytest.mark.parametrize("mode", ["stdio", "assert"])
def test_sandbox_dies_with_a_sigkilled_grader_and_leftovers_are_swept(mode):
    """SIGKILL a grader while its program loops: the sandbox (and checker) die with it; the next grader's start-up
    sweep removes the dead grader's cgroup and work dir."""
    program = "while True:\n    pass" if mode == "stdio" else "def f():\n    while True:\n        pass"
    case = "" if mode == "stdio" else {"test": "f()", "setup": None, "entry_point": "f"}
    limits = SandboxLimits(cpu_s=60, wall_s=60.0, test_timeout_s=60.0)
    grader = os.fork()
    if grader == 0:  # a grader process of its own, to be killed without any chance to clean up
        try:
            run_in_sandbox(program, [case], mode=mode, limits=limits)
        finally:
            os._exit(0)
    try:
        deadline, family = time.monotonic() + HANG_GUARD_S, set()
        while not any((procs.uid_of(p) or 0) >= UID_BASE for p in family) and time.monotonic() < deadline:
            time.sleep(0.05)  # until the program runs under its sandbox uid
            family = _descendants(grader)
        assert family, "the sandbox never started"
        time.sleep(0.2)
        family = _descendants(grader)
    finally:
        os.kill(grader, signal.SIGKILL)
        os.waitpid(grader, 0)
    deadline = time.monotonic() + 60  # killed at once; teardown of the family on a busy box can lag
    while _running(family) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(family), [Path(f"/proc/{p}/cmdline").read_bytes()[-40:] for p in _running(family)]
    tag = f"{os.stat('/proc/self/ns/pid').st_ino}-{grader}"
    workdirs = list(Path(tempfile.gettempdir()).glob(f"vespo-sandbox-{tag}-*"))
    groups = [d for parent in _cgroup_parents() for d in parent.glob(f"vespo-{tag}-*")]
    assert workdirs  # a SIGKILLed grader cannot clean up: the next one does
    procs._swept.clear()
    procs.sweep_once()
    assert not [p for p in workdirs + groups if p.exists()]


# ---- Hosts without namespaces ---------------------------------------------------------------------------------


def test_no_namespaces_is_refused_unless_the_caller_opts_in(monkeypatch):
    monkeypatch.setattr(sandbox_mod, "namespaces_work", lambda: False)
    monkeypatch.delenv(sandbox_mod.ALLOW_UNCONFINED_ENV, raising=False)
    with pytest.raises(SandboxUnavailable, match=sandbox_mod.ALLOW_UNCONFINED_ENV):
        code_reward(["print('ok')"], tests=[TEST])
    monkeypatch.setenv(sandbox_mod.ALLOW_UNCONFINED_ENV, "1")
    monkeypatch.setattr(sandbox_mod, "_warned", [])
    with pytest.warns(RuntimeWarning, match="without namespaces"):
        assert code_reward(["print('ok')"], tests=[TEST]) == [1.0]


def test_a_probe_that_times_out_is_asked_again(monkeypatch):
    calls = []

    class SlowSession:
        def __init__(self, *args, **kwargs):
            calls.append(1)
            raise TimeoutError("timeout")

    monkeypatch.setattr(sandbox_mod, "_probed", [])
    monkeypatch.setattr(sandbox_mod, "_Session", SlowSession)
    assert sandbox_mod.namespaces_work() is None and sandbox_mod.namespaces_work() is None
    assert len(calls) == 2  # not cached
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert grade_code("print('ok')", TEST, limits=LIMITS).score == 1.0


def test_only_the_stdlib_of_the_interpreter_prefix_is_visible():
    """An answer key planted in the interpreter's install prefix outside its standard library (where a system-wide
    package, /usr/share or /usr/local would sit on a Debian- or NGC-style install) cannot be read: the sandbox binds
    the stdlib and the shared libraries, not the whole prefix. The stdlib itself still imports."""
    import importlib
    import sys

    import vespo.sandbox

    planted = Path(os.path.realpath(sys.base_prefix)) / "share" / f"vespo-key-{os.getpid()}.txt"
    try:
        planted.parent.mkdir(exist_ok=True)
        planted.write_text(SECRET)
    except OSError:
        pytest.skip(f"cannot plant a file in {planted.parent} (not root)")
    try:
        read = f"try:\n    print(open({str(planted)!r}).read())\nexcept OSError:\n    print('hidden')"
        program = "import json, decimal, zlib\n" + read
        run = run_in_sandbox(program, [""], mode="stdio", limits=LIMITS)
        if not run.isolated:
            pytest.skip("namespaces refused here: the mount layout does not apply")
        assert run.outputs == ["hidden\n"], (run.outputs, run.errors)
    finally:
        planted.unlink()
    # a Debian-style layout: prefix /usr, stdlib /usr/lib/python3.X; neither /usr nor a dist-packages is bound
    sys.path.insert(0, str(Path(vespo.sandbox.__file__).parent))  # the child's own import path (`_wire` beside it)
    try:
        _sandbox_child = importlib.import_module("_sandbox_child")
    finally:
        sys.path.pop(0)
    real = _sandbox_child._stdlib_dir
    try:
        _sandbox_child._stdlib_dir = lambda: "/usr/lib/python3.11"
        dirs = _sandbox_child._visible_dirs()
    finally:
        _sandbox_child._stdlib_dir = real
    assert "/usr" not in dirs and "/usr/local" not in dirs and not any("packages" in d for d in dirs), dirs


def test_only_allow_listed_packages_are_visible():
    """A package planted beside numpy in the same site-packages (and torch, where installed) can be neither imported
    nor read by the program, nor imported by the checker; numpy, on the allow-list, imports in both."""
    import sys

    numpy = pytest.importorskip("numpy")
    site = Path(numpy.__file__).resolve().parent.parent
    name = f"vespo_key_{os.getpid()}"
    planted = site / name / "__init__.py"
    try:
        planted.parent.mkdir()
        planted.write_text(f"KEY = {SECRET!r}\n")
    except OSError:
        pytest.skip(f"cannot plant a package in {site}")
    try:
        sys.path.insert(0, str(site))  # the grader itself can import it: it really is a package there
        try:
            assert __import__(name).KEY == SECRET
        finally:
            sys.path.remove(str(site))
            sys.modules.pop(name, None)
        others = [name] + (["torch"] if _installed("torch") else [])
        probe = "import json, numpy\nseen = {}\n"
        for module in others:
            probe += f"try:\n    import {module}\n    seen[{module!r}] = 'imported'\nexcept ImportError:\n    pass\n"
        probe += f"try:\n    seen['read'] = open({str(planted)!r}).read()\nexcept OSError:\n    pass\n"
        probe += "print(json.dumps(seen), numpy.ones(3).sum())"
        run = run_in_sandbox(probe, [""], mode="stdio", limits=LIMITS)
        assert run.errors == [None], run.errors
        if run.isolated:  # without namespaces every file of the user is readable (docs/guides/rewards.md)
            assert run.outputs == ["{} 3.0\n"], run.outputs
        else:
            assert json.loads(run.outputs[0].split(" ")[0]).keys() <= {"read"}, run.outputs
        check = "import numpy as np\nassert np.allclose(f(), [1.0])\n"
        tests = [{"test": check, "entry_point": "f"}] + [{"test": f"import {m}"} for m in others]
        run = run_in_sandbox("def f():\n    return [1.0]", tests, mode="assert", limits=LIMITS)
        assert run.outputs[0] == "passed" and run.outputs[1:] == [None] * len(others), (run.outputs, run.errors)
        assert all("No module named" in e for e in run.errors[1:]), run.errors
    finally:
        planted.unlink()
        planted.parent.rmdir()


def test_packages_installed_below_tmp_are_bound(monkeypatch):
    """The sandbox's new root is a tmpfs over /tmp: a distribution installed below /tmp (a venv or a clone there, as
    on CI machines) is still bound, by a descriptor opened before the tmpfs covers it; a one-file module too."""
    import shutil

    base = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        name = f"vespo_probe_{os.getpid()}"
        (base / name).mkdir()
        (base / name / "__init__.py").write_text("VALUE = 42\n")
        (base / f"{name}_single.py").write_text("VALUE = 7\n")
        info = base / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (info / "RECORD").write_text(f"{name}/__init__.py,,\n{name}_single.py,,\n{info.name}/METADATA,,\n")
        monkeypatch.syspath_prepend(str(base))  # importlib.metadata finds the distribution there
        limits = SandboxLimits(**{**LIMITS.__dict__, "packages": (name,)})
        program = f"import {name}, {name}_single\nprint({name}.VALUE + {name}_single.VALUE)"
        run = run_in_sandbox(program, [""], mode="stdio", limits=limits)
        assert run.errors == [None] and run.outputs == ["49\n"], (run.outputs, run.errors)
    finally:
        shutil.rmtree(base)


def _installed(distribution: str) -> bool:
    import importlib.metadata

    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_numpy_imports_under_the_limits_with_one_blas_thread():
    """numpy's import stays within tight limits (256 MiB, 16 processes, seccomp): OpenBLAS starts no thread pool
    (one per core would count against the process cap and each thread's buffers against the address space)."""
    pytest.importorskip("numpy")
    program = (
        "import numpy as np\n"
        "threads = [l for l in open('/proc/self/status') if l.startswith('Threads:')][0].split()[1]\n"
        "a = np.arange(40_000, dtype=float).reshape(200, 200)\n"
        "print(threads, float((a @ a).trace()))"
    )
    run = run_in_sandbox(program, [""], mode="stdio", limits=LIMITS)
    assert run.errors == [None], run.errors
    threads, trace = run.outputs[0].split()
    assert threads == "1" and float(trace) > 0, run.outputs

"""Runs inside the sandbox: confine itself, then serve run/call requests for the candidate program as data.

Started by `vespo.sandbox` as ``python -I -S _sandbox_child.py`` with a request pipe on fd 0 and a response pipe
on fd 1 (one JSON message per line, see `_wire`). Only the standard library is used. Order matters: namespaces,
mounts and the new root need root, so they come first; resource limits and ``no_new_privs`` next; the uid drop and
the seccomp filter last, after which nothing can be undone. This process is untrusted once the candidate runs: it
never sees expected outputs or test code, and whatever it sends back is only data for the grader to judge.
"""

import builtins
import ctypes
import os
import resource
import select
import signal
import struct
import sys

import _imports
import _wire

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID = 0x00020000, 0x04000000, 0x08000000, 0x20000000
CLONE_NEWNET, CLONE_NEWUSER, CLONE_NEWCGROUP, CLONE_NEWTIME = 0x40000000, 0x10000000, 0x02000000, 0x80
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 1 << 12, 1 << 14, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 38, 22, 2
NEW_ROOT = "/tmp"  # a tmpfs mounted here inside the private mount namespace becomes "/" (host /tmp is untouched)
PACKAGES = "/packages"  # inside the new root: the allow-listed distributions' top-level entries, each bound read-only
DEVICES = ("null", "zero", "random", "urandom")

libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")


def _mount(source, target: str, fstype, flags: int, data=None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(libc.mount(enc(source), target.encode(), enc(fstype), flags, enc(data)), f"mount {target}")


def _enter_namespaces(privileged: bool) -> bool:
    """New PID, mount, network, IPC and UTS namespaces (False if the kernel refuses); without root inside a new user
    namespace where only our own uid/gid exist (as 0). Then fork: the child becomes PID 1 and this process only
    waits for it, so killing this process kills the whole sandbox (PDEATHSIG on PID 1)."""
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    if privileged:
        if libc.unshare(flags) != 0:
            return False
    else:
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(CLONE_NEWUSER | flags) != 0:
            return False
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    pid = os.fork()
    if pid:
        for fd in (0, 1, 3, 4):
            os.close(fd)
        os.waitpid(pid, 0)
        os._exit(0)
    _die_with_parent(0)  # the parent lives outside the new PID namespace: getppid() is 0 here
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    return True


def _die_with_parent(parent: int, requests: int = 3) -> None:
    """Be SIGKILLed when the parent dies; exit now if it already has (``getppid() != parent``) or if the grader's
    end of the request pipe is closed. A change of uid or gid clears the setting (prctl(2)), so this runs again
    after the privilege drop: grader dead -> top sandbox process dead -> PID 1 dead -> the whole namespace."""
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    poller = select.poll()
    poller.register(requests, select.POLLIN)
    if os.getppid() != parent or any(events & select.POLLHUP for _, events in poller.poll(0)):
        os._exit(1)


def _stdlib_dir() -> str:
    """The running interpreter's standard library (lib-dynload inside it), wherever the layout puts it."""
    return os.path.realpath(os.path.dirname(os.__file__))


def _visible_dirs() -> list[str]:
    """Host directories the running interpreter needs: its standard library (with lib-dynload) and the system shared
    libraries, never its whole prefix: on a Debian-style (`/usr`) or NGC-style install the prefix also holds
    system-wide site- and dist-packages, /usr/share and /usr/local, which a program must not read."""
    multiarch = getattr(sys.implementation, "_multiarch", "")
    libs = [f"/usr/lib/{multiarch}", f"/lib/{multiarch}"] if multiarch else []
    dirs = [_stdlib_dir(), *libs, "/usr/lib64", "/lib64"]
    return sorted({os.path.realpath(d) for d in dirs if os.path.isdir(d)})


def _bind_read_only(host: int, is_dir: bool, target: str) -> None:
    """Bind a host directory or file, given as an O_PATH descriptor, at ``target`` (created) in the new root,
    read-only, no devices, no setuid."""
    if is_dir:
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "x").close()
    _mount(f"/proc/self/fd/{host}", target, None, MS_BIND | MS_REC)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _build_root(uid: int, disk_mb: int, packages: list[str]) -> None:
    """A read-only tmpfs root with only the interpreter, the stdlib, shared libraries, the allow-listed packages'
    top-level entries (in /packages), four devices, a fresh /proc and a size-limited tmpfs workdir at /work (also
    /tmp); then chroot into it."""
    ro = MS_RDONLY | MS_NOSUID | MS_NODEV
    # every source is opened before the tmpfs covers NEW_ROOT: a source below it (a venv or a clone in /tmp) stays
    # reachable through its descriptor
    binds = [(d, NEW_ROOT + d) for d in _visible_dirs()]  # siblings in /packages, as installed: numpy's RPATH
    binds += [(e, f"{NEW_ROOT}{PACKAGES}/{os.path.basename(e)}") for e in packages]  # finds ../numpy.libs
    sources = [(os.open(host, os.O_PATH | os.O_CLOEXEC), os.path.isdir(host), target) for host, target in binds]
    _mount("tmpfs", NEW_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for fd, is_dir, target in sources:
        _bind_read_only(fd, is_dir, target)
        os.close(fd)
    for site in {os.path.join(_stdlib_dir(), n) for n in ("site-packages", "dist-packages")}:
        if os.path.isdir(NEW_ROOT + site):  # third-party packages (and their caches) stay hidden
            _mount("tmpfs", NEW_ROOT + site, "tmpfs", ro, "size=4k,mode=0555")
    for name in os.listdir("/"):  # merged-/usr links such as /lib -> usr/lib, /lib64 -> usr/lib64
        if os.path.islink("/" + name) and not os.path.lexists(f"{NEW_ROOT}/{name}"):
            os.symlink(os.readlink("/" + name), f"{NEW_ROOT}/{name}")
    os.mkdir(f"{NEW_ROOT}/dev")
    for dev in DEVICES:
        open(f"{NEW_ROOT}/dev/{dev}", "w").close()
        _mount(f"/dev/{dev}", f"{NEW_ROOT}/dev/{dev}", None, MS_BIND)
    os.mkdir(f"{NEW_ROOT}/proc")
    _mount("proc", f"{NEW_ROOT}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.mkdir(f"{NEW_ROOT}/work")
    _mount("tmpfs", f"{NEW_ROOT}/work", "tmpfs", MS_NOSUID | MS_NODEV, f"size={disk_mb}m,mode=0700")
    os.chown(f"{NEW_ROOT}/work", uid, uid)
    os.symlink("/work", f"{NEW_ROOT}/tmp")
    _mount(None, NEW_ROOT, None, MS_REMOUNT | ro, "size=1m,mode=0755")
    os.chdir(NEW_ROOT)
    os.chroot(".")
    os.chdir("/work")


def _apply_limits(limits: dict, extra_procs: int) -> None:
    mb = 1 << 20
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"] + extra_procs,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["max_open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _drop_capabilities() -> None:
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    _check(libc.capset(header, bytes(24)), "capset")  # effective, permitted, inheritable = 0 (two 32-bit words)


def _drop_privileges(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


# Seccomp (x86_64): a classic-BPF deny list built with ctypes, no libseccomp. Denied calls fail with EPERM; a foreign
# architecture or x32 ABI call kills the process. Numbers from the kernel's arch/x86/entry/syscalls/syscall_64.tbl.
AUDIT_ARCH_X86_64 = 0xC000003E
DENIED_SYSCALLS = {
    "socket": 41,
    "shmget": 29,
    "semget": 64,
    "msgget": 68,
    "ptrace": 101,
    "personality": 135,
    "pivot_root": 155,
    "chroot": 161,
    "acct": 163,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "init_module": 175,
    "delete_module": 176,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "fsopen": 430,
    "fsmount": 432,
    "open_tree": 428,
    "move_mount": 429,
}
NR_CLONE, NR_CLONE3 = 56, 435
NAMESPACE_FLAGS = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWUSER
NAMESPACE_FLAGS |= CLONE_NEWCGROUP | CLONE_NEWTIME
RET_ALLOW, RET_KILL, RET_EPERM, RET_ENOSYS = 0x7FFF0000, 0x80000000, 0x00050000 | 1, 0x00050000 | 38
LD_ABS, JEQ, JSET, JGE, RET = 0x20, 0x15, 0x45, 0x35, 0x06


def _seccomp_program() -> list[tuple[int, int, int, int]]:
    """(code, jt, jf, k) instructions over struct seccomp_data {nr @0, arch @4, ip @8, args[6] @16}."""
    prog = [(LD_ABS, 0, 0, 4), (JEQ, 1, 0, AUDIT_ARCH_X86_64), (RET, 0, 0, RET_KILL), (LD_ABS, 0, 0, 0)]
    prog += [(JGE, 0, 1, 0x40000000), (RET, 0, 0, RET_KILL)]  # x32 ABI aliases
    for nr in DENIED_SYSCALLS.values():
        prog += [(JEQ, 0, 1, nr), (RET, 0, 0, RET_EPERM)]
    prog += [(JEQ, 0, 1, NR_CLONE3), (RET, 0, 0, RET_ENOSYS)]  # clone3 flags sit behind a pointer: libc falls back
    prog += [(JEQ, 0, 3, NR_CLONE), (LD_ABS, 0, 0, 16), (JSET, 0, 1, NAMESPACE_FLAGS), (RET, 0, 0, RET_EPERM)]
    return prog + [(RET, 0, 0, RET_ALLOW)]


def _install_seccomp() -> bool:
    """Install the filter (needs no_new_privs or root); False on another architecture."""
    if os.uname().machine != "x86_64":
        return False
    prog = _seccomp_program()
    filt = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *ins) for ins in prog))
    fprog = struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(filt))
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0), "prctl(SECCOMP)")
    return True


def _error(exc: BaseException) -> dict:
    return {"error": f"{type(exc).__name__}: {exc}"[:500], "type": type(exc).__name__}


def _run_stdio(code, stdin_text: str, max_chars: int) -> dict:
    """Run the program with fds 0/1 on fresh memory files, so ``input()``, ``sys.stdin.buffer``, ``open(0)`` and
    ``os.write(1, ...)`` all work; stdout is bounded by RLIMIT_FSIZE and read back up to the output cap."""
    for fd, name in ((0, "stdin"), (1, "stdout")):
        memfd = os.memfd_create(name)  # may itself be 0 or 1 if the last program closed that fd
        if memfd != fd:
            os.dup2(memfd, fd)
            os.close(memfd)
    os.write(0, stdin_text.encode())
    os.lseek(0, 0, os.SEEK_SET)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    try:
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
        sys.stdout.flush()
    except SystemExit as exc:  # exit() ends this test, not the server
        if exc.code not in (None, 0):
            return {"error": f"SystemExit({exc.code})"}
        sys.stdout.flush()
    except BaseException as exc:  # noqa: BLE001 - any failure of untrusted code is one failed test
        return _error(exc)
    finally:
        sys.stdout, sys.stdin = sys.__stdout__, sys.__stdin__
    try:
        data = os.pread(1, 4 * max_chars + 4, 0)
    except OSError as exc:
        return _error(exc)
    text = data.decode("utf-8", "replace")
    return {"output": text} if len(text) <= max_chars else {"error": f"output over {max_chars} characters"}


def _call(env: dict, request: dict) -> dict:
    try:
        name = request["name"]
        owner = env.get("Solution")
        fn = getattr(owner(), name) if isinstance(owner, type) and hasattr(owner, name) else env[name]
        value = fn(*_wire.decode(request["args"]), **_wire.decode(request["kwargs"]))
        return {"value": _wire.encode(value)}
    except BaseException as exc:  # noqa: BLE001
        return _error(exc)


def main() -> None:
    requests, responses = os.dup(0), os.dup(1)  # fds 3 and 4; 0-2 become /dev/null below
    reader = _wire.Reader(requests, 1 << 30)
    spec = reader.read(None)
    _die_with_parent(spec["grader"], requests)
    limits = spec["limits"]
    privileged = os.geteuid() == 0
    root = spec["namespaces"] and _enter_namespaces(privileged)
    if root:
        _build_root(spec["uid"] if privileged else 0, limits["disk_mb"], spec["packages"])
    elif not spec["allow_unconfined"]:
        _wire.send(responses, {"confined": False, "seccomp": False})
        os._exit(0)
    else:
        os.environ["HOME"] = os.environ["TMPDIR"] = os.getcwd()
    _apply_limits(limits, extra_procs=0 if privileged else spec["user_procs"])
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    if privileged:  # also without namespaces: a fresh uid still cannot touch other users' files or processes
        if not root:
            os.chown(".", spec["uid"], spec["uid"])
        _drop_privileges(spec["uid"])
        _die_with_parent(0 if root else spec["grader"], requests)  # the uid change disarmed it
    elif root:  # root of our own user namespace: give up its capabilities there too
        _drop_capabilities()
    seccomp = _install_seccomp()
    _wire.send(responses, {"confined": root, "seccomp": seccomp})  # before the program runs: the grader trusts it
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    sys.path[:] = [p for p in sys.path if os.path.isdir(p)]
    _imports.allow(spec["packages"], PACKAGES if root else None)
    builtins.exit = builtins.quit = sys.exit  # what the site module (off under -S) would have provided
    ready = {"ready": True}
    env = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        code = compile(spec["program"], "<solution>", "exec")
        if spec["mode"] != "stdio":
            exec(code, env)
            names = (n for n, v in list(env.items()) if callable(v) and n.isidentifier() and not n.startswith("__"))
            ready["names"] = sorted(names)[:10_000]
    except BaseException as exc:  # noqa: BLE001 - a program that does not load fails every case
        ready = {"load_error": _error(exc)["error"]}
    _wire.send(responses, ready)
    while "ready" in ready:
        try:
            request = reader.read(None)
        except _wire.WireError:
            break
        if request.get("op") == "run":
            response = _run_stdio(code, request["stdin"], limits["max_output_chars"])
        else:
            response = _call(env, request)
        try:
            _wire.send(responses, response)
        except (TypeError, ValueError) as exc:  # e.g. an int past the str-conversion limit
            _wire.send(responses, _error(exc))
    os._exit(0)  # skip interpreter teardown that the program may have booby-trapped (atexit, __del__)


if __name__ == "__main__":
    main()

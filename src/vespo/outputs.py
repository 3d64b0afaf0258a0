"""What vespo may write, replace and delete: output directories it marked itself, each held under a lock.

Every command that writes a directory (`vespo train --run-dir`, `vespo eval --out`, `vespo lab/sweep --out-dir`)
claims it first. A directory is vespo's when it holds vespo's marker (`MARKER`: the command kind, a run identity and
the manifest of names the command writes there); only names in that manifest are ever replaced or deleted. A
directory without the marker is used only when it is new or empty, or, when the user asks (`overwrite`), when none of
the manifest's names exists in it: nothing vespo did not write is ever touched. While a command runs it holds an
exclusive `flock` on `LOCK` (which records its PID), so a second process on the same directory is refused.

Every file vespo writes goes through one writer, `write_atomic` (an exclusively created temporary name beside the
target, fsync, rename, fsync of the directory), or `atomic_dir` for a whole directory; files it appends to or reads
back are opened by `open_regular`, which never follows a symbolic link and never blocks on a FIFO. So no name in a
directory can turn a vespo write against a file elsewhere, and a kill leaves the old or the new file, never a torn one
(its temporary is deleted by the next claim of the directory: `sweep_temporaries`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

MARKER = ".vespo-output.json"
"""The marker file: {"kind", "id", "created", "manifest"}; written when vespo first claims a directory."""
LOCK = ".vespo-output.lock"
"""The lock file: flock-ed for as long as a command writes the directory; holds the writer's PID."""
_MAX_MARKER_BYTES = 1 << 16


class OutputError(ValueError):
    """An output location vespo may not write (one line naming it, the reason and what is accepted)."""


def read_marker(path: Path) -> dict | None:
    """The marker of directory `path` (None when it has none, or one that is not vespo's: never trusted blindly)."""
    try:
        data = json.loads(read_regular(path / MARKER, _MAX_MARKER_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    ok = isinstance(data, dict) and isinstance(data.get("kind"), str) and isinstance(data.get("manifest"), list)
    return data if ok and all(isinstance(n, str) and _plain_name(n) for n in data["manifest"]) else None


def _plain_name(name: str) -> bool:
    """A manifest entry names one entry of the directory itself (no path, no parent): what vespo may delete is only
    ever inside the marked directory."""
    return name not in ("", ".", "..", MARKER, LOCK) and "/" not in name and "\0" not in name


class OwnedDir:
    """A directory claimed by this process (`claim`): its marker's manifest, and the lock held until `release` (or
    until the object is garbage collected: the lock file's handle closes with it)."""

    def __init__(self, path: Path, kind: str, manifest: list[str], lock: BinaryIO, created_dir: bool, marked_now: bool):
        self.path, self.kind, self.manifest = path, kind, manifest
        self._lock, self._created_dir, self._marked_now = lock, created_dir, marked_now

    def existing(self) -> list[str]:
        """The manifest's names that exist in the directory (outputs of an earlier run of this kind)."""
        return [n for n in self.manifest if os.path.lexists(self.path / n)]

    def clear(self) -> list[str]:
        """Delete every manifest entry that exists (files, links, whole directories vespo wrote); returns their names.
        Nothing outside the manifest is touched, and a directory inside it that another vespo process holds (a sweep
        cell a `vespo train` is writing) is refused with an OutputError before anything is deleted."""
        gone = self.existing()
        with _hold_nested_locks([self.path / n for n in gone]):
            for name in gone:
                target = self.path / name
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                else:
                    target.unlink()
        return gone

    def release(self) -> None:
        """Drop the lock. A claim that wrote nothing leaves nothing: its marker, lock file and (if it made it) the
        directory are removed again, so a command refused for a bad input leaves no output behind."""
        if self._lock.closed:
            return
        try:
            if self._marked_now and not self.existing() and set(os.listdir(self.path)) <= {MARKER, LOCK}:
                for name in (MARKER, LOCK):
                    (self.path / name).unlink(missing_ok=True)
                if self._created_dir:
                    self.path.rmdir()
        except OSError:
            pass  # best effort: a leftover marker only marks an empty directory as vespo's
        finally:
            self._lock.close()  # closing the descriptor releases the flock

    def __enter__(self) -> OwnedDir:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def claim(
    path: str | Path,
    kind: str,
    manifest: Iterable[str],
    *,
    label: str,
    overwrite: bool = False,
    overwrite_flag: str = "--overwrite-output-dir",
    legacy: Callable[[Path], bool] | None = None,
) -> OwnedDir:
    """Lock directory `path` for this process and make sure vespo may write `manifest` there (OutputError otherwise,
    before anything is written):

    - new, or empty: created and marked;
    - marked by vespo for `kind`: used (what to do with earlier outputs is the caller's call: `existing`, `clear`);
      marked for another kind: refused;
    - not marked but `legacy(path)` recognises an earlier vespo version's output of this kind: marked and used;
    - not marked and not empty: refused, unless `overwrite` and none of the manifest's names exists there, in which
      case vespo writes beside the files it finds (and never touches them).

    `label` names the option in messages (e.g. "run_dir"). A second process on a claimed directory is refused with the
    PID of the one that holds it."""
    path = Path(path).expanduser()
    names = list(manifest)
    _check_claimable(path, kind, names, label, overwrite, overwrite_flag, legacy)
    created_dir = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{label} {path} cannot be written: {exc.strerror or exc}") from None
    lock = _lock(path, label)
    try:
        manifest_now, marked_now = _mark(path, kind, names, label)
    except OutputError:
        lock.close()
        raise
    sweep_temporaries(path, manifest_now)  # under the lock: no other vespo process writes here now
    return OwnedDir(path, kind, manifest_now, lock, created_dir, marked_now)


def _check_claimable(
    path: Path, kind: str, names: list[str], label: str, overwrite: bool, flag: str, legacy: Callable | None
) -> None:
    """`claim`'s rules before anything is written or locked: OutputError for a file, a foreign or other-kind marker,
    or an unmarked, non-empty directory that is neither legacy output nor allowed by `overwrite` without clashes."""
    if os.path.lexists(path) and not path.is_dir():
        raise OutputError(f"{label} {path} is a file, not a directory")
    marker = read_marker(path) if path.is_dir() else None
    if marker is None and os.path.lexists(path / MARKER):
        raise OutputError(_foreign_marker(label, path))
    if marker is not None and marker["kind"] != kind:
        raise OutputError(f"{label} {path} holds the output of `vespo {marker['kind']}`; choose another directory")
    if marker is not None or not path.is_dir():
        return
    present = sorted(set(os.listdir(path)) - {MARKER, LOCK})
    if not present or (legacy is not None and legacy(path)):
        return
    if not overwrite:
        raise OutputError(
            f"{label} {path} is not empty and was not created by vespo (no {MARKER}); choose a new or empty "
            f"directory, or pass {flag} to write vespo's files beside what is there (none of it is "
            "deleted or replaced)"
        )
    clash = [n for n in names if n in present]
    if clash:
        raise OutputError(
            f"{label} {path} already holds {', '.join(clash)}, which vespo did not write there; vespo never "
            "replaces files it did not create: choose another directory"
        )


def _mark(path: Path, kind: str, names: list[str], label: str) -> tuple[list[str], bool]:
    """Under the lock: read the marker again (another process may have marked the directory meanwhile), write it
    if there is none, record the manifest's new names before they are written; (manifest, marked now)."""
    marker = read_marker(path)
    if marker is None and os.path.lexists(path / MARKER):
        raise OutputError(_foreign_marker(label, path))
    marked_now = False
    if marker is None:
        marker = {"kind": kind, "id": uuid.uuid4().hex, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        write_atomic(path / MARKER, json.dumps(marker | {"manifest": names}, indent=1) + "\n")
        marker["manifest"], marked_now = names, True
    elif marker["kind"] != kind:
        raise OutputError(f"{label} {path} holds the output of `vespo {marker['kind']}`; choose another directory")
    manifest_now = list(dict.fromkeys([*marker["manifest"], *names]))
    if manifest_now != marker["manifest"]:  # a newer vespo writes more names: they are recorded before written
        write_atomic(path / MARKER, json.dumps(marker | {"manifest": manifest_now}, indent=1) + "\n")
    return manifest_now, marked_now


_TEMPORARY = re.compile(r"\.(?P<target>.+)\.[a-z0-9_]{8}\.tmp")
"""A temporary name of `write_atomic` (`tempfile.mkstemp`'s 8 random characters between ".<target>." and ".tmp")."""


def sweep_temporaries(path: Path, manifest: Iterable[str]) -> list[Path]:
    """Delete the temporary files a killed `write_atomic` left in the output directory `path` (claimed and locked
    by the caller): `.<name>.<8 random characters>.tmp` files, in `path` for a `name` of its manifest (or its
    marker), and anywhere inside the manifest's directories (all vespo's), never inside a nested output directory
    (its own claim sweeps it) and never through a symbolic link. Nothing else is touched; returns what was deleted."""
    names, gone = set(manifest) | {MARKER}, []
    folders = [(path, names.__contains__)]  # a stack, not recursion: a deep tree cannot exhaust it
    while folders:
        folder, ours = folders.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            match = _TEMPORARY.fullmatch(entry.name)
            if match and ours(match["target"]) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    gone.append(Path(entry.path))
            elif (not match and ours(entry.name) and entry.is_dir(follow_symlinks=False)
                  and not os.path.lexists(Path(entry.path, MARKER))):  # fmt: skip
                folders.append((Path(entry.path), lambda _: True))
    return gone


def _foreign_marker(label: str, path: Path) -> str:
    return (
        f"{label} {path}: its {MARKER} is not a marker vespo wrote (not a regular file of vespo's JSON); vespo "
        "replaces nothing it did not create: remove it or choose another directory"
    )


def _lock(path: Path, label: str) -> BinaryIO:
    """Take the exclusive flock on `path`'s LOCK and write this process's PID into it. The lock file is opened only
    if it is a regular file of its own (never through a symlink, a FIFO or a second hard link: its PID is written
    into it), and the flock counts only if LOCK still names the locked file afterwards: a `release` that removed it
    meanwhile would otherwise let two processes each hold a lock on a different file."""
    for _ in range(100):  # each retry means another process removed the lock file between our open and our flock
        try:
            fd = open_regular(path / LOCK, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise OutputError(f"{label} {path}: {LOCK} {_why(exc)}; remove it or choose another directory") from None
        lock = open(fd, "r+b")  # noqa: SIM115 (held for the run)
        if os.fstat(fd).st_nlink != 1:
            lock.close()
            raise OutputError(f"{label} {path}: {LOCK} has other hard links, so it is not vespo's lock file; remove "
                              "it or choose another directory")  # fmt: skip
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = lock.read(32).decode(errors="replace").strip() or "unknown"
            lock.close()
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise OutputError(
                    f"{label} {path} is in use by another vespo process (pid {holder}); wait for it to finish or "
                    "choose another directory"
                ) from None
            raise OutputError(f"{label} {path}: cannot lock {LOCK}: {exc.strerror or exc}") from None
        if _same_file(fd, path / LOCK):
            lock.truncate(0)
            lock.write(f"{os.getpid()}\n".encode())
            lock.flush()
            return lock
        lock.close()
    raise OutputError(f"{label} {path}: {LOCK} keeps being replaced by another process; try again")


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` (not followed) still names the file open as `fd`."""
    try:
        st, now = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)


@contextlib.contextmanager
def _hold_nested_locks(targets: list[Path]) -> Iterator[None]:
    """Hold the LOCK of every vespo output directory inside `targets` (symlinks not followed) while the body deletes
    them; OutputError naming the first one another process holds, before anything is deleted."""
    held = []
    try:
        for target in targets:
            if not target.is_dir() or target.is_symlink():
                continue
            for root, _dirs, files in os.walk(target):  # os.walk does not descend into symlinked directories
                if LOCK not in files:
                    continue
                try:
                    fd = open_regular(Path(root) / LOCK, os.O_RDONLY)
                except OSError:
                    continue  # not a lock file vespo could have held (a link, a FIFO): nothing holds it
                held.append(fd)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    raise OutputError(
                        f"{root} is in use by another vespo process; nothing was deleted: wait for it to finish"
                    ) from None
        yield
    finally:
        for fd in held:
            os.close(fd)


def _why(exc: OSError) -> str:
    """An OSError from `open_regular` as a short reason."""
    if exc.errno == errno.ELOOP:
        return "is a symbolic link (vespo never writes through one)"
    if exc.errno == errno.EINVAL and exc.strerror == _NOT_REGULAR:
        return "is not a regular file"
    return f"cannot be opened: {exc.strerror or exc}"


_NOT_REGULAR = "not a regular file"


def open_regular(path: str | Path, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """Open `path` as a file descriptor only if it is a regular file: never through a symbolic link (O_NOFOLLOW),
    never blocking on a FIFO or a device (O_NONBLOCK; anything but a regular file is refused with EINVAL). The one
    opener for every file vespo appends to or reads back from a directory a user can write."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, _NOT_REGULAR, str(path))
    os.set_blocking(fd, True)
    return fd


def read_regular(path: str | Path, limit: int | None = None, *, cap: int | None = None) -> bytes:
    """The bytes of regular file `path` (its first `limit`), opened by `open_regular`. With `cap`, the whole file,
    refused (OSError EFBIG, "larger than N MiB ...") when it is larger: a reader of a whole file never loads more
    than its cap."""
    with open(open_regular(path), "rb") as f:
        data = f.read(-1 if limit is None and cap is None else cap + 1 if limit is None else limit)
    if cap is not None and limit is None and len(data) > cap:
        raise OSError(errno.EFBIG, f"larger than {cap / 2**20:g} MiB, the most vespo reads of such a file", str(path))
    return data


def open_append(path: str | Path):
    """A text stream appending to regular file `path` (created if missing), opened by `open_regular`: logs."""
    return open(open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a", encoding="utf-8")


def write_atomic(path: str | Path, data: str | bytes | Callable[[BinaryIO], None]) -> None:
    """Replace file `path` with `data` (text, bytes, or a function writing to a binary file, e.g. `torch.save`):
    written to an exclusively created temporary name beside it (never an existing file, never through a link),
    fsynced, renamed over `path`, and the directory fsynced. Readers and a kill at any point see the old or the new
    file, never a torn one. The one writer of every file vespo writes whole."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with open(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fchmod(f.fileno(), 0o644)  # mkstemp's 0600 would hide results from the user's other accounts
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_dir(path: str | Path, *, replace: bool = False) -> Iterator[Path]:
    """Build directory `path` whole: the body writes into a fresh temporary directory beside it, which is fsynced and
    renamed to `path` (absent or an empty directory; with `replace`, a directory the caller knows vespo wrote, which
    is then deleted) when the body returns; on an error it is removed. A kill leaves `path` as it was and only a
    `.NAME.*.tmp` directory, which the next `atomic_dir` of the same `path` removes (a build still running in another
    process holds its tag file locked and is left alone)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        if stale.is_dir() and not stale.is_symlink() and _abandoned(stale / _ATOMIC_TAG):
            shutil.rmtree(stale, ignore_errors=True)  # ours: an earlier build of `path` that a kill interrupted
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    tag = os.open(tmp / _ATOMIC_TAG, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(tag, fcntl.LOCK_EX)  # held while this process builds: the build is not abandoned
        yield tmp
        os.unlink(tmp / _ATOMIC_TAG)
        for root, _, files in os.walk(tmp):
            for name in files:
                with open(open_regular(Path(root) / name)) as f:
                    os.fsync(f.fileno())
            _fsync_dir(Path(root))
        old = None
        if replace and path.is_dir() and not path.is_symlink() and any(path.iterdir()):
            old = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
            os.rename(path, old)
            (old / _ATOMIC_TAG).touch()  # a kill before the rmtree below leaves it to the next build to remove
        os.rename(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(tag)
    _fsync_dir(path.parent)


def _abandoned(tag: Path) -> bool:
    """Whether `tag` marks a temporary directory of `atomic_dir` whose builder is gone: it exists, is a regular file,
    and no process holds its lock."""
    try:
        fd = open_regular(tag, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # a build in progress
    finally:
        os.close(fd)
    return True


_ATOMIC_TAG = ".vespo-partial"
"""Names a temporary directory of `atomic_dir` as vespo's, so a later build may remove it after a kill."""


def _fsync_dir(path: Path) -> None:
    """Persist a rename in directory `path` (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def check_new_dir(path: str | Path, *, label: str, owned: tuple[str | Path, str, Iterable[str]] | None = None) -> Path:
    """A directory a command creates whole (`vespo export --out`), checked before anything loads (OutputError, one
    line, otherwise): not a symbolic link, new or an empty directory, below directories only, the nearest existing
    one writable, and inside no entry a vespo output directory owns (a run's final/, checkpoints/, ...: the names of
    its marker's manifest, which its next run replaces or deletes). `owned` = (directory, kind, names): one more the
    caller knows, marked or not (a run of a vespo before the marker, which its next run marks and then owns)."""
    path = Path(path).expanduser()
    if path.is_symlink():
        raise OutputError(f"{label} {path} is a symbolic link (vespo never writes through one); give a new directory")
    if os.path.lexists(path) and not path.is_dir():
        raise OutputError(f"{label} {path} is a file, not a directory; give a new or empty directory")
    if path.is_dir() and any(path.iterdir()):
        raise OutputError(
            f"{label} {path} exists and is not empty; give a new or empty directory (nothing is replaced)"
        )
    parent = next(p for p in path.absolute().parents if os.path.lexists(p))
    if not parent.is_dir():
        raise OutputError(f"{label} {path} is below {parent}, which is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{label} {path}: {parent} is not writable")
    real = Path(os.path.realpath(path))  # links and .. above it resolved: where it really is
    known = Path(os.path.realpath(owned[0])) if owned is not None else None
    for owner in real.parents:
        marker = read_marker(owner) if owner.is_dir() else None
        if marker is None and owner == known:
            marker = {"kind": owned[1], "manifest": list(owned[2])}
        entry = real.relative_to(owner).parts[0]
        if marker is not None and entry in marker["manifest"]:
            raise OutputError(
                f"{label} {path} is inside {owner / entry}, which the `vespo {marker['kind']}` output in {owner} "
                "owns (its next run replaces or deletes it); choose a directory outside it"
            )
    return path


def check_output_file(path: str | Path, *, label: str, inputs: Iterable[str | Path] = (), overwrite: bool) -> Path:
    """A single output file (`vespo compare --out`): its directory exists, it is not a directory, it is none of the
    command's `inputs`, and an existing file is replaced only with `overwrite`. OutputError otherwise."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise OutputError(f"{label} {path} is a directory; give a file path")
    for source in inputs:
        source = Path(source).expanduser()
        if path.resolve() == source.resolve() or (path.exists() and source.exists() and path.samefile(source)):
            raise OutputError(f"{label} {path} is the command's input {source}; give another file")
    if not path.parent.is_dir():
        raise OutputError(f"{label} {path}: directory {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise OutputError(f"{label} {path}: directory {path.parent} is not writable")
    if os.path.lexists(path) and not overwrite:
        raise OutputError(f"{label} {path} exists; pass --overwrite to replace it, or give another file")
    return path

"""What vespo may write, replace and delete: output directories it marked itself, each held under a lock.

Every command that writes a directory (`vespo train --run-dir`, `vespo eval --out`, `vespo lab/sweep --out-dir`)
claims it first. A directory is vespo's when it holds vespo's marker (`MARKER`: the command kind, a run identity and
the manifest of names the command writes there); only names in that manifest are ever replaced or deleted. A
directory without the marker is used only when it is new or empty, or, when the user asks (`overwrite`), when none of
the manifest's names exists in it: nothing vespo did not write is ever touched. While a command runs it holds an
exclusive `flock` on `LOCK` (which records its PID), so a second process on the same directory is refused.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
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
        with open(path / MARKER, "rb") as f:
            data = json.loads(f.read(_MAX_MARKER_BYTES))
    except (OSError, ValueError):
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
        Nothing outside the manifest is touched."""
        gone = self.existing()
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
    if os.path.lexists(path) and not path.is_dir():
        raise OutputError(f"{label} {path} is a file, not a directory")
    marker = read_marker(path) if path.is_dir() else None
    if marker is not None and marker["kind"] != kind:
        raise OutputError(f"{label} {path} holds the output of `vespo {marker['kind']}`; choose another directory")
    if marker is None and path.is_dir():
        present = sorted(set(os.listdir(path)) - {MARKER, LOCK})
        if present and not (legacy is not None and legacy(path)):
            clash = [n for n in names if n in present]
            if not overwrite:
                raise OutputError(
                    f"{label} {path} is not empty and was not created by vespo (no {MARKER}); choose a new or empty "
                    f"directory, or pass {overwrite_flag} to write vespo's files beside what is there (none of it is "
                    "deleted or replaced)"
                )
            if clash:
                raise OutputError(
                    f"{label} {path} already holds {', '.join(clash)}, which vespo did not write there; vespo never "
                    "replaces files it did not create: choose another directory"
                )
    created_dir = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
        lock = open(os.open(path / LOCK, os.O_RDWR | os.O_CREAT, 0o644), "r+b")  # noqa: SIM115 (held for the run)
    except OSError as exc:
        raise OutputError(f"{label} {path} cannot be written: {exc.strerror or exc}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = lock.read(32).decode(errors="replace").strip() or "unknown"
        lock.close()
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise OutputError(
                f"{label} {path} is in use by another vespo process (pid {holder}); wait for it to finish or choose "
                "another directory"
            ) from None
        raise OutputError(f"{label} {path}: cannot lock {LOCK}: {exc.strerror or exc}") from None
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n".encode())
    lock.flush()
    marked_now = False
    marker = read_marker(path)  # again, under the lock: another process may have marked it meanwhile
    if marker is None:
        marker = {"kind": kind, "id": uuid.uuid4().hex, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        write_atomic(path / MARKER, json.dumps(marker | {"manifest": names}, indent=1) + "\n")
        marker["manifest"], marked_now = names, True
    elif marker["kind"] != kind:
        lock.close()
        raise OutputError(f"{label} {path} holds the output of `vespo {marker['kind']}`; choose another directory")
    manifest_now = list(dict.fromkeys([*marker["manifest"], *names]))
    if manifest_now != marker["manifest"]:  # a newer vespo writes more names: they are recorded before written
        write_atomic(path / MARKER, json.dumps(marker | {"manifest": manifest_now}, indent=1) + "\n")
    return OwnedDir(path, kind, manifest_now, lock, created_dir, marked_now)


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file beside it and a rename: readers see the old or the new file,
    never a torn one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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

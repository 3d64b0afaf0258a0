"""A sandbox's limits (`SandboxLimits`: CPU, wall clock, memory, files, processes, output, the allow-listed
distributions), checked when built, and the host paths of those distributions (`package_entries`)."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
from dataclasses import asdict, dataclass, field

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

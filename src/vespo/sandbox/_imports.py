"""Third-party packages inside the sandbox and the checker: only the allow-listed top-level names (stdlib only).

Both run ``python -I -S``, so no site-packages directory is on ``sys.path``. `allow` adds a finder that imports
exactly the top-level modules and packages of the entries it is given (``numpy/``, ``six.py``, an extension module)
from their own directory, and nothing else from there (entries that are not modules, like ``numpy.libs/``, are only
needed on disk, next to the package that loads them).
"""

import importlib.machinery
import os
import sys

_SUFFIXES = sorted(importlib.machinery.all_suffixes(), key=len, reverse=True)  # ".cpython-311-x86_64-linux-gnu.so"


def module_name(entry: str) -> str | None:
    """The import name a top-level entry provides (``numpy/`` -> numpy, ``six.py`` -> six), or None."""
    base = os.path.basename(entry)
    if not os.path.isdir(entry):
        base = next((base[: -len(s)] for s in _SUFFIXES if base.endswith(s)), "")
    return base if base.isidentifier() else None


class _AllowList:
    """A meta-path finder for top-level names only; submodules are found through their package's ``__path__``."""

    def __init__(self, parents: dict[str, str]):
        self.parents = parents

    def find_spec(self, name, path=None, target=None):
        parent = self.parents.get(name) if path is None else None
        return None if parent is None else importlib.machinery.PathFinder.find_spec(name, [parent])


def allow(entries: list[str], directory: str | None = None) -> None:
    """Make the top-level ``entries`` (host paths) importable, found where they are or, when given, in
    ``directory`` (the sandbox root's view, where each is bound under its own name). After the standard library."""
    parents = {}
    for entry in entries:
        where = os.path.join(directory, os.path.basename(entry)) if directory else entry
        name = module_name(where)
        if name is not None:
            parents[name] = os.path.dirname(where)
    if parents:
        sys.meta_path.append(_AllowList(parents))

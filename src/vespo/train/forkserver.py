"""The samplers' fork server (`vespo train --async`): Python's forkserver, told to import what every sampler imports
(torch, transformers' model and generation code, vespo's sampler side: about 7 s on one CPU core) once, in its own
fresh interpreter. `vespo train --async` starts it first thing, so those imports run beside the learner's own imports
and setup; each sampler is then a fork of that warm, CUDA-free process (never of the learner) and is ready in well
under a second. One server per learner process, reused by later runs in it; it exits when the learner does.
This module imports nothing heavy: the `vespo` command loads it before torch.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

PRELOAD = (
    "torch",
    "torch.multiprocessing",  # its tensor reductions: shared-memory weights arrive as arguments
    "transformers",
    "transformers.modeling_utils",
    "transformers.generation",
    "vespo.advantages",
    "vespo.data",
    "vespo.rewards",  # math and code rewards (math-verify, sympy)
    "vespo.rewards.batch",
    "vespo.rollout",
    "vespo.train.config",
    "vespo.train.produce",
    "vespo.train.sampler",
    "vespo.train.system",
)
"""Imported once by the server for every sampler (an ImportError only skips that module; the model's own modeling
module and a user's reward module load in the sampler: a user module may do anything at import)."""


def sampler_context():
    """The multiprocessing context samplers start from, its server started (a no-op when it runs already)."""
    import multiprocessing
    from multiprocessing import forkserver

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    with _no_working_directory_on_path():
        forkserver.ensure_running()
    return ctx


@contextlib.contextmanager
def _no_working_directory_on_path():
    """Start the server so that the directory `vespo train` runs in is not on its import path: Python puts '' first on
    the path of the server's `python -c` interpreter, so a `regex.py` there would be imported by the preload (and by
    every sampler forked from it). Python >= 3.11 leaves it out under PYTHONSAFEPATH; 3.10 starts the server in an
    empty directory of its own that nobody can write to (each sampler changes back to the learner's directory, and
    takes the learner's import path, when it starts: multiprocessing's `spawn.prepare`)."""
    if sys.version_info >= (3, 11):
        old = os.environ.get("PYTHONSAFEPATH")
        os.environ["PYTHONSAFEPATH"] = "1"
        try:
            yield
        finally:
            if old is None:
                del os.environ["PYTHONSAFEPATH"]
            else:
                os.environ["PYTHONSAFEPATH"] = old
        return
    here, empty = os.getcwd(), tempfile.mkdtemp(prefix="vespo-forkserver-")
    os.chmod(empty, 0o500)
    os.chdir(empty)
    try:
        yield
    finally:
        os.chdir(here)


def wants_async(argv: list[str]) -> bool:
    """Whether `vespo train` argv asks for async mode on its face (`--async`, `--mode async`): only decides how early
    the server starts; the validated config decides the mode (a YAML `mode: async` starts it in the loop instead)."""
    pairs = zip(argv, argv[1:], strict=False)
    return "--async" in argv or "--mode=async" in argv or any(a == "--mode" and b == "async" for a, b in pairs)

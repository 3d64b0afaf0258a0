"""The samplers' fork server (`vespo train --async`): Python's forkserver, told to import what every sampler imports
(torch, transformers' model and generation code, vespo's sampler side: about 7 s on one CPU core) once, in its own
fresh interpreter. `vespo train --async` starts it first thing, so those imports run beside the learner's own imports
and setup; each sampler is then a fork of that warm, CUDA-free process (never of the learner) and is ready in well
under a second. One server per learner process, reused by later runs in it; it exits when the learner does.
This module imports nothing heavy: the `vespo` command loads it before torch.
"""

from __future__ import annotations

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
    "vespo.train.runs",
    "vespo.train.sampler",
)
"""Imported once by the server for every sampler (an ImportError only skips that module; the model's own modeling
module and a user's reward module load in the sampler: a user module may do anything at import)."""


def sampler_context():
    """The multiprocessing context samplers start from, its server started (a no-op when it runs already)."""
    import multiprocessing
    from multiprocessing import forkserver

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    forkserver.ensure_running()
    return ctx


def wants_async(argv: list[str]) -> bool:
    """Whether `vespo train` argv asks for async mode on its face (`--async`, `--mode async`): only decides how early
    the server starts; the validated config decides the mode (a YAML `mode: async` starts it in the loop instead)."""
    pairs = zip(argv, argv[1:], strict=False)
    return "--async" in argv or "--mode=async" in argv or any(a == "--mode" and b == "async" for a, b in pairs)

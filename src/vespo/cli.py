"""The `vespo` command: one sub-command per job, each owned by the module that does the work.

Sub-commands are looked up lazily so `vespo bound` does not import transformers.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys

# name -> ("module", "function", "one-line help"); each function takes the remaining argv.
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "train": ("vespo.train.launch", "cli", "RL-train a causal LM (embedded default task when run with no arguments)"),
    "export": (
        "vespo.train.launch",
        "export_cli",
        "write a run's checkpoint as a Hugging Face model directory (LoRA merged), for `vespo eval --model`",
    ),
    "sweep": (
        "vespo.experiments.sweep",
        "cli",
        "grid of methods x staleness N x seeds, with tables and paper-style plots",
    ),
    "lab": (
        "vespo.experiments.lab",
        "cli",
        "exact sequence-level workbench: methods x length T x staleness N x lr, in seconds",
    ),
    "compare": (
        "vespo.experiments.compare",
        "cli",
        "significance of a sweep's differences (--test auto: paired t-test, Fisher's exact test where a seed "
        "collapsed, Welch where seeds differ; Holm)",
    ),
    "eval": ("vespo.evaluation", "cli", "avg@k / pass@k on math and code benchmarks"),
    "kernels": ("vespo.plots", "kernels_cli", "draw the paper's Figure 2: phi(W) and surrogates per method"),
    "bound": ("vespo.kernels", "bound_cli", "print the variance bound K and phi_max for (c1, c2)"),
}


def _version() -> str:
    """The installed package's version (its metadata), or the source tree's when vespo is not installed."""
    try:
        return importlib.metadata.version("vespo")
    except importlib.metadata.PackageNotFoundError:
        from vespo import __version__

        return __version__


def _usage() -> str:
    lines = ["usage: vespo <command> [options]  |  vespo --version", "", "commands:"]
    lines += [f"  {name:<9} {help_}" for name, (_, _, help_) in _COMMANDS.items()]
    lines += ["", "Run `vespo <command> --help` for the options of one command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `vespo` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"vespo {_version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in _COMMANDS:
        print(f"vespo: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module, func, _ = _COMMANDS[name]
    if name == "train":
        from vespo.train.forkserver import sampler_context, wants_async

        if wants_async(rest):  # the samplers' imports run beside this process's own (vespo.train.forkserver)
            sampler_context()
    result = getattr(importlib.import_module(module), func)(rest)
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())

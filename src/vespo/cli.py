"""The `vespo` command, a dispatcher only: one sub-command per job, each owned by the module that does the work (the
conventions of their command lines are `vespo.argv`'s, a room below every command).

Sub-commands are looked up lazily so `vespo bound` does not import transformers, and `--help` or a bad flag is
answered before torch is imported.
"""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

from vespo.argv import ArgumentParser

# name -> ("module", "function", "one-line help"); each function takes the remaining argv.
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "train": ("vespo.train.launch", "cli", "RL-train a causal LM (embedded default task when run with no arguments)"),
    "export": (
        "vespo.train.launch",
        "export_cli",
        "write a run's checkpoint as a Hugging Face model directory (LoRA merged), for `vespo eval --model`",
    ),
    "sweep": (
        "vespo.experiments.sweep.command",
        "cli",
        "grid of methods x N mini-batches per rollout step x seeds, with tables and paper-style plots",
    ),
    "reproduce": (
        "vespo.experiments.reproduce.command",
        "cli",
        "the paper's staleness table (paper) and its long-response table with git-dated designs (paper-long)",
    ),
    "lab": (
        "vespo.experiments.lab_cli",
        "cli",
        "exact sequence-level workbench: methods x length T x N mini-batches per rollout step x lr, in seconds",
    ),
    "compare": (
        "vespo.experiments.compare",
        "cli",
        "significance of a sweep's differences (--test auto: paired t-test, Fisher's exact test where a seed "
        "collapsed, Welch where seeds differ; Holm)",
    ),
    "eval": ("vespo.evaluation", "cli", "avg@k / pass@k on math and code benchmarks"),
    "kernels": ("vespo.cli", "kernels_cli", "draw the paper's Figure 2: phi(W) and surrogates per method"),
    "bound": ("vespo.cli", "bound_cli", "print the variance bound K and phi_max for (c1, c2)"),
}


def _version() -> str:
    """The version in the one place it is written, `vespo.__version__` (pyproject reads it from there)."""
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
    try:
        command = getattr(importlib.import_module(module), func)
    except ModuleNotFoundError as err:  # the core install (torch, numpy) lacks the command's extra
        if (err.name or "vespo").partition(".")[0] == "vespo":
            raise
        extra = "experiments" if name in ("sweep", "reproduce", "lab", "compare") else "train"
        print(f"vespo {name}: needs {err.name!r}, not installed: pip install 'vespo[{extra}]'", file=sys.stderr)
        return 2
    return int(command(rest) or 0)


def bound_cli(argv: list[str]) -> int:
    """`vespo bound --c1 2 --c2 3`: print K, phi_max and where they are attained (Prop. 3.1 and C.1)."""
    parser = ArgumentParser(prog="vespo bound", description=bound_cli.__doc__)
    parser.add_argument("--c1", type=float, default=2.0, help="power exponent c1 (alpha); default 2")
    parser.add_argument("--c2", type=float, default=3.0, help="decay rate c2 (lambda); default 3")
    args = parser.parse_args(argv)
    from vespo.kernels import check_c, phi_argmax, phi_max, variance_bound_argmax, variance_bound_K  # torch

    try:
        check_c(args.c1, args.c2)
    except ValueError as err:
        parser.error(str(err))
    c1, c2 = args.c1, args.c2
    k, k_at = variance_bound_K(c1, c2), variance_bound_argmax(c1, c2)
    print(f"phi(W) = W^{c1:g} * exp({c2:g} * (1 - W))")
    print(f"phi_max = {phi_max(c1, c2):.6g}   attained at W = c1/c2 = {phi_argmax(c1, c2):.6g}")
    if math.isinf(k):
        print("K       = inf  (phi(w)/w -> inf as w -> 0)")
        print(
            f"warning: c1 = {c1:g} < 1 makes the variance bound E_mu[phi^2] <= Z*K*C of Prop. 3.1 vacuous; "
            "choose c1 >= 1 for a finite K.",
            file=sys.stderr,
        )
    elif c1 == 1.0:
        print(f"K       = {k:.6g}   approached as w -> 0 (c1 = 1: K = e^c2)")
    else:
        print(f"K       = {k:.6g}   attained at w = (c1-1)/c2 = {k_at:.6g}")
    print("Prop. 3.1: E_mu[phi(W)^2] <= Z * K * C, with Z = E_mu[phi(W)] and C >= E_Q[W].")
    return 0


def kernels_cli(argv: list[str]) -> int:
    """`vespo kernels --out DIR`: write the Figure-2-style kernel plot to DIR/kernels.png."""
    parser = ArgumentParser(prog="vespo kernels", description=kernels_cli.__doc__)
    parser.add_argument("--out", default="runs/kernels", help="output directory (default: runs/kernels)")
    parser.add_argument("--w-max", type=float, default=3.0, help="right end of the w axis (default: 3)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing DIR/kernels.png")
    args = parser.parse_args(argv)
    from vespo.outputs import check_output_file

    try:
        Path(args.out).expanduser().mkdir(parents=True, exist_ok=True)
        check_output_file(Path(args.out).expanduser() / "kernels.png", label="--out", overwrite=args.overwrite)
    except (OSError, ValueError) as exc:  # OutputError, or a path that cannot be a directory
        parser.error(str(exc) if isinstance(exc, ValueError) else f"--out {args.out}: {exc.strerror or exc}")
    from vespo.plots import plot_kernels  # torch, matplotlib

    print(plot_kernels(args.out, args.w_max))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

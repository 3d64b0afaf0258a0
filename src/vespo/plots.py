"""Figures of the reshaping kernels (the paper's Figure 2): gradient weight phi(W) and surrogate f(W) per method.

Each method is written as a function of one ratio w (the sequence weight W for VESPO / TOPR, the token ratio r for
the token-level methods, the geometric-mean ratio s for GSPO), for one advantage sign, with its default
hyperparameters. phi is the factor multiplying A * grad log pi; f is the implicit objective with f'(w) = phi(w)/w.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import torch

from vespo.kernels import surrogate, vespo_log_phi
from vespo.outputs import check_output_file

Curve = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # w -> (phi(w), f(w))


def _clip_curves(low: float, high: float, positive: bool, dual_c: float | None) -> Curve:
    """PPO clip: A > 0 keeps the gradient while r <= high, A < 0 while low <= r (< c with the dual clip)."""

    def curve(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if positive:
            return torch.where(w <= high, w, 0.0), torch.clamp(w, max=high)
        keep = (w >= low) & (w <= (dual_c if dual_c is not None else math.inf))
        f = torch.clamp(w, min=low)
        return torch.where(keep, w, 0.0), torch.clamp(f, max=dual_c) if dual_c is not None else f

    return curve


def _method_curves(positive: bool) -> dict[str, Curve]:
    """The curves drawn for one advantage sign (A >= 0 if `positive`), each method at its paper defaults."""
    c1, c2 = (2.0, 3.0) if positive else (3.0, 2.0)
    tau = 1.0 if positive else 1.05

    def vespo(w):
        return torch.exp(vespo_log_phi(torch.log(w), c1, c2)), surrogate(w, c1, c2)

    def sapo(w):
        g = torch.sigmoid(tau * (w - 1.0))
        return 4.0 * g * (1.0 - g) * w, g * 4.0 / tau

    def cispo(w):  # phi = min(r, 5); f = r below 5, 5 + 5 log(r/5) above
        return torch.clamp(w, max=5.0), torch.where(w <= 5.0, w, 5.0 + 5.0 * torch.log(w / 5.0))

    def topr(w):  # A >= 0: phi = 1, f = log W;  A < 0: phi = min(W, 1), f = W below 1, 1 + log W above
        if positive:
            return torch.ones_like(w), torch.log(w)
        return torch.clamp(w, max=1.0), torch.where(w <= 1.0, w, 1.0 + torch.log(w))

    return {
        f"VESPO (c1={c1:g}, c2={c2:g})": vespo,
        "GRPO clip (0.2, 0.28), dual c=3": _clip_curves(0.8, 1.28, positive, 3.0),
        "GSPO clip (3e-4, 4e-4), on s": _clip_curves(1 - 3e-4, 1 + 4e-4, positive, None),
        f"SAPO (tau={tau:g})": sapo,
        "CISPO (r <= 5)": cispo,
        "TOPR": topr,
    }


_COLORS = ("tab:red", "tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown")


def sequential_color(i: int, n: int) -> tuple[float, float, float, float]:
    """Colour `i` of `n` ordered values (N, lr): viridis cut before its pale-yellow end, readable on white."""
    import matplotlib

    return matplotlib.colormaps["viridis"](0.85 * i / max(1, n - 1))


def category_color(i: int) -> tuple[float, float, float, float]:
    """Colour of the `i`-th method: tab10 (no pale tints); repeats after 10, so pair it with a line style."""
    import matplotlib

    return matplotlib.colormaps["tab10"](i % 10)


def luminance(color) -> float:
    """Relative luminance (0 black .. 1 white) of an RGB(A) colour: a line drawn on white needs it well below 1."""
    import matplotlib.colors

    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in matplotlib.colors.to_rgb(color))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def kernel_figure(w_max: float = 3.0):
    """The kernels figure: phi(w) and f(w) for both advantage signs, each column with its own legend (the A < 0
    column draws VESPO at (c1, c2) = (3, 2))."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = torch.linspace(1e-3, w_max, 2000, dtype=torch.float64)
    one = torch.ones(1, dtype=torch.float64)
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for col, positive in enumerate((True, False)):
        for (name, curve), color in zip(_method_curves(positive).items(), _COLORS, strict=True):
            phi, f = curve(w)
            f1 = curve(one)[1]
            style = {"lw": 2.6 if name.startswith("VESPO") else 1.4, "color": color}
            axes[0, col].plot(w, (f - f1 + 1.0).numpy(), label=name, **style)
            axes[1, col].plot(w, phi.numpy(), label=name, **style)
        sign = "A > 0" if positive else "A < 0"
        axes[0, col].set_title(f"surrogate f(w) - f(1) + 1, {sign}")
        axes[1, col].set_title(f"gradient weight phi(w) = w f'(w), {sign}")
        axes[1, col].set_xlabel("importance ratio w (sequence W, token r, or GSPO's s)")
        axes[0, col].set_xlabel("importance ratio w")
        axes[0, col].set_ylabel("f(w) - f(1) + 1")
        axes[1, col].set_ylabel("phi(w)")
        axes[1, col].legend(fontsize=8, loc="upper right")
        for ax in axes[:, col]:
            ax.axvline(1.0, color="grey", lw=0.6, ls=":")
            ax.grid(alpha=0.3)
        axes[0, col].set_ylim(-1.5, 3.0)
        axes[1, col].set_ylim(-0.05, 3.2)
    fig.suptitle("Importance-weight reshaping kernels (cf. VESPO paper, Figure 2)")
    fig.tight_layout()
    return fig


def plot_kernels(out_dir: str | Path, w_max: float = 3.0) -> Path:
    """Draw `kernel_figure` into `out_dir`/kernels.png; return the path."""
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig = kernel_figure(w_max)
    path = out / "kernels.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def kernels_cli(argv: list[str]) -> int:
    """`vespo kernels --out DIR`: write the Figure-2-style kernel plot to DIR/kernels.png."""
    parser = argparse.ArgumentParser(prog="vespo kernels", description=kernels_cli.__doc__)
    parser.add_argument("--out", default="runs/kernels", help="output directory (default: runs/kernels)")
    parser.add_argument("--w-max", type=float, default=3.0, help="right end of the w axis (default: 3)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing DIR/kernels.png")
    args = parser.parse_args(argv)
    try:
        Path(args.out).expanduser().mkdir(parents=True, exist_ok=True)
        check_output_file(Path(args.out).expanduser() / "kernels.png", label="--out", overwrite=args.overwrite)
    except (OSError, ValueError) as exc:  # OutputError, or a path that cannot be a directory
        parser.error(str(exc) if isinstance(exc, ValueError) else f"--out {args.out}: {exc.strerror or exc}")
    print(plot_kernels(args.out, args.w_max))
    return 0

"""Figures of the reshaping kernels (the paper's Figure 2): gradient weight phi(W) and surrogate f(W) per method.

Each method is written as a function of one ratio w (the sequence weight W for VESPO / TOPR, the token ratio r for
the token-level methods, the geometric-mean ratio s for GSPO), for one advantage sign, with its default
hyperparameters. phi is the factor multiplying A * grad log pi; f is the implicit objective with f'(w) = phi(w)/w.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vespo.kernels import surrogate, vespo_log_phi
from vespo.outputs import write_atomic

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
N_AXIS = "N (mini-batches per rollout step)"
"""The axis label of N (`num_mini_batches`, the paper's staleness ratio gbs/mbs) in every figure."""


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


@dataclass
class Series:
    """One named line of a panel: y over x, optionally with a band (`low`..`high`, e.g. a 95% CI) or error bars
    (`yerr`: half-widths), and matplotlib line options (`style`: color, ls, marker, ...)."""

    x: Sequence[float]
    y: Sequence[float]
    low: Sequence[float] | None = None
    high: Sequence[float] | None = None
    yerr: Sequence[float] | None = None
    style: dict = field(default_factory=dict)


@dataclass
class Panel:
    """One axes of a `panel_figure`: labelled axes, its series by legend name, and the metric's range `bounds`
    (bands and error bars are clipped to it: a CI never runs past what the metric can take, such as a reward above
    1 or a negative length)."""

    title: str
    xlabel: str
    ylabel: str
    series: dict[str, Series] = field(default_factory=dict)
    bounds: tuple[float, float] | None = None
    xscale: str | None = None
    """A matplotlib scale ("log", ...), or "log2" (a log axis in powers of 2, for N)."""
    yscale: str | None = None
    hline: float | None = None
    """A grey dotted reference level (e.g. the warm start's accuracy)."""
    xticks: Sequence[float] | None = None
    """Ticks to show (and only those, as plain numbers): N = 1, 4, 16 on a log axis without crowding."""


def panel_figure(rows: list[list[Panel]], *, title: str | None = None, panel_size: tuple[float, float] = (3.4, 2.6)):
    """A grid of panels (`rows` of `Panel`) with one legend for the whole figure, right of the panels, so it never
    covers data. Save it with `save_figure` (which keeps the legend in the picture)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = max(len(r) for r in rows)
    fig, axes = plt.subplots(
        len(rows), width, figsize=(panel_size[0] * width, panel_size[1] * len(rows)), squeeze=False
    )
    legend: dict[str, object] = {}
    for r, row in enumerate(rows):
        for c in range(width):
            ax = axes[r][c]
            if c >= len(row):
                ax.set_visible(False)
                continue
            legend |= {name: h for name, h in _draw_panel(ax, row[c]).items() if name not in legend}
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8,
                   frameon=False)  # fmt: skip
    return fig


def _draw_panel(ax, panel: Panel) -> dict[str, object]:
    """Draw one panel's series (error bars and bands clipped to its bounds), reference line, scales, ticks and labels
    on `ax`; returns its legend handles by series name."""
    import numpy as np

    handles: dict[str, object] = {}
    lo, hi = panel.bounds if panel.bounds is not None else (-np.inf, np.inf)
    for name, line in panel.series.items():
        x, y = np.asarray(line.x, float), np.asarray(line.y, float)
        if line.yerr is not None:
            err = np.asarray(line.yerr, float)
            below, above = np.minimum(err, y - lo), np.minimum(err, hi - y)  # clipped to the range
            handle = ax.errorbar(x, y, yerr=[np.maximum(below, 0), np.maximum(above, 0)], capsize=2,
                                 **{"marker": "o", "ms": 3} | line.style)  # fmt: skip
        else:
            (handle,) = ax.plot(x, y, **line.style)
        if line.low is not None and line.high is not None:
            band = np.clip(np.asarray(line.low, float), lo, hi), np.clip(np.asarray(line.high, float), lo, hi)
            color = handle.get_color() if hasattr(handle, "get_color") else handle.lines[0].get_color()
            ax.fill_between(x, *band, color=color, alpha=0.15, lw=0)
        handles.setdefault(name, handle)
    if panel.hline is not None:
        ax.axhline(panel.hline, color="grey", ls=":", lw=1)
    if panel.xscale:
        scale, options = ("log", {"base": 2}) if panel.xscale == "log2" else (panel.xscale, {})
        ax.set_xscale(scale, **options)
    if panel.yscale:
        ax.set_yscale(panel.yscale)
    if panel.xticks is not None:
        ax.set_xticks(list(panel.xticks), [f"{t:g}" for t in panel.xticks])
        ax.minorticks_off()
    if panel.bounds is not None and not panel.yscale:
        pad = 0.03 * (hi - lo) if np.isfinite(hi - lo) else 0
        ax.set_ylim(lo - pad if np.isfinite(lo) else None, hi + pad if np.isfinite(hi) else None)
    ax.set_title(panel.title, fontsize=9)
    ax.set_xlabel(panel.xlabel, fontsize=8)
    ax.set_ylabel(panel.ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    return handles


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
    """Save `fig` with everything drawn outside its panels (the legend) included, and close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    try:
        write_atomic(path, lambda f: fig.savefig(f, format=fmt, dpi=dpi, bbox_inches="tight"))
    finally:
        plt.close(fig)
    return Path(path)


def kernel_figure(w_max: float = 3.0):
    """The kernels figure: phi(w) and f(w) for both advantage signs, each column with its own legend below it (the
    A < 0 column draws VESPO at (c1, c2) = (3, 2))."""
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
        axes[1, col].legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
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

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return save_figure(kernel_figure(w_max), out / "kernels.png", dpi=120)

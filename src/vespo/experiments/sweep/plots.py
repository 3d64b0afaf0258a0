"""A sweep's figures in the style of the paper's: fig3_training_reward.png, fig4_dynamics.png and, over several
learning rates, fig_lr_robustness.png."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vespo.experiments.sweep.config import Cell, SweepConfig
from vespo.experiments.sweep.report import read_summary

FIG4_COLUMNS = (  # (metric, axis label, the metric's range: bands and limits stay inside it)
    ("reward/mean", "training reward", (0.0, 1.0)),
    ("eval/accuracy", "held-out accuracy", (0.0, 1.0)),
    ("response/length_mean", "response length (tokens)", (0.0, float("inf"))),
    ("response/clip_frac", "share cut at max length", (0.0, 1.0)),
    ("is/approx_kl", "KL(mu || pi)", (0.0, float("inf"))),
    ("actor/entropy", "entropy (nats)", (0.0, float("inf"))),
    ("loss/pg", "pg loss", None),
)


def _curves(out_dir: Path, cell: Cell, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(optimizer steps, values) of one metric of one cell; x = rollout step x N so all N share one axis."""
    from vespo.train.logs import read_metrics

    rows = [r for r in read_metrics(out_dir / "cells" / cell.name) if key in r]
    return np.array([r["step"] * cell.num_mini_batches for r in rows]), np.array([r[key] for r in rows])


def _seed_mean(out_dir: Path, group: list[Cell], key: str) -> tuple[np.ndarray, np.ndarray] | None:
    curves = [_curves(out_dir, c, key) for c in group]
    if not curves or any(len(x) == 0 for x, _ in curves):
        return None
    length = min(len(x) for x, _ in curves)
    return curves[0][0][:length], np.mean([y[:length] for _, y in curves], axis=0)


def plot(cfg: SweepConfig, grid: list[Cell]) -> None:
    """fig3_training_reward.png (a panel per method, a curve per N) and fig4_dynamics.png (rows N, metric columns);
    every axis labelled, one legend beside the panels."""
    from vespo.plots import Panel, Series, category_color, panel_figure, save_figure, sequential_color

    out_dir = Path(cfg.out_dir)
    names = list(dict.fromkeys(c.variant for c in grid))
    colors = {v: category_color(i) for i, v in enumerate(names)}
    styles = {v: ("-", "--", ":")[i // 10 % 3] for i, v in enumerate(names)}  # colours repeat after 10
    ns = list(cfg.num_mini_batches)

    def group(v, n):
        return [c for c in grid if c.variant == v and c.num_mini_batches == n]

    def series(v, n, key, style) -> dict[str, Series]:
        xy = _seed_mean(out_dir, group(v, n), key)
        return {} if xy is None else {"": Series(*xy, style=style)}

    fig3 = []
    for v in names:
        panel = Panel(v, "optimizer step", "training reward (mean over seeds)", bounds=(0.0, 1.0))
        for i, n in enumerate(ns):
            for line in series(v, n, "reward/mean", {"color": sequential_color(i, len(ns))}).values():
                panel.series[f"N={n}"] = line
        fig3.append(panel)
    save_figure(panel_figure([fig3]), out_dir / "fig3_training_reward.png")

    if len(cfg.lr) > 1:
        plot_lr_robustness(cfg, grid)

    fig4 = []
    for n in ns:
        row = []
        for key, label, bounds in FIG4_COLUMNS:
            panel = Panel(f"{label}, N={n}", "optimizer step", label, bounds=bounds)
            for v in names:
                style = {"color": colors[v], "ls": styles[v], "marker": "o" if key.startswith("eval/") else None,
                         "ms": 3}  # fmt: skip
                for line in series(v, n, key, style).values():
                    panel.series[v] = line
            row.append(panel)
        fig4.append(row)
    save_figure(panel_figure(fig4, title="mean over seeds", panel_size=(3.0, 2.3)), out_dir / "fig4_dynamics.png", 100)


def plot_lr_robustness(cfg: SweepConfig, grid: list[Cell]) -> None:
    """fig_lr_robustness.png: final held-out accuracy (mean and min over seeds) vs N, a line per learning rate, a
    panel per method (columns) and task (rows); the dotted line is the warm start's accuracy."""
    from vespo.plots import save_figure

    out_dir = Path(cfg.out_dir)
    paths = {c.name: out_dir / "cells" / c.name / "summary.json" for c in grid}
    summaries = [
        saved | {"lr": c.lr, "variant": c.variant, "task": c.task, "N": c.num_mini_batches}
        for c in grid
        if (saved := read_summary(paths[c.name])) is not None
    ]
    save_figure(lr_robustness_figure(summaries, list(cfg.num_mini_batches)), out_dir / "fig_lr_robustness.png")


def _lr_of(summary: dict) -> float:
    """A cell's learning rate: its `lr`, or the `@lr<value>` of its variant name (results.csv's rows)."""
    if "lr" in summary:
        return float(summary["lr"])
    tag = next((t for t in summary["variant"].split("@")[1:] if t.startswith("lr")), None)
    return float(tag[2:]) if tag else float("nan")


def lr_robustness_figure(summaries: list[dict], num_mini_batches: list[int]):
    """The lr-robustness figure from per-cell summaries (`summarize`'s rows with their `lr`; results.csv's rows give
    the same): a panel per method and task, final held-out accuracy vs N, mean (solid) and worst seed (dashed) per
    learning rate."""
    from vespo.plots import N_AXIS, Panel, Series, panel_figure, sequential_color

    summaries = [s | {"lr": _lr_of(s), "base": s["variant"].split("@")[0]} for s in summaries]
    tasks = list(dict.fromkeys(s["task"] for s in summaries))
    bases = list(dict.fromkeys(s["base"] for s in summaries))
    lrs = sorted({s["lr"] for s in summaries})
    rows = []
    for task in tasks:
        row = []
        starts = [float(s["initial_eval_acc"]) for s in summaries if s["task"] == task]
        for base in bases:
            start = float(np.mean(starts)) if starts else None
            panel = Panel(f"{base} ({task})", N_AXIS, "final held-out accuracy", bounds=(0.0, 1.0), xscale="log2",
                          xticks=num_mini_batches, hline=start)  # fmt: skip
            for i, lr in enumerate(lrs):
                pts = []
                for n in num_mini_batches:
                    cell = (task, base, lr, n)
                    accs = [float(s["final_eval_acc"]) for s in summaries
                            if (s["task"], s["base"], s["lr"], int(s["N"])) == cell]  # fmt: skip
                    if accs:
                        pts.append((n, np.mean(accs), np.min(accs)))
                if pts:
                    x, mean, low = zip(*pts, strict=True)
                    color = sequential_color(i, len(lrs))
                    panel.series[f"lr {lr:g} (mean)"] = Series(x, mean, style={"color": color, "marker": "o"})
                    panel.series[f"lr {lr:g} (worst seed)"] = Series(x, low, style={"color": color, "ls": "--"})
            row.append(panel)
        rows.append(row)
    return panel_figure(rows, title="dotted: the warm start's accuracy")

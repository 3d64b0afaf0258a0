"""reward.png: a run's training reward per step and its held-out accuracy at the evaluation steps, titled by what
the run is (`run_title`)."""

from __future__ import annotations

from pathlib import Path

from vespo.train.config_io import load_yaml
from vespo.train.logs import read_metrics


def run_title(run_dir: str | Path) -> str:
    """What a run is, from its config.yaml: method, staleness N, lr, task or model, seed."""
    try:
        c = load_yaml(Path(run_dir) / "config.yaml")
        n = int(c["train_batch_size"]) // int(c["ppo_mini_batch_size"])
        data = c["task"] if c.get("model") == "embedded" else Path(str(c["model"])).name
        return f"{c['method']}, N={n}, lr={c['lr']:g}, {data}, seed {c['seed']}"
    except (KeyError, TypeError, ValueError):  # ConfigError is a ValueError: an unreadable config.yaml
        return Path(run_dir).name


def plot_run(run_dir: str | Path) -> Path:
    """reward.png: training reward per step and held-out accuracy at the evaluation steps."""
    from vespo.plots import Panel, Series, panel_figure, save_figure

    rows = read_metrics(run_dir)
    panel = Panel(run_title(run_dir), "rollout step", "reward / accuracy", bounds=(0.0, 1.0))
    train = [(r["step"], r["reward/mean"]) for r in rows if "reward/mean" in r]
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    if train:
        panel.series["training reward"] = Series(*zip(*train, strict=True))
    if evals:
        panel.series["held-out accuracy"] = Series(*zip(*evals, strict=True), style={"marker": "o"})
    return save_figure(panel_figure([[panel]], panel_size=(6, 3.5)), Path(run_dir) / "reward.png", dpi=120)

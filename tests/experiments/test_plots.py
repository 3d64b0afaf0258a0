"""Plots checked through their data (issue 22): the kernels legend names the parameters each column draws, every
axis is labelled, no line is too pale to see on white, and a run's plot says what the run was."""

import pytest

from vespo.plots import category_color, kernel_figure, luminance, sequential_color


def test_kernel_legends_state_the_drawn_parameters_and_axes_are_labelled():
    import matplotlib.pyplot as plt

    fig = kernel_figure()
    axes = fig.axes
    try:
        for col, want in ((0, "VESPO (c1=2, c2=3)"), (1, "VESPO (c1=3, c2=2)")):  # A > 0 | A < 0
            legend = axes[2 + col].get_legend()
            assert legend is not None
            names = [t.get_text() for t in legend.get_texts()]
            assert want in names and not any(n.startswith("VESPO") and n != want for n in names)
        for ax in axes:
            assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
            for line in ax.get_lines():
                if line.get_linestyle() != ":":  # the grey w = 1 marker
                    assert luminance(line.get_color()) < 0.6, line.get_label()
    finally:
        plt.close(fig)


@pytest.mark.parametrize("n", [2, 4, 6, 9])
def test_palettes_stay_readable_on_white(n):
    assert all(luminance(sequential_color(i, n)) < 0.6 for i in range(n))
    assert all(luminance(category_color(i)) < 0.6 for i in range(12))
    assert luminance("#fde725") > 0.6  # viridis' end, the pale yellow the old plots drew: the check can fail


def test_run_plot_title_is_the_method_and_settings(tmp_path):
    import json

    from vespo.train.config import TrainConfig
    from vespo.train.config_io import to_yaml
    from vespo.train.reward_plot import plot_run, run_title

    (tmp_path / "config.yaml").write_text(to_yaml(TrainConfig(method="grpo", train_batch_size=64, lr=1e-3, seed=2)))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    assert run_title(tmp_path) == "grpo, N=4, lr=0.001, arithmetic, seed 2"
    assert plot_run(tmp_path).is_file()
    assert run_title(tmp_path / "missing") == "missing"  # no config: the directory name, not a crash


# issue 32: every plotting function labels both axes, keeps its legend off the data and its bands inside the metric's
# range. Each *_figure function of vespo.plots is rendered here on made-up data (a new one without a case fails).


def _made_up_panels():
    import numpy as np

    from vespo.plots import Panel, Series

    x = np.arange(10.0)
    reward = Panel("reward", "step", "reward", bounds=(0.0, 1.0), hline=0.25)
    reward.series["band past both ends"] = Series(x, x / 9, low=x / 9 - 0.5, high=x / 9 + 0.5)
    reward.series["error bars past both ends"] = Series(x, 1 - x / 9, yerr=np.full(10, 0.4))
    length = Panel("length", "step", "length (tokens)", bounds=(0.0, float("inf")), xscale="log2", xticks=[1, 4, 8])
    length.series["band below 0"] = Series(x + 1, 5 + x, low=x - 20, high=x + 20)
    free = Panel("loss", "step", "loss", yscale="symlog")
    free.series["unbounded"] = Series(x, np.sin(x))
    return [[reward, length], [free]]


_CASES = {"kernel_figure": lambda: {}, "panel_figure": lambda: {"rows": _made_up_panels(), "title": "made up"}}


def test_every_plotting_function_is_rendered_here():
    import vespo.plots

    drawn = {n for n in dir(vespo.plots) if n.endswith("_figure") and n != "save_figure"}
    assert drawn == set(_CASES)


@pytest.mark.parametrize("name", sorted(_CASES))
def test_plotting_functions_label_axes_keep_legends_off_data_and_clip_bands(name):
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.collections import LineCollection, PolyCollection

    import vespo.plots

    fig = getattr(vespo.plots, name)(**_CASES[name]())
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        shown = [ax for ax in fig.axes if ax.get_visible()]
        for ax in shown:
            assert ax.get_xlabel() and ax.get_ylabel(), (name, ax.get_title())
        legends = list(fig.legends) + [ax.get_legend() for ax in shown if ax.get_legend() is not None]
        assert legends, name
        for legend in legends:  # beside or below the panels, never over a panel's data
            box = legend.get_window_extent(renderer)
            assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in shown), name
        if name == "panel_figure":
            for ax, (lo, hi) in ((shown[0], (0.0, 1.0)), (shown[1], (0.0, np.inf))):
                for item in ax.collections:
                    if isinstance(item, PolyCollection):  # a band
                        ys = np.concatenate([p.vertices[:, 1] for p in item.get_paths()])
                    elif isinstance(item, LineCollection):  # error bars
                        ys = np.concatenate([seg[:, 1] for seg in item.get_segments()])
                    else:
                        continue
                    assert ys.min() >= lo - 1e-9 and ys.max() <= hi + 1e-9, (ax.get_title(), ys.min(), ys.max())
            assert [t.get_text() for t in shown[1].get_xticklabels()] == ["1", "4", "8"]
    finally:
        plt.close(fig)


def test_figure_producers_of_sweep_lab_and_run_use_labelled_panels(tmp_path):
    """The sweep's lr-robustness figure from results.csv-style rows and the lab's figures from made-up cells."""
    import matplotlib.pyplot as plt

    from vespo.experiments.lab import plot as lab_plot
    from vespo.experiments.sweep import lr_robustness_figure

    rows = [{"task": "arithmetic", "variant": f"{m}@lr{lr}", "N": n, "seed": s, "initial_eval_acc": 0.2,
             "final_eval_acc": 0.1 * s + lr * 100} for m in ("vespo", "grpo") for lr in (3e-4, 9e-4) for n in (4, 64)
            for s in (0, 1)]  # fmt: skip
    fig = lr_robustness_figure(rows, [4, 64])
    try:
        assert all(ax.get_xlabel() == "N (mini-batches per rollout step)" and ax.get_ylabel() for ax in fig.axes)
        assert {t.get_text() for t in fig.legends[0].get_texts()} >= {"lr 0.0003 (mean)", "lr 0.0009 (worst seed)"}
    finally:
        plt.close(fig)
    summary = {"method": "vespo", "length": 8, "staleness": 4, "lr_scale": 1.0, "final_reward": 0.5}
    per_k = {k: [0.1, 0.2, 0.3, 0.4] for k in ("log_w_mean", "ess", "top1_share", "grad_norm", "update_norm")}
    lab_plot(tmp_path, [{"summary": summary | {"seed": s}, "per_k": per_k} for s in (0, 1)])
    assert (tmp_path / "lab_reward.png").is_file() and (tmp_path / "lab_mechanism.png").is_file()

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
    from vespo.train.runs import plot_run, run_title

    (tmp_path / "config.yaml").write_text(to_yaml(TrainConfig(method="grpo", train_batch_size=64, lr=1e-3, seed=2)))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    assert run_title(tmp_path) == "grpo, N=4, lr=0.001, arithmetic, seed 2"
    assert plot_run(tmp_path).is_file()
    assert run_title(tmp_path / "missing") == "missing"  # no config: the directory name, not a crash

"""`vespo sweep`: methods x N (`num_mini_batches`, the paper's staleness ratio gbs/mbs) x seeds on the embedded task,
in parallel processes, resumable.

Every cell uses the same mini-batch (`ppo_mini_batch_size` prompts x `rollout_n` responses) and the same total number of
optimizer steps, hence the same number of samples; only the rollout batch (N mini-batches) changes with N, as in the
paper (fixed mini-batch 256, varying global batch; Sec. 4.1). A cell runs at least `min_rollout_steps` rollout steps:
where `optimizer_steps / N` is fewer, its optimizer steps are scaled up to `min_rollout_steps * N` (stated in the
tables). Outputs: results.csv (one row per cell, final and best held-out accuracy), results.md (mean ± 95% CI over
seeds and the evaluation noise floor; significance: `vespo compare`), fig3_training_reward.png and fig4_dynamics.png
in the style of the paper's Figures 3 and 4.

The package, one job a module: `config` (SweepConfig, Cell, a preset's regime), `cells` (the grid, each cell's
`vespo train` config and identity), `pool` (cells in parallel processes, resumable), `report` (per-cell summaries,
results.csv / results.md), `plots` (the figures) and `command` (`vespo sweep`). The presets are data in
`vespo.experiments.presets`.
"""

from vespo.experiments.sweep.cells import LATER_FIELDS, NOT_IDENTITY, cell_key, cells, optimizer_steps, train_config
from vespo.experiments.sweep.command import cli
from vespo.experiments.sweep.config import SWEEP_OWNED, Cell, SweepConfig, preset_config, resolve, variants
from vespo.experiments.sweep.plots import lr_robustness_figure, plot, plot_lr_robustness
from vespo.experiments.sweep.pool import SWEEP_OUTPUTS, run_cell, sweep, write_cell_config
from vespo.experiments.sweep.report import PROBE_METRICS, read_summary, regime_summary, summarize, write_tables

__all__ = [
    "LATER_FIELDS", "NOT_IDENTITY", "PROBE_METRICS", "SWEEP_OUTPUTS", "SWEEP_OWNED", "Cell", "SweepConfig", "cell_key",
    "cells", "cli", "lr_robustness_figure", "optimizer_steps", "plot", "plot_lr_robustness", "preset_config",
    "read_summary", "regime_summary", "resolve", "run_cell", "summarize", "sweep", "train_config", "variants",
    "write_cell_config", "write_tables",
]  # fmt: skip

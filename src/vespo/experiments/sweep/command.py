"""`vespo sweep [flags]`: the command line of a sweep (a preset's regime is the starting point its flags override)."""

from __future__ import annotations

from pathlib import Path

from vespo.experiments.grid import grid_cli
from vespo.experiments.presets import PRESET_REGIMES
from vespo.experiments.sweep.cells import cells
from vespo.experiments.sweep.config import SweepConfig, preset_config
from vespo.experiments.sweep.pool import sweep


def preset_of(argv: list[str]) -> str | None:
    """The `--preset` that argv names (`--preset X` or `--preset=X`; the last one wins), read before tyro parses argv:
    its regime is the default the other flags override, so a flag always wins, even one naming SweepConfig's own
    default."""
    found = None
    for flag, following in zip(argv, [*argv[1:], ""], strict=True):
        name, eq, value = flag.partition("=")
        if name == "--preset":
            found = value if eq else following
    return found


def cli(argv: list[str]) -> int:
    """`vespo sweep [flags]`."""

    def run(cfg: SweepConfig) -> None:
        sweep(cfg)
        print((Path(cfg.out_dir) / "results.md").read_text())

    description = "Methods x N mini-batches per rollout step x seeds on the embedded task; resumable; tables + figures."
    preset = preset_of(argv)
    default = preset_config(preset) if preset in PRESET_REGIMES else None  # flags override the preset's regime
    return grid_cli("vespo sweep", SweepConfig, argv, description, cells, run, default)

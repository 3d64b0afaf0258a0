"""`vespo lab`: parse and check the settings (`vespo.experiments.lab_config`), then run the grid
(`vespo.experiments.lab`, which imports torch) once they are valid, so `--help` and bad input are answered at once.
A module of its own: the workbench imports the settings, so the settings' module cannot import the workbench."""

from __future__ import annotations

from vespo.experiments.grid import grid_cli
from vespo.experiments.lab_config import LabConfig, cells


def cli(argv: list[str]) -> int:
    """`vespo lab [flags]`: the exact sequence-level workbench, where response length T and N (mini-batches per
    rollout step) are free."""

    def run(cfg: LabConfig) -> None:
        from vespo.experiments import lab  # torch

        lab.lab(cfg)

    return grid_cli("vespo lab", LabConfig, argv, cli.__doc__, cells, run)

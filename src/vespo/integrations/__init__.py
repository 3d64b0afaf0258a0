"""Adapters of vespo's losses to other trainers: `trl` (TRL's `GRPOTrainer`) and `verl` (veRL's policy-loss
registry). Each imports its engine, which the core install does not have, through `engine_names`."""

from __future__ import annotations

import importlib


def engine_names(integration: str, engine: str, hint: str, module: str, *names: str) -> tuple[object, ...]:
    """`names` of the engine's `module`, imported; a missing module raises ModuleNotFoundError in one line naming
    the integration, the engine and how to install it (`hint`)."""
    try:
        found = importlib.import_module(module)
        return tuple(getattr(found, name) for name in names)
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(f"{integration} needs {engine} ({err}): {hint}", name=err.name) from err

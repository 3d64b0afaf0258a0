"""What `vespo lab` and `vespo sweep` share as grids: a cell's identity and the command-line entry."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from typing import TypeVar

import tyro

C = TypeVar("C")


def settings_key(settings: dict) -> str:
    """A cell's identity: a short hash of every setting it depends on, so a finished cell is reused only for exactly
    the same settings."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=repr).encode()).hexdigest()[:12]


def grid_cli(prog: str, config: type[C], argv: list[str], description: str, plan: Callable, run: Callable) -> int:
    """Parse `config` from argv, let `plan` refuse bad settings (ValueError -> one line, exit 2) before any compute,
    then `run` the grid."""
    cfg = tyro.cli(config, args=argv, prog=prog, description=description)
    try:
        plan(cfg)
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    run(cfg)
    return 0

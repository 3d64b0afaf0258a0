"""What `vespo lab` and `vespo sweep` share as grids: a cell's identity and the command-line entry."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from vespo.argv import parse_flags
from vespo.deadline import sigterm_as_interrupt
from vespo.outputs import OutputError, OwnedDir, claim, read_regular

C = TypeVar("C")


def settings_key(settings: dict) -> str:
    """A cell's identity: a short hash of every setting it depends on, so a finished cell is reused only for exactly
    the same settings."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=repr).encode()).hexdigest()[:12]


def claim_grid_dir(
    kind: str, out_dir: str, outputs: tuple[str, ...], *, overwrite: bool, columns: set[str]
) -> OwnedDir:
    """Claim a grid's output directory (`vespo.outputs.claim`). A directory vespo marked continues the grid (finished
    cells are reused, tables rebuilt from them); with `overwrite` its outputs are deleted first. An unmarked one is
    taken as an earlier vespo's output of this grid when its results.csv has the grid's `columns`."""

    def legacy(path: Path) -> bool:
        try:
            head = read_regular(path / "results.csv", 1 << 12).decode()
        except (OSError, UnicodeDecodeError):
            return False
        return columns <= set(head.splitlines()[0].strip().split(",") if head else ())

    out = claim(out_dir, kind, outputs, label="out_dir", overwrite=overwrite, legacy=legacy)
    if overwrite:
        try:
            out.clear()  # refused while a cell's `vespo train` still holds its run dir: nothing is deleted
        except OutputError:
            out.release()
            raise
    return out


class GridInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a grid after it stopped its workers; the message says what was kept."""


def grid_cli(
    prog: str,
    config: type[C],
    argv: list[str],
    description: str,
    plan: Callable,
    run: Callable,
    default: C | None = None,
) -> int:
    """Parse `config` from argv (flags override `default`, e.g. a preset's settings), let `plan` refuse bad settings,
    and `run` refuse an output directory it may not write (ValueError -> one line, exit 2), both before any compute;
    then `run` the grid. A flag that cannot be parsed is one line too (`vespo.argv.parse_flags`)."""
    try:
        cfg = parse_flags(config, argv, prog=prog, description=description, default=default)
        plan(cfg)
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    try:
        with sigterm_as_interrupt():
            run(cfg)
    except OutputError as exc:  # raised by the claim, before the grid's first cell
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        return interrupted(prog, exc)
    return 0


def interrupted(prog: str, exc: KeyboardInterrupt) -> int:
    """Ctrl-C of a grid command: one line saying what was kept, exit 130 (128 + SIGINT), as `vespo train`."""
    kept = str(exc) if isinstance(exc, GridInterrupted) else "finished cells are kept; the same command continues"
    print(f"{prog}: interrupted; {kept}", file=sys.stderr)
    return 130

"""Grading a batch with TRL's reward call, fn(completions, **columns) -> list[float]: the one path the sync trainer,
the async samplers and a user's reward function share."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch

G = TypeVar("G")


class GraderHostError(RuntimeError):
    """The grading host failed (disk full, out of file descriptors, a checker that cannot start, a dead channel):
    never scored as a wrong answer; the trainer stops with one line and the last checkpoint kept."""


@dataclass
class Scores(Generic[G]):
    """A graded batch (`score_math`, `score_code`): per-item grades, their scores, and counts to log."""

    grades: list[G] = field(default_factory=list)

    @property
    def scores(self) -> list[float]:
        return [g.score for g in self.grades]

    def metrics(self, prefix: str) -> dict[str, float]:
        """Accuracy (mean score) and the number of wall-clock timeouts, under `prefix`."""
        timeouts = float(sum(g.timed_out for g in self.grades))
        return {f"{prefix}accuracy": sum(self.scores) / max(len(self.grades), 1), f"{prefix}timeouts": timeouts}


def load_reward_fn(spec: str) -> Callable[..., list[float]]:
    """Import the `module:function` reward and check it can be called as fn(completions, **columns); a bad spec is a
    one-line ValueError."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"reward_fn must look like 'module:function', got {spec!r}")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(f"reward_fn: cannot import module {module!r} ({exc})") from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise ValueError(f"reward_fn: module {module!r} has no function {name!r}")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return fn  # builtins without a signature: trust the caller
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    if not positional:
        raise ValueError(f"reward_fn: {spec} is not a reward function fn(completions, **columns) -> list[float]")
    return fn


def reward_columns(records: list[dict]) -> list[str]:
    """The fields every record has besides the prompt: what the reward function receives as keyword lists."""
    return sorted(set.intersection(*(set(r) for r in records)) - {"prompt"})


def check_reward_columns(spec: str, columns: list[str]) -> None:
    """The reward function can be called as fn(completions, **columns) with the dataset's columns (ValueError)."""
    fn = load_reward_fn(spec)
    try:
        inspect.signature(fn).bind([], **dict.fromkeys(columns))
    except TypeError as exc:
        code = "tests" in columns
        hint = " (code records {prompt, tests} need --reward-fn vespo.rewards:code_reward)" if code else ""
        raise ValueError(
            f"reward_fn {spec} cannot be called as fn(completions, **columns) with the dataset's columns {columns}: "
            f"{exc}{hint}"
        ) from None
    except ValueError:  # no signature to check
        pass


def grade_batch(reward_fn: Callable[..., list[float]], completions: list[str], records: list[dict], n: int):
    """Rewards (B,) of `n` consecutive completions per record, with TRL's call fn(completions, **columns)."""
    columns = {k: [r[k] for r in records for _ in range(n)] for k in reward_columns(records)}
    rewards = reward_fn(completions, **columns)
    if len(rewards) != len(completions):
        raise RuntimeError(f"reward function returned {len(rewards)} rewards for {len(completions)} completions")
    return torch.tensor([float(r) for r in rewards], dtype=torch.float32)  # (B,)

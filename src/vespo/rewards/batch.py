"""Grading a batch with TRL's reward call, fn(completions, **columns) -> list[float]: the one path the sync trainer,
the async samplers and a user's reward function share."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

import torch

from vespo.sandbox import GraderHostError as GraderHostError  # re-exported: the math grader's pool raises it

G = TypeVar("G")


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


class RewardList(list):
    """What a vespo reward function returns: TRL's list of floats, which also carries the batch's grading counts
    (``metrics``, e.g. verifier errors) for the trainer to log."""

    def __init__(self, scores: list[float], metrics: dict[str, float]):
        super().__init__(scores)
        self.metrics = dict(metrics)


def load_reward_fn(spec: str) -> Callable[..., list[float]]:
    """The reward `module:function` (an importable module) or `path/to/file.py:function` (a Python file, relative to
    the working directory), checked to be callable as fn(completions, **columns); a bad spec is a one-line
    ValueError."""
    module, sep, name = spec.rpartition(":")
    if not sep or not module or not name:
        raise ValueError(f"reward_fn must look like 'module:function' or 'path/to/file.py:function', got {spec!r}")
    if module.endswith(".py") or "/" in module or "\\" in module:
        mod = _load_file(module, spec)
    else:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            local = Path(f"{module.replace('.', '/')}.py")
            hint = (
                f"; {local} is here, but the working directory is not on the import path: give the file, "
                f"--reward-fn ./{local}:{name}"
                if local.is_file()
                else "; give an installed module, or a file as --reward-fn path/to/file.py:function"
            )
            raise ValueError(f"reward_fn: cannot import module {module!r} ({exc}){hint}") from None
        except Exception as exc:  # the module itself fails while importing
            raise ValueError(f"reward_fn: importing {module!r} failed: {type(exc).__name__}: {exc}") from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise ValueError(f"reward_fn: {module} has no function {name!r}")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return fn  # builtins without a signature: trust the caller
    if {"solution_str", "ground_truth"} <= {p.name for p in params}:
        return verl_reward(fn)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    if not positional:
        raise ValueError(f"reward_fn: {spec} is not a reward function fn(completions, **columns) -> list[float]")
    return fn


def verl_reward(compute_score: Callable) -> Callable[..., list[float]]:
    """A veRL reward function, compute_score(data_source, solution_str, ground_truth, extra_info) -> float or
    {"score": float, ...}, called once per completion, as a TRL-style one: fn(completions, answer, **columns), the
    record's answer as ground_truth and its `data_source` / `extra_info` columns when it has them (veRL's parquet)."""

    def reward(completions: list[str], answer: list[str], **columns) -> list[float]:
        n = len(completions)
        sources, extras = columns.get("data_source", [""] * n), columns.get("extra_info", [None] * n)
        scores = []
        for text, truth, source, extra in zip(completions, answer, sources, extras, strict=True):
            score = compute_score(data_source=source, solution_str=text, ground_truth=truth, extra_info=extra)
            scores.append(score["score"] if isinstance(score, dict) else score)
        return scores

    reward.__name__ = getattr(compute_score, "__name__", "compute_score")
    return reward


def _load_file(path: str, spec: str):
    """The module of a reward file, executed once per process (a second load of the same file reuses it)."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ValueError(f"reward_fn: no such file {path} (in {spec!r})")
    name = f"_vespo_reward_{hashlib.sha256(str(file).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, file)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"reward_fn: {path} is not a Python file")
    mod = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = mod
    try:
        module_spec.loader.exec_module(mod)
    except Exception as exc:  # a syntax error or a failing import inside the user's file: one line naming it
        del sys.modules[name]
        raise ValueError(f"reward_fn: loading {path} failed: {type(exc).__name__}: {exc}") from None
    return mod


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


def grade_batch(
    reward_fn: Callable[..., list[float]], completions: list[str], records: list[dict], n: int
) -> tuple[torch.Tensor, dict[str, float]]:
    """Rewards (B,) of `n` consecutive completions per record, with TRL's call fn(completions, **columns), and the
    grading counts the function reported (`RewardList.metrics`; empty for a plain list)."""
    columns = {k: [r[k] for r in records for _ in range(n)] for k in reward_columns(records)}
    rewards = reward_fn(completions, **columns)
    if len(rewards) != len(completions):
        raise RuntimeError(f"reward function returned {len(rewards)} rewards for {len(completions)} completions")
    return torch.tensor([float(r) for r in rewards], dtype=torch.float32), dict(getattr(rewards, "metrics", {}))

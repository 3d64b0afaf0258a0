"""What a run shows while it trains: the progress bar over rollout steps and, after this process's first step, one
line with the time the run still needs (`time_estimate`)."""

from __future__ import annotations

import time


def time_estimate(total: int, eval_every: int, step: int, step_s: float, eval_s: float | None) -> str | None:
    """One line: the time a run of `total` rollout steps (held-out evaluation every `eval_every`) still needs after
    rollout step `step`, for any model, from that step's time `step_s` and one held-out evaluation's `eval_s` (0: none
    are run; None: not timed yet, left out and said so); None when no step is left."""
    left = total - step
    if left <= 0:
        return None
    evals = 0 if eval_s == 0 else sum(s % eval_every == 0 or s == total for s in range(step + 1, total + 1))
    seconds = left * step_s + evals * (eval_s or 0.0)
    parts = f"{left} more step{'s' * (left > 1)} x {_duration(step_s)}"
    if evals:
        each = "not timed yet" if eval_s is None else f"x {_duration(eval_s)}"
        parts += f" + {evals} evaluation{'s' * (evals > 1)} {each}"
    done = time.strftime("%H:%M", time.localtime(time.time() + seconds))
    return f"vespo train: step {step} took {_duration(step_s)}, about {_duration(seconds)} left ({parts}), done ~{done}"


def _duration(seconds: float) -> str:
    """12.3 s, 4.5 min, 3.2 h."""
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


def progress_bar(total: int, start: int, method: str):
    """A tqdm bar over a run's `total` rollout steps, from `start`, labelled with its method."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, desc=f"vespo train [{method}]", unit="step")

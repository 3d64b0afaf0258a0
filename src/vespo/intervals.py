"""Real intervals written as in maths ("[0, 1)", "(0, inf)"): the one way vespo states and checks a numeric range,
for loss hyperparameters (the registry) and run settings (the trainer's config) alike."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    """A real interval, e.g. "(0, inf)" or "[0, 1)"; `reason` cites where it comes from."""

    text: str
    reason: str = ""

    def __post_init__(self) -> None:
        match = re.fullmatch(r"([\[(])\s*(\S+)\s*,\s*(\S+)\s*([\])])", self.text.strip())
        if match is None:
            raise ValueError(f"interval must look like '(0, inf)' or '[0, 1)', got {self.text!r}")
        object.__setattr__(self, "_parsed", (match[1] == "[", float(match[2]), float(match[3]), match[4] == "]"))

    def contains(self, x: float) -> bool:
        lo_closed, lo, hi, hi_closed = self._parsed
        return (x > lo or (lo_closed and x == lo)) and (x < hi or (hi_closed and x == hi))

    def violation(self, name: str, value: float) -> str | None:
        """None when `value` is finite and inside; else one line naming `name`, what is accepted and the `reason`
        (integers bounded only below read "an integer >= k")."""
        if math.isfinite(value) and self.contains(value):
            return None
        lo_closed, lo, hi, _ = self._parsed
        why = f" ({self.reason})" if self.reason else ""
        if isinstance(value, int) and not isinstance(value, bool):
            if hi == math.inf:
                return f"{name} must be an integer >= {lo if lo_closed else lo + 1:g}{why}, got {value}"
            return f"{name} must be an integer in {self.text}{why}, got {value}"
        return f"{name} must be a finite number in {self.text}{why}, got {value!r}"

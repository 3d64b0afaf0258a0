"""Statistics over seeds for the harness's tables: mean ± 95% CI, Welch's t-test, a paired bootstrap over seeds,
Holm's correction for many comparisons, and the binomial noise floor of a held-out evaluation.

Pure functions of plain lists; a difference is called significant only by `compare`, with the test and the number
of comparisons stated.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

LEVEL = 0.95


def mean_ci(values: list[float], level: float = LEVEL) -> tuple[float, float]:
    """(mean, half-width of the Student-t confidence interval); half-width is nan for fewer than 2 values."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return math.nan, math.nan
    if x.size < 2:
        return float(x.mean()), math.nan
    sem = x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean()), float(_st.t.ppf(0.5 + level / 2, x.size - 1) * sem)


def format_ci(values: list[float], digits: int = 3) -> str:
    """ "mean ± half-width" (95% CI), or the mean alone with "(n=1)" when there is one value: never a fake ± 0."""
    mean, half = mean_ci(values)
    if math.isnan(mean):
        return "–"
    if math.isnan(half):
        return f"{mean:.{digits}f} (n=1)"
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


def welch(a: list[float], b: list[float]) -> float:
    """Two-sided p-value of Welch's t-test for a difference of means (unequal variances); 1.0 when undefined (fewer
    than 2 values a side, or both sides constant and equal)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 2 or b.size < 2:
        return 1.0
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    if va + vb == 0:
        return 1.0 if a.mean() == b.mean() else 0.0
    t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    return float(2 * _st.t.sf(abs(t), df))


def paired_bootstrap(a: list[float], b: list[float], *, n_boot: int = 10_000, seed: int = 0) -> float:
    """Two-sided p-value of the paired bootstrap over seeds for mean(a - b) (a[i], b[i] share seed i): resample the
    differences, centre them (the null), and count resampled means at least as far from 0 as the observed one."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if d.size < 2:
        return 1.0
    observed = d.mean()
    centred = d - observed
    rng = np.random.default_rng(seed)
    means = centred[rng.integers(0, d.size, size=(n_boot, d.size))].mean(1)
    return float((np.sum(np.abs(means) >= abs(observed) - 1e-15) + 1) / (n_boot + 1))


def holm(p_values: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (family-wise error control over all the comparisons given)."""
    m = len(p_values)
    order = np.argsort(p_values)
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted.tolist()


def binomial_sd(p: float, n: int) -> float:
    """SD of an accuracy estimated from n independent 0/1 scores with success rate p (the evaluation noise floor)."""
    return math.sqrt(max(p * (1 - p), 0.0) / n)


def markdown_grid(
    rows: list[str], columns: list, cell: Callable[[str, object], str], first: str = "variant"
) -> list[str]:
    """A markdown table with one row per name in `rows` and one column per staleness N in `columns`."""
    lines = [f"| {first} | " + " | ".join(f"N={c}" for c in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    return lines + [f"| {r} | " + " | ".join(cell(r, c) for c in columns) + " |" for r in rows]


@dataclass(frozen=True)
class Comparison:
    """One method against the baseline in one column (e.g. one staleness N)."""

    column: object
    method: str
    diff: float  # mean(method) - mean(baseline)
    p: float  # raw p-value of the test
    p_adjusted: float  # Holm-adjusted over every comparison of the table
    n: tuple[int, int]  # seeds per side

    def significant(self, alpha: float = 0.05) -> bool:
        return self.p_adjusted < alpha


def compare(
    groups: dict[tuple[str, object], dict[int, float]], baseline: str, *, test: str = "welch"
) -> list[Comparison]:
    """Every method against `baseline` in every column: `groups[(method, column)] = {seed: value}`. `test` is
    "welch" (unpaired) or "bootstrap" (paired over the seeds both sides share). p-values are Holm-adjusted over all
    the comparisons returned."""
    if test not in ("welch", "bootstrap"):
        raise ValueError(f"test must be 'welch' or 'bootstrap', got {test!r}")
    raw = []
    for (method, column), values in groups.items():
        base = groups.get((baseline, column))
        if method == baseline or base is None:
            continue
        if test == "welch":
            a, b = list(values.values()), list(base.values())
            p = welch(a, b)
        else:
            seeds = sorted(set(values) & set(base))
            a, b = [values[s] for s in seeds], [base[s] for s in seeds]
            p = paired_bootstrap(a, b)
        raw.append((column, method, float(np.mean(a) - np.mean(b)) if a and b else math.nan, p, (len(a), len(b))))
    adjusted = holm([r[3] for r in raw]) if raw else []
    return [Comparison(c, m, d, p, q, n) for (c, m, d, p, n), q in zip(raw, adjusted, strict=True)]

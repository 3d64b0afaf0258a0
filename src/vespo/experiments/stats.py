"""Statistics over seeds for the harness's tables: mean ± 95% CI; paired tests (paired t, Wilcoxon signed-rank, a
paired bootstrap p-value and CI) for the harness's paired design; Fisher's exact test on collapse counts; Welch's
t-test for unpaired designs; Holm's correction for many comparisons; the binomial noise floor of an evaluation; the
power of the paired t-test and the minimal detectable difference (MDD) of a design, fixed before it runs.

The harness's design is paired: a seed fixes the initial policy (the lab's `init_seed`, the sweep's shared warm
start) and the random streams of every method, so two methods' runs with the same seed are a pair (at N = 1 methods
that take the same step give identical runs). A paired test removes the seed effect that an unpaired one counts as
noise. Outcomes that are bimodal (a seed either collapses or learns) are compared on their collapse counts with
Fisher's exact test, never with a t-test. `choose_test` states the rule; `compare` applies it per comparison.

Pure functions of plain lists; a difference is called significant only by `compare`, with the test and the number
of comparisons stated. scipy (1.4 s to import) is imported by the functions that use it, so `vespo compare --help`
answers at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
POWER = 0.8
"""Power at which a design's minimal detectable difference is stated (`minimal_detectable_difference`)."""


def mean_ci(values: list[float], level: float = LEVEL) -> tuple[float, float]:
    """(mean, half-width of the Student-t confidence interval); half-width is nan for fewer than 2 values."""
    from scipy.stats import t as t_dist

    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return math.nan, math.nan
    if x.size < 2:
        return float(x.mean()), math.nan
    sem = x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean()), float(t_dist.ppf(0.5 + level / 2, x.size - 1) * sem)


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
    from scipy.stats import t as t_dist

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 2 or b.size < 2:
        return 1.0
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    if va + vb == 0:
        return 1.0 if a.mean() == b.mean() else 0.0
    t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    return float(2 * t_dist.sf(abs(t), df))


def _differences(a: list[float], b: list[float]) -> np.ndarray:
    """d = a - b per pair (a[i] and b[i] share seed i); ValueError when the lengths differ."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired samples need equal lengths, got {a.size} and {b.size}")
    return a - b


def paired_t(a: list[float], b: list[float]) -> float:
    """Two-sided p-value of the paired t-test (scipy's ttest_rel): t = mean(d) / (sd(d) / sqrt(n)), n - 1 degrees
    of freedom, d = a - b. 1.0 when undefined (fewer than 2 pairs); with every difference equal, 1.0 if they are 0
    and 0.0 otherwise (a constant nonzero shift, as `welch` treats two constant sides)."""
    from scipy.stats import t as t_dist

    d = _differences(a, b)
    if d.size < 2:
        return 1.0
    sd = d.std(ddof=1)
    if sd == 0:
        return 1.0 if d.mean() == 0 else 0.0
    t = d.mean() / (sd / math.sqrt(d.size))
    return float(2 * t_dist.sf(abs(t), d.size - 1))


WILCOXON_EXACT_MAX = 200
"""Largest number of nonzero differences for which `wilcoxon` computes its exact null distribution."""


def wilcoxon(a: list[float], b: list[float]) -> float:
    """Two-sided p-value of the Wilcoxon signed-rank test of d = a - b against a distribution symmetric about 0.

    Differences are rounded to 12 decimals first, so that float noise in a - b neither breaks a tie nor makes a zero
    nonzero. Zero differences are dropped (Wilcoxon's convention, scipy's `zero_method="wilcox"`); |d| is ranked
    with ties given their mean rank; the statistic is T+ = the sum of the ranks of the positive differences. Exact
    for up to `WILCOXON_EXACT_MAX` nonzero differences, ties included: under the null each sign is + or - with
    probability 1/2 independently, so the distribution of T+ given the (mid)ranks is computed exactly by dynamic
    programming over the doubled ranks (integers), and p = min(1, 2 min(P(T+ <= t), P(T+ >= t))). Beyond that,
    the normal approximation with the tie-corrected variance n(n+1)(2n+1)/24 - sum(t^3 - t)/48 and no continuity
    correction (scipy's `method="approx"`). 1.0 when every difference is 0.

    With n pairs the smallest attainable p is 2 / 2^n: 0.0625 for 5 seeds, so the test cannot reach 0.05 below 6.
    """
    from scipy.stats import norm, rankdata

    d = np.round(_differences(a, b), 12)  # float noise of a - b (1e-17) must not break a tie or a zero
    d = d[d != 0]
    n = d.size
    if n == 0:
        return 1.0
    ranks = rankdata(np.abs(d))  # midranks for ties
    t_plus = ranks[d > 0].sum()
    if n > WILCOXON_EXACT_MAX:
        _, counts = np.unique(np.abs(d), return_counts=True)
        var = n * (n + 1) * (2 * n + 1) / 24 - (counts**3 - counts).sum() / 48
        z = (t_plus - n * (n + 1) / 4) / math.sqrt(var)
        return float(2 * norm.sf(abs(z)))
    doubled = np.rint(2 * ranks).astype(int)  # midranks are multiples of 1/2
    dist = np.zeros(doubled.sum() + 1)
    dist[0] = 1.0
    for r in doubled:  # rank r (>= 2 doubled) with sign + (adds r) or - (adds 0), probability 1/2 each
        shifted = np.zeros_like(dist)
        shifted[r:] = dist[:-r]
        dist = 0.5 * (dist + shifted)
    t = int(round(2 * t_plus))
    low, high = dist[: t + 1].sum(), dist[t:].sum()
    return float(min(1.0, 2 * min(low, high)))


def _bootstrap_means(d: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """Means of `n_boot` resamples of d with replacement (seeded)."""
    rng = np.random.default_rng(seed)
    return d[rng.integers(0, d.size, size=(n_boot, d.size))].mean(1)


def paired_bootstrap(a: list[float], b: list[float], *, n_boot: int = 10_000, seed: int = 0) -> float:
    """Two-sided p-value of the paired bootstrap over seeds for mean(a - b) (a[i], b[i] share seed i): resample the
    differences, centre them (the null), and count resampled means at least as far from 0 as the observed one."""
    d = _differences(a, b)
    if d.size < 2:
        return 1.0
    observed = d.mean()
    means = _bootstrap_means(d - observed, n_boot, seed)
    return float((np.sum(np.abs(means) >= abs(observed) - 1e-15) + 1) / (n_boot + 1))


def paired_bootstrap_ci(
    a: list[float], b: list[float], level: float = LEVEL, *, n_boot: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """(mean(a - b), low, high): the percentile bootstrap confidence interval of the mean paired difference, from
    `n_boot` seeded resamples of the differences (scipy's `bootstrap(..., method="percentile")` up to resampling
    noise). With fewer than 2 pairs the interval is (nan, nan)."""
    d = _differences(a, b)
    if d.size == 0:
        return math.nan, math.nan, math.nan
    if d.size < 2:
        return float(d.mean()), math.nan, math.nan
    means = _bootstrap_means(d, n_boot, seed)
    low, high = np.percentile(means, [50 * (1 - level), 50 * (1 + level)])
    return float(d.mean()), float(low), float(high)


def fisher_exact(events_a: int, n_a: int, events_b: int, n_b: int) -> float:
    """Two-sided p-value of Fisher's exact test on the 2x2 table [[events_a, n_a - events_a], [events_b, n_b -
    events_b]] (e.g. collapsed seeds out of seeds per method): under the null, with the margins fixed, events_a is
    hypergeometric; p sums the probabilities of every table no more likely than the observed one (relative slack
    1e-7, scipy's convention). 1.0 when a side is empty. Example: 0/5 vs 3/5 collapsed gives p = 0.167."""
    from scipy.stats import hypergeom

    if not (0 <= events_a <= n_a and 0 <= events_b <= n_b):
        raise ValueError(f"need 0 <= events <= n on both sides, got {events_a}/{n_a} and {events_b}/{n_b}")
    if n_a == 0 or n_b == 0:
        return 1.0
    total, events = n_a + n_b, events_a + events_b
    support = np.arange(max(0, events - n_b), min(events, n_a) + 1)
    pmf = hypergeom.pmf(support, total, events, n_a)
    observed = hypergeom.pmf(events_a, total, events, n_a)
    return float(min(1.0, pmf[pmf <= observed * (1 + 1e-7)].sum()))


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


def paired_t_power(diff: float, sd: float, n: int, alpha: float) -> float:
    """Power of the two-sided paired t-test at level `alpha` over `n` pairs whose differences have SD `sd`, when their
    true mean is `diff`: P(|T| > t_{1 - alpha/2, n-1}) with T noncentral t, n - 1 degrees of freedom, noncentrality
    diff sqrt(n) / sd (exact, scipy's `nct`). nan for fewer than 2 pairs; with sd = 0, 1 for a nonzero diff and alpha
    for diff = 0 (a constant shift is always detected, as `paired_t` treats it)."""
    from scipy.stats import nct
    from scipy.stats import t as t_dist

    if n < 2:
        return math.nan
    if sd == 0:
        return 1.0 if diff != 0 else alpha
    df, nc = n - 1, abs(diff) * math.sqrt(n) / sd
    crit = t_dist.ppf(1 - alpha / 2, df)
    return float(nct.sf(crit, df, nc) + nct.sf(crit, df, -nc))  # upper and lower rejection regions


def minimal_detectable_difference(sd: float, n: int, alpha: float, power: float = POWER) -> float:
    """The smallest true mean difference the two-sided paired t-test at level `alpha` detects with probability `power`
    over `n` pairs with SD `sd` of their differences: the root of `paired_t_power` (monotone in diff), exact. For a
    family of m comparisons under Holm, pass alpha / m, the level Holm's first step tests at (a difference that must
    be found among nulls needs it; later steps are looser, so this bounds every comparison's MDD from above).
    nan for fewer than 2 pairs or a non-finite sd; 0 for sd = 0."""
    from scipy.optimize import brentq

    if n < 2 or not math.isfinite(sd):
        return math.nan
    if sd == 0:
        return 0.0
    high = sd
    while paired_t_power(high, sd, n, alpha) < power:  # bracket the root; power -> 1 as diff grows
        high *= 2
    return float(brentq(lambda d: paired_t_power(d, sd, n, alpha) - power, 0.0, high, xtol=1e-12 * sd, rtol=1e-12))


def seeds_for(target: float, sd: float, alpha: float, power: float = POWER, most: int = 200) -> int | None:
    """The fewest pairs (seeds) at which the paired t-test at level `alpha` detects a true difference `target` with
    `power`, given the SD `sd` of the paired differences; None when even `most` seeds do not."""
    for n in range(2, most + 1):
        if minimal_detectable_difference(sd, n, alpha, power) <= target:
            return n
    return None


def binomial_sd(p: float, n: int) -> float:
    """SD of an accuracy estimated from n independent 0/1 scores with success rate p (the evaluation noise floor)."""
    return math.sqrt(max(p * (1 - p), 0.0) / n)


def markdown_grid(
    rows: list[str], columns: list, cell: Callable[[str, object], str], first: str = "variant"
) -> list[str]:
    """A markdown table with one row per name in `rows` and one column per N in `columns`."""
    lines = [f"| {first} | " + " | ".join(f"N={c}" for c in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    return lines + [f"| {r} | " + " | ".join(cell(r, c) for c in columns) + " |" for r in rows]


TESTS = ("auto", "paired_t", "wilcoxon", "bootstrap", "welch", "fisher")
"""`compare`'s tests: "auto" picks one per comparison (`choose_test`)."""
TEST_NAMES = {
    "paired_t": "paired t-test over seeds",
    "wilcoxon": "Wilcoxon signed-rank test over seeds (exact)",
    "bootstrap": "paired bootstrap over seeds (10,000 resamples)",
    "welch": "Welch's t-test (unpaired)",
    "fisher": "Fisher's exact test on collapsed seeds",
}


def choose_test(
    a: dict[int, float],
    b: dict[int, float],
    collapsed_a: dict[int, bool] | None = None,
    collapsed_b: dict[int, bool] | None = None,
) -> str:
    """The test that fits one comparison of `{seed: value}` samples:

    - "fisher" when collapse flags are given and a seed of either side collapsed: the outcome is then bimodal (a
      collapsed seed sits near 0, the others near their ceiling), a t-test's normal model does not hold, and what
      differs is how often a method collapses;
    - else "paired_t" when both sides ran the same seeds (at least 2): a seed fixes the initial policy and the random
      streams of every method, so the design is paired;
    - else "welch" (unpaired: the seeds differ)."""
    if collapsed_a is not None and collapsed_b is not None and (any(collapsed_a.values()) or any(collapsed_b.values())):
        return "fisher"
    if set(a) == set(b) and len(a) >= 2:
        return "paired_t"
    return "welch"


@dataclass(frozen=True)
class Comparison:
    """One method against the baseline in one column (e.g. one N)."""

    column: object
    method: str
    diff: float  # mean(method) - mean(baseline)
    p: float  # raw p-value of the test
    p_adjusted: float  # Holm-adjusted over every comparison of the table
    n: tuple[int, int]  # seeds per side
    test: str = "welch"  # the test that gave p (a key of TEST_NAMES)
    collapsed: tuple[int, int] | None = None  # collapsed seeds per side, when collapse flags were given
    sd: float = math.nan  # SD of the paired differences over seeds (paired tests; nan otherwise)
    family: int = 1  # comparisons in the Holm family this one was corrected over

    def significant(self, alpha: float = 0.05) -> bool:
        return self.p_adjusted < alpha

    def mdd(self, alpha: float = 0.05, power: float = POWER) -> float:
        """The minimal detectable difference of this comparison's design (`minimal_detectable_difference` at Holm's
        first-step level alpha / family, the measured SD and seeds); nan where it is not a paired t-test."""
        if self.test != "paired_t":
            return math.nan
        return minimal_detectable_difference(self.sd, self.n[0], alpha / self.family, power)


def compare(
    groups: dict[tuple[str, object], dict[int, float]],
    baseline: str,
    *,
    test: str = "auto",
    collapsed: dict[tuple[str, object], dict[int, bool]] | None = None,
) -> list[Comparison]:
    """Every method against `baseline` in every column: `groups[(method, column)] = {seed: value}`, and optionally
    `collapsed[(method, column)] = {seed: collapsed?}`. `test` is one of `TESTS`: "auto" (per comparison, the test
    `choose_test` picks), "paired_t", "wilcoxon" or "bootstrap" (paired over the seeds both sides share), "welch"
    (unpaired) or "fisher" (collapse counts; needs `collapsed`). p-values are Holm-adjusted over all the comparisons
    returned; each comparison keeps the SD of its paired differences and the family size, for its `mdd`."""
    if test not in TESTS:
        raise ValueError(f"test must be one of {list(TESTS)}, got {test!r}")
    paired = {"paired_t": paired_t, "wilcoxon": wilcoxon, "bootstrap": paired_bootstrap}
    raw = []
    sds = []
    for (method, column), values in groups.items():
        base = groups.get((baseline, column))
        if method == baseline or base is None:
            continue
        flags = [None if collapsed is None else collapsed.get((m, column)) for m in (method, baseline)]
        kind = choose_test(values, base, *flags) if test == "auto" else test
        counts = None if None in flags else (sum(map(bool, flags[0].values())), sum(map(bool, flags[1].values())))
        if kind in paired:
            seeds = sorted(set(values) & set(base))
            a, b = [values[s] for s in seeds], [base[s] for s in seeds]
            p = paired[kind](a, b)
            sd = float(np.std(_differences(a, b), ddof=1)) if len(seeds) >= 2 else math.nan
        else:
            a, b = list(values.values()), list(base.values())
            sd = math.nan
            if kind == "welch":
                p = welch(a, b)
            elif counts is None:
                raise ValueError(f"Fisher's test needs collapse flags for {method!r} and {baseline!r} at {column}")
            else:
                p = fisher_exact(counts[0], len(flags[0]), counts[1], len(flags[1]))
        diff = float(np.mean(a) - np.mean(b)) if a and b else math.nan
        raw.append((column, method, diff, p, (len(a), len(b)), kind, counts))
        sds.append(sd)
    adjusted = holm([r[3] for r in raw]) if raw else []
    return [
        Comparison(c, m, d, p, q, n, k, x, sd, len(raw))
        for (c, m, d, p, n, k, x), q, sd in zip(raw, adjusted, sds, strict=True)
    ]

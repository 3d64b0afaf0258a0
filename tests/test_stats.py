"""Statistics of the harness: hand-computed CI and Holm values, Welch vs scipy, and the comparison detects a known
difference and does not flag a null one (both tests), with bold only where significant."""

import csv
import math

import numpy as np
import pytest
from scipy import stats as st

from vespo.cli import main
from vespo.experiments.stats import binomial_sd, compare, format_ci, holm, mean_ci, paired_bootstrap, welch


def test_mean_ci_by_hand():
    mean, half = mean_ci([1.0, 2.0, 3.0])  # sd 1, sem 1/sqrt(3), t_{0.975, 2} = 4.302653
    assert mean == 2.0 and half == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert format_ci([0.5]) == "0.500 (n=1)"  # one seed: no fake "± 0.00"
    assert format_ci([0.5, 0.5]) == "0.500 ± 0.000"


def test_holm_by_hand():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5]) == [0.5]


def test_welch_matches_scipy_and_binomial_sd():
    a, b = [0.51, 0.55, 0.49, 0.6, 0.52], [0.45, 0.47, 0.5, 0.44]
    assert welch(a, b) == pytest.approx(st.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-10)
    assert welch([1.0], [2.0, 3.0]) == 1.0  # undefined with one value: never significant
    assert binomial_sd(0.5, 2000) == pytest.approx(0.01118, rel=1e-3)  # 500 prompts x avg@4


def _groups(shift: float, seeds=range(5), noise=0.02, seed=0):
    rng = np.random.default_rng(seed)
    base = {s: 0.5 + noise * rng.standard_normal() for s in seeds}
    other = {s: base[s] + shift + noise * rng.standard_normal() for s in seeds}
    return {("grpo", 8): base, ("vespo", 8): other}


@pytest.mark.parametrize("test", ["welch", "bootstrap"])
def test_a_known_difference_is_detected_and_a_null_one_is_not(test):
    (hit,) = compare(_groups(0.2), "grpo", test=test)
    assert hit.significant() and hit.diff == pytest.approx(0.2, abs=0.05)
    for seed in range(5):  # no shift: not significant, whatever the noise draw
        (miss,) = compare(_groups(0.0, seed=seed), "grpo", test=test)
        assert not miss.significant(), (seed, miss)


def test_paired_bootstrap_uses_the_pairing():
    """A small constant gain hidden under a large seed effect: paired finds it, unpaired Welch cannot."""
    base = [0.1, 0.3, 0.5, 0.7, 0.9, 0.2, 0.4, 0.6]
    gain = [b + 0.02 + 0.001 * (i % 2) for i, b in enumerate(base)]
    assert paired_bootstrap(gain, base) < 0.01
    assert welch(gain, base) > 0.5


def test_compare_command_bolds_only_significant_cells(tmp_path):
    rows = []
    rng = np.random.default_rng(1)
    for seed in range(5):
        for n, gap in ((1, 0.0), (64, 0.25)):
            base = 0.5 + 0.02 * rng.standard_normal()
            rows.append({"variant": "grpo", "N": n, "seed": seed, "final_eval_acc": base})
            rows.append({"variant": "vespo", "N": n, "seed": seed, "final_eval_acc": base + gap})
    path = tmp_path / "results.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert main(["compare", str(path), "--out", str(tmp_path / "c.md")]) == 0
    text = (tmp_path / "c.md").read_text()
    assert "Holm-corrected over 2 comparisons" in text
    vespo_row = next(line for line in text.splitlines() if line.startswith("| vespo"))
    n1, n64 = vespo_row.split("|")[2:4]
    assert "**" not in n1 and "**+0.2" in n64

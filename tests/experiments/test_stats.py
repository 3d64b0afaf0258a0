"""Statistics of the harness: hand-computed CI and Holm values; Welch, paired t, Wilcoxon signed-rank, the paired
bootstrap CI and Fisher's exact test against scipy on hand-made data; paired vs unpaired on a paired design; the
comparison picks the test the design calls for, detects a known difference and does not flag a null one, with bold
only where significant."""

import csv
import math

import numpy as np
import pytest
from scipy import stats as st

from vespo.cli import main
from vespo.experiments.stats import (
    binomial_sd,
    choose_test,
    compare,
    fisher_exact,
    format_ci,
    holm,
    mean_ci,
    minimal_detectable_difference,
    paired_bootstrap,
    paired_bootstrap_ci,
    paired_t,
    paired_t_power,
    seeds_for,
    welch,
    wilcoxon,
)


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


@pytest.mark.parametrize("test", ["welch", "bootstrap", "paired_t", "auto"])
def test_a_known_difference_is_detected_and_a_null_one_is_not(test):
    (hit,) = compare(_groups(0.2), "grpo", test=test)
    assert hit.significant() and hit.diff == pytest.approx(0.2, abs=0.05)
    for seed in range(5):  # no shift: not significant, whatever the noise draw
        (miss,) = compare(_groups(0.0, seed=seed), "grpo", test=test)
        assert not miss.significant(), (seed, miss)


def test_paired_tests_use_the_pairing():
    """A small constant gain hidden under a large seed effect: every paired test finds it, unpaired Welch cannot."""
    base = [0.1, 0.3, 0.5, 0.7, 0.9, 0.2, 0.4, 0.6]
    gain = [b + 0.02 + 0.001 * (i % 2) for i, b in enumerate(base)]
    assert paired_bootstrap(gain, base) < 0.01
    assert paired_t(gain, base) < 1e-6 and wilcoxon(gain, base) == pytest.approx(2 / 2**8)  # all 8 signs positive
    mean, low, high = paired_bootstrap_ci(gain, base)
    assert mean == pytest.approx(0.0205) and 0.02 <= low < high <= 0.021
    assert welch(gain, base) > 0.5
    assert st.ttest_rel(gain, base).pvalue < 1e-6 and st.ttest_ind(gain, base, equal_var=False).pvalue > 0.5


def test_paired_t_matches_scipy():
    a, b = [0.51, 0.55, 0.49, 0.6, 0.52, 0.58], [0.45, 0.47, 0.5, 0.44, 0.5, 0.49]
    assert paired_t(a, b) == pytest.approx(st.ttest_rel(a, b).pvalue, rel=1e-12)
    assert paired_t([1.0], [0.0]) == 1.0  # one pair: undefined, never significant
    assert paired_t([1.0, 2.0], [0.5, 1.5]) == 0.0 and paired_t([1.0, 2.0], [1.0, 2.0]) == 1.0  # constant shift
    with pytest.raises(ValueError, match="equal lengths"):
        paired_t([1.0, 2.0], [1.0])


@pytest.mark.parametrize(
    "d",
    [
        [1, 2, -3, 4, 5, 6, 7],  # no ties: scipy's exact distribution
        [1, 2, -3, 4, 5, 5, 6],  # a tie
        [0.1, 0.1, -0.1, 0.2, 0.2, 0.3, -0.3, 0.4, 0.0],  # ties across signs and a zero difference (dropped)
        [2, -2, 2, 2],  # all |d| tied
    ],
)
def test_wilcoxon_is_exact_with_ties_and_matches_scipy(d):
    d = np.asarray(d, dtype=float)
    a, b = list(d), [0.0] * len(d)
    x = d[d != 0]  # exact reference: all 2^n sign flips of the nonzero differences, T+ = sum of positive midranks
    ref = st.permutation_test(
        (x,), lambda z: (st.rankdata(np.abs(z)) * (z > 0)).sum(), permutation_type="samples", n_resamples=np.inf
    ).pvalue
    assert wilcoxon(a, b) == pytest.approx(ref, rel=1e-12)
    assert wilcoxon(a, b) == pytest.approx(st.wilcoxon(d).pvalue, rel=1e-12)  # scipy's default handling agrees
    assert wilcoxon(list(d + 0.7), [0.7] * len(d)) == wilcoxon(a, b)  # float noise in a - b breaks no tie


def test_wilcoxon_by_hand_and_its_normal_approximation():
    # 5 positive differences: P(T+ = 15) = 1/32, two-sided 2/32 -- the smallest p five seeds can give (> 0.05)
    assert wilcoxon([1, 2, 3, 4, 5], [0, 0, 0, 0, 0]) == pytest.approx(0.0625)
    assert wilcoxon([1.0, 2.0], [1.0, 2.0]) == 1.0  # no nonzero difference
    rng = np.random.default_rng(0)
    d = np.round(rng.normal(0.1, 1, 300), 1)  # n > 200: normal approximation with ties, as scipy's "approx"
    assert wilcoxon(list(d), [0.0] * 300) == pytest.approx(st.wilcoxon(d, method="approx").pvalue, rel=1e-9)


def test_paired_bootstrap_ci_matches_scipy():
    a, b = [0.51, 0.55, 0.49, 0.6, 0.52, 0.58], [0.45, 0.47, 0.5, 0.44, 0.5, 0.49]
    mean, low, high = paired_bootstrap_ci(a, b, seed=3)
    d = np.subtract(a, b)
    ref = st.bootstrap((d,), np.mean, method="percentile", n_resamples=10_000, rng=3).confidence_interval
    assert mean == pytest.approx(d.mean())
    assert low == pytest.approx(ref.low, abs=0.004) and high == pytest.approx(ref.high, abs=0.004)  # resampling noise
    assert paired_bootstrap_ci(a, b, seed=3) == (mean, low, high)  # seeded
    assert math.isnan(paired_bootstrap_ci([1.0], [0.0])[1])


@pytest.mark.parametrize(("table"), [(0, 5, 3, 5), (2, 7, 6, 8), (5, 5, 0, 5), (0, 5, 0, 5), (1, 10, 9, 12)])
def test_fisher_exact_matches_scipy(table):
    ka, na, kb, nb = table
    assert fisher_exact(*table) == pytest.approx(st.fisher_exact([[ka, na - ka], [kb, nb - kb]]).pvalue, rel=1e-12)


def test_fisher_on_collapse_counts_where_welch_overstates():
    """Issue 29's case: 0/5 vs 3/5 collapsed seeds. The final values are bimodal; Welch on them says p < 0.05,
    Fisher on the counts p = 1/6 (C(5,3) C(5,0) / C(10,3) = 10/120, twice by symmetry)."""
    stable = {s: v for s, v in enumerate([0.85, 0.84, 0.86, 0.85, 0.83])}
    mixed = {s: v for s, v in enumerate([0.0, 0.01, 0.0, 0.7, 0.75])}
    flags = {("eps", 64): {s: False for s in range(5)}, ("base", 64): {s: s < 3 for s in range(5)}}
    groups = {("eps", 64): stable, ("base", 64): mixed}
    assert welch(list(stable.values()), list(mixed.values())) < 0.05
    (c,) = compare(groups, "base", collapsed=flags)
    assert c.test == "fisher" and c.collapsed == (0, 3) and c.p == pytest.approx(1 / 6) and not c.significant()
    assert fisher_exact(0, 5, 3, 5) == pytest.approx(1 / 6)


def test_choose_test_follows_the_design():
    same = ({0: 1.0, 1: 2.0}, {0: 1.5, 1: 2.5})
    assert choose_test(*same) == "paired_t"  # shared seeds: paired
    assert choose_test({0: 1.0, 1: 2.0}, {2: 1.5, 3: 2.5}) == "welch"  # different seeds: unpaired
    none = {0: False, 1: False}
    assert choose_test(*same, none, none) == "paired_t"
    assert choose_test(*same, none, {0: True, 1: False}) == "fisher"  # a collapse: bimodal outcomes
    with pytest.raises(ValueError, match="collapse flags"):
        compare({("a", 1): same[0], ("b", 1): same[1]}, "b", test="fisher")


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
    assert "Test per comparison, by design" in text and "Used here: paired t-test over seeds [t]" in text
    vespo_row = next(line for line in text.splitlines() if line.startswith("| vespo"))
    n1, n64 = vespo_row.split("|")[2:4]
    assert "**" not in n1 and "**+0.2" in n64 and "[t]" in n64
    assert "regime diagnostics" not in text  # results.csv without them: no empty table


def test_compare_uses_fisher_on_collapsed_cells_and_shows_the_diagnostics(tmp_path):
    rows = []
    for seed in range(5):
        cells = (("grpo", 0.80 + 0.01 * seed, False), ("vespo", 0.0 if seed < 4 else 0.8, seed < 4))
        for variant, acc, collapsed in cells:
            rows.append({"variant": variant, "N": 64, "seed": seed, "final_eval_acc": acc, "best_eval_acc": 0.85,
                         "collapsed": collapsed, "grad_clipped_frac": 0.5, "kl_mu_pi_stalest": 0.01,
                         "log_w_std_stalest": 2.0, "mean_phi_stalest": 0.3 if variant == "vespo" else "nan",
                         "momentum_share_stalest": 0.06})  # fmt: skip
    path = tmp_path / "results.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert main(["compare", str(path), "--out", str(tmp_path / "c.md")]) == 0
    text = (tmp_path / "c.md").read_text()
    assert "Fisher's exact test on collapsed seeds [F]" in text and "✗ 4/5 vs 0/5" in text  # p = 0.048
    assert "regime diagnostics" in text and "clip 0.5 · KL 0.01 · sd log W 2 · φ̄ 0.3 · g-share 0.06" in text
    assert "clip 0.5 · KL 0.01 · sd log W 2 · g-share 0.06" in text  # grpo: no phi, no φ̄
    # the best checkpoint is taken before a collapse: paired t there
    assert main(["compare", str(path), "--metric", "best_eval_acc", "--out", str(tmp_path / "b.md")]) == 0
    assert "[t]" in (tmp_path / "b.md").read_text()


# --------------------------------------------------------------------------------------------------------------------
# power and the minimal detectable difference (issue 43: fixed before the cells run)


def test_mdd_has_the_stated_power_by_simulation():
    """Simulate 40,000 designs of 6 paired seeds whose true difference is the MDD at alpha = 0.01: the paired t-test
    rejects in 80% of them (binomial SE 0.002), and at a true difference of 0 in 1% (the test's size)."""
    n, sd, alpha = 6, 0.02, 0.01
    mdd = minimal_detectable_difference(sd, n, alpha)
    rng = np.random.default_rng(0)
    crit = st.t.ppf(1 - alpha / 2, n - 1)
    for true, want in ((mdd, 0.8), (0.0, alpha)):
        d = rng.normal(true, sd, size=(40_000, n))
        t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
        assert np.mean(np.abs(t) > crit) == pytest.approx(want, abs=0.008)
    assert paired_t_power(0.0, sd, n, alpha) == pytest.approx(alpha, rel=1e-9)
    assert paired_t_power(mdd, sd, n, alpha) == pytest.approx(0.8, abs=1e-9)


def test_mdd_limits_and_the_seeds_it_needs():
    # many seeds: the t-test is the z-test, MDD = (z_{1 - alpha/2} + z_{power}) sd / sqrt(n)
    z = (st.norm.ppf(1 - 0.025) + st.norm.ppf(0.8)) * 0.01 / math.sqrt(4000)
    assert minimal_detectable_difference(0.01, 4000, 0.05) == pytest.approx(z, rel=1e-3)
    # the paper table's VESPO - GRPO at N = 64: SD 0.011 over 5 seeds, Holm over 30 (README)
    assert minimal_detectable_difference(0.011, 5, 0.05 / 30) == pytest.approx(0.0461, abs=5e-5)
    assert minimal_detectable_difference(0.0, 5, 0.05) == 0.0 and math.isnan(minimal_detectable_difference(1, 1, 0.05))
    n = seeds_for(0.03, 0.016, 0.05 / 24)
    assert (
        minimal_detectable_difference(0.016, n, 0.05 / 24)
        <= 0.03
        < minimal_detectable_difference(0.016, n - 1, 0.05 / 24)
    )
    assert seeds_for(1e-6, 1.0, 0.05, most=10) is None


def test_comparisons_keep_their_sd_and_family_for_the_mdd():
    groups = {("vespo", 4): {0: 0.5, 1: 0.6, 2: 0.7}, ("grpo", 4): {0: 0.52, 1: 0.6, 2: 0.75},
              ("gspo", 4): {0: 0.4, 1: 0.5, 2: 0.6}}  # fmt: skip
    by = {c.method: c for c in compare(groups, "vespo")}
    assert by["grpo"].sd == pytest.approx(np.std([0.02, 0.0, 0.05], ddof=1)) and by["grpo"].family == 2
    assert by["grpo"].mdd() == pytest.approx(minimal_detectable_difference(by["grpo"].sd, 3, 0.025))
    assert by["gspo"].sd == pytest.approx(0.0, abs=1e-15) and by["gspo"].mdd() == pytest.approx(0.0, abs=1e-12)
    unpaired = compare({("vespo", 4): {0: 0.5, 1: 0.6}, ("grpo", 4): {2: 0.5, 3: 0.7}}, "vespo")[0]
    assert unpaired.test == "welch" and math.isnan(unpaired.mdd())

"""`vespo reproduce paper`'s verdicts (vespo.experiments.reproduce.paper) on hand-made results rows: the side a
significant difference favours and whether the paper's has the same sign, unresolved; paired tests, Fisher on
collapses, Holm."""

import pytest

from vespo.experiments.presets import PAPER_TABLE
from vespo.experiments.reproduce import paper


def test_verdict_words():
    assert paper.verdict(-0.1, 0.01, -1) == "favours VESPO; same sign as paper"
    assert paper.verdict(+0.1, 0.01, -1) == "favours the baseline; opposite sign to paper"
    assert paper.verdict(-0.1, 0.01, +1) == "favours VESPO; opposite sign to paper"  # never "contradicted"
    assert paper.verdict(-0.1, 0.2, -1) == "unresolved"  # not significant after correction
    assert paper.verdict(-0.1, 0.05, -1) == "unresolved"  # alpha is strict: p must be below it
    assert paper.verdict(float("nan"), 0.01, -1) == "unresolved"


def test_paper_claims_follow_the_papers_table():
    claims = {c["claim"]: c for c in paper.paper_claims()}
    assert len([c for c in claims.values() if isinstance(c["column"], int)]) == 12  # 3 baselines x 4 N
    assert claims["VESPO > SAPO at N=64"]["paper_diff_pct"] == pytest.approx(16.5 - 61.8)
    assert all(c["sign"] == -1 for c in claims.values())  # every claim: the baseline below VESPO
    # degradation from N = 4 to 64: VESPO -8.2, GRPO -5.4 (less than VESPO: no claim), GSPO -12.3, SAPO -48.7
    drops = [c["other"] for c in claims.values() if not isinstance(c["column"], int)]
    assert drops == ["gspo", "sapo"]


def _rows(values: dict[tuple[str, int], list[float]], collapsed: dict[tuple[str, int], list[bool]] | None = None):
    rows = []
    for (v, n), accs in values.items():
        for seed, a in enumerate(accs):
            flag = bool((collapsed or {}).get((v, n), [False] * len(accs))[seed])
            rows.append({"variant": v, "N": str(n), "seed": str(seed), "final_eval_acc": str(a),
                         "best_eval_acc": str(a + 0.01), "collapsed": str(flag), "grad_clipped_frac": "0.02",
                         "kl_mu_pi_stalest": "0.001", "mean_phi_stalest": "0.97" if v == "vespo" else ""})  # fmt: skip
    return rows


def test_verdicts_on_hand_made_rows():
    base = [0.40, 0.45, 0.50, 0.42, 0.47]
    rows = _rows({
        ("vespo", 4): base, ("vespo", 64): base,
        ("grpo", 4): [x - 0.10 + 0.001 * i for i, x in enumerate(base)],  # below in every seed: paired t significant
        ("grpo", 64): [x - 0.10 - 0.001 * i for i, x in enumerate(base)],
        ("gspo", 4): [x + 0.10 + 0.001 * i for i, x in enumerate(base)],  # far above: favours the baseline
        ("gspo", 64): [x + (-1) ** i * 0.02 for i, x in enumerate(base)],  # noise around VESPO: unresolved
        ("sapo", 4): base, ("sapo", 64): base,
    })  # fmt: skip
    found = {(r["claim"], r["metric"]): r for r in paper.verdicts(rows)}
    assert found[("VESPO > GRPO at N=4", "final_eval_acc")]["verdict"] == "favours VESPO; same sign as paper"
    assert found[("VESPO > GRPO at N=4", "final_eval_acc")]["test"] == "paired_t"
    assert found[("VESPO > GSPO at N=4", "best_eval_acc")]["verdict"] == "favours the baseline; opposite sign to paper"
    assert found[("VESPO > GSPO at N=64", "final_eval_acc")]["verdict"] == "unresolved"
    assert found[("VESPO > GRPO at N=16", "final_eval_acc")]["verdict"] == "not run"
    # GSPO drops by 0.10 more than VESPO from N = 4 to 64 in every seed (paired): the paper's degradation claim
    drop = found[("GSPO loses more than VESPO from N=4 to 64", "best_eval_acc")]
    assert drop["verdict"] == "favours VESPO; same sign as paper"
    assert found[("SAPO loses more than VESPO from N=4 to 64", "best_eval_acc")]["verdict"] == "unresolved"
    assert found[("VESPO > GRPO at N=4", "final_eval_acc")]["vespo_mean_phi_stalest"] == pytest.approx(0.97)


def test_collapses_are_tested_by_fisher_and_too_few_are_unresolved():
    base = [0.40, 0.45, 0.50, 0.42, 0.47]
    rows = _rows(
        {("vespo", 64): base, ("sapo", 64): [0.01, 0.01, 0.01, 0.45, 0.47]},
        collapsed={("sapo", 64): [True, True, True, False, False]},
    )
    found = {(r["claim"], r["metric"]): r for r in paper.verdicts(rows)}
    final = found[("VESPO > SAPO at N=64", "final_eval_acc")]
    assert final["test"] == "fisher" and final["collapsed"] == [3, 0]
    assert final["verdict"] == "unresolved"  # 3/5 vs 0/5 collapses: Fisher p = 0.17
    assert final["p_adjusted"] == pytest.approx(0.1667, abs=1e-3)
    assert found[("VESPO > SAPO at N=64", "best_eval_acc")]["test"] == "paired_t"  # best checkpoint: not bimodal


def test_coverage_names_what_of_the_preset_table_is_left_to_run():
    rows = [{"variant": v, "N": str(n), "seed": str(s)} for v in ("vespo", "sapo") for n in (4, 64) for s in range(5)]
    text = paper.coverage(rows)
    assert "not run: variants grpo, gspo, cispo, topr, topr-tokenmean; N = 1, 8, 16." in text
    assert "seeds [" not in text.split("not run:")[1]  # all 5 seeds ran
    full = [{"variant": v, "N": str(n), "seed": str(s)} for v in PAPER_TABLE for n in (1, 4, 8, 16, 64)
            for s in range(5)]  # fmt: skip
    assert "not run" not in paper.coverage(full)


def test_the_committed_verdicts_recompute_bit_identically_from_the_package(tmp_path):
    """Issue 52: `vespo reproduce paper --report-only` on a copy of benchmarks/results/paper_staleness rewrites its
    comparisons and verdicts byte for byte."""
    import shutil
    from pathlib import Path

    table = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "paper_staleness"
    names = ("verdicts.md", "verdicts.json", "verdicts.csv", "compare_vespo_best_eval_acc.md",
             "compare_vespo_final_eval_acc.md", "results.md")  # fmt: skip
    for name in ("results.csv", "results.md"):  # results.md: the sweep's tables, headed by the coverage line
        shutil.copy(table / name, tmp_path / name)
    paper.report(tmp_path)
    for name in names:
        assert (tmp_path / name).read_bytes() == (table / name).read_bytes(), name

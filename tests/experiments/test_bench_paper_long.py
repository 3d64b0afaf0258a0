"""`vespo reproduce paper-long` (vespo.experiments.reproduce): a slice's plan (comparisons, families, seeds chosen by
power), designs written once and dated by git (a plan that does not precede its results is exploratory), the regime
gate deciding which seeds a comparison uses, Holm over the planned family, the MDD under every unresolved verdict, a
slice merge that cannot forge the table, and the probe's split-half ceiling."""

import json
import math
from pathlib import Path

import pytest

from vespo.experiments.compare import load_rows
from vespo.experiments.presets import PRESETS, gate
from vespo.experiments.reproduce import designs, long, plan, registration, slices, verdicts
from vespo.experiments.stats import minimal_detectable_difference, paired_t
from vespo.experiments.sweep import cells

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "benchmarks" / "results" / "paper_long"


def test_a_slice_plan_is_powered_before_any_cell():
    variants = list(PRESETS["paper-long"])
    found = plan.comparisons(variants, (4, 16, 64, 128))
    later = len(plan.LATER)  # the 2025-26 corrections: families of their own, the paper's claims' Holm unchanged
    baselines = len(variants) - 1 - later
    assert plan.families(found) == {"at one N": 4 * baselines, "degradation": baselines,
                                     "at one N · 2025-26 corrections": 4 * later,
                                     "degradation · 2025-26 corrections": later}  # fmt: skip
    by = {c["name"]: c for c in found}
    # the paper's GRPO row for both GRPO variants; its VESPO 61.8 vs GRPO 48.6 at N = 64
    assert by["grpo-dual10 vs VESPO at N=64"]["paper_diff_pct"] == pytest.approx(48.6 - 61.8)
    assert "paper_diff_pct" not in by["grpo vs VESPO at N=128"] and "paper_diff_pct" not in by["cispo vs VESPO at N=4"]
    # SAPO's drop from N = 4 to 64 (65.2 -> 16.5) minus VESPO's (70.0 -> 61.8)
    assert by["sapo's change from N=4 to 64 minus VESPO's"]["paper_diff_pct"] == pytest.approx(-48.7 + 8.2)
    cfg = slices.config(Path("/tmp/unused"), None, 2, variants, [4, 16, 64, 128], smoke=False)
    seeds = len(cfg.seeds)  # the preset's
    for row in plan.plan_rows(variants, (4, 16, 64, 128), seeds):
        sd, m = plan.assumed_sd(row["family"]), row["comparisons"]
        assert row["mdd"] == pytest.approx(minimal_detectable_difference(sd, seeds, 0.05 / m))
        assert row["detects_target"] == (row["mdd"] <= plan.TARGET)
    need = plan.choose_seeds(variants, (4, 16, 64, 128))  # the fewest that detect 0.03 in every family
    mdds = [minimal_detectable_difference(plan.assumed_sd(f), k, 0.05 / m)
            for f, m in plan.families(found).items() for k in (need - 1, need)]  # fmt: skip
    assert max(mdds[1::2]) <= plan.TARGET < max(mdds[0::2])
    assert f"Seeds needed to detect 0.03 in every family: {need} " in plan.plan_text(cfg)
    assert plan.estimate_seconds(cfg) > 0 and "Estimated wall time on 2 cores" in plan.plan_text(cfg)


def _row(v, n, s, acc, gate_text="ok"):
    return {"variant": v, "N": str(n), "seed": str(s), "best_eval_acc": str(acc), "final_eval_acc": str(acc),
            "gate": gate_text, "log_w_std_stalest": "1.5", "clip_frac_stalest": "0.02" if v == "grpo" else "",
            "grad_clipped_frac": "0.01", "probe_cos_grpo": "0.7" if v == "vespo" else "1.0",
            "probe_cos_reinforce": "0.6"}  # fmt: skip


def test_gate_decides_the_seeds_and_holm_runs_over_the_planned_family():
    """GRPO is 0.05 below VESPO in 4 seeds at N = 64, but seed 3's GRPO cell misses the gate: 3 seeds are tested.
    At N = 4 the two tie (noise): unresolved, with the MDD of the measured SD under it."""
    vespo = [0.40, 0.45, 0.50, 0.42]
    noise = [0.01, -0.012, 0.008, -0.009]
    rows = [_row("vespo", n, s, a) for n in (4, 64) for s, a in enumerate(vespo)]
    rows += [_row("grpo", 4, s, a + e) for s, (a, e) in enumerate(zip(vespo, noise, strict=True))]
    rows += [_row("grpo", 64, s, a - 0.05 + 0.001 * s, "ok" if s < 3 else "missed: sd log W 0.4") for s, a in
             enumerate(vespo)]  # fmt: skip
    found = {(r["name"], r["metric"]): r for r in verdicts.verdicts(rows, plan.comparisons(["vespo", "grpo"], (4, 64)))}
    at64 = found[("grpo vs VESPO at N=64", "best_eval_acc")]
    assert (at64["seeds"], at64["seeds_run"]) == (3, 4)
    p = paired_t([a - 0.05 + 0.001 * s for s, a in enumerate(vespo[:3])], vespo[:3])
    assert at64["p"] == pytest.approx(p)
    assert at64["p_adjusted"] == pytest.approx(min(1.0, 2 * p))  # Holm, smallest of a family of 2 (N = 4, 64)
    assert at64["verdict"] == "favours VESPO; same sign as paper"  # the paper's GRPO is below its VESPO at N = 64
    at4 = found[("grpo vs VESPO at N=4", "best_eval_acc")]
    assert at4["verdict"] == "unresolved" and at4["seeds"] == 4
    sd = float(__import__("numpy").std(noise, ddof=1))
    assert at4["mdd"] == pytest.approx(minimal_detectable_difference(sd, 4, 0.05 / 2))
    drop = found[("grpo's change from N=4 to 64 minus VESPO's", "best_eval_acc")]
    assert drop["seeds"] == 3  # every cell of the seed must pass: N = 4 and 64, both methods
    confirmed = {f: {"class": "confirmatory", "why": "", "plan_commit": None, "results_commit": None}
                 for f in ("at one N", "degradation")}  # fmt: skip
    text = verdicts.verdicts_markdown(list(found.values()), [0, 1, 2, 3], confirmed)
    assert "seeds [0, 1, 2, 3]" in text and f"unresolved<br>MDD {at4['mdd']:.2g}" in text
    assert "**favours VESPO; same sign as paper**" in text  # bold: confirmatory and significant
    assert "**" not in verdicts.verdicts_markdown(list(found.values()), [0, 1, 2, 3])  # exploratory: never bold


def test_a_comparison_without_two_gated_seeds_is_not_tested_and_counts_as_p_1():
    rows = [_row(v, 64, s, 0.4 + 0.01 * s, "missed: grad_clip share 0.3" if v == "grpo" else "ok")
            for v in ("vespo", "grpo") for s in range(3)]  # fmt: skip
    (r, _) = verdicts.verdicts(rows, plan.comparisons(["vespo", "grpo"], (64,)))
    assert r["verdict"] == "not tested (fewer than 2 gated seeds)" and r["p_adjusted"] == 1.0
    assert math.isnan(r["diff"])


def test_a_pair_from_two_warm_start_builds_is_not_a_pair():
    """Seed 2's GRPO cell started from another build of the warm start (another CPU): dropped from both sides, as a
    gate miss is; rows that record no build (older cells) still pair."""
    rows = [_row(v, 64, s, 0.4 + 0.02 * s - 0.03 * (v == "grpo")) | {"warm_start": "b" if (v, s) == ("grpo", 2)
            else "a"} for v in ("vespo", "grpo") for s in range(4)]  # fmt: skip
    (r, _) = verdicts.verdicts(rows, plan.comparisons(["vespo", "grpo"], (64,)))
    assert r["tested_seeds"] == [0, 1, 3] and r["seeds_run"] == 4 and r["diff"] == pytest.approx(-0.03)
    (r, _) = verdicts.verdicts([{k: v for k, v in x.items() if k != "warm_start"} for x in rows],
                               plan.comparisons(["vespo", "grpo"], (64,)))  # fmt: skip
    assert r["tested_seeds"] == [0, 1, 2, 3]


def test_gate_of_a_cell():
    ok = {"grad_clipped_frac": 0.05, "clip_frac_stalest": 0.04, "log_w_std_stalest": 1.2}
    assert gate("paper-long", "grpo", 64, ok) == "ok"
    assert gate("paper-long", "grpo", 4, ok | {"log_w_std_stalest": 0.1}) == "ok"  # sd log W is checked at N >= 64
    assert gate("paper-long", "gspo", 64, ok | {"log_w_std_stalest": 0.1, "clip_frac_stalest": 0.4}) == "ok"
    missed = gate("paper-long", "vespo", 128, ok | {"log_w_std_stalest": 0.6, "grad_clipped_frac": 0.1})
    assert missed.startswith("missed: ") and "sd log W, stalest 0.6" in missed and "grad_clip share 0.1" in missed
    assert "not logged" in gate("paper-long", "grpo", 64, ok | {"clip_frac_stalest": None})
    assert gate("paper", "grpo", 64, ok) == ""  # a preset without a gate


def test_slices_of_the_table_merge_and_holm_runs_over_the_comparisons_they_planned():
    """A first slice ran VESPO and GRPO at N = 4 and 64, a second GSPO at N = 64 only: the table's families are the
    union of what the slices planned (GSPO at N = 4 and its degradation never ran, so they are not padded in), and a
    cell both slices hold must agree."""
    first = [_row(v, n, s, 0.4 + 0.01 * s - (0.05 if v == "grpo" and n == 64 else 0.0))
             for v in ("vespo", "grpo") for n in (4, 64) for s in range(4)]  # fmt: skip
    second = [_row("gspo", 64, s, 0.3 + 0.012 * s) for s in range(4)]
    for r in first + second:
        r["task"] = "chain"
    rows = slices.merge_rows(first, second + first[:2], "slice")  # cells it already has are skipped
    assert len(rows) == len(first) + len(second)
    ran = slices.slices_run(plan.comparisons(["vespo", "grpo", "gspo"], (4, 64)), rows)
    names = {r["name"] for r in verdicts.verdicts(rows, ran)}
    assert names == {"grpo vs VESPO at N=4", "grpo vs VESPO at N=64", "gspo vs VESPO at N=64",
                     "grpo's change from N=4 to 64 minus VESPO's"}  # fmt: skip
    found = verdicts.verdicts(rows, ran)
    sizes = plan.families(slices.slices_run(plan.comparisons(["vespo", "grpo", "gspo"], (4, 64)), rows))
    assert sizes == {"at one N": 3, "degradation": 1}
    at64 = next(r for r in found if r["name"] == "gspo vs VESPO at N=64" and r["metric"] == "best_eval_acc")
    ps = sorted(r["p"] for r in found if r["family"] == "at one N" and r["metric"] == "best_eval_acc")
    assert at64["p_adjusted"] >= min(1.0, 3 * ps[0]) - 1e-12  # Holm over 3, not over the 2 a full grid would add
    respelled = [
        dict(r, best_eval_acc=r["best_eval_acc"] + "0", clip_frac_stalest=r["clip_frac_stalest"] or "nan")
        for r in first
    ]  # fmt: skip  (as write_tables spells a row again)
    assert len(slices.merge_rows(respelled, first, "again")) == len(first)  # merging twice changes nothing
    clash = dict(first[0], best_eval_acc="0.9")
    with pytest.raises(ValueError, match="chain/vespo/4/0 differs"):
        slices.merge_rows(first, [clash], "slice")
    typed = slices.typed_row({"N": "64", "seed": "3", "rollout_steps": "8", "collapsed": "False", "gate": "ok",
                          "clip_frac_stalest": "", "best_eval_acc": "0.5"})  # fmt: skip
    assert typed["N"] == 64 and typed["collapsed"] is False and typed["gate"] == "ok" and typed["best_eval_acc"] == 0.5
    assert math.isnan(typed["clip_frac_stalest"])


def test_the_later_corrections_are_holm_corrected_apart_and_leave_the_papers_claims_as_they_were():
    """M2PO (a 2025-26 correction, no paper number) added beside VESPO and GRPO: its comparisons form their own
    families, GRPO's adjusted p-values are those of the table without it, and M2PO's are Holm over its own two."""
    paper_rows = [_row(v, n, s, 0.4 + 0.01 * s - (0.04 + 0.002 * s if v == "grpo" and n == 64 else 0.0))
             for v in ("vespo", "grpo") for n in (4, 64) for s in range(5)]  # fmt: skip
    later = [_row("m2po", n, s, 0.4 + 0.01 * s - (0.03 - 0.003 * s if n == 64 else -0.001 * s))
             for n in (4, 64) for s in range(5)]  # fmt: skip
    two, three = plan.comparisons(["vespo", "grpo"], (4, 64)), plan.comparisons(["vespo", "grpo", "m2po"], (4, 64))
    alone = {(r["name"], r["metric"]): r for r in verdicts.verdicts(paper_rows, two)}
    both = {(r["name"], r["metric"]): r for r in verdicts.verdicts(paper_rows + later, three)}
    for key, r in alone.items():
        assert both[key]["p_adjusted"] == r["p_adjusted"] and both[key]["family"] == r["family"]
    m2po = [r for k, r in both.items() if k[0].startswith("m2po") and k[1] == "best_eval_acc"]
    assert {r["family"] for r in m2po} == {"at one N · 2025-26 corrections", "degradation · 2025-26 corrections"}
    at_n = sorted((r for r in m2po if isinstance(r["column"], int)), key=lambda r: r["p"])
    assert at_n[0]["p_adjusted"] == pytest.approx(min(1.0, 2 * at_n[0]["p"]))  # Holm over its own 2, not 4
    assert "paper_diff_pct" not in at_n[0] and at_n[0]["verdict"] in ("favours VESPO", "favours m2po", "unresolved")


def test_collapsed_seeds_are_counted_and_fishers_exact_test_is_reported_beside_the_paired_t():
    from vespo.experiments.stats import fisher_exact

    rows = [_row("vespo", 64, s, 0.6 + 0.01 * s) | {"collapsed": "False"} for s in range(4)]
    rows += [_row("sapo", 64, s, 0.1 if s < 3 else 0.5) | {"collapsed": str(s < 3)} for s in range(4)]
    (r, _) = verdicts.verdicts(rows, plan.comparisons(["vespo", "sapo"], (64,)))
    assert (r["collapsed_vespo"], r["collapsed_other"]) == (0, 3)
    assert r["fisher_p"] == pytest.approx(fisher_exact(0, 4, 3, 4)) and r["test"] == "paired_t"
    assert f"0 / 3, p = {r['fisher_p']:.2g}" in verdicts.verdicts_markdown([r], [0, 1, 2])
    quiet_rows = [dict(x, collapsed="False") for x in rows]
    (quiet, _) = verdicts.verdicts(quiet_rows, plan.comparisons(["vespo", "sapo"], (64,)))
    assert math.isnan(quiet["fisher_p"])  # no collapse, no exact test


def test_a_report_alone_keeps_the_slices_plans_as_they_are(tmp_path):
    """`--report-only` rebuilds the verdicts from results.csv and leaves plan.md (the slices' designs, fixed before
    their cells ran) as it was, whatever --variants / --seeds the report command carries; the verdicts name the
    seeds results.csv holds, not the command's."""
    import csv
    import os
    import shutil
    import subprocess
    import sys

    table = TABLE
    for name in ("results.csv", "plan.md"):
        shutil.copy(table / name, tmp_path / name)
    plan_bytes = (tmp_path / "plan.md").read_bytes()
    command = [sys.executable, "-m", "vespo", "reproduce", "paper-long", "--report-only", "--out-dir", str(tmp_path),
               "--variants", "vespo", "grpo", "--num-mini-batches", "4", "--seeds", "0"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=os.environ | {"MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "plan.md").read_bytes() == plan_bytes
    seeds = sorted({int(r["seed"]) for r in csv.DictReader((table / "results.csv").open())})
    assert f"seeds {seeds};" in (tmp_path / "verdicts.md").read_text()
    assert (tmp_path / "verdicts.png").stat().st_size > 0


def test_a_new_design_runs_beside_a_table_that_holds_other_cells_never_over_it(tmp_path):
    """The committed table's out-dir, given a rerun on unseen seeds or another N, sends that run to
    out/slices/<design> (its own verdicts; merged only by --add-results); the same grid, or a fresh dir, runs in
    place."""
    (tmp_path / "results.csv").write_text(
        "task,variant,N,seed,best_eval_acc\nchain,vespo,4,0,0.4\nchain,grpo,4,0,0.4\n"
    )
    same = slices.config(tmp_path, [0, 1], 1, ["vespo", "grpo"], [4, 64], smoke=False)
    assert slices.run_dir(tmp_path, same) == tmp_path  # the table's cells are this grid's: the same command finishes it
    other = slices.config(tmp_path, [9], 1, ["vespo", "grpo"], [32], smoke=False)
    where = slices.run_dir(tmp_path, other)
    assert where.parent == tmp_path / "slices" and where.name.startswith("N32_seeds9_")
    assert slices.run_dir(tmp_path / "fresh", other) == tmp_path / "fresh"
    fewer = slices.config(tmp_path, [0], 1, ["vespo"], [4], smoke=False)  # a sub-grid would drop grpo's cell
    assert slices.run_dir(tmp_path, fewer) != tmp_path


def test_the_probe_has_a_split_half_noise_ceiling():
    """Two sequences (one per half) share a 2-parameter policy: log pi_it = theta . f_it - 1, REINFORCE as the
    trained method (dL/dtheta = -sum_t A_i f_it / 4, token-mean over 4 tokens). The split-half cosine is the cosine of
    the two halves' gradients, computed by hand: row 0 (A = +1) f = (1, 0), (1, 1) -> g0 = -(2, 1) / 4; row 1 (A = -1)
    f = (0, 1), (1, 1) -> g1 = (1, 2) / 4; cos = -4 / 5."""
    import torch

    from vespo import diagnostics as diag
    from vespo.losses import compute_policy_loss

    theta = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    f = torch.tensor([[[1.0, 0.0], [1.0, 1.0]], [[0.0, 1.0], [1.0, 1.0]]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.float64)

    def losses():
        for row in (0, 1):
            lp = (f[row : row + 1] * theta).sum(-1) - 1
            inputs = {"log_prob": lp, "old_log_prob": lp.detach(), "advantages": adv[row : row + 1],
                      "response_mask": mask[row : row + 1], "global_num_tokens": 4.0,
                      "global_num_seqs": 2.0}  # fmt: skip
            names = (("method", "reinforce"), ("grpo", "grpo"), ("reinforce", "reinforce"))
            yield {name: compute_policy_loss(method, **inputs)[0] for name, method in names}

    out = diag.gradient_probe([theta], losses(), halves=[0, 1])
    assert float(out["probe/cos_split_half"]) == pytest.approx(-4 / 5, rel=1e-12)
    assert float(out["probe/cos_reinforce"]) == 1.0  # the same loss over the whole batch: exactly 1, not a ceiling
    assert "probe/cos_split_half" not in diag.gradient_probe([theta], losses())  # no halves given: none computed


# --- issue 50 case 1: a merge that cannot forge the table -----------------------------------------------------------


def _slice_dir(path, rows, plan_md=None):
    """A slice's out-dir: results.csv from `rows`, plan.md (bytes) when given."""
    import csv
    import io

    path.mkdir(parents=True, exist_ok=True)
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=list(dict.fromkeys(k for r in rows for k in r)), restval="")
    w.writeheader()
    w.writerows(rows)
    (path / "results.csv").write_text(text.getvalue())
    if plan_md is not None:
        (path / "plan.md").write_bytes(plan_md)
    return path


def _chain(v, n, s, acc):
    return _row(v, n, s, acc) | {"task": "chain", "method": "vespo" if v == "vespo" else "grpo",
                                 "loss_agg_mode": "token-mean"}  # fmt: skip


def _table(tmp_path):
    """A table of VESPO and GRPO at N = 4 and 64 (seeds 0-3) with its plan.md."""
    import dataclasses

    rows = [_chain(v, n, s, 0.4 + 0.01 * s - (0.05 if v == "grpo" and n == 64 else 0.0))
            for v in ("vespo", "grpo") for n in (4, 64) for s in range(4)]  # fmt: skip
    cfg = slices.config(tmp_path, [0, 1, 2, 3], 1, ["vespo", "grpo"], [4, 64], smoke=False)
    return _slice_dir(tmp_path / "table", rows, plan.plan_text(dataclasses.replace(cfg)).encode())


def test_a_slice_of_another_task_or_preset_or_an_unknown_variant_is_refused(tmp_path):
    """The forged-verdict case: a slice of another task keyed (variant, N) like the chain's would replace its
    numbers. Each refusal names the field; nothing is merged."""
    table = _table(tmp_path)
    rows = load_rows(table / "results.csv", "best_eval_acc")
    other_task = [dict(r, task="arithmetic", best_eval_acc="0.9") for r in rows if r["variant"] == "grpo"]
    with pytest.raises(ValueError, match="task 'arithmetic' is not this table's"):
        slices.merge_rows(rows, other_task, "slice")
    other_preset = [dict(r, method="gspo", seed=str(int(r["seed"]) + 10)) for r in rows if r["variant"] == "grpo"]
    with pytest.raises(ValueError, match="another preset's slice"):
        slices.merge_rows(rows, other_preset, "slice")
    unknown = [dict(rows[0], variant="grpo | forged |\n| x", seed="50")]
    with pytest.raises(ValueError, match="is not one of preset paper-long's"):
        slices.merge_rows(rows, unknown, "slice")
    no_task = [{k: v for k, v in r.items() if k != "task"} | {"seed": "60"} for r in rows[:1]]
    with pytest.raises(ValueError, match="no task column"):
        slices.merge_rows(rows, no_task, "slice")
    formula = [dict(rows[0], seed="70", gate='=HYPERLINK("http://x","ok")')]
    with pytest.raises(ValueError, match="is not what the cell's own values give"):
        slices.merge_rows(rows, formula, "slice")
    in_number = [dict(rows[0], seed="71", best_eval_acc="=1+1")]
    with pytest.raises(ValueError, match="column 'best_eval_acc' must hold a number"):
        slices.merge_rows(rows, in_number, "slice")
    assert len(slices.merge_rows(rows, [dict(rows[0], seed="72")], "slice")) == len(rows) + 1  # a good cell joins


def test_names_are_escaped_in_markdown_and_csv():
    assert plan.md("a | b\nc") == "a \\| b c" or plan.md("a | b\nc") == "a \\| b c"
    assert plan.md("x|y") == "x\\|y" and "\n" not in plan.md("x\r\ny") and plan.md("<b>") == "&lt;b&gt;"
    for text in ('=HYPERLINK("http://x")', "+1+1", "-2+3", "@SUM(A1)", "\t=1"):
        assert plan.csv_safe(text) == "'" + text
    assert plan.csv_safe("-0.05") == "-0.05" and plan.csv_safe(0.5) == 0.5 and plan.csv_safe("grpo") == "grpo"
    rows = [_row(v, 64, s, 0.4 + 0.01 * s * (v == "grpo")) for v in ("vespo", "grpo") for s in range(3)]
    planned = [dict(c, name="grpo | forged\n| row |") for c in plan.comparisons(["vespo", "grpo"], (64,))]
    text = verdicts.verdicts_markdown(verdicts.verdicts(rows, planned), [0, 1, 2])
    table_rows = [line for line in text.splitlines() if line.startswith("| grpo")]
    assert len(table_rows) == 2 and all("\\| forged" in line for line in table_rows)  # one row per rule
    assert not any(line.startswith("| row") for line in text.splitlines())


@pytest.mark.parametrize("bad", ["symlink", "latin-1", "no task"])
def test_a_bad_slice_is_one_line_before_plan_md_or_anything_is_rewritten(tmp_path, bad):
    """A symlinked or non-UTF-8 plan.md, or a slice without a task column: one line naming it, exit 2, and the
    table's plan.md, results.csv (and no verdicts) as they were."""
    import os
    import subprocess
    import sys

    table = _table(tmp_path)
    rows = load_rows(table / "results.csv", "best_eval_acc")
    extra = [dict(r, seed=str(int(r["seed"]) + 4)) for r in rows]
    if bad == "no task":
        extra = [{k: v for k, v in r.items() if k != "task"} for r in extra]
    piece = _slice_dir(tmp_path / "slice", extra, None if bad == "symlink" else b"")
    if bad == "symlink":
        (piece / "plan.md").symlink_to(table / "plan.md")
    elif bad == "latin-1":
        (piece / "plan.md").write_bytes("# paper-long: the design caf\xe9\n".encode("latin-1"))
    before = {p.name: p.read_bytes() for p in table.iterdir()}
    done = subprocess.run([sys.executable, "-m", "vespo", "reproduce", "paper-long", "--report-only", "--out-dir",
                           str(table), "--add-results", str(piece)], capture_output=True, text=True, timeout=600,
                          env=os.environ | {"MPLBACKEND": "Agg"})  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    expect = {"symlink": "a symbolic link", "latin-1": "not UTF-8", "no task": "no task column"}[bad]
    assert expect in last and last.startswith("usage:") is False
    assert {p.name: p.read_bytes() for p in table.iterdir()} == before


# --- issue 53 item 1: the report reads git ----------------------------------------------------------------------------


def _git(root, *args):
    import subprocess

    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": __import__("os").environ["PATH"]})  # fmt: skip


def _toy_design(name):
    found = [plan.at_n("grpo", 64, f"{name}: VESPO vs GRPO at N=64")]
    return designs._design(name, "q?", ["vespo", "grpo"], [64], designs._seed_plan((0,), 100, 3), found,
                         {found[0]["family"]: 0.05}, "toy", {}, "toy")  # fmt: skip


def test_a_plan_committed_after_or_with_its_results_is_exploratory(tmp_path):
    """Three designs in a tiny repository: one whose plan is committed before its results (confirmatory), one whose
    plan is added in the same commit as its results, one whose plan is committed after them (both exploratory); and
    the rule itself."""
    out = tmp_path / "repo"
    out.mkdir()
    _git(out, "init", "-q")
    rows = [_chain(v, 64, s, 0.5 - 0.1 * (v == "grpo") + 0.01 * (s - 100) * (v == "grpo")) for v in ("vespo", "grpo")
            for s in (100, 101, 102)]  # fmt: skip

    def plan(name):
        (out / "plans").mkdir(exist_ok=True)
        (out / "plans" / f"{name}.md").write_text(designs.design_text(_toy_design(name)))
        return f"plans/{name}.md"

    def results(name):
        _slice_dir(out / "designs" / name, rows)
        return f"designs/{name}/results.csv"

    _git(out, "add", plan("before"))
    _git(out, "commit", "-q", "-m", "plan")
    _git(out, "add", results("before"), plan("same"), results("same"), results("after"))
    _git(out, "commit", "-q", "-m", "results")
    _git(out, "add", plan("after"))
    _git(out, "commit", "-q", "-m", "late plan")
    found = long.report(out)
    reg = json.loads((out / "verdicts.json").read_text())["registration"]
    assert reg["before: VESPO vs GRPO at N=64"]["class"] == "confirmatory"
    assert reg["same: VESPO vs GRPO at N=64"]["why"].startswith("plan added in the same commit as its results")
    assert reg["after: VESPO vs GRPO at N=64"]["class"] == "exploratory"
    text = (out / "verdicts.md").read_text()
    confirmatory, exploratory = text.split("## Exploratory results")
    assert "**favours VESPO; same sign as paper**" in confirmatory
    assert "**" not in exploratory  # shown, never bolded
    assert {r["registration"] for r in found if r["family"].startswith("after")} == {"exploratory"}
    (out / "plans" / "before.md").write_text((out / "plans" / "before.md").read_text() + "\nedited\n")
    long.report(out)  # a plan written once: an edit after its commit makes its family exploratory
    reg = json.loads((out / "verdicts.json").read_text())["registration"]["before: VESPO vs GRPO at N=64"]
    assert reg["class"] == "exploratory" and reg["why"].endswith("the plan file changed after its commit")
    assert registration.classify(None, None, False)[0] == "exploratory"
    assert registration.classify("a" * 40, None, False)[0] == "confirmatory"  # results not committed yet
    assert registration.classify("a" * 40, "b" * 40, False)[0] == "exploratory"
    assert registration.classify("a" * 40, "b" * 40, True)[0] == "confirmatory"


def test_a_planned_comparison_whose_cells_never_ran_stays_in_its_family_at_p_1():
    rows = [_row(v, 64, s, 0.4 + 0.01 * s - 0.05 * (v == "grpo") + 0.001 * s * s) for v in ("vespo", "grpo")
            for s in range(4)]  # fmt: skip
    plan, _ = slices.table_plan(
        "# paper-long: the design of one slice\n\nVariants vespo, grpo, gspo; N = 64; seeds [0, 1, 2, 3]; 12 cells.\n\n"
        "Comparisons (2 per checkpoint rule, both rules: best (x), final): grpo vs VESPO at N=64; gspo vs VESPO at "
        "N=64.\n", "plan.md")  # fmt: skip
    found = [r for r in verdicts.verdicts(rows, plan) if r["metric"] == "best_eval_acc"]
    by = {r["name"]: r for r in found}
    assert by["gspo vs VESPO at N=64"]["p"] == 1.0 and by["gspo vs VESPO at N=64"]["family_m"] == 2
    assert by["gspo vs VESPO at N=64"]["verdict"].startswith("not run")
    assert by["grpo vs VESPO at N=64"]["p_adjusted"] == pytest.approx(min(1.0, 2 * by["grpo vs VESPO at N=64"]["p"]))


def test_a_design_over_two_warm_starts_reports_each_ones_difference_and_labels_read_right():
    """Seeds 100-102 on SFT seed 0 and 103-105 on SFT seed 100: the pooled paired t over 6 pairs, each warm start's
    mean difference beside it; a method's own fall from N = 4 to 64 says "falls", a result that favours VESPO never
    reads as a contradiction, and the paper's sign is the sign only."""
    gaps = {100: -0.05, 101: -0.07, 102: -0.06, 103: -0.01, 104: -0.03, 105: -0.02}
    rows = [
        _row(v, n, s, 0.5 + (gaps[s] if v == "grpo" else 0.0) - (0.1 + 0.01 * (s % 3)) * (n == 64))
        | {"sft_seed": str(0 if s < 103 else 100)}
        for v in ("vespo", "grpo")
        for n in (4, 64)
        for s in gaps
    ]
    planned = [plan.at_n("grpo", 64, "a"), plan.own_change("vespo", 4, 64, "b"),
               plan.change_minus_vespo("grpo", 4, 64, "c")]  # fmt: skip
    by = {r["name"]: r for r in verdicts.verdicts(rows, planned) if r["metric"] == "best_eval_acc"}
    at64 = by["grpo vs VESPO at N=64"]
    assert at64["by_warm_start"] == pytest.approx({"0": -0.06, "100": -0.02})
    assert at64["p"] == pytest.approx(paired_t(list(gaps.values()), [0.0] * 6))
    assert at64["verdict"] == "favours VESPO; same sign as paper"
    assert by["vespo's change from N=4 to 64"]["verdict"] == "falls from N=4 to 64; same sign as paper"  # -8.2 pts
    assert by["vespo's change from N=4 to 64"]["paper_diff_pct"] == pytest.approx(61.8 - 70.0)
    drop = by["grpo's change from N=4 to 64 minus VESPO's"]
    assert drop["paper_diff_pct"] == pytest.approx(2.8) and drop["diff"] == pytest.approx(0.0, abs=1e-12)
    text = verdicts.verdicts_markdown(list(by.values()), sorted(gaps))
    assert "by SFT seed: 0: -0.06, 100: -0.02" in text and "contradicted" not in text and "reproduced" not in text


def test_a_slice_needs_a_plan_of_this_preset_that_names_its_variants(tmp_path):
    """A sweep of another preset has no paper-long plan.md; a slice whose results hold a variant its plan does not
    name was not the slice its plan describes. Both refused by `prepare_merge`, which writes nothing."""
    import dataclasses

    table = _table(tmp_path)
    rows = load_rows(table / "results.csv", "best_eval_acc")
    extra = [dict(r, seed=str(int(r["seed"]) + 4)) for r in rows]
    with pytest.raises(ValueError, match="no plan.md"):
        slices.prepare_merge(table, [_slice_dir(tmp_path / "a", extra)])
    with pytest.raises(ValueError, match="no section beginning"):
        slices.prepare_merge(table, [_slice_dir(tmp_path / "b", extra, b"# sweep of preset paper\n")])
    cfg = slices.config(tmp_path, [4, 5, 6, 7], 1, ["vespo"], [4, 64], smoke=False)
    only_vespo = plan.plan_text(dataclasses.replace(cfg)).encode()
    with pytest.raises(ValueError, match=r"variants its plan.md does not name: \['grpo'\]"):
        slices.prepare_merge(table, [_slice_dir(tmp_path / "c", extra, only_vespo)])
    cfg = slices.config(tmp_path, [4, 5, 6, 7], 1, ["vespo", "grpo"], [4, 64], smoke=False)
    rows, text = slices.prepare_merge(table, [_slice_dir(tmp_path / "d", extra, plan.plan_text(cfg).encode())])
    assert len(rows) == 2 * len(extra) and text.count(plan.PLAN_HEAD) == 2


def test_the_learner_logs_the_split_half_cosine_beside_the_cross_method_ones():
    """The probe of a real update (test_diagnostics' tiny one: micro-batches of 3, two mini-batches) logs the trained
    method's split-half cosine, a cosine of two different gradients (below 1), and the sweep's summary reads it."""
    from test_diagnostics import _probe_update

    from vespo.experiments.sweep import PROBE_METRICS

    hist, _ = _probe_update("vespo")
    cos = float(hist[-1]["probe/cos_split_half"])
    assert -1.0 <= cos < 1.0 and "cos_split_half" in PROBE_METRICS


def test_a_design_runs_only_from_its_committed_unchanged_plan_and_a_plan_is_written_once(tmp_path, monkeypatch):
    out = tmp_path / "repo"
    out.mkdir()
    _git(out, "init", "-q")
    _slice_dir(out, [_chain(v, 64, s, 0.5 + 0.01 * s) for v in ("vespo", "grpo") for s in range(3)])
    monkeypatch.setitem(designs.DESIGNS, "toy", lambda table: _toy_design("toy"))
    path = designs.write_plan(out, "toy")
    with pytest.raises(ValueError, match="a plan is written once"):
        designs.write_plan(out, "toy")
    with pytest.raises(ValueError, match="is not committed: commit it alone"):
        registration.plan_committed(out, "toy")
    _git(out, "add", "plans/toy.md")
    _git(out, "commit", "-q", "-m", "plan")
    assert len(registration.plan_committed(out, "toy")) == 40
    path.write_text(path.read_text().replace("q?", "another question?"))
    with pytest.raises(ValueError, match="differs from the commit that added it"):
        registration.plan_committed(out, "toy")


_CELL_SUMMARY = {"rollout_steps": "8", "initial_eval_acc": "0.2", "collapsed": "False", "final_train_reward": "0.5",
                 "initial_length": "128", "final_length": "128"}  # fmt: skip
"""The rest of a faked sweep's cell summary."""


def _committed_design(tmp_path, monkeypatch, name, ns, warm, seeds, **candidates):
    """A git repo holding a table and the committed plan of design `name`: VESPO vs GRPO at each N in `ns`, `seeds`
    fresh seeds from 100 over the warm starts `warm` (`candidates`: the pilot and builds of `designs._design`)."""
    out = tmp_path / "repo"
    out.mkdir(parents=True)
    _git(out, "init", "-q")
    found = [plan.at_n("grpo", n, f"{name}: VESPO vs GRPO") for n in ns]
    design = designs._design(name, "q?", ["vespo", "grpo"], ns, designs._seed_plan(warm, 100, seeds), found,
                           {found[0]["family"]: 0.05}, "toy", {}, "toy", **candidates)  # fmt: skip
    monkeypatch.setitem(designs.DESIGNS, name, lambda table: design)
    _slice_dir(out, [_chain(v, 64, s, 0.5) for v in ("vespo", "grpo") for s in range(2)])
    designs.write_plan(out, name)
    _git(out, "add", f"plans/{name}.md")
    _git(out, "commit", "-q", "-m", "plan")
    return out


def test_a_design_runs_seed_by_seed_across_its_warm_starts(tmp_path, monkeypatch):
    """`run_design` (the sweep faked): seeds interleaved over the warm starts (pairs finish together), each seed's
    sweep in designs/<name>/sft<k> with that SFT seed, the summaries with their sft_seed in designs/<name>/results.csv,
    and no seed started after --until."""
    import datetime

    out = _committed_design(tmp_path, monkeypatch, "toy2", [64], (0, 100), 4)
    ran = []

    def fake_sweep(cfg):
        ran.append((Path(cfg.out_dir).name, cfg.extra["sft_seed"], cfg.seeds))
        return [slices.typed_row(_chain(v, 64, s, 0.5 - 0.05 * (v == "grpo") + 0.01 * s) | _CELL_SUMMARY)
                for v in cfg.variants for s in cfg.seeds]  # fmt: skip

    monkeypatch.setattr(long, "sweep", fake_sweep)
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=1)
    long.run_design(out, "toy2", 2, None, past)
    assert ran == []  # --until reached: nothing starts
    long.run_design(out, "toy2", 2, None, None)
    assert ran == [("sft0", "0", (100,)), ("sft100", "100", (102,)), ("sft0", "0", (101,)), ("sft100", "100", (103,))]
    rows = load_rows(out / "designs" / "toy2" / "results.csv", "best_eval_acc")
    assert sorted((r["sft_seed"], r["seed"]) for r in rows if r["variant"] == "grpo") == [
        ("0", "100"), ("0", "101"), ("100", "102"), ("100", "103")]  # fmt: skip
    found = json.loads((out / "verdicts.json").read_text())["verdicts"]
    verdict = next(r for r in found if r.get("design") == "toy2")
    assert verdict["seeds"] == 4 and verdict["by_warm_start"] == pytest.approx({"0": -0.05, "100": -0.05})
    assert verdict["seeds"] == 4 and verdict["registration"] == "confirmatory"


def test_the_committed_verdicts_recompute_bit_identically_from_the_package(tmp_path):
    """Issue 52: the report of benchmarks/results/paper_long (its results.csv, plan.md, plans/*.md and what git says
    about them), written into another directory, is byte for byte the committed verdicts.md / .json / .csv."""
    long.report(TABLE, dest=tmp_path)
    for name in ("verdicts.md", "verdicts.json", "verdicts.csv"):
        assert (tmp_path / name).read_bytes() == (TABLE / name).read_bytes(), name


@pytest.mark.slow
@pytest.mark.parametrize("table", ["paper", "paper-long"])
def test_the_smoke_of_each_table_runs_from_the_vespo_command(tmp_path, table):
    """`vespo reproduce <table> --smoke --out-dir DIR`: tiny cells on a 2-step warm start in DIR, then the verdicts,
    nothing written under benchmarks/results (CI's smoke of the reproduction)."""
    import os
    import subprocess
    import sys

    out, cwd = tmp_path / "out", tmp_path / "cwd"
    cwd.mkdir()
    env = os.environ | {"MPLBACKEND": "Agg", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "vespo", "reproduce", table, "--smoke", "--out-dir", str(out)]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    expected = ["plan.md", "verdicts.md", "verdicts.json", "verdicts.png", "results.md"] if table == "paper-long" else [
        "verdicts.md", "verdicts.json", "results.md", "compare_vespo_best_eval_acc.md"]  # fmt: skip
    for name in expected:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert not (cwd / "benchmarks").exists()


def test_a_committed_designs_cells_keep_their_names():
    """The cells of design confirm-n64 (running while the scripts became `vespo reproduce paper-long`) keep the keys
    they were started under, so the same design continues them: its config from the committed plan, each cell named by
    the hash of its `vespo train` config."""
    d = designs.parse_design(designs.read_text(TABLE / "plans" / "confirm-n64.md"), "confirm-n64")
    (w,) = [w for w in d["warm_starts"] if w["sft_seed"] == 0]
    where = TABLE / "designs" / "confirm-n64" / "sft0"
    cfg = slices.config(where, w["seeds"], 2, d["variants"], d["num_mini_batches"], False, extra={"sft_seed": "0"},
                        **d["sweep"])  # fmt: skip
    names = {c.name for c in cells(cfg)}
    assert {"grpo/N64/seed100/ce8e4b9a0a4c", "grpo/N64/seed101/031076b4df78"} <= names and len(names) == 14


def test_ctrl_c_of_a_design_run_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys):
    """Ctrl-C while a design's cells run (the sweep's GridInterrupted, raised by `run_design`): the command prints
    the sweep's one line of what was kept, no traceback, and exits 130 without writing the report."""
    from vespo.experiments.grid import GridInterrupted
    from vespo.experiments.reproduce.command import paper_long_cli

    def stopped(*args):
        raise GridInterrupted("0 of 8 cells finished and kept in X; the same command continues the sweep")

    monkeypatch.setattr(long, "run_design", stopped)
    monkeypatch.setattr(long, "report", lambda out: pytest.fail("no report after an interrupt"))
    assert paper_long_cli(["--design", "confirm-n64", "--out-dir", str(tmp_path)]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["vespo reproduce paper-long: interrupted; 0 of 8 cells finished and kept in X; the same command "
                   "continues the sweep"]  # fmt: skip


def test_a_design_run_of_other_n_adds_to_its_results_and_never_drops_a_cell(tmp_path, monkeypatch):
    """N = 4 first, N = 64 later (`--num-mini-batches`, each a fresh process whose cells/ may be gone): results.csv
    ends with both; a cell run again replaces its own row only, never a row of another N or seed."""
    out = _committed_design(tmp_path, monkeypatch, "toy3", [4, 64], (0,), 2)
    acc = {4: 0.3, 64: 0.6}

    def fake_sweep(cfg):
        return [slices.typed_row(_chain(v, n, s, acc[n] + 0.01 * s - 0.02 * (v == "grpo")) | _CELL_SUMMARY)
                for v in cfg.variants for n in cfg.num_mini_batches for s in cfg.seeds]  # fmt: skip

    monkeypatch.setattr(long, "sweep", fake_sweep)
    results = out / "designs" / "toy3" / "results.csv"

    def cells_now():
        return {
            (r["variant"], r["N"], r["seed"]): float(r["best_eval_acc"]) for r in load_rows(results, "best_eval_acc")
        }

    long.run_design(out, "toy3", 2, [4], None)
    after_4 = cells_now()
    assert {k[1] for k in after_4} == {"4"} and len(after_4) == 4
    long.run_design(out, "toy3", 2, [64], None)
    both = cells_now()
    assert len(both) == 8 and {k: v for k, v in both.items() if k[1] == "4"} == after_4
    acc[4] = 0.35  # N = 4 run again: its rows are replaced, N = 64's kept
    long.run_design(out, "toy3", 2, [4], None)
    again = cells_now()
    assert len(again) == 8 and all(again[k] == pytest.approx(v + 0.05) for k, v in after_4.items())
    assert {k: v for k, v in again.items() if k[1] == "64"} == {k: v for k, v in both.items() if k[1] == "64"}


def test_sigterm_of_a_design_run_stops_it_as_ctrl_c_does(tmp_path, monkeypatch, capsys):
    """SIGTERM (a scheduler's stop, `kill`) while the cells run unwinds as Ctrl-C: the sweep's KeyboardInterrupt path
    stops its cell processes, one line, exit 130 (before, the sweep died and its cells ran on as orphans)."""
    import os
    import signal
    import time

    from vespo.experiments.reproduce.command import paper_long_cli

    def terminated(*args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler interrupts this at once
        pytest.fail("SIGTERM did not interrupt the run")

    monkeypatch.setattr(long, "run_design", terminated)
    assert paper_long_cli(["--design", "confirm-n64", "--out-dir", str(tmp_path)]) == 130
    assert capsys.readouterr().err.strip().splitlines() == [
        "vespo reproduce paper-long: interrupted; finished cells are kept; the same command continues"]  # fmt: skip
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is the run's only


def _candidates(tmp_path, monkeypatch, name, rises, here):
    """A committed design over candidate warm starts SFT seeds 0 and 1 (seeds 100-101 each, VESPO vs GRPO at N = 64)
    whose builds are named "b0", "b1"; this machine builds `here` (SFT seed -> fingerprint); the pilot of SFT seed k
    rises `rises[k]` above 0.2. Returns (repo, the cells run: (dir, sft_seed, seeds, variants, N))."""
    from vespo.experiments.reproduce import builds

    pilot = dict(builds.PILOT)
    out = _committed_design(tmp_path, monkeypatch, name, [64], (0, 1), 4, pilot=pilot, builds={"0": "b0", "1": "b1"})
    ran = []

    def fake_sweep(cfg):
        k = int(cfg.extra["sft_seed"])
        ran.append((Path(cfg.out_dir).name, k, cfg.seeds, cfg.variants, cfg.num_mini_batches))
        rise = rises[k] if cfg.seeds == (pilot["seed"],) else 0.3
        return [slices.typed_row(_chain(v, n, s, 0.2 + rise - 0.05 * (v == "grpo")) | _CELL_SUMMARY)
                for v in cfg.variants for n in cfg.num_mini_batches for s in cfg.seeds]  # fmt: skip

    monkeypatch.setattr(long, "sweep", fake_sweep)
    monkeypatch.setattr(builds, "sweep", fake_sweep)
    monkeypatch.setattr(builds, "build_fingerprint", lambda cfg: here[int(cfg.extra["sft_seed"])])
    return out, ran


def test_a_design_over_candidate_builds_runs_on_the_first_whose_pilot_trains(tmp_path, monkeypatch, capsys):
    """The pilot of SFT seed 0 rises 0.01 (< 0.05): its cells do not run; SFT seed 1's rises 0.1: the design's cells
    run on it alone. pilots.csv records both; a rerun reads them instead of running them again."""
    out, ran = _candidates(tmp_path, monkeypatch, "cand", {0: 0.01, 1: 0.1}, {0: "b0", 1: "b1"})
    long.run_design(out, "cand", 2, None, None)
    pilots = [(name, k, seeds) for name, k, seeds, _, _ in ran if name.startswith("pilot")]
    assert pilots == [("pilot-sft0", 0, (900,)), ("pilot-sft1", 1, (900,))]
    assert [(name, k, seeds) for name, k, seeds, *_ in ran if not name.startswith("pilot")] == [
        ("sft1", 1, (102,)),
        ("sft1", 1, (103,)),
    ]
    import csv

    rows = list(csv.DictReader((out / "designs" / "cand" / "pilots.csv").open()))
    assert [(r["sft_seed"], r["warm_start"], r["passed"]) for r in rows] == [("0", "b0", "False"), ("1", "b1", "True")]
    assert float(rows[0]["rise"]) == pytest.approx(0.01) and float(rows[1]["rise"]) == pytest.approx(0.1)
    said = capsys.readouterr().out
    assert "SFT seed 0 (build b0) pilot vespo N = 4 seed 900: 0.200 -> 0.210, fails (< 0.05): not run" in said
    results = load_rows(out / "designs" / "cand" / "results.csv", "best_eval_acc")
    assert {r["sft_seed"] for r in results} == {"1"} and len(results) == 4
    ran.clear()
    long.run_design(out, "cand", 2, None, None)  # a rerun: the pilots are read, not run again
    assert not [r for r in ran if r[0].startswith("pilot")]


def test_a_design_runs_no_cell_where_no_candidate_trains_or_the_build_differs(tmp_path, monkeypatch, capsys):
    """No pilot rises 0.05: one line, no design cell. A machine that builds another fingerprint of a named build:
    one ValueError naming both, before that candidate's pilot or any cell runs."""
    out, ran = _candidates(tmp_path, monkeypatch, "none", {0: 0.0, 1: 0.049}, {0: "b0", 1: "b1"})
    long.run_design(out, "none", 2, None, None)
    assert [r[0] for r in ran] == ["pilot-sft0", "pilot-sft1"]
    assert "no candidate warm start passes its pilot rule; no cell runs" in capsys.readouterr().out
    assert not (out / "designs" / "none" / "results.csv").exists()
    out2, ran2 = _candidates(tmp_path / "other", monkeypatch, "moved", {0: 0.1, 1: 0.1}, {0: "c0", 1: "b1"})
    with pytest.raises(ValueError, match="its plan names build b0 of SFT seed 0, this machine builds c0"):
        long.run_design(out2, "moved", 2, None, None)
    assert ran2 == []


def test_a_plan_over_candidate_builds_names_them_and_its_power_counts_one_warm_start(tmp_path, monkeypatch):
    """corrections-2026b: the warm starts are candidates (0, then 1) with their fingerprints in the plan, the pilot
    rule in its JSON and words, and its families' MDD at 5 seeds (one warm start's), as corrections-2026's."""
    from vespo.experiments.reproduce import builds

    monkeypatch.setattr(builds, "build_fingerprint", lambda cfg: f"fp{cfg.extra['sft_seed']}")
    table = load_rows(TABLE / "results.csv", "best_eval_acc")
    d, base = designs.design_corrections_2026b(table), designs.design_corrections_2026(table)
    assert d["builds"] == {"0": "fp0", "1": "fp1"} and d["pilot"] == builds.PILOT
    assert [w["sft_seed"] for w in d["warm_starts"]] == [0, 1] and d["cells"] == base["cells"] == 40
    assert [f["mdd"] for f in d["families"]] == [f["mdd"] for f in base["families"]]
    same = [{k: v for k, v in c.items() if k != "family"} for c in base["comparisons"]]
    assert [{k: v for k, v in c.items() if k != "family"} for c in d["comparisons"]] == same
    assert {c["family"] for c in d["comparisons"]}.isdisjoint(c["family"] for c in base["comparisons"])
    assert d["variant_defs"] == base["variant_defs"]
    text = designs.design_text(d)
    assert "SFT seed 0 (build fp0): RL seeds 0-4; SFT seed 1 (build fp1): RL seeds 0-4; 40 cells" in text
    assert "rises 0.05 or more in best held-out accuracy above its start" in text


def test_a_design_whose_family_is_another_plans_is_refused_before_its_plan_is_written(tmp_path, monkeypatch):
    """The report keys a family's registration by its name, so a second design with the first's family name would
    take its registration: --plan-only refuses it and writes nothing."""
    out = tmp_path / "repo"
    _slice_dir(out, [_chain(v, 64, s, 0.5) for v in ("vespo", "grpo") for s in range(2)])
    monkeypatch.setitem(designs.DESIGNS, "first", lambda table: _toy_design("first"))
    monkeypatch.setitem(designs.DESIGNS, "second", lambda table: _toy_design("first") | {"design": "second"})
    designs.write_plan(out, "first")
    with pytest.raises(ValueError, match="its family 'first: VESPO vs GRPO at N=64' is also first.md's"):
        designs.write_plan(out, "second")
    assert not (out / "plans" / "second.md").exists()

"""Sweep: grid geometry keeps samples equal across N, validation, and a tiny end-to-end grid that resumes."""

import csv
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from vespo.embedded.warm_start import fingerprint
from vespo.experiments.presets import PAPER_LR, PRESETS
from vespo.experiments.sweep import (
    Cell,
    SweepConfig,
    cells,
    resolve,
    summarize,
    sweep,
    train_config,
)
from vespo.train.config import TrainConfig


def flat(cfg: SweepConfig, cell: Cell) -> SimpleNamespace:
    """A cell's `vespo train` settings by their flat names (`TrainConfig.flat`, how a cell's identity reads them), and
    its N."""
    tc = train_config(cfg, cell).flat()
    return SimpleNamespace(**tc, num_mini_batches=tc["train_batch_size"] // tc["ppo_mini_batch_size"])


def test_cells_keep_mini_batch_and_optimizer_steps_fixed_across_n():
    cfg = SweepConfig(methods=("vespo", "grpo"), num_mini_batches=(1, 4, 8), seeds=(0, 1), optimizer_steps=16)
    grid = cells(cfg)
    assert len(grid) == 2 * 3 * 2
    for c in grid:
        tc = flat(cfg, c)
        assert tc.num_mini_batches == c.num_mini_batches and tc.ppo_mini_batch_size == cfg.ppo_mini_batch_size
        # at N = 8, 16 steps would be 2 rollout steps: scaled up to 4 rollout steps
        steps = max(16, 4 * c.num_mini_batches)
        assert tc.total_training_steps * tc.num_mini_batches == steps and tc.total_training_steps >= 4
        assert tc.total_training_steps * tc.train_batch_size * tc.rollout_n == steps * 4 * 8  # samples


def test_topr_both_ways_and_controls_reach_the_cells():
    """`topr` is TOPR's own token-sum form, `topr-tokenmean` the length-normalised one the VESPO paper compared."""
    cfg = SweepConfig(methods=("topr", "topr-tokenmean"), num_mini_batches=(1,), seeds=(0,))
    modes = {c.variant: flat(cfg, c).loss_agg_mode for c in cells(cfg)}
    assert modes == {"topr": None, "topr-tokenmean": "token-mean"}  # None: the method's own, seq-mean-token-sum
    controls = {c.variant: flat(cfg, c) for c in cells(SweepConfig(preset="step_controls", num_mini_batches=(1,)))}
    assert controls["vespo-meanphi"].step_scale == "mean_phi" and controls["vespo-targetkl"].target_kl == 0.02


def test_lr_axis_adds_rows_and_reaches_each_cell():
    cfg = SweepConfig(
        methods=("vespo", "topr"), num_mini_batches=(1, 4), seeds=(0,), optimizer_steps=16, lr=(1e-4, 9e-4)
    )
    grid = cells(cfg)
    assert sorted({c.variant for c in grid}) == ["topr@lr0.0001", "topr@lr0.0009", "vespo@lr0.0001", "vespo@lr0.0009"]
    for c in grid:
        assert flat(cfg, c).lr == c.lr and c.variant.endswith(f"@lr{c.lr:g}")
    assert len({c.name for c in grid}) == len(grid)  # every cell has its own run dir
    single = cells(SweepConfig(methods=("vespo",), num_mini_batches=(1,), seeds=(0,), lr=(5e-4,)))
    assert [(c.variant, flat(SweepConfig(lr=(5e-4,)), c).lr) for c in single] == [("vespo", 5e-4)]
    with pytest.raises(ValueError, match="lr must be"):
        cells(SweepConfig(lr=(float("nan"),)))


def test_presets_and_validation():
    grid = cells(SweepConfig(preset="length_norm", num_mini_batches=(1,), seeds=(0,)))
    assert [(c.variant, c.hparams) for c in grid] == [
        ("vespo", {}),
        ("vespo-sqrt", {"length_norm": "sqrt"}),
        ("vespo-linear", {"length_norm": "linear"}),
    ]
    assert set(PRESETS) == {"length_norm", "asymmetry", "topr", "step_controls", "paper", "paper-long"}
    with pytest.raises(ValueError, match="multiple of every N"):
        cells(SweepConfig(num_mini_batches=(1, 3), optimizer_steps=16))
    with pytest.raises(ValueError, match="unknown preset"):
        cells(SweepConfig(preset="nope"))
    with pytest.raises(ValueError, match="known methods"):
        cells(SweepConfig(methods=("vespo", "ppo9")))


def test_paper_preset_resolves_to_the_documented_regime():
    """docs/guides/paper.md: the paper's AdamW (betas (0.9, 0.999), weight decay 0.01, grad_clip 1.0), the free-length
    scratchpad task, >= 8 rollout steps per cell at every N, the staleness table's 7 variants at N = 1, 4, 8, 16, 64
    over 5 seeds; a flag the user sets wins over the preset."""
    full = resolve(SweepConfig(preset="paper"))
    assert (full.num_mini_batches, full.seeds, full.task, full.lr) == ((1, 4, 8, 16, 64), (0, 1, 2, 3, 4),
                                                                      ("scratchpad",), (PAPER_LR,))  # fmt: skip
    assert full.min_rollout_steps >= 8 and full.num_operands == 4
    grid = cells(SweepConfig(preset="paper", num_mini_batches=(1, 64), seeds=(0,)))
    assert [c.variant for c in grid if c.num_mini_batches == 1] == ["vespo", "grpo", "gspo", "sapo", "cispo", "topr",
                                                                    "topr-tokenmean", "m2po", "opsm", "aipo",
                                                                    "vcpo"]  # fmt: skip
    for c in grid:
        tc = flat(SweepConfig(preset="paper", num_mini_batches=(1, 64), seeds=(0,)), c)
        assert (tc.betas, tc.weight_decay, tc.grad_clip) == ((0.9, 0.999), 0.01, 1.0)
        assert (tc.task, tc.num_operands, tc.lr, tc.ppo_mini_batch_size) == ("scratchpad", 4, PAPER_LR, 8)
        assert tc.total_training_steps >= 8  # rollout steps, also at N = 64
        assert tc.probe_every == tc.total_training_steps // 4  # 4 gradient probes per cell
        assert tc.max_response_length > 12  # the longest scratchpad solution (12 tokens) has room: free length
        if c.variant == "grpo":  # DAPO's clip-higher bounds
            assert (tc.hparams["clip_ratio_low"], tc.hparams["clip_ratio_high"]) == (0.2, 0.28)
        if c.variant.startswith("topr"):
            assert tc.loss_agg_mode == ("token-mean" if c.variant == "topr-tokenmean" else None)
    mine = SweepConfig(preset="paper", lr=(3e-5,), num_mini_batches=(4,), seeds=(0,), extra={"weight_decay": "0"})
    tc = flat(mine, cells(mine)[0])
    assert (tc.lr, tc.weight_decay, tc.betas) == (3e-5, 0.0, (0.9, 0.999))
    assert resolve(resolve(mine)) == resolve(mine)
    subset = cells(SweepConfig(preset="paper", variants=("sapo", "vespo"), num_mini_batches=(4,), seeds=(0,)))
    assert [c.variant for c in subset] == ["sapo", "vespo"]
    with pytest.raises(ValueError, match="variants must be distinct variants of preset paper"):
        cells(SweepConfig(preset="paper", variants=("ppo",)))
    with pytest.raises(ValueError, match="without --preset"):
        cells(SweepConfig(variants=("vespo",)))
    plain = flat(
        SweepConfig(num_mini_batches=(1,), seeds=(0,)), cells(SweepConfig(num_mini_batches=(1,), seeds=(0,)))[0]
    )
    assert (plain.betas, plain.weight_decay) == ((0.9, 0.99), 0.0)  # no preset: the trainer's own defaults


def test_paper_preset_on_the_command_line_lets_every_flag_win(tmp_path, monkeypatch):
    """`vespo sweep --preset paper` starts from the preset's settings; a flag wins even when it names SweepConfig's own
    default (mini-batch 4), and `--extra` adds to the preset's AdamW settings instead of replacing them."""
    import vespo.experiments.sweep.command as sweep_module

    seen = []

    def fake_sweep(cfg):
        seen.append(cfg)
        (tmp_path / "results.md").write_text("")

    monkeypatch.setattr(sweep_module, "sweep", fake_sweep)
    argv = ["--preset", "paper", "--out-dir", str(tmp_path), "--mini-batch-size", "4", "--num-mini-batches", "64",
            "--extra", "tensorboard", "False"]  # fmt: skip
    assert sweep_module.cli(argv) == 0
    (cfg,) = seen
    tc = flat(cfg, cells(cfg)[0])
    assert (tc.ppo_mini_batch_size, tc.betas, tc.weight_decay, tc.tensorboard) == (4, (0.9, 0.999), 0.01, False)
    assert cfg.seeds == (0, 1, 2, 3, 4) and cfg.task == ("scratchpad",)


def test_summary_and_collapse_flag():
    rows = [{"step": 0, "eval/accuracy": 0.4}] + [
        {"step": s, "reward/mean": r} for s, r in enumerate([0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.1, 0.3], 1)
    ]
    rows[-1]["eval/accuracy"] = 0.1
    rows[4]["eval/accuracy"] = 0.6
    rows[1] |= {"is/kl_mu_pi/last_mini_batch": 0.02, "actor/momentum_share/last_mini_batch": 0.1}
    rows[2] |= {"is/kl_mu_pi/last_mini_batch": 0.04, "actor/momentum_share/last_mini_batch": 0.3}
    rows[3] |= {"clip/frac/last_mini_batch": 0.05, "probe/cos_grpo": 1.0, "probe/cos_reinforce": 0.5}
    rows[7] |= {"clip/frac/last_mini_batch": 0.01, "probe/cos_grpo": 1.0, "probe/cos_reinforce": 0.7}
    rows[8] |= {"probe/cos_grpo": math.nan, "probe/cos_reinforce": math.nan}  # a batch without gradient: left out
    s = summarize(Cell("grpo", "grpo", {}, 4, 0), rows, collapse_ratio=0.5)
    # the token clip share at the stalest mini-batch and the gradient probe: means over the steps that logged them
    assert s["clip_frac_stalest"] == pytest.approx(0.03) and s["probe_cos_reinforce"] == pytest.approx(0.6)
    assert s["probe_cos_grpo"] == 1.0 and s["probe_rel_diff_grpo"] is None
    # the regime diagnostics at the stalest mini-batch: means over rollout steps; None where never logged (no phi)
    assert s["kl_mu_pi_stalest"] == pytest.approx(0.03) and s["momentum_share_stalest"] == pytest.approx(0.2)
    assert s["mean_phi_stalest"] is None
    assert s["final_train_reward"] == pytest.approx(0.2)  # last quarter = last 2 steps
    assert (s["initial_eval_acc"], s["final_eval_acc"], s["collapsed"]) == (0.4, 0.1, True)
    assert s["best_eval_acc"] == 0.6 and s["loss_agg_mode"] == "token-mean" and s["rollout_steps"] == 8


@pytest.mark.slow
def test_tiny_grid_end_to_end_and_resume(tmp_path, capsys):
    cfg = SweepConfig(
        out_dir=str(tmp_path / "sw"),
        methods=("vespo", "grpo"),
        num_mini_batches=(1, 2),
        seeds=(0,),
        ppo_mini_batch_size=2,
        rollout_n=4,
        optimizer_steps=2,
        eval_points=1,
        eval_size=8,
        eval_n=1,
        jobs=2,
        cache_dir=str(tmp_path / "cache"),
        probes=1,
        extra={"sft_steps": "5", "max_response_length": "8", "tensorboard": "False"},
    )
    summaries = sweep(cfg)
    assert len(summaries) == 4
    with (tmp_path / "sw" / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {(r["variant"], r["N"]) for r in rows} == {("vespo", "1"), ("vespo", "2"), ("grpo", "1"), ("grpo", "2")}
    assert "probe_cos_grpo" in rows[0]  # the gradient probe's column (empty where every advantage was 0)
    # every cell names the warm-start build it started from: the weights' hash, the same for all four
    (built,) = [p for p in (tmp_path / "cache").glob("embedded-*") if p.is_dir()]
    assert {r["warm_start"] for r in rows} == {fingerprint(built)} and len(fingerprint(built)) == 12
    md = (tmp_path / "sw" / "results.md").read_text()
    assert "| vespo |" in md and "N=2" in md
    assert "(n=1)" in md and "± 0.000" not in md  # one seed: the mean alone, never a fake CI
    assert "`grpo` = grpo with token-mean" in md and "Noise floor: warm-start held-out accuracy" in md
    assert "binomial SD of one evaluation (8 samples)" in md and "N = 1 gap between grpo, vespo" in md
    for fig in ("fig3_training_reward.png", "fig4_dynamics.png"):
        assert (tmp_path / "sw" / fig).stat().st_size > 0
    # finished cells are skipped: summaries come back unchanged without rerunning
    (cell,) = [c for c in cells(cfg) if (c.variant, c.num_mini_batches) == ("grpo", 2)]
    done = tmp_path / "sw" / "cells" / "grpo" / "N2" / "seed0" / cell.key / "summary.json"
    stamp = done.stat().st_mtime_ns
    assert sweep(cfg) == summaries and done.stat().st_mtime_ns == stamp
    assert json.loads(done.read_text())["N"] == 2
    # a torn summary.json (an older vespo wrote it in place and crashed) is summarised again, not a JSONDecodeError
    done.write_text("")
    again = sweep(cfg)
    # ... and keeps every number; its wall time and warm-start build were in the torn file only
    assert [{k: v for k, v in s.items() if k not in ("wall_s", "warm_start")} for s in again] == [
        {k: v for k, v in s.items() if k not in ("wall_s", "warm_start")} for s in summaries
    ]
    assert [s.get("warm_start") for s in again].count(None) == 1
    assert json.loads(done.read_text())["N"] == 2
    assert "is damaged; summarised again from its metrics.jsonl" in capsys.readouterr().err


def test_lr_and_task_are_grid_axes():
    cfg = SweepConfig(
        methods=("vespo",),
        num_mini_batches=(1, 4),
        seeds=(0,),
        optimizer_steps=8,
        lr=(1e-4, 9e-4),
        task=("arithmetic", "chain"),
    )
    cfg.num_operands = 84
    grid = cells(cfg)
    assert len(grid) == 2 * 2 * 2 and len({c.name for c in grid}) == len(grid)
    for c in grid:
        tc = flat(cfg, c)
        assert (tc.lr, tc.task) == (c.lr, c.task)
        assert tc.max_response_length == (257 if c.task == "chain" else 16)
        assert tc.num_operands == (84 if c.task == "chain" else 3)


def test_chain_task_needs_room_for_its_response():
    from vespo.train.config_io import parse_args

    with pytest.raises(ValueError, match=r"max_response_length >= 95"):
        parse_args(["--task", "chain", "--num-operands", "30", "--max-response-length", "40"])
    with pytest.raises(ValueError, match=r"--task must be one of \['arithmetic', 'chain', 'scratchpad'\]"):
        parse_args(["--task", "chains"])  # `task` is a Literal: the parser lists the accepted ones
    assert (
        parse_args(["--task", "chain", "--num-operands", "3"]).rollout.max_response_length == 16
    )  # 3 steps: 14 tokens


def test_lr_robustness_figure_reads_finished_cells(tmp_path):
    from vespo.experiments.sweep import plot_lr_robustness

    cfg = SweepConfig(
        out_dir=str(tmp_path),
        methods=("vespo", "grpo"),
        num_mini_batches=(1, 4),
        seeds=(0, 1),
        optimizer_steps=8,
        lr=(1e-4, 9e-4),
    )
    grid = cells(cfg)
    for i, c in enumerate(grid[:-1]):  # one cell unfinished: the figure still draws from the others
        d = tmp_path / "cells" / c.name
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"final_eval_acc": 0.1 * (i % 5), "initial_eval_acc": 0.25}))
    plot_lr_robustness(cfg, grid)
    assert (tmp_path / "fig_lr_robustness.png").stat().st_size > 0


def test_changed_settings_never_reuse_a_cell(tmp_path, monkeypatch):
    """A cell's run dir is named by the hash of its whole `vespo train` config: a finished cell is reused only for
    exactly the same settings."""
    import dataclasses
    import subprocess

    base = SweepConfig(out_dir=str(tmp_path), methods=("vespo",), num_mini_batches=(1,), seeds=(0,), optimizer_steps=4)

    def run_dirs(cfg):
        return [flat(cfg, c).run_dir for c in cells(cfg)]

    first = run_dirs(base)
    assert run_dirs(base) == first and run_dirs(dataclasses.replace(base, jobs=4)) == first
    changes = [
        {"eval_size": 100},
        {"eval_points": 2},
        {"ppo_mini_batch_size": 2},
        {"rollout_n": 4},
        {"optimizer_steps": 8},
        {"extra": {"rollout_logit_noise": "0.3"}},
        {"extra": {"tensorboard": "False"}},
        {"extra": {"eval_top_p": "0.7"}},
    ]
    for change in changes:
        assert set(run_dirs(dataclasses.replace(base, **change))).isdisjoint(first), change

    def ran(*args, **kwargs):
        raise RuntimeError("the cell ran")

    monkeypatch.setattr(subprocess, "Popen", ran)  # a cell's `vespo train` process (stoppable: `_Cells`)
    from vespo.experiments.sweep import run_cell

    (cell,) = cells(base)
    done = tmp_path / "cells" / cell.name / "summary.json"
    done.parent.mkdir(parents=True)
    done.write_text(json.dumps({"final_eval_acc": 0.5}))
    assert run_cell(base, cell) == {"final_eval_acc": 0.5}  # same settings: the finished cell is reused
    changed = dataclasses.replace(base, eval_size=100)
    with pytest.raises(RuntimeError, match="the cell ran"):  # other settings: never the old summary
        run_cell(changed, cells(changed)[0])


@pytest.mark.parametrize("key", ["run_dir", "run-dir", "seed", "method", "hparams", "lr", "cache_dir", "resume"])
def test_extra_cannot_set_the_sweeps_own_fields(tmp_path, key):
    cfg = SweepConfig(out_dir=str(tmp_path), methods=("vespo",), num_mini_batches=(1,), seeds=(0,), extra={key: "x"})
    with pytest.raises(ValueError, match=f"extra: {key} is set by the sweep"):
        cells(cfg)
    with pytest.raises(ValueError, match="extra: nope is not a `vespo train` field"):
        cells(
            SweepConfig(
                out_dir=str(tmp_path), methods=("vespo",), num_mini_batches=(1,), seeds=(0,), extra={"nope": "1"}
            )
        )


def test_default_held_out_evaluation_resolves_differences_of_a_few_points():
    """Issue 19: a sweep's default evaluation has binomial SD <= 0.015 at any accuracy (p = 0.5 is the worst case),
    and the default task's held-out pool has that many prompts (cells() refuses an eval_size above the pool)."""
    cfg = SweepConfig()
    assert (0.25 / (cfg.eval_size * cfg.eval_n)) ** 0.5 <= 0.015
    assert cells(cfg)


def test_an_eval_size_above_the_held_out_pool_is_refused_before_any_cell_runs(tmp_path, capsys):
    """The pool check is part of the config's one validation path, so `vespo sweep` refuses it in one line."""
    from vespo.experiments.sweep import cli

    with pytest.raises(ValueError, match=r"eval_size must be in \[1, 500\] for task arithmetic"):
        cells(SweepConfig(eval_size=501))
    assert cli(["--eval-size", "501", "--out-dir", str(tmp_path / "sw")]) == 2
    assert "eval_size" in capsys.readouterr().err and not (tmp_path / "sw").exists()


def test_issue_40_variants_reach_their_cells_and_earlier_cells_keep_their_names():
    """The four corrections of issue 40 are variants of the paper preset (and `vcpo` a named method): VCPO as its
    scripts run it (loss, threshold 8, ESS step scaling, optimal baseline). The fields added with them, at their
    defaults, leave every earlier cell's identity as it was."""

    from vespo.experiments.grid import settings_key
    from vespo.experiments.sweep import LATER_FIELDS, NOT_IDENTITY, cell_key

    cfg = SweepConfig(preset="paper", variants=("m2po", "opsm", "aipo", "vcpo"), num_mini_batches=(64,), seeds=(0,))
    tcs = {c.variant: flat(cfg, c) for c in cells(cfg)}
    assert {v: tc.method for v, tc in tcs.items()} == {v: v for v in ("m2po", "opsm", "aipo", "vcpo")}
    vcpo = tcs["vcpo"]
    assert (vcpo.step_scale, vcpo.adv_estimator) == ("ess_sqrt", "opob")
    assert float(vcpo.hparams["rollout_is_threshold"]) == 8.0  # a correction option keeps its command-line text
    assert tcs["m2po"].adv_estimator == "grpo" and tcs["m2po"].step_scale == "none"
    named = cells(SweepConfig(methods=("vcpo", "aipo"), num_mini_batches=(1,), seeds=(0,)))
    assert [flat(SweepConfig(), c).adv_estimator for c in named] == ["opob", "grpo"]
    tc = train_config(SweepConfig(methods=("vespo",), num_mini_batches=(4,), seeds=(0,)), cells(SweepConfig(
        methods=("vespo",), num_mini_batches=(4,), seeds=(0,)))[0])  # fmt: skip
    before = {k: v for k, v in tc.flat().items() if k not in NOT_IDENTITY and k not in LATER_FIELDS}
    assert cell_key(tc) == settings_key(before)  # the hash a cell had before the fields existed
    assert cell_key(TrainConfig(**(tc.flat() | {"eval_top_p": 0.7}))) != cell_key(tc)


def test_cell_configs_are_built_from_the_settings_with_typed_extra():
    """Issue 41: a cell's TrainConfig is built from its settings, no flags parsed. Checked field by field against the
    flag-parsed configs before that path went (presets, hparams, tasks, typed `extra`: every field and type equal);
    pinned here by hand: rollout steps = max(optimizer_steps, min_rollout_steps x N) / N, evaluations, checkpoints and
    probes at equal strides of them, and the cell keys the flag-parsed configs had (finished cells are reused)."""

    from vespo.experiments.sweep import preset_config

    def changed(cfg):  # (cell name, the fields that differ from TrainConfig's defaults)
        (c,) = cells(cfg)
        default = TrainConfig().flat()
        return c.name, {k: v for k, v in train_config(cfg, c).flat().items() if v != default[k]}

    common = {"eval_size": 500, "eval_n": 2, "num_threads": 1, "progress": False}  # reward_fn: math, as TrainConfig()
    # paper-long, N = 64: max(64, 8 x 64) / 64 = 8 rollout steps of 8 x 64 prompts; 4 evaluations and probes
    name, fields = changed(
        preset_config("paper-long", out_dir="sw", variants=("vespo",), num_mini_batches=(64,), seeds=(0,))
    )
    assert name == "vespo/N64/seed0/97794d43d7e7"
    assert fields == common | {
        "train_batch_size": 512, "ppo_mini_batch_size": 8, "total_training_steps": 8, "lr": 1e-4,
        "weight_decay": 0.01, "betas": (0.9, 0.999), "probe_every": 2, "eval_every": 2, "save_every": 1,
        "task": "chain", "num_operands": 41, "max_response_length": 3 * 41 + 5, "sft_steps": 4000, "sft_lr": 1e-3,
        "run_dir": f"sw/cells/{name}",
    }  # fmt: skip
    # paper's vcpo, N = 4: max(32, 8 x 4) / 4 = 8 rollout steps; `extra` text typed by its field (weight_decay 0.0)
    extra = {"weight_decay": "0", "target_kl": "0.02", "tensorboard": "False", "eval-top-p": "None"}
    cfg = preset_config("paper", out_dir="sw", variants=("vcpo",), num_mini_batches=(4,), seeds=(2,), extra=extra)
    name, fields = changed(cfg)
    assert name == "vcpo/N4/seed2/c4f6eb35c90d"
    assert fields == common | {
        "method": "vcpo", "hparams": {"rollout_is_threshold": "8.0"}, "adv_estimator": "opob",
        "step_scale": "ess_sqrt", "train_batch_size": 32, "ppo_mini_batch_size": 8, "total_training_steps": 8,
        "lr": 1e-4, "betas": (0.9, 0.999), "target_kl": 0.02, "tensorboard": False, "probe_every": 2,
        "eval_every": 2, "save_every": 1, "task": "scratchpad", "num_operands": 4, "seed": 2,
        "run_dir": f"sw/cells/{name}",
    }  # fmt: skip
    # no preset, N = 8: 192 / 8 = 24 rollout steps, evaluations every 24 / 4, checkpoints every 24 / 8
    name, fields = changed(SweepConfig(methods=("topr-tokenmean",), out_dir="sw", num_mini_batches=(8,), seeds=(1,)))
    assert name == "topr-tokenmean/N8/seed1/cd173bb8dbd5"
    assert fields == common | {
        "method": "topr", "loss_agg_mode": "token-mean", "train_batch_size": 32, "ppo_mini_batch_size": 4,
        "total_training_steps": 24, "seed": 1, "save_every": 3, "eval_every": 6, "eval_n": 4,
        "run_dir": f"sw/cells/{name}",
    }  # fmt: skip
    for key, text, accepted in (("eval_every", "x", "an integer"), ("tensorboard", "yes", "true or false"),
                                ("step_scale", "half", "one of")):  # fmt: skip
        with pytest.raises(ValueError, match=f"extra: {key} must be {accepted}.*got '{text}'"):
            cells(SweepConfig(methods=("vespo",), num_mini_batches=(1,), seeds=(0,), extra={key: text}))


def test_a_cell_runs_from_its_config_file(tmp_path, monkeypatch):
    """A cell's `vespo train` process reads the cell's config file beside its run dir (which says how to run it by
    hand): the same TrainConfig, `--resume` added once a checkpoint exists."""
    import subprocess
    import sys

    from vespo.experiments.sweep import run_cell
    from vespo.train.config_io import parse_args
    from vespo.train.resume import CHECKPOINT

    started = []

    class Exits1:
        def __init__(self, argv, **kwargs):
            started.append(argv)

        def wait(self):
            return 1

    monkeypatch.setattr(subprocess, "Popen", Exits1)
    cfg = SweepConfig(out_dir=str(tmp_path / "sw"), methods=("grpo",), num_mini_batches=(2,), seeds=(0,),
                      optimizer_steps=4, extra={"tensorboard": "False"})  # fmt: skip
    (cell,) = cells(cfg)
    tc = train_config(cfg, cell)
    path = tmp_path / "sw" / "cells" / "grpo" / "N2" / "seed0" / f"{cell.key}.yaml"
    for resume in ([], ["--resume"]):
        with pytest.raises(RuntimeError, match="failed \\(exit 1\\)"):
            run_cell(cfg, cell)
        assert started.pop() == [sys.executable, "-m", "vespo", "train", "--config", str(path), *resume]
        assert parse_args(["--config", str(path)]) == tc
        (Path(tc.run.run_dir) / CHECKPOINT).parent.mkdir(parents=True, exist_ok=True)
        (Path(tc.run.run_dir) / CHECKPOINT).write_bytes(b"")
    assert path.read_text().splitlines()[1] == f"#   vespo train --config {path}"

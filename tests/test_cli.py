"""The `vespo` command and the kernel figure."""

import subprocess
import sys

import pytest
import torch

from vespo.cli import main
from vespo.plots import _method_curves


@pytest.mark.parametrize("positive", [True, False])
def test_figure_curves_are_consistent(positive):
    # every kernel gives on-policy samples unit weight, and each drawn surrogate satisfies f'(w) = phi(w) / w
    w = torch.tensor([0.3, 0.7, 1.1, 1.6, 2.5], dtype=torch.float64)
    h = 1e-7
    for name, curve in _method_curves(positive).items():
        assert curve(torch.ones(1, dtype=torch.float64))[0].item() == pytest.approx(1.0), name
        phi, _ = curve(w)
        fd = (curve(w + h)[1] - curve(w - h)[1]) / (2 * h)
        torch.testing.assert_close(fd, phi / w, rtol=1e-5, atol=1e-6, msg=name)


def test_kernels_command_writes_png(tmp_path):
    assert main(["kernels", "--out", str(tmp_path)]) == 0
    png = tmp_path / "kernels.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_unknown_command_and_help(capsys):
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err
    assert main([]) == 0
    assert "bound" in capsys.readouterr().out


def test_console_script_runs():
    out = subprocess.run(
        [sys.executable, "-m", "vespo", "bound", "--c1", "3", "--c2", "2"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "K       = 1 " in out.stdout


_SMALL_SWEEP = ["--methods", "vespo", "--staleness", "1", "--seeds", "0", "--out-dir", "{root}/sw"]
_SMALL_LAB = ["--methods", "vespo", "--length", "8", "--staleness", "1", "--seeds", "0", "--out-dir", "{root}/lab"]
# (argv with {root}, the field the one-line message must name)
_BAD_GRIDS = [
    (["sweep", *_SMALL_SWEEP, "--out-dir", "{root}/afile"], "out_dir"),
    (["sweep", *_SMALL_SWEEP, "--out-dir", ""], "out_dir"),
    (["sweep", *_SMALL_SWEEP, "--out-dir", "{root}/afile/sub"], "out_dir"),
    (["sweep", *_SMALL_SWEEP, "--seeds"], "seeds"),
    (["sweep", *_SMALL_SWEEP, "--staleness"], "staleness"),
    (["sweep", *_SMALL_SWEEP, "--methods"], "methods"),
    (["sweep", *_SMALL_SWEEP, "--lr"], "lr"),
    (["sweep", *_SMALL_SWEEP, "--task"], "task"),
    (["sweep", *_SMALL_SWEEP, "--seeds", "0", "0"], "seeds"),
    (["sweep", *_SMALL_SWEEP, "--staleness", "1", "1"], "staleness"),
    (["sweep", *_SMALL_SWEEP, "--eval-points", "0"], "eval_points"),
    (["sweep", *_SMALL_SWEEP, "--jobs", "0"], "jobs"),
    (["sweep", *_SMALL_SWEEP, "--optimizer-steps", "0"], "optimizer_steps"),
    (["sweep", *_SMALL_SWEEP, "--min-rollout-steps", "0"], "min_rollout_steps"),
    (["sweep", *_SMALL_SWEEP, "--collapse-ratio", "nan"], "collapse_ratio"),
    (["sweep", *_SMALL_SWEEP, "--extra", "run_dir", "{root}"], "extra: run_dir"),
    (["sweep", *_SMALL_SWEEP, "--extra", "seed", "3"], "extra: seed"),
    (["lab", *_SMALL_LAB, "--out-dir", "{root}/afile"], "out_dir"),
    (["lab", *_SMALL_LAB, "--out-dir", ""], "out_dir"),
    (["lab", *_SMALL_LAB, "--seeds"], "seeds"),
    (["lab", *_SMALL_LAB, "--length"], "length"),
    (["lab", *_SMALL_LAB, "--staleness"], "staleness"),
    (["lab", *_SMALL_LAB, "--methods"], "methods"),
    (["lab", *_SMALL_LAB, "--lr-scale"], "lr_scale"),
    (["lab", *_SMALL_LAB, "--length", "100000000"], "length"),
    (["lab", *_SMALL_LAB, "--vocab", "100000000"], "vocab"),
    (["lab", *_SMALL_LAB, "--length", "65536", "--vocab", "1024"], "length x vocab"),
    (["lab", *_SMALL_LAB, "--mini-batch-size", "65536", "--length", "65536"], "staleness x mini_batch_size x length"),
    (["lab", *_SMALL_LAB, "--eval-points", "0"], "eval_points"),
    (["lab", *_SMALL_LAB, "--optimizer-steps", "0"], "optimizer_steps"),
    (["lab", *_SMALL_LAB, "--collapse-ratio", "-1"], "collapse_ratio"),
    (["lab", *_SMALL_LAB, "--seeds", "1", "1"], "seeds"),
    (["train", "--run-dir", ""], "run_dir"),
    (["train", "--run-dir", "  "], "run_dir"),
    (["train", "--run-dir", "{root}/afile"], "run_dir"),
    (["train", "--cache-dir", ""], "cache_dir"),
]


@pytest.mark.parametrize(("argv", "field"), _BAD_GRIDS, ids=[" ".join(a[:1] + a[-2:]) for a, _ in _BAD_GRIDS])
def test_bad_grid_and_path_is_one_line_naming_the_field_and_nothing_is_created(
    tmp_path, capsys, monkeypatch, argv, field
):
    import vespo.experiments.lab
    import vespo.experiments.sweep
    import vespo.train.launch

    def ran(*args, **kwargs):
        raise AssertionError("the bad input was accepted and the command started")

    monkeypatch.setattr(vespo.experiments.sweep, "sweep", ran)
    monkeypatch.setattr(vespo.experiments.lab, "lab", ran)
    monkeypatch.setattr(vespo.train.launch, "_run", ran)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("keep")
    before = sorted(tmp_path.rglob("*"))
    assert main([a.replace("{root}", str(tmp_path)) for a in argv]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert not out and len(lines) == 1 and f"error: {field}" in lines[0], err
    assert sorted(tmp_path.rglob("*")) == before and (tmp_path / "afile").read_text() == "keep"


@pytest.mark.parametrize("checkpointed", [False, True])
def test_interrupt_promises_resume_only_when_a_checkpoint_exists(tmp_path, capsys, monkeypatch, checkpointed):
    import vespo.train.launch
    from vespo.train.runs import CHECKPOINT

    def interrupted(cfg):
        if checkpointed:
            (tmp_path / "run" / CHECKPOINT).parent.mkdir(parents=True)
            (tmp_path / "run" / CHECKPOINT).write_bytes(b"x")
        raise KeyboardInterrupt

    monkeypatch.setattr(vespo.train.launch, "_run", interrupted)
    assert main(["train", "--run-dir", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err
    assert ("--resume continues" in err) == checkpointed, err
    assert checkpointed or "no checkpoint was saved yet" in err


def test_version_comes_from_the_package_metadata():
    from importlib.metadata import version

    proc = subprocess.run([sys.executable, "-m", "vespo", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == f"vespo {version('vespo')}", proc.stderr
    assert "--version" in subprocess.run([sys.executable, "-m", "vespo"], capture_output=True, text=True).stdout


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--method", "cispo", "--hparams", "ratio_min", "None"], {"ratio_min": None}),
        (
            ["--method", "cispo", "--hparams", "ratio_min", "0.5", "ratio_max", "3"],
            {"ratio_min": 0.5, "ratio_max": 3.0},
        ),
        (
            ["--hparams", "c1_pos", "2", "rollout_rs", "token_k1", "rollout_rs_threshold", "0.5_5"],
            {"c1_pos": 2.0, "rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_5"},
        ),
        (["--hparams", "rollout_is", "None"], {"rollout_is": None}),
    ],
)
def test_hparams_are_typed_by_the_methods_own_signature(argv, expected):
    """`--hparams` values take the registry's types: None where None is accepted (CISPO's ratio_min), floats for
    floats, and veRL's "lower_upper" thresholds stay text (a number parser reads "0.5_5" as 0.55)."""
    from vespo.train.config_io import parse_args

    got = parse_args(argv).hparams
    assert got == expected and all(type(got[k]) is type(v) for k, v in expected.items())

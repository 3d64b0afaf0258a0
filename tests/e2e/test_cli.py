"""The `vespo` command and the kernel figure."""

import contextlib
import io
import json
import re
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


_SMALL_SWEEP = ["--methods", "vespo", "--num-mini-batches", "1", "--seeds", "0", "--out-dir", "{root}/sw"]
_SMALL_LAB = [
    "--methods",
    "vespo",
    "--length",
    "8",
    "--num-mini-batches",
    "1",
    "--seeds",
    "0",
    "--out-dir",
    "{root}/lab",
]
# (argv with {root}, the field the one-line message must name)
_BAD_GRIDS = [
    (["sweep", *_SMALL_SWEEP, "--out-dir", "{root}/afile"], "out_dir"),
    (["sweep", *_SMALL_SWEEP, "--out-dir", ""], "out_dir"),
    (["sweep", *_SMALL_SWEEP, "--out-dir", "{root}/afile/sub"], "out_dir"),
    (["sweep", *_SMALL_SWEEP, "--seeds"], "seeds"),
    (["sweep", *_SMALL_SWEEP, "--num-mini-batches"], "num_mini_batches"),
    (["sweep", *_SMALL_SWEEP, "--methods"], "methods"),
    (["sweep", *_SMALL_SWEEP, "--lr"], "lr"),
    (["sweep", *_SMALL_SWEEP, "--task"], "task"),
    (["sweep", *_SMALL_SWEEP, "--seeds", "0", "0"], "seeds"),
    (["sweep", *_SMALL_SWEEP, "--num-mini-batches", "1", "1"], "num_mini_batches"),
    (["sweep", *_SMALL_SWEEP, "--staleness", "4"], "--num-mini-batches and --staleness are two names of one setting"),
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
    (["lab", *_SMALL_LAB, "--num-mini-batches"], "num_mini_batches"),
    (["lab", *_SMALL_LAB, "--methods"], "methods"),
    (["lab", *_SMALL_LAB, "--lr-scale"], "lr_scale"),
    (["lab", *_SMALL_LAB, "--length", "100000000"], "length"),
    (["lab", *_SMALL_LAB, "--vocab", "100000000"], "vocab"),
    (["lab", *_SMALL_LAB, "--length", "65536", "--vocab", "1024"], "length x vocab"),
    (
        ["lab", *_SMALL_LAB, "--mini-batch-seqs", "65536", "--length", "65536"],
        "num_mini_batches x mini_batch_seqs x length",
    ),
    (["lab", *_SMALL_LAB, "--eval-points", "0"], "eval_points"),
    (["lab", *_SMALL_LAB, "--optimizer-steps", "0"], "optimizer_steps"),
    (["lab", *_SMALL_LAB, "--collapse-ratio", "-1"], "collapse_ratio"),
    (["lab", *_SMALL_LAB, "--seeds", "1", "1"], "seeds"),
    (["lab", *_SMALL_LAB, "--staleness", "4"], "--num-mini-batches and --staleness are two names of one setting"),
    (["lab", *_SMALL_LAB, "--mini-batch-size", "8", "--mini-batch-seqs", "8"], "--mini-batch-size and --mini-batch-s"),
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
    import vespo.train.runs

    def ran(*args, **kwargs):
        raise AssertionError("the bad input was accepted and the command started")

    monkeypatch.setattr(vespo.experiments.sweep, "sweep", ran)
    monkeypatch.setattr(vespo.experiments.lab, "lab", ran)
    monkeypatch.setattr(vespo.train.runs, "claim_run_dir", ran)  # a run starts by claiming its run dir
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
    import vespo.train.runs
    from vespo.train.resume import CHECKPOINT

    def interrupted(cfg):
        if checkpointed:
            (tmp_path / "run" / CHECKPOINT).parent.mkdir(parents=True)
            (tmp_path / "run" / CHECKPOINT).write_bytes(b"x")
        raise KeyboardInterrupt

    monkeypatch.setattr(vespo.train.runs, "claim_run_dir", interrupted)
    assert main(["train", "--run-dir", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err
    assert ("the same command continues" in err) == checkpointed, err
    assert checkpointed or "no checkpoint was saved yet" in err


def test_ctrl_c_then_the_same_train_command_continues_and_another_run_dir_is_refused_before_torch(
    tmp_path, capsys, monkeypatch
):
    """Issue 55 item 4: after Ctrl-C (a checkpoint kept), the same `vespo train` command continues the run, as sweep
    and lab do and README promises; the same run dir with another config is refused in one line, from a process that
    never imported torch or transformers (it answered after 4-29 s of imports before)."""
    import vespo.train.runs
    from vespo.train.config_io import parse_args, to_yaml
    from vespo.train.resume import CHECKPOINT

    run = tmp_path / "run"
    argv = ["train", "--run-dir", str(run), "--total-training-steps", "10", "--no-progress"]
    started = []

    def claimed(cfg):  # the run section
        started.append(cfg.resume)
        if not cfg.resume:  # the first run: config.yaml and a checkpoint, then Ctrl-C
            (run / CHECKPOINT).parent.mkdir(parents=True)
            (run / "config.yaml").write_text(to_yaml(parse_args(argv[1:])))
            (run / CHECKPOINT).write_bytes(b"a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(vespo.train.runs, "claim_run_dir", claimed)
    assert main(argv) == 130 and "the same command continues" in capsys.readouterr().err
    assert main(argv) == 130 and started == [False, True]
    assert f"run_dir {run} holds this run's checkpoint; continuing it (as --resume)" in capsys.readouterr().err
    result = tmp_path / "result.json"
    other = json.dumps([*argv, "--lr", "0.01"])
    proc = subprocess.run([sys.executable, "-c", _IMPORTS, other, str(result), json.dumps(_HEAVY)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)  # fmt: skip
    assert json.loads(result.read_text()) == {"code": 2, "heavy": []}, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "holds another run with a checkpoint (lr: 0.0003 -> 0.01)" in lines[0], proc.stderr
    assert "--overwrite-output-dir to replace it" in lines[0] and (run / CHECKPOINT).read_bytes() == b"a checkpoint"


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

    got = parse_args(argv).algorithm.hparams
    assert got == expected and all(type(got[k]) is type(v) for k, v in expected.items())


# --- a command line that answers at once (issue 39 item 2): no heavy import before the config is valid
_HEAVY = ("torch", "transformers", "datasets", "reasoning_gym", "trl", "vllm", "matplotlib", "scipy")
_IMPORTS = """
import json, sys
from vespo.cli import main
code = None
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as exc:
    code = exc.code
with open(sys.argv[2], "w") as f:
    json.dump({"code": code, "heavy": [m for m in json.loads(sys.argv[3]) if m in sys.modules]}, f)
"""


def _listed_commands() -> list[str]:
    """The sub-commands `vespo --help` lists: each is checked below, so a new one is covered without editing this."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["--help"])
    listing = out.getvalue().split("commands:\n", 1)[1].split("\n\n", 1)[0]
    return [line.split()[0] for line in listing.splitlines()]


_LISTED = _listed_commands()
_ANSWERED_AT_ONCE = [  # (argv with {root}, exit code, what the one-line error names)
    *(([name, "--help"], 0, None) for name in _LISTED),
    *(([name, "--no-such-flag"], 2, "unknown flag --no-such-flag") for name in _LISTED),
    (["train", "--method", "vesop", "--run-dir", "{root}/run"], 2, "unknown method 'vesop'"),
    (["train", "--metod", "vespo"], 2, "unknown flag --metod; nearest: --method"),
    (["train", "--output-dirr", "{root}/run"], 2, "nearest: --output-dir"),
    (["train", "--lr", "-1"], 2, "lr must be"),
    (["train", "--optim", "adam"], 2, "--optim must be one of ['adamw_torch', 'sgd'], got 'adam'"),
    (["train", "--dataset", "reasoning-gym:chain_summ", "--run-dir", "{root}/run"], 2, "task 'chain_summ'"),
    (["train", "--num-train-epochs", "3"], 2, "--total-training-steps"),
    (["sweep", "--methods", "vesop", "--out-dir", "{root}/sw"], 2, "unknown method 'vesop'"),
    (["sweep", "--mini-batch", "2"], 2, "nearest: --mini-batch-size"),
    (["lab", "--methods", "vesop", "--out-dir", "{root}/sw"], 2, "methods: unknown ['vesop']"),
    (["lab", "--lr", "-1", "--out-dir", "{root}/sw"], 2, "lr must be a finite number > 0, got -1.0"),
    (["eval", "--model", "m", "--temperature", "0", "--out", "{root}/run"], 2, "--temperature must be"),
    (["compare", "{root}/results.csv", "--alpha", "2"], 2, "--alpha must be in (0, 1), got 2.0"),
]


def test_the_help_listing_is_read():
    """`_LISTED`, which the test below runs, is read from `vespo --help`: the parse finds every command it shows
    today (a new one adds itself)."""
    assert set(_LISTED) >= {"train", "export", "sweep", "lab", "compare", "eval", "kernels", "bound"}


@pytest.mark.parametrize(
    ("argv", "code", "names"), _ANSWERED_AT_ONCE, ids=[" ".join(a) for a, _, _ in _ANSWERED_AT_ONCE]
)
def test_help_and_bad_input_are_answered_before_torch_is_imported(tmp_path, argv, code, names):
    """`--help`, a bad flag, value, method or reasoning-gym task: the answer comes from a process that never imported
    torch, transformers, datasets, reasoning-gym, trl or matplotlib (read from its sys.modules at the end); an error
    is one line."""
    argv = [a.replace("{root}", str(tmp_path)) for a in argv]
    result = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORTS, json.dumps(argv), str(result), json.dumps(_HEAVY)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    got = json.loads(result.read_text())
    assert got == {"code": code, "heavy": []}, proc.stderr
    if names is None:
        assert "usage" in proc.stdout.lower() and not proc.stderr
    else:
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and names in lines[0] and " error: " in lines[0], proc.stderr
        assert not (tmp_path / "run").exists() and not (tmp_path / "sw").exists()


def test_the_cached_method_list_is_the_registry():
    """`BUILTIN_METHODS` (how --method is checked before torch) is what importing `vespo.losses` registers."""
    code = "import json, vespo.losses; print(json.dumps(vespo.losses.available_methods()))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    from vespo.train.config import BUILTIN_METHODS

    assert sorted(BUILTIN_METHODS) == json.loads(proc.stdout)


def test_the_cached_reasoning_gym_tasks_are_the_installed_registry(monkeypatch):
    """`KNOWN_TASKS` equals reasoning-gym's registry at `KNOWN_TASKS_VERSION` (update both when the version moves);
    with another version installed the registry itself is read."""
    reasoning_gym = pytest.importorskip("reasoning_gym")
    from importlib.metadata import version

    from vespo.data import reasoning_gym as rg

    assert version("reasoning-gym") == rg.KNOWN_TASKS_VERSION, "update KNOWN_TASKS for this reasoning-gym"
    assert rg.KNOWN_TASKS == sorted(reasoning_gym.factory.DATASETS)
    monkeypatch.setattr(rg, "KNOWN_TASKS", ["only_this"])
    assert rg.task_names() == ["only_this"]
    monkeypatch.setattr(rg, "KNOWN_TASKS_VERSION", "0.0.0")
    assert rg.task_names() == sorted(reasoning_gym.factory.DATASETS)


@pytest.mark.parametrize(
    ("accepted", "known", "message"),
    [
        (["--output-dir", "--overwrite-output-dir", "--run-dir"], ["--output-dirr"], "unknown flag --output-dirr; "
         "nearest: --output-dir, --overwrite-output-dir"),
        (["--lr-scheduler-type", "--lr"], ["--lr_schedule=x"], "unknown flag --lr_schedule; nearest: "
         "--lr-scheduler-type"),
        (["--progress", "--no-progress"], ["--progres"], "unknown flag --progres; nearest: --progress"),
        (["--progress", "--no-progress"], ["--no-progres"], "unknown flag --no-progres; nearest: --no-progress, "
         "--progress"),
        (["--out"], ["--zzz"], "unknown flag --zzz"),
        (["--lr-scheduler-type"], ["--lr_scheduler_type=x", "-1e-3", "-inf"], None),  # `_` is `-`; numbers are values
    ],
)  # fmt: skip
def test_unknown_flag_names_the_nearest(accepted, known, message):
    from vespo.argv import unknown_flag

    assert unknown_flag(known, accepted) == message


# --- TRL's names (issue 42 item 4)
@pytest.mark.parametrize(
    ("trl", "vespo"),
    [
        (["--output-dir", "{root}"], {"run_dir": "{root}"}),
        (["--output_dir={root}"], {"run_dir": "{root}"}),
        (["--num-generations", "4"], {"rollout_n": 4}),
        (["--max-completion-length", "20"], {"max_response_length": 20}),
        (["--learning-rate", "1e-4"], {"lr": 1e-4}),
        (["--beta", "0.01"], {"kl_coef": 0.01}),
        (["--max-grad-norm", "0.5"], {"grad_clip": 0.5}),
        # TRL's per-device batch counts completions: 16 / 4 generations = 4 prompts, one optimizer step per rollout
        (["--per-device-train-batch-size", "16", "--num-generations", "4"],
         {"rollout_n": 4, "ppo_mini_batch_size": 4, "train_batch_size": 4}),
        (["--per-device-train-batch-size", "16"], {"ppo_mini_batch_size": 2, "train_batch_size": 2}),  # 8 responses
        (["--per-device-train-batch-size", "16", "--staleness", "3"],
         {"ppo_mini_batch_size": 2, "train_batch_size": 6}),
        (["--per-device-train-batch-size", "16", "--train-batch-size", "8"],
         {"ppo_mini_batch_size": 2, "train_batch_size": 8}),
        (["--per-device-train-batch-size", "16", "--steps-per-generation", "4"],
         {"ppo_mini_batch_size": 2, "train_batch_size": 8}),
        # TRL's max_steps counts optimizer steps: 12 at N = 4 are 3 rollout steps
        (["--max-steps", "12"], {"total_training_steps": 12}),
        (["--max_steps=12", "--staleness", "4"], {"total_training_steps": 3, "train_batch_size": 64}),
    ],
)  # fmt: skip
def test_trl_names_are_read_as_vespo_fields_in_vespos_units(tmp_path, trl, vespo):
    from vespo.train.config_io import parse_args

    base = ["--run-dir", str(tmp_path)] if "{root}" not in " ".join(trl) else []
    cfg = parse_args(base + [a.replace("{root}", str(tmp_path)) for a in trl])
    got = {k: cfg.flat()[k] for k in vespo}
    assert got == {k: str(tmp_path) if v == "{root}" else v for k, v in vespo.items()}


@pytest.mark.parametrize(
    ("batch", "generations", "steps_per_generation", "max_steps"), [(16, 4, 1, 6), (16, 4, 2, 12), (24, 8, 3, 9)]
)
def test_trl_batch_and_steps_mean_what_trls_own_config_makes_of_them(
    tmp_path, batch, generations, steps_per_generation, max_steps
):
    """Cross-check with TRL's GRPOConfig (one process, no gradient accumulation): its generation batch in prompts is
    vespo's train_batch_size, its optimizer step's batch in prompts vespo's ppo_mini_batch_size, and its max_steps
    over the optimizer steps per generation vespo's rollout steps."""
    trl = pytest.importorskip("trl")
    from vespo.train.config_io import parse_args

    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"), per_device_train_batch_size=batch, num_generations=generations,
        steps_per_generation=steps_per_generation, max_steps=max_steps, use_cpu=True, bf16=False, report_to="none",
    )  # fmt: skip
    flags = {"per-device-train-batch-size": batch, "num-generations": generations, "max-steps": max_steps,
             "steps-per-generation": steps_per_generation, "output-dir": tmp_path / "run"}  # fmt: skip
    cfg = parse_args([x for k, v in flags.items() for x in (f"--{k}", str(v))])
    assert args.world_size * args.gradient_accumulation_steps == 1
    assert cfg.batch.train_batch_size == args.generation_batch_size // args.num_generations
    assert cfg.batch.ppo_mini_batch_size == args.per_device_train_batch_size // args.num_generations
    assert cfg.batch.total_training_steps == args.max_steps // args.steps_per_generation
    assert cfg.batch.rollout_n == args.num_generations


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-train-epochs", "3"], "--num-train-epochs (TRL) has no vespo counterpart: vespo counts rollout steps"),
        (["--gradient-accumulation-steps", "2"], "--ppo-mini-batch-size"),
        (["--epsilon", "0.2"], "--hparams clip_ratio_low"),
        (["--per-device-train-batch-size", "12"], "a positive multiple of rollout_n=8"),
        (["--max-steps", "7", "--staleness", "2"], "a positive multiple of the staleness N=2"),
        (["--max-steps", "0"], "a positive multiple"),
        (["--output-dir", "a", "--run-dir", "b"], "--output-dir is TRL's name for --run-dir: give one of them"),
        (["--num-generations", "4", "--rollout-n", "4"], "--num-generations is TRL's name for --rollout-n"),
        (["--num-generations", "four"], "--num-generations must be an integer, got 'four'"),
        (["--learning-rate"], "--learning-rate needs a value"),
        (["--num-generations", "1"], "rollout_n must be >= 2"),
    ],
)
def test_trl_names_without_a_counterpart_or_with_bad_values_are_one_line(argv, message):
    from vespo.train.config import ConfigError
    from vespo.train.config_io import parse_args

    with pytest.raises(ConfigError) as info:
        parse_args(argv)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_trl_names_match_the_yaml_given_fields(tmp_path):
    """A TRL flag and its vespo field from --config are the same setting twice: refused; other YAML fields stay."""
    from vespo.train.config import ConfigError
    from vespo.train.config_io import parse_args

    (tmp_path / "c.yaml").write_text("rollout_n: 4\nlr: 0.001\n")
    with pytest.raises(ConfigError, match="--num-generations is TRL's name for --rollout-n"):
        parse_args(["--config", str(tmp_path / "c.yaml"), "--num-generations", "8"])
    cfg = parse_args(["--config", str(tmp_path / "c.yaml"), "--per-device-train-batch-size", "8"])
    assert (cfg.batch.rollout_n, cfg.optimizer.lr, cfg.batch.ppo_mini_batch_size, cfg.batch.train_batch_size) == (
        4,
        0.001,
        2,
        2,
    )


# --- the run's time, printed after its first step (issue 39 item 3)
def test_time_estimate_counts_the_steps_and_evaluations_left():
    from vespo.train.progress import time_estimate

    cfg = (10, 4)  # total_training_steps, eval_every
    line = time_estimate(*cfg, 1, 2.0, 3.0)  # 9 steps x 2 s + evaluations at 4, 8 and 10 x 3 s = 27 s
    assert line.startswith("vespo train: step 1 took 2.0 s, about 27.0 s left (9 more steps x 2.0 s + 3 evaluations "
                           "x 3.0 s), done ~")  # fmt: skip
    assert "about 18.0 s left (9 more steps x 2.0 s), done" in time_estimate(*cfg, 1, 2.0, 0.0)  # no evaluations
    assert "2 evaluations not timed yet" in time_estimate(*cfg, 5, 90.0, None)  # resumed: 8 and 10; 5 x 1.5 min
    assert "about 7.5 min left" in time_estimate(*cfg, 5, 90.0, None)
    assert "about 2.5 h left" in time_estimate(101, 0, 1, 90.0, 0.0)
    assert time_estimate(*cfg, 10, 2.0, 3.0) is None


def test_train_prints_its_time_estimate_after_the_first_step(tmp_path, capsys):
    run = ["--run-dir", str(tmp_path / "run"), "--total-training-steps", "3", "--eval-every", "2", "--eval-size", "8"]
    assert main(["train", *run, "--train-batch-size", "4", "--ppo-mini-batch-size", "4", "--no-tensorboard"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "left (" in line]
    assert len(lines) == 1, lines
    assert re.search(r"vespo train: step 1 took [\d.]+ s, about [\d.]+ (s|min) left \(2 more steps x [\d.]+ s \+ "
                     r"2 evaluations x [\d.]+ s\), done ~\d\d:\d\d$", lines[0].split("\r")[-1]), lines  # fmt: skip


def test_the_flag_check_accepts_every_flag_tyro_does():
    """`parse_flags` refuses unknown flags itself, before tyro: aliases (the old spellings) and `--no-` booleans pass,
    a suppressed field (`tyro.conf.Suppress`) has no flag."""
    from vespo.argv import UsageError, parse_flags
    from vespo.experiments.lab import LabConfig
    from vespo.experiments.sweep import SweepConfig

    old = ["--group-size", "4", "--optimizer", "sgd", "--adam-eps", "0.01", "--mismatch-std", "0.5"]
    cfg = parse_flags(LabConfig, old, prog="vespo lab", description="")
    assert (cfg.rollout_n, cfg.optim, cfg.adam_epsilon, cfg.rollout_logit_noise) == (4, "sgd", 0.01, 0.5)
    old = ["--mini-batch-size", "2", "--chain_operands", "7", "--no-overwrite-output-dir"]
    cfg = parse_flags(SweepConfig, old, prog="vespo sweep", description="")
    assert (cfg.ppo_mini_batch_size, cfg.num_operands, cfg.overwrite_output_dir) == (2, 7, False)
    with pytest.raises(UsageError, match=r"^unknown flag --regime-applied \(vespo sweep --help lists every flag\)$"):
        parse_flags(SweepConfig, ["--regime-applied"], prog="vespo sweep", description="")


def test_an_old_flag_name_still_works_with_one_deprecation_line(capsys):
    """A renamed field's old flags (`vespo.argv.RENAMED`) set the field and print one line each, once per flag; the
    current names and the other aliases print nothing."""
    from vespo.argv import parse_flags, renamed_flags, warn_renamed
    from vespo.experiments.lab import LabConfig
    from vespo.experiments.sweep import SweepConfig

    cfg = parse_flags(SweepConfig, ["--staleness", "4", "16", "--mini-batch-size", "2"], prog="vespo sweep",
                      description="")  # fmt: skip
    assert (cfg.num_mini_batches, cfg.ppo_mini_batch_size) == ((4, 16), 2)
    assert capsys.readouterr().err == "vespo sweep: --staleness is deprecated; use --num-mini-batches\n"
    cfg = parse_flags(LabConfig, ["--staleness=2", "--mini_batch_size", "16", "--staleness", "4"], prog="vespo lab",
                      description="")  # fmt: skip
    assert (cfg.num_mini_batches, cfg.mini_batch_seqs) == ((4,), 16)
    assert capsys.readouterr().err.splitlines() == [
        "vespo lab: --staleness is deprecated; use --num-mini-batches",
        "vespo lab: --mini-batch-size is deprecated; use --mini-batch-seqs",
    ]
    cfg = parse_flags(SweepConfig, ["--num-mini-batches", "8"], prog="vespo sweep", description="")
    assert cfg.num_mini_batches == (8,) and capsys.readouterr().err == ""
    from vespo.train.config_io import parse_args  # issue 55 item 5: train takes N by the same name, the same line

    assert parse_args(["--staleness", "4", "--ppo-mini-batch-size", "2"]).batch.num_mini_batches == 4
    assert capsys.readouterr().err == "vespo train: --staleness is deprecated; use --num-mini-batches\n"
    assert parse_args(["--num-mini-batches", "4", "--ppo-mini-batch-size", "2"]).batch.train_batch_size == 8
    assert capsys.readouterr().err == ""
    assert renamed_flags(SweepConfig) == {"--staleness": "--num-mini-batches"}
    warn_renamed("bench.py", ["--seeds", "1", "--sync-staleness", "4"], {"--sync-staleness": "--sync-n"})
    assert capsys.readouterr().err == "bench.py: --sync-staleness is deprecated; use --sync-n\n"


def test_cli_is_the_dispatcher_only_and_the_argv_toolkit_sits_below_every_room():
    """Issue 52: cli.py was both the `vespo` dispatcher and the argv toolkit lower rooms imported (train, evaluation,
    experiments, benchmarks, the TRL example), an arrow running back up. Now no package module imports vespo.cli but
    `__main__`, scripts take only the command itself (`main`) from it, and vespo.argv imports no vespo module."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]

    def from_cli(path: Path) -> set[str]:
        """The names `path` imports from vespo.cli ("*" for `import vespo.cli`)."""
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "vespo.cli":
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.Import) and any(a.name == "vespo.cli" for a in node.names):
                names.add("*")
        return names

    package = [p for p in (root / "src").rglob("*.py") if p.name != "__main__.py" and from_cli(p)]
    scripts = [p for d in ("benchmarks", "examples") for p in (root / d).rglob("*.py") if from_cli(p) - {"main"}]
    assert package == [] and scripts == [], f"these import the argv toolkit from the dispatcher: {package + scripts}"
    argv = ast.parse((root / "src" / "vespo" / "argv.py").read_text())
    assert not [n for n in ast.walk(argv) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("vespo")]

"""Nothing lost: a run directory is vespo's only when vespo marked it, only what its manifest lists is ever deleted,
one process writes it at a time, and resume survives a missing or damaged log. Each case is an attack a careless user
(or another trainer sharing the directory) made on an earlier version; before the fix they lost files or crashed."""

import errno
import hashlib
import json
import os
from pathlib import Path

import pytest
from conftest import with_model

from vespo.outputs import LOCK, MARKER, claim
from vespo.rewards import GraderHostError
from vespo.train.launch import cli
from vespo.train.logs import read_metrics
from vespo.train.resume import CHECKPOINT


@pytest.fixture(scope="module")
def assets(tmp_path_factory, warm_model):
    """The shared warm-started tiny model (root/model) and a JSONL training set of the arithmetic task."""
    root = with_model(tmp_path_factory.mktemp("assets"), warm_model)
    train_set = warm_model.train
    (root / "train.jsonl").write_text("".join(json.dumps({"prompt": p.prompt, "answer": p.answer}) + "\n"
                                              for p in train_set))  # fmt: skip
    return root


def _argv(assets, run_dir, *extra) -> list[str]:
    flags = {"model": assets / "model", "dataset": assets / "train.jsonl", "run-dir": run_dir, "train-batch-size": 2,
             "ppo-mini-batch-size": 1, "rollout-n": 2, "max-response-length": 4, "total-training-steps": 2,
             "eval-every": 0, "num-threads": 1, "save-every": 1}  # fmt: skip
    return [a for k, v in flags.items() for a in (f"--{k}", str(v))] + ["--no-progress", "--no-tensorboard", *extra]


def _snapshot(root) -> dict[str, str]:
    """Every file under `root` with a hash of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _another_trainers_dir(root):
    """What another trainer leaves: its checkpoints, an exported model, TensorBoard logs and a metrics log."""
    (root / "checkpoints" / "checkpoint-5000").mkdir(parents=True)
    (root / "checkpoints" / "checkpoint-5000" / "model.safetensors").write_bytes(os.urandom(256))
    (root / "final").mkdir()
    (root / "final" / "config.json").write_text('{"model_type": "llama"}')
    (root / "tb").mkdir()
    (root / "tb" / "events.out.tfevents.1").write_bytes(os.urandom(64))
    (root / "metrics.jsonl").write_text('{"step": 5000, "loss": 0.1}\n')
    return _snapshot(root)


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_a_directory_vespo_did_not_create_is_never_deleted_from(assets, tmp_path, capsys):
    before = _another_trainers_dir(tmp_path)
    assert cli(_argv(assets, tmp_path)) == 2
    line = _one_line(capsys.readouterr().err)
    assert "was not created by vespo" in line and "--overwrite-output-dir" in line
    # asked to overwrite, vespo still replaces nothing it did not write: checkpoints/, final/, tb/ are the other's
    assert cli(_argv(assets, tmp_path, "--overwrite-output-dir")) == 2
    assert "which vespo did not write" in _one_line(capsys.readouterr().err)
    assert _snapshot(tmp_path) == before and not (tmp_path / MARKER).exists() and not (tmp_path / LOCK).exists()


def test_overwrite_writes_beside_foreign_files_and_a_rerun_deletes_only_the_manifest(assets, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.jsonl").write_text("{}\n")
    assert cli(_argv(assets, tmp_path, "--overwrite-output-dir")) == 0
    assert (tmp_path / CHECKPOINT).is_file() and json.loads((tmp_path / MARKER).read_text())["kind"] == "train"
    # the run is now vespo's: replacing it deletes its outputs, never notes.txt or data/
    assert cli(_argv(assets, tmp_path, "--overwrite-output-dir", "--seed", "1")) == 0
    assert "replacing the run there" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "data" / "x.jsonl").read_text() == "{}\n"


def test_a_second_process_on_a_run_dir_is_refused_with_the_holders_pid(assets, tmp_path, capsys):
    assert cli(_argv(assets, tmp_path / "run")) == 0
    held = claim(tmp_path / "run", "train", [], label="run_dir")  # another process's run, for the lock's purposes
    try:
        before = _snapshot(tmp_path / "run")
        assert cli(_argv(assets, tmp_path / "run", "--resume", "--total-training-steps", "3",
                         "--allow-change", "total_training_steps")) == 2  # fmt: skip
        line = _one_line(capsys.readouterr().err)
        assert f"in use by another vespo process (pid {os.getpid()})" in line
        assert _snapshot(tmp_path / "run") == before
    finally:
        held.release()
    # released: the same resume now runs, and logs every step once
    assert cli(_argv(assets, tmp_path / "run", "--resume", "--total-training-steps", "3",
                     "--allow-change", "total_training_steps")) == 0  # fmt: skip
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2, 3]


def test_completions_are_replaced_with_the_run_and_truncated_on_resume(assets, tmp_path):
    run = tmp_path / "run"
    argv = _argv(assets, run, "--log-completions", "--num-completions-to-print", "2")
    assert cli(argv) == 0
    assert cli([*argv, "--overwrite-output-dir", "--seed", "3"]) == 0  # a replaced run leaves none of its rows

    def steps(name):
        return [json.loads(line)["step"] for line in (run / name).read_text().splitlines()]

    assert steps("completions.jsonl") == [1, 1, 2, 2]
    # a run killed after logging step 3 but before its checkpoint: the resume redoes step 3 and logs it once
    with (run / "completions.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3, "prompt": "p", "completion": "c", "reward": 0.0, "advantage": 0.0}) + "\n")
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3, "reward/mean": 0.0}) + "\n")
    resume = ["--resume", "--total-training-steps", "3", "--allow-change", "total_training_steps"]
    assert cli([*argv, "--seed", "3", *resume]) == 0
    assert steps("completions.jsonl") == [1, 1, 2, 2, 3, 3]
    assert steps("metrics.jsonl") == [1, 2, 3]


@pytest.mark.parametrize("damage", ["missing", "middle line", "not rows"])
def test_resume_recovers_from_a_missing_or_damaged_metrics_log(assets, tmp_path, capsys, damage):
    run = tmp_path / "run"
    assert cli(_argv(assets, run)) == 0
    log = run / "metrics.jsonl"
    if damage == "missing":
        log.unlink()
    elif damage == "middle line":
        lines = log.read_text().splitlines()
        log.write_text("\n".join([lines[0], '{"step": 2, "rew', *lines[1:]]) + "\n")
    else:
        log.write_text("[1, 2]\n{}\n" + log.read_text())
    capsys.readouterr()
    resume = ["--resume", "--total-training-steps", "3", "--allow-change", "total_training_steps"]
    for _ in range(2):  # and a later resume is not stuck on the same damage
        assert cli(_argv(assets, run, *resume)) == 0
        resume[2] = "4"
    err = [line for line in capsys.readouterr().err.splitlines() if "resume:" in line]
    assert len(err) == 1 and ("is missing" in err[0] if damage == "missing" else "damaged line" in err[0]), err
    assert [r["step"] for r in read_metrics(run)] == ([3, 4] if damage == "missing" else [1, 2, 3, 4])


def test_a_run_refused_for_bad_data_leaves_no_directory_behind(assets, tmp_path, capsys):
    small = tmp_path / "small.jsonl"
    small.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    argv = _argv(assets, tmp_path / "new" / "run")
    argv[argv.index("--dataset") + 1] = str(small)
    assert cli(argv) == 2
    assert "fewer than train_batch_size" in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "new" / "run").exists()


# ---------------------------------------------------------------------------------------------------------------
# every other --out: eval, compare, lab, sweep


def _eval_argv(assets, tmp_path, out, *extra) -> list[str]:
    bench = tmp_path / "toy.jsonl"
    bench.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(2)))
    return ["--model", str(assets / "model"), "--benchmarks", str(bench), "--k", "1", "--max-new-tokens", "4",
            "--out", str(out), *extra]  # fmt: skip


def _error_line(err: str) -> str:
    """The one error line of an argparse-style refusal (usage line aside), never a traceback."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    return lines[0]


def test_eval_never_truncates_an_earlier_result_unless_asked(assets, tmp_path, capsys):
    from vespo import evaluation

    foreign = tmp_path / "theirs"
    foreign.mkdir()
    (foreign / "samples.jsonl").write_text('{"keep": true}\n')
    with pytest.raises(SystemExit) as exit_:
        evaluation.cli(_eval_argv(assets, tmp_path, foreign))
    assert exit_.value.code == 2 and "not created by vespo" in _error_line(capsys.readouterr().err)
    assert (foreign / "samples.jsonl").read_text() == '{"keep": true}\n' and not (foreign / MARKER).exists()

    out = tmp_path / "out"
    assert evaluation.cli(_eval_argv(assets, tmp_path, out)) == 0
    before = _snapshot(out)
    with pytest.raises(SystemExit) as exit_:  # refused before the model loads: samples.jsonl keeps its rows
        evaluation.cli(_eval_argv(assets, tmp_path, out))
    assert exit_.value.code == 2 and "--overwrite-output-dir" in _error_line(capsys.readouterr().err)
    assert _snapshot(out) == before
    assert evaluation.cli(_eval_argv(assets, tmp_path, out, "--overwrite-output-dir", "--seed", "1")) == 0
    assert len((out / "samples.jsonl").read_text().splitlines()) == 2  # replaced, not appended to

    (tmp_path / "file").write_text("x")
    for bad, message in ((tmp_path / "file", "is a file"), (tmp_path / "file" / "sub", "cannot be written")):
        with pytest.raises(SystemExit):
            evaluation.cli(_eval_argv(assets, tmp_path, bad))
        assert message in _error_line(capsys.readouterr().err)


def test_compare_never_replaces_its_input_or_an_existing_file_unless_asked(tmp_path, capsys):
    from vespo.experiments.compare import cli

    results = tmp_path / "results.csv"
    rows = [f"{v},1,{s},{0.5 + 0.01 * s + (0.1 if v == 'vespo' else 0)}" for v in ("grpo", "vespo") for s in range(5)]
    results.write_text("variant,N,seed,final_eval_acc\n" + "\n".join(rows) + "\n")
    original = results.read_text()
    (tmp_path / "table.md").write_text("mine")
    (tmp_path / "dir").mkdir()
    cases = [  # (out, given --overwrite, refusal): even --overwrite never replaces the input
        (results, True, "is the command's input"),
        (tmp_path / "." / "results.csv", True, "is the command's input"),
        (tmp_path / "table.md", False, "exists; pass --overwrite"),
        (tmp_path / "dir", True, "is a directory"),
        (tmp_path / "missing" / "t.md", True, "does not exist"),
    ]
    for out, overwrite, message in cases:
        with pytest.raises(SystemExit) as exit_:
            cli([str(results), "--out", str(out), *(["--overwrite"] if overwrite else [])])
        assert exit_.value.code == 2 and message in _error_line(capsys.readouterr().err)
    assert results.read_text() == original and (tmp_path / "table.md").read_text() == "mine"
    assert cli([str(results), "--out", str(tmp_path / "table.md"), "--overwrite"]) == 0
    assert (tmp_path / "table.md").read_text() == capsys.readouterr().out  # the table printed is the table written


@pytest.mark.parametrize("command", ["lab", "sweep"])
def test_grids_refuse_a_foreign_or_busy_out_dir_before_any_cell_runs(tmp_path, capsys, command):
    from vespo.cli import main

    grid = [command, "--methods", "vespo", "--num-mini-batches", "1", "--seeds", "0"]
    foreign = tmp_path / "theirs"
    foreign.mkdir()
    (foreign / "results.md").write_text("mine")
    assert main([*grid, "--out-dir", str(foreign)]) == 2
    assert "not created by vespo" in _one_line(capsys.readouterr().err)
    assert main([*grid, "--out-dir", str(foreign), "--overwrite-output-dir"]) == 2
    assert "which vespo did not write" in _one_line(capsys.readouterr().err)
    assert sorted(p.name for p in foreign.iterdir()) == ["results.md"]
    held = claim(tmp_path / "busy", command, [], label="out_dir")
    try:
        assert main([*grid, "--out-dir", str(tmp_path / "busy")]) == 2
        assert f"(pid {os.getpid()})" in _one_line(capsys.readouterr().err)
    finally:
        held.release()


# ---------------------------------------------------------------------------------------------------------------
# a grading-host failure stops the run: never trained on as zero rewards


def host_fails_after_one_batch(completions, **kwargs):
    """Grades the first batch (all wrong), then fails as a full disk does under the code grader."""
    marker = Path(os.environ["VESPO_TEST_HOST_MARKER"])
    if marker.exists():
        raise GraderHostError("cannot create the sandbox's directory: [Errno 28] No space left on device")
    marker.write_text("graded once")
    return [0.0] * len(completions)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_grading_host_failure_stops_the_run_in_one_line(assets, tmp_path, monkeypatch, capfd, mode):
    monkeypatch.setenv("VESPO_TEST_HOST_MARKER", str(tmp_path / "marker"))
    extra = ["--total-training-steps", "4", "--reward-fn", "test_output_safety:host_fails_after_one_batch"]
    extra += ["--async", "--max-staleness", "4"] if mode == "async" else []
    assert cli(_argv(assets, tmp_path / "run", *extra)) == 1
    err = [line for line in capfd.readouterr().err.splitlines() if line.startswith("vespo train")]
    assert len(err) == 1 and "grading failed on this host" in err[0] and "No space left on device" in err[0], err
    # only the batch that was graded is trained on (async: if the learner got to it before the failure arrived)
    steps = [r["step"] for r in read_metrics(tmp_path / "run")]
    assert steps == [1] if mode == "sync" else steps in ([], [1])
    assert "restarting it" not in "".join(err)  # a restarted sampler would only fail (or score zeros) again


def test_kernels_replaces_an_existing_figure_only_when_asked(tmp_path, capsys):
    from vespo.cli import kernels_cli

    (tmp_path / "kernels.png").write_bytes(b"theirs")
    (tmp_path / "file").write_text("x")
    for argv, message in (([], "exists; pass --overwrite"), (["--out", str(tmp_path / "file")], "--out")):
        with pytest.raises(SystemExit) as exit_:
            kernels_cli(argv or ["--out", str(tmp_path)])
        assert exit_.value.code == 2 and message in _error_line(capsys.readouterr().err)
    assert (tmp_path / "kernels.png").read_bytes() == b"theirs"
    assert kernels_cli(["--out", str(tmp_path), "--overwrite"]) == 0
    assert (tmp_path / "kernels.png").read_bytes()[:4] == b"\x89PNG"


def test_results_csv_is_read_only_as_a_regular_file(tmp_path):
    """`vespo compare` and the benchmarks read results.csv through `load_rows`: a FIFO there (which would block a
    plain open) or a symlink is refused in one line, a regular file is read."""
    import os

    from vespo.experiments.compare import load_rows

    real = tmp_path / "real.csv"
    real.write_text("variant,N,seed,best_eval_acc\nvespo,4,0,0.5\n")
    assert load_rows(real, "best_eval_acc") == [{"variant": "vespo", "N": "4", "seed": "0", "best_eval_acc": "0.5"}]
    os.mkfifo(tmp_path / "fifo.csv")
    (tmp_path / "link.csv").symlink_to(real)
    for name in ("fifo.csv", "link.csv"):
        with pytest.raises(ValueError, match="cannot read"):
            load_rows(tmp_path / name, "best_eval_acc")


# ---------------------------------------------------------------------------------------------------------------
# Issue 50: an export a resume deletes, a full disk at a save, a temporary a kill leaves


def test_export_refuses_an_out_a_resume_would_replace_and_checks_it_before_anything_loads(
    assets, tmp_path, capsys, monkeypatch
):
    """`vespo export RUN --out RUN/final/model` was accepted, and the run's next --resume replaced final/ with the
    export in it. An --out inside any entry a vespo output dir owns (even through a link), a symlink, one below a
    file, or one in a read-only directory is one line, exit 2, before the checkpoint or the model is read; an --out
    beside the run's own entries is written and survives the resume."""
    import vespo.models
    import vespo.train.resume
    from vespo.train.launch import export_cli

    run = tmp_path / "run"
    assert cli(_argv(assets, run)) == 0
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "via").symlink_to(run / "final", target_is_directory=True)
    (tmp_path / "ro").mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != tmp_path / "ro" and real_access(p, mode, **kw))

    def loaded(*args, **kwargs):
        raise AssertionError("read before --out was checked")

    monkeypatch.setattr(vespo.models, "load_policy", loaded)
    monkeypatch.setattr(vespo.train.resume, "load_checkpoint", loaded)
    owned = f"which the `vespo train` output in {run} owns"
    cases = {
        run / "final" / "model": f"is inside {run / 'final'}, {owned}",
        run / "checkpoints" / "export": f"is inside {run / 'checkpoints'}, {owned}",
        run / "tb" / "a" / ".." / "b": f"is inside {run / 'tb'}, {owned}",
        tmp_path / "via" / "model": f"is inside {run / 'final'}, {owned}",
        tmp_path / "link": "is a symbolic link",
        tmp_path / "file" / "model": f"is below {tmp_path / 'file'}, which is a file",
        tmp_path / "ro" / "model": f"{tmp_path / 'ro'} is not writable",
        run: "exists and is not empty",
    }
    before = _snapshot(run)
    for out, message in cases.items():
        assert export_cli([str(run), "--out", str(out)]) == 2
        line = _one_line(capsys.readouterr().err)
        assert line.startswith(f"vespo export: error: --out {out}") and message in line, line
    assert _snapshot(run) == before and not (tmp_path / "elsewhere").exists()
    (run / MARKER).rename(tmp_path / "marker")  # a run of a vespo before the marker: its next run adopts final/ too
    assert export_cli([str(run), "--out", str(run / "final" / "model")]) == 2
    assert f"is inside {run / 'final'}, {owned}" in _one_line(capsys.readouterr().err)
    (tmp_path / "marker").rename(run / MARKER)
    monkeypatch.undo()
    assert export_cli([str(run), "--out", str(run / "exported")]) == 0  # beside the run's entries: not the run's
    resume = ["--resume", "--total-training-steps", "3", "--allow-change", "total_training_steps"]
    assert cli(_argv(assets, run, *resume)) == 0
    assert (run / "exported" / "config.json").is_file() and (run / "final" / "config.json").is_file()
    # a run that diverged: NaN weights in last.pt are refused by export and by resume, in one line, writing nothing
    from vespo import checkpoints

    state = checkpoints.load(run / CHECKPOINT, checkpoints.RUN, label="test")
    next(iter(state["model"].values())).view(-1)[0] = float("nan")
    checkpoints.save(run / CHECKPOINT, checkpoints.RUN, state)
    capsys.readouterr()
    assert export_cli([str(run), "--out", str(tmp_path / "nan")]) == 2
    assert "is damaged: its weights are not finite" in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "nan").exists()
    resume[2] = "4"  # one step more than the run has done
    assert cli(_argv(assets, run, *resume)) == 2
    assert "is damaged: its weights are not finite" in _one_line(capsys.readouterr().err)


def test_a_full_disk_at_a_checkpoint_save_stops_the_run_in_one_line_keeping_the_last(
    assets, tmp_path, capsys, monkeypatch
):
    """A full disk at the step-2 save: one line naming ENOSPC and the intact step-1 checkpoint, exit 1, no
    traceback and no temporary; the run dir is released and --resume continues from step 1."""
    from vespo import checkpoints

    real = checkpoints.write_atomic

    def writer(path, data):
        if Path(path).name == "last.pt" and (Path(path).parent / "last.pt").exists():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # the second save: the disk is full
        real(path, data)

    monkeypatch.setattr(checkpoints, "write_atomic", writer)
    run = tmp_path / "run"
    assert cli(_argv(assets, run)) == 1
    line = _one_line(capsys.readouterr().err)
    assert line == (f"vespo train: error: saving checkpoint {run / CHECKPOINT} (step 2) failed: No space left on "
                    f"device (ENOSPC); the previous checkpoint {run / CHECKPOINT} is intact and no partial file was "
                    "left")  # fmt: skip
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.pt"] and not (run / "final").exists()
    monkeypatch.undo()
    assert cli(_argv(assets, run, "--resume")) == 0  # released, and resumable from step 1
    assert [r["step"] for r in read_metrics(run)] == [1, 2]


def test_temporaries_a_killed_save_leaves_are_swept_by_the_next_run_and_nothing_else(assets, tmp_path):
    """A SIGKILL during a checkpoint write left `.last.pt.<random>.tmp` for ever. The next command that claims the
    dir deletes the temporaries of vespo's atomic writer (in the run's own entries, or of a manifest name) and
    nothing else: not a user's file that looks alike beside them, not a link, not a nested output dir's."""
    import subprocess
    import sys

    run = tmp_path / "run"
    assert cli(_argv(assets, run)) == 0
    kill = (
        "import os, sys\nfrom vespo.outputs import write_atomic\n"
        "def data(f):\n    f.write(b'half a checkpoint')\n    f.flush()\n    os.kill(os.getpid(), 9)\n"
        "write_atomic(sys.argv[1], data)\n"
    )
    for target in (run / CHECKPOINT, run / "config.yaml"):
        done = subprocess.run([sys.executable, "-c", kill, str(target)], capture_output=True, check=False)
        assert done.returncode == -9, done.stderr
    left = sorted(p for p in run.rglob(".*.tmp"))
    assert [p.name.split(".")[1:3] for p in left] == [["config", "yaml"], ["last", "pt"]], left
    keep = [run / ".notes.abcdefgh.tmp", run / "notes.tmp", run / "mine" / ".last.pt.abcdefgh.tmp"]
    for path in keep:
        path.parent.mkdir(exist_ok=True)
        path.write_text("the user's")
    (run / "checkpoints" / ".x.abcdefgh.tmp").symlink_to(tmp_path / "target")  # a link: never followed or removed
    (tmp_path / "target").write_text("kept")
    resume = ["--resume", "--total-training-steps", "3", "--allow-change", "total_training_steps"]
    assert cli(_argv(assets, run, *resume)) == 0
    assert not any(os.path.lexists(p) for p in left)
    assert all(p.read_text() == "the user's" for p in keep)
    assert (run / "checkpoints" / ".x.abcdefgh.tmp").is_symlink() and (tmp_path / "target").read_text() == "kept"


def test_a_lone_surrogate_in_a_prompt_stops_train_and_eval_before_anything_runs(assets, tmp_path, capsys):
    """Issue 50: a prompt holding "\\ud800" trained until the step that drew it, died there after every resume, and
    killed `vespo eval`. Both read records through the one reader: one line naming the file, line and field, before
    the run dir or the eval's --out exists."""
    from vespo import evaluation

    data = tmp_path / "lone.jsonl"
    rows = (assets / "train.jsonl").read_text().splitlines()
    data.write_text("\n".join([*rows[:3], '{"prompt": "1+\\ud800=", "answer": "2"}', *rows[3:]]) + "\n")
    argv = _argv(assets, tmp_path / "run")
    argv[argv.index("--dataset") + 1] = str(data)
    assert cli(argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"{data}:4: 'prompt' holds a lone surrogate" in line and not (tmp_path / "run").exists(), line
    eval_argv = _eval_argv(assets, tmp_path, tmp_path / "eval")
    eval_argv[eval_argv.index("--benchmarks") + 1] = str(data)
    with pytest.raises(SystemExit) as exit_:
        evaluation.cli(eval_argv)
    line = _error_line(capsys.readouterr().err)
    assert exit_.value.code == 2 and f"{data}:4: 'prompt' holds a lone surrogate" in line, line
    assert not (tmp_path / "eval").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda rows: rows.__setitem__(3, "vespo,1,0,"), ":5: final_eval_acc must be a number, got ''"),
        (
            lambda rows: rows.__setitem__(3, "vespo,1.0,0,0.6"),
            ":5: N must be an integer (as the sweep writes it), got '1.0'",
        ),  # fmt: skip
        (lambda rows: rows.__setitem__(3, "vespo,1,0,nan"), ":5: final_eval_acc must be finite"),
        (lambda rows: rows.__setitem__(3, ",1,0,0.6"), ":5: variant is empty"),
        (lambda rows: rows.__setitem__(3, "vespo,1,x,0.6"), ":5: seed must be an integer"),
        (lambda rows: rows.__setitem__(3, "vespo,1,0"), ":5: has fewer fields than the header"),
        (
            lambda rows: rows.append("grpo,1,2,0.9"),
            ":12: variant 'grpo' at N = 1, seed 2 is also on line 4; each (variant, N, seed) must appear once",
        ),  # fmt: skip
    ],
)
def test_compare_refuses_a_row_it_would_misread_naming_the_row_and_field(tmp_path, capsys, change, message):
    """Issue 50: a blank metric was a traceback, and `N=4.0` beside `N=4` (or any row repeated) was resolved
    silently to the last row. Each is one line naming the line of results.csv and the field, exit 2."""
    from vespo.experiments.compare import cli

    results = tmp_path / "results.csv"
    rows = [f"{v},1,{s},{0.5 + 0.01 * s}" for v in ("grpo", "vespo") for s in range(5)]
    change(rows)
    results.write_text("variant,N,seed,final_eval_acc\n" + "\n".join(rows) + "\n")
    with pytest.raises(SystemExit) as exit_:
        cli([str(results)])
    line = _error_line(capsys.readouterr().err)
    assert exit_.value.code == 2 and f"{results}{message}" in line, line


def test_truncate_log_streams_the_log_and_drops_an_overlong_line_as_damaged(tmp_path, monkeypatch, capsys):
    """Issue 50 (noted): truncate_log read a whole log into memory (a long run's completions.jsonl holds gigabytes).
    It now streams it line by line with at most MAX_LOG_LINE_BYTES of a line in memory: kept rows are copied byte for
    byte, rows past the checkpoint go, a longer line is dropped as damaged (one stderr line), a torn last line
    silently."""
    from vespo.train import logs

    monkeypatch.setattr(logs, "MAX_LOG_LINE_BYTES", 40)
    path = tmp_path / "metrics.jsonl"
    kept = ['{"step": 1, "r": 0.5}', '{"step":2,"r":1e-3}']
    lines = [kept[0], '{"step": 2, "text": "' + "x" * 100 + '"}', kept[1], '{"step": 3, "r": 0.1}', '{"step": 2, "r']
    path.write_text("\n".join(lines))
    assert logs.truncate_log(path, 2) == {"step": 2, "r": 1e-3}
    assert path.read_text() == "\n".join(kept) + "\n"
    assert "dropped 1 damaged line(s) (line 2)" in _one_line(capsys.readouterr().err)
    missing = tmp_path / "completions.jsonl"
    assert logs.truncate_log(missing, 2) is None and not missing.exists()

"""The one checkpoint module (`vespo.checkpoints`): both kinds are written with a format header and read back by one
validating reader; a file of the wrong kind, of a newer format or with a damaged field is one clear line; files
written before the format (format 1, no header) still load, and a run or a warm start resumed from one continues as
if never interrupted."""

import dataclasses
import errno
import os
import random
import shutil

import numpy as np
import pytest
import torch

from vespo import checkpoints
from vespo.checkpoints import FORMAT_KEY, KIND_KEY, RUN, WARM_START, CheckpointError, rng_state
from vespo.train.config import ConfigError, TrainConfig
from vespo.train.learner import Learner, UpdateSettings
from vespo.train.logs import read_metrics
from vespo.train.resume import CHECKPOINT, load_checkpoint, restore, save_checkpoint


def _learner() -> Learner:
    """A learner of a Linear(3, 2) after one AdamW step (so the optimizer holds state)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    return Learner(model, opt, UpdateSettings())


def _warm_snapshot(step=3, steps=10) -> dict:
    """An unfinished warm start's state after `step` of `steps` SFT steps, as `sft_warm_start` saves it."""
    learner = _learner()
    rng = {"python": random.Random(0).getstate(), "torch": torch.get_rng_state()}
    return {"step": step, "model": learner.model.state_dict(), "optimizer": learner.optimizer.state_dict(),
            "rng": rng, "losses": [0.5] * step, "key": "k", "steps": steps}  # fmt: skip


def test_both_kinds_are_saved_with_the_header_and_loaded_without_it(tmp_path):
    save_checkpoint(tmp_path, 4, _learner(), torch.Generator().manual_seed(1))
    raw = torch.load(tmp_path / CHECKPOINT, weights_only=True)
    assert (raw[FORMAT_KEY], raw[KIND_KEY]) == (2, "run")
    assert sorted(load_checkpoint(tmp_path)) == ["model", "optimizer", "rng", "step"]
    checkpoints.save(tmp_path / "w.pt", WARM_START, _warm_snapshot())
    raw = torch.load(tmp_path / "w.pt", weights_only=True)
    assert (raw[FORMAT_KEY], raw[KIND_KEY]) == (2, "warm_start")
    got = checkpoints.load(tmp_path / "w.pt", WARM_START, label="x")
    assert sorted(got) == ["key", "losses", "model", "optimizer", "rng", "step", "steps"] and got["step"] == 3


def test_save_refuses_fields_outside_the_schema(tmp_path):
    with pytest.raises(ValueError, match="a run checkpoint has fields"):
        checkpoints.save(tmp_path / "a.pt", RUN, {"step": 1, "model": {}, "optimizer": {}, "rng": {}, "extra": 1})
    with pytest.raises(ValueError, match="a warm_start checkpoint has fields"):
        checkpoints.save(tmp_path / "b.pt", WARM_START, {"step": 1})
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_file_of_the_other_kind_or_a_newer_format_is_one_clear_line(tmp_path):
    checkpoints.save(tmp_path / "w.pt", WARM_START, _warm_snapshot())
    with pytest.raises(ConfigError, match=r"^--checkpoint: .*w\.pt is a 'warm_start' checkpoint, not a run one$"):
        load_checkpoint(tmp_path, tmp_path / "w.pt", label="--checkpoint")
    save_checkpoint(tmp_path, 2, _learner(), torch.Generator())
    with pytest.raises(CheckpointError, match=r"^ws: .*last\.pt is a 'run' checkpoint, not a warm_start one$"):
        checkpoints.load(tmp_path / CHECKPOINT, WARM_START, label="ws")
    newer = torch.load(tmp_path / CHECKPOINT, weights_only=True) | {FORMAT_KEY: 3}
    torch.save(newer, tmp_path / "newer.pt")
    with pytest.raises(CheckpointError, match="has checkpoint format 3; this vespo reads 1 to 2"):
        checkpoints.load(tmp_path / "newer.pt", RUN, label="x")
    # a format-1 warm start (no header) handed over as a run checkpoint: its own fields give it away
    torch.save(_warm_snapshot(), tmp_path / "old_warm.pt")
    with pytest.raises(CheckpointError, match=r"is damaged: unknown entries \['losses', 'key', 'steps'\]"):
        checkpoints.load(tmp_path / "old_warm.pt", RUN, label="x")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"step": 10}, "step 10 is not below steps 10"),
        ({"step": 0}, "step must be an integer >= 1"),
        ({"losses": [0.5, 0.5]}, "losses must be a list of 3 floats"),
        ({"key": 7}, "key must be a string"),
        ({"rng": {"python": random.getstate()}}, "rng must be a mapping with torch and python states"),
        ({"rng": {"python": (3, (1, 2), None), "torch": torch.get_rng_state()}}, "rng.python is not"),
    ],
)
def test_a_damaged_warm_start_field_is_named(tmp_path, change, message):
    torch.save(_warm_snapshot() | change, tmp_path / "w.pt")
    with pytest.raises(CheckpointError, match=f"^x: .*w\\.pt is damaged: {message}"):
        checkpoints.load(tmp_path / "w.pt", WARM_START, label="x")


def test_a_warm_starts_kept_state_is_used_only_for_exactly_its_settings(tmp_path, capsys):
    """`load_partial`: another setting's state is passed over silently; a finished, damaged or torn one is refused
    in one stderr line and the build starts over."""
    from vespo.embedded.warm_start import load_partial, save_partial

    path = tmp_path / "embedded-x.partial.pt"
    save_partial(path, _warm_snapshot())
    assert load_partial(path, "k", 10)["step"] == 3
    assert load_partial(path, "other", 10) is None and load_partial(path, "k", 20) is None
    assert capsys.readouterr().err == ""
    save_partial(path, _warm_snapshot(step=10))  # all steps done but never published: not a warm start either
    assert load_partial(path, "k", 10) is None
    err = capsys.readouterr().err.splitlines()
    assert err == [f"vespo: warm start: {path} is damaged: step 10 is not below steps 10 (a finished warm start is a "
                   "directory); building it from step 0"]  # fmt: skip
    path.write_bytes(b"torn")
    assert load_partial(path, "k", 10) is None
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"vespo: warm start: cannot load checkpoint {path}: "), err


def test_a_format_1_run_checkpoint_restores_every_stream(tmp_path):
    """A checkpoint as vespo wrote it before the format (torch.save of the bare dict) loads and restores the weights
    and every RNG stream exactly."""
    learner, gen = _learner(), torch.Generator().manual_seed(5)
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    (tmp_path / "checkpoints").mkdir()
    torch.save({"step": 4, **learner.state_dict(), "rng": rng_state(gen)}, tmp_path / CHECKPOINT)
    expected = (torch.rand(3), random.random(), np.random.rand(3), torch.rand(3, generator=gen))
    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    model = torch.nn.Linear(3, 2)
    other, gen2 = Learner(model, torch.optim.AdamW(model.parameters()), UpdateSettings()), torch.Generator()
    assert restore(load_checkpoint(tmp_path), other, gen2) == (4, {})
    assert torch.equal(other.model.weight, learner.model.weight)
    assert other.optimizer.state_dict()["state"][0]["step"] == 1  # the one AdamW step of `_learner`
    got = (torch.rand(3), random.random(), np.random.rand(3), torch.rand(3, generator=gen2))
    assert torch.equal(got[0], expected[0]) and got[1] == expected[1]
    assert np.array_equal(got[2], expected[2]) and torch.equal(got[3], expected[3])


def _strip_time(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def test_a_run_resumed_from_a_format_1_checkpoint_matches_the_uninterrupted_run(random_model, tmp_path):
    """A run of 4 steps keeps its step-2 checkpoint (save_total_limit 2); a copy of its run dir whose last.pt is that
    checkpoint rewritten as format 1 resumes at step 2 and logs the same steps 3 and 4 and the same final weights."""
    from safetensors.torch import load_file

    from vespo.train.launch import train

    cfg = TrainConfig(model=str(random_model), num_operands=2, eval_size=8, train_batch_size=2,
                      ppo_mini_batch_size=1, rollout_n=2, max_response_length=4, eval_every=0, total_training_steps=4,
                      save_every=2, save_total_limit=2, num_threads=1, progress=False, tensorboard=False,
                      run_dir=str(tmp_path / "a"))  # fmt: skip
    train(cfg)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    ckpt = tmp_path / "b" / CHECKPOINT
    old = {k: v for k, v in torch.load(ckpt.with_name("step_2.pt"), weights_only=True).items()
           if k not in (FORMAT_KEY, KIND_KEY)}  # fmt: skip
    assert old["step"] == 2
    ckpt.unlink()  # last.pt is a hard link of step_4.pt: written anew, not through the link
    torch.save(old, ckpt)
    metrics = tmp_path / "b" / "metrics.jsonl"  # what the resume must write again: steps 3 and 4, the final policy
    metrics.write_text("".join(line + "\n" for line in metrics.read_text().splitlines()[:2]))
    shutil.rmtree(tmp_path / "b" / "final")
    train(cfg.replace(run_dir=str(tmp_path / "b"), resume=True))
    want, got = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [r["step"] for r in got] == [1, 2, 3, 4] and _strip_time(got) == _strip_time(want)
    a, b = (load_file(str(tmp_path / d / "final" / "model.safetensors")) for d in "ab")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_warm_start_resumed_from_a_format_1_partial_equals_an_uninterrupted_one(tmp_path, monkeypatch, capsys):
    """A warm start's state saved after 3 of 6 SFT steps, written as format 1 (no header) where the next build looks
    for it: that build resumes at step 3 and publishes the weights of an uninterrupted build."""
    from safetensors.torch import load_file

    import vespo.embedded.warm_start as ws

    spec = ws.WarmStartSpec(num_operands=2, sft_steps=6, sft_batch_size=2, cache_dir=str(tmp_path / "a"))
    resumed = dataclasses.replace(spec, cache_dir=str(tmp_path / "b"))
    _, partial = ws.cache_paths(resumed)
    real = ws.save_partial

    def keep_step_3(path, snapshot):  # the build saves after every step (SAVE_EVERY_S 0); step 3's is kept, headless
        if snapshot["step"] == 3:
            partial.parent.mkdir(parents=True, exist_ok=True)
            torch.save(snapshot, partial)
        real(path, snapshot)

    monkeypatch.setattr(ws, "SAVE_EVERY_S", 0.0)
    monkeypatch.setattr(ws, "save_partial", keep_step_3)
    reference = ws.embedded_policy_path(spec)
    assert FORMAT_KEY not in torch.load(partial, weights_only=True)
    monkeypatch.setattr(ws, "save_partial", real)
    capsys.readouterr()
    final = ws.embedded_policy_path(resumed)
    assert f"resuming at step 3 from {partial}" in capsys.readouterr().err and not partial.exists()
    want, got = load_file(str(reference / "model.safetensors")), load_file(str(final / "model.safetensors"))
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize("where", ["model", "optimizer"])
def test_a_checkpoint_with_non_finite_values_is_refused_naming_it_and_the_survivors(tmp_path, where):
    """Issue 50: a run that diverged saved NaN weights in last.pt; resume died in generation and `vespo export`
    wrote the NaN model with exit 0. The reader refuses it in one line naming the file and the tensor, and says
    which earlier checkpoints survive (with --save-total-limit) or that none does."""
    learner = _learner()
    for step in (1, 2):
        save_checkpoint(tmp_path, step, learner, _gen(), keep=3)
    with torch.no_grad():
        if where == "model":
            learner.model.weight[0, 1] = float("nan")
        else:
            next(iter(learner.optimizer.state.values()))["exp_avg_sq"][0] = float("inf")
    save_checkpoint(tmp_path, 3, learner, _gen(), keep=3)  # step_3.pt is last.pt itself: no survivor
    with pytest.raises(ConfigError) as info:
        load_checkpoint(tmp_path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"resume: {tmp_path / CHECKPOINT} is damaged:"), message
    assert ("NaN or inf in 'weight'" if where == "model" else "NaN or inf in state 0.exp_avg_sq") in message
    assert "earlier checkpoints survive" in message and "step_1, step_2 " in message and "step_3" not in message
    assert load_checkpoint(tmp_path, tmp_path / "checkpoints" / "step_2.pt")["step"] == 2  # the survivor loads
    lone = tmp_path / "lone"
    save_checkpoint(lone, 1, learner, _gen())
    with pytest.raises(ConfigError, match="no earlier checkpoint of this run is kept"):
        load_checkpoint(lone)


class _FullDisk:
    """A file object that takes `room` bytes, then fails every write with ENOSPC (a disk that filled up)."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


@pytest.mark.parametrize("fails", ["write", "fsync"])
def test_a_full_disk_at_a_save_is_one_line_and_the_previous_checkpoint_survives(tmp_path, monkeypatch, fails):
    """Issue 50: a full disk at a checkpoint save ended in chained tracebacks (torch.save turns the OSError into a
    RuntimeError) with no word about the last checkpoint. Now: one line naming the file, the step, ENOSPC, and that
    the previous checkpoint is intact; no temporary is left, and the previous checkpoint still loads."""
    from vespo import outputs

    learner = _learner()
    save_checkpoint(tmp_path, 1, learner, _gen())
    before = (tmp_path / CHECKPOINT).read_bytes()
    if fails == "write":
        monkeypatch.setattr(outputs, "open", lambda fd, mode: _FullDisk(open(fd, mode), 100), raising=False)
    else:  # delayed allocation: the writes land in the page cache, the fsync reports the full disk

        def fsync(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(outputs.os, "fsync", fsync)
    with pytest.raises(CheckpointError) as info:
        save_checkpoint(tmp_path, 2, learner, _gen())
    monkeypatch.undo()
    message = str(info.value)
    assert message == (
        f"saving checkpoint {tmp_path / CHECKPOINT} (step 2) failed: No space left on device (ENOSPC); "
        f"the previous checkpoint {tmp_path / CHECKPOINT} is intact and no partial file was left"
    )
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no chained traceback
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last.pt"]
    assert (tmp_path / CHECKPOINT).read_bytes() == before and load_checkpoint(tmp_path)["step"] == 1


def test_a_save_error_that_is_not_the_file_systems_is_not_disguised(tmp_path, monkeypatch):
    """Only a write the OS refused becomes the one-line CheckpointError; a bug in what is saved stays itself."""

    def broken(obj, f):
        raise RuntimeError("a tensor that cannot be pickled")

    monkeypatch.setattr(checkpoints.torch, "save", broken)
    with pytest.raises(RuntimeError, match="cannot be pickled"):
        save_checkpoint(tmp_path, 1, _learner(), _gen())

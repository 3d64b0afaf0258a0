"""Run management: checkpoints load with weights_only (a crafted pickle is refused), RNG state round-trips through
them, resume refuses a changed config and never overwrites the saved one, and a torn metrics line is ignored."""

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from vespo.outputs import LOCK, MARKER
from vespo.train.config import ConfigError, TrainConfig
from vespo.train.config_io import to_yaml
from vespo.train.fields import TrainFields
from vespo.train.learner import Learner, UpdateSettings
from vespo.train.logs import Logger, read_metrics
from vespo.train.resume import CHECKPOINT, check_run, continue_same_run, load_checkpoint, restore, save_checkpoint
from vespo.train.runs import claim_run_dir, start_run


def _learner(model, opt=None) -> Learner:
    """A learner of `model` (AdamW unless `opt` is given), as the loops checkpoint it."""
    return Learner(model, opt or torch.optim.AdamW(model.parameters()), UpdateSettings())


def _names(run_dir) -> list[str]:
    """The run dir's entries besides vespo's marker and lock."""
    return sorted(p.name for p in run_dir.iterdir() if p.name not in (MARKER, LOCK))


def _saved_run(tmp_path, step=3, **kw) -> TrainConfig:
    """A run dir as a run leaves it after `step` steps: config.yaml, a checkpoint of a tiny model, metrics."""
    cfg = TrainConfig(run_dir=str(tmp_path / "run"), total_training_steps=10, tensorboard=False, **kw)
    start_run(cfg, claim_run_dir(cfg.run))
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optimizer.lr, betas=cfg.optimizer.betas)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    save_checkpoint(tmp_path / "run", step, _learner(model, opt), torch.Generator().manual_seed(1))
    return cfg


def test_checkpoint_round_trips_model_optimizer_and_every_rng_stream(tmp_path):
    cfg = _saved_run(tmp_path)
    gen = torch.Generator().manual_seed(5)
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    model, opt = torch.nn.Linear(3, 2), None
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optimizer.lr)
    save_checkpoint(tmp_path / "run", 4, _learner(model, opt), gen)
    expected = (torch.rand(3), random.random(), np.random.rand(3), torch.rand(3, generator=gen))
    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    gen2 = torch.Generator()
    assert restore(load_checkpoint(tmp_path / "run"), _learner(model, opt), gen2) == (4, {})
    got = (torch.rand(3), random.random(), np.random.rand(3), torch.rand(3, generator=gen2))
    assert torch.equal(got[0], expected[0]) and got[1] == expected[1]
    assert np.array_equal(got[2], expected[2]) and torch.equal(got[3], expected[3])


class _Payload:
    """Unpickling this calls open(marker, "w"): proof that the loader executed code from the file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_crafted_pickle_is_refused_without_running_it(tmp_path):
    _saved_run(tmp_path)
    marker = tmp_path / "pwned"
    evil = {"step": 1, "model": _Payload(marker), "optimizer": {}, "rng": {}}
    torch.save(evil, tmp_path / "run" / CHECKPOINT)
    with pytest.raises(ConfigError, match="cannot load checkpoint"):
        load_checkpoint(tmp_path / "run")
    assert not marker.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "cannot load checkpoint"),
        ("truncate", "cannot load checkpoint"),
        ({"weights": torch.ones(2)}, "not a vespo checkpoint"),
        ([1, 2, 3], "not a vespo checkpoint"),
    ],
)
def test_empty_truncated_and_foreign_checkpoints_are_one_clear_error(tmp_path, content, message):
    _saved_run(tmp_path)
    path = tmp_path / "run" / CHECKPOINT
    if content == "truncate":
        path.write_bytes(path.read_bytes()[:300])
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    with pytest.raises(ConfigError, match=message):
        check_run(TrainConfig(run_dir=str(tmp_path / "run"), total_training_steps=10, resume=True))


def test_resume_refuses_a_changed_config_and_keeps_the_saved_one(tmp_path):
    cfg = _saved_run(tmp_path)
    saved = (tmp_path / "run" / "config.yaml").read_text()
    resume = cfg.replace(resume=True)
    assert check_run(resume)["step"] == 3
    assert check_run(resume.replace(progress=False, num_threads=1, save_every=1))["step"] == 3
    for change, field in (({"lr": 1e-3}, "lr"), ({"method": "grpo"}, "method"), ({"seed": 1}, "seed")):
        with pytest.raises(ConfigError, match=f"differs from the saved run in {field}"):
            check_run(resume.replace(**change))
    with pytest.raises(ConfigError, match="rollout_n: 8 -> 4"):
        check_run(resume.replace(rollout_n=4))
    # more steps: allowed only when asked for explicitly
    longer = resume.replace(total_training_steps=20)
    with pytest.raises(ConfigError, match="--allow-change total_training_steps"):
        check_run(longer)
    assert check_run(longer.replace(allow_change=("total_training_steps",)))["step"] == 3
    with pytest.raises(ConfigError, match="below the checkpoint's step 3"):
        check_run(resume.replace(total_training_steps=2, allow_change=("total_training_steps",)))
    with pytest.raises(ConfigError, match=r"allow_change must be a list \(each item one of \['total_"):
        check_run(resume.replace(allow_change=("lr",)))
    assert (tmp_path / "run" / "config.yaml").read_text() == saved  # nothing was overwritten


def _drop_keys(path: Path, *keys: str) -> str:
    """config.yaml at `path` without the top-level `keys` (as a user's hand edit leaves it); returns its text."""
    text = "".join(line for line in path.read_text().splitlines(True) if line.split(":")[0] not in keys)
    path.write_text(text)
    return text


def test_resume_compares_the_whole_config_so_keys_removed_from_config_yaml_change_nothing(tmp_path):
    """Issue 50: with method, lr and seed removed from config.yaml, `--resume --method grpo --lr 0.01 --seed 7` was
    accepted (only the keys the file held were compared) and config.yaml then claimed GRPO for the whole run. A key
    the saved file lacks is a difference, even at the same value (the file no longer says what ran)."""
    cfg = _saved_run(tmp_path)
    text = _drop_keys(tmp_path / "run" / "config.yaml", "method", "lr", "seed")
    for resume in (cfg.replace(resume=True, method="grpo", lr=0.01, seed=7),
                   cfg.replace(resume=True)):  # fmt: skip
        with pytest.raises(ConfigError, match=r"^resume: the saved config.yaml lacks method, lr, seed, so the run"):
            check_run(resume)
    assert (tmp_path / "run" / "config.yaml").read_text() == text  # nothing rewritten to claim GRPO


def test_a_resume_rewrites_config_yaml_only_in_what_it_was_allowed_to_change(tmp_path):
    """The config.yaml a resume writes is the saved one but for the changes the resume was allowed (a longer run, the
    thread count, bookkeeping): never another method, lr or seed than the run trained with."""
    import yaml

    cfg = _saved_run(tmp_path)
    before = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    longer = cfg.replace(resume=True, total_training_steps=20, allow_change=("total_training_steps",),
                                 save_every=5, num_threads=2)  # fmt: skip
    assert check_run(longer)["step"] == 3
    start_run(longer, claim_run_dir(longer.run), num_threads=2)
    after = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {"total_training_steps", "save_every", "num_threads"} and set(after) == set(before)
    assert (after["resume"], after["allow_change"]) == (False, [])  # what the run is, not how it was started


def test_a_field_added_after_a_run_was_saved_reads_as_its_default(tmp_path, capsys):
    """A config.yaml written before a field existed (`ADDED_FIELDS`) ran at the field's default: resuming it at the
    default continues (one line says so), at another value is a change of the run, named as the default."""
    cfg = _saved_run(tmp_path)
    _drop_keys(tmp_path / "run" / "config.yaml", "bypass_mode", "eval_top_p", "adv_estimator")
    capsys.readouterr()
    assert check_run(cfg.replace(resume=True))["step"] == 3
    assert capsys.readouterr().err.endswith("config.yaml predates 3 field(s), read at their defaults: "
                                            "adv_estimator='grpo', bypass_mode=False, eval_top_p=None\n")  # fmt: skip
    with pytest.raises(ConfigError, match=r"differs from the saved run in bypass_mode: False \(default: not in "
                                          r"config.yaml\) -> True"):  # fmt: skip
        check_run(cfg.replace(resume=True, bypass_mode=True))


def test_the_same_command_continues_its_run_and_another_run_is_refused_naming_the_change(tmp_path, capsys):
    """Issue 55 item 4: `vespo train` run again as it was started continues the run (as sweep and lab do); a run dir
    holding a checkpoint of another config is refused naming the difference and what to type, without reading the
    checkpoint. --overwrite-output-dir and a fresh dir leave the fields as given."""
    cfg = _saved_run(tmp_path)
    fields = TrainFields(run_dir=cfg.run.run_dir, total_training_steps=10, tensorboard=False)
    again = continue_same_run(fields)
    assert again == dataclasses.replace(fields, resume=True)
    assert capsys.readouterr().err == (f"vespo train: run_dir {tmp_path / 'run'} holds this run's checkpoint; "
                                       "continuing it (as --resume)\n")  # fmt: skip
    with pytest.raises(ConfigError, match=r"holds another run with a checkpoint \(lr: 0.0003 -> 0.01\): run it with "
                                          r"its own settings .*config.yaml\) to continue it, pass "
                                          r"--overwrite-output-dir to replace it"):  # fmt: skip
        continue_same_run(dataclasses.replace(fields, lr=0.01))
    with pytest.raises(ConfigError, match=r"\(total_training_steps: 10 -> 20\).*\(longer: --resume --allow-change"):
        continue_same_run(dataclasses.replace(fields, total_training_steps=20))
    over = dataclasses.replace(fields, lr=0.01, overwrite_output_dir=True)
    assert continue_same_run(over) is over
    fresh = TrainFields(run_dir=str(tmp_path / "fresh"))
    assert continue_same_run(fresh) is fresh and not (tmp_path / "fresh").exists()
    (tmp_path / "run" / "config.yaml").unlink()
    with pytest.raises(ConfigError, match="holds a checkpoint but no config.yaml"):
        continue_same_run(fields)


def test_resume_without_checkpoint_is_an_error_and_a_dead_run_dir_is_reused(tmp_path, capsys):
    cfg = TrainConfig(run_dir=str(tmp_path / "fresh"))
    with pytest.raises(ConfigError, match="no checkpoint"):
        check_run(cfg.replace(resume=True))
    assert not (tmp_path / "fresh").exists()
    # a run that wrote its config.yaml, metrics and events but died before its first checkpoint
    dead = cfg.replace(lr=0.1)
    start_run(dead, claim_run_dir(dead.run))
    (tmp_path / "fresh" / "metrics.jsonl").write_text('{"step": 0, "eval/accuracy": 0.5}\n')
    (tmp_path / "fresh" / "tb").mkdir()
    (tmp_path / "fresh" / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert check_run(cfg) is None  # no error: nothing there can be resumed
    start_run(cfg, claim_run_dir(cfg.run))
    assert "holds no checkpoint; starting over" in capsys.readouterr().err
    assert _names(tmp_path / "fresh") == ["config.yaml", "notes.txt"]
    assert (tmp_path / "fresh" / "config.yaml").read_text() == to_yaml(cfg)
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="not writable"):
        check_run(TrainConfig(run_dir=str(tmp_path / "file" / "run")))


def test_a_run_with_a_checkpoint_is_replaced_only_when_asked(tmp_path, capsys):
    cfg = _saved_run(tmp_path)
    (tmp_path / "run" / "notes.txt").write_text("mine")
    fresh = cfg.replace(lr=1e-3)
    with pytest.raises(ConfigError, match="--resume to continue it, --overwrite-output-dir to replace it"):
        check_run(fresh)
    with pytest.raises(ConfigError, match="exclude each other"):
        cfg.replace(resume=True, overwrite_output_dir=True)
    over = fresh.replace(overwrite_output_dir=True)
    assert check_run(over) is None and (tmp_path / "run" / CHECKPOINT).exists()  # checking deletes nothing
    capsys.readouterr()
    start_run(over, claim_run_dir(over.run))
    assert "replacing the run there (deleting its config.yaml, checkpoints)" in capsys.readouterr().err
    assert _names(tmp_path / "run") == ["config.yaml", "notes.txt"]
    # the replaced run's saved config (overwrite_output_dir: true) still resumes without the flag
    resumed = fresh.replace(resume=True)
    model = torch.nn.Linear(3, 2)
    save_checkpoint(tmp_path / "run", 1, _learner(model), torch.Generator())
    assert check_run(resumed)["step"] == 1


def test_a_foreign_config_yaml_is_never_replaced(tmp_path):
    (tmp_path / "config.yaml").write_text("model: resnet\nepochs: 3\n")
    with pytest.raises(ConfigError, match="not empty and was not created by vespo.*--overwrite-output-dir"):
        claim_run_dir(TrainConfig(run_dir=str(tmp_path)).run)
    with pytest.raises(ConfigError, match="already holds config.yaml, which vespo did not write"):
        claim_run_dir(TrainConfig(run_dir=str(tmp_path), overwrite_output_dir=True).run)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]
    assert (tmp_path / "config.yaml").read_text() == "model: resnet\nepochs: 3\n"


def test_default_run_dir_is_per_method():
    assert TrainConfig(method="grpo").run.run_dir == "runs/grpo"
    assert TrainConfig().run.run_dir == "runs/vespo"
    assert TrainConfig(method="grpo", run_dir="x").run.run_dir == "x"


def test_torn_last_metrics_line_is_ignored_and_dropped_on_resume(tmp_path):
    cfg = _saved_run(tmp_path)
    rows = [{"step": s, "reward/mean": s / 10} for s in range(5)]
    path = tmp_path / "run" / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5, "rewa')
    assert read_metrics(tmp_path / "run") == rows
    Logger(cfg.run, tmp_path / "run", start_step=3).log({"reward/mean": 0.9}, 4)
    assert read_metrics(tmp_path / "run") == [*rows[:4], {"step": 4, "reward/mean": 0.9}]
    path.write_text('{"step": 0}\n{oops\n{"step": 2}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        read_metrics(tmp_path / "run")


def test_saved_config_is_yaml_of_the_config(tmp_path):
    cfg = _saved_run(tmp_path)
    assert (tmp_path / "run" / "config.yaml").read_text() == to_yaml(cfg)


def test_checkpoint_of_another_model_is_one_clear_error_on_restore(tmp_path):
    _saved_run(tmp_path)  # weights of a Linear(3, 2)
    model = torch.nn.Linear(4, 2)
    with pytest.raises(ConfigError, match=r"does not fit the model: weight has shape \[2, 3\], the model \[2, 4\]"):
        restore(load_checkpoint(tmp_path / "run"), _learner(model), torch.Generator())


def test_save_total_limit_keeps_the_last_k_checkpoints(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "mine.pt").write_bytes(b"not ours")
    for step in range(1, 6):
        with torch.no_grad():
            model.weight.fill_(step)
        save_checkpoint(tmp_path, step, _learner(model, opt), torch.Generator(), keep=3)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["last.pt", "mine.pt", "step_3.pt", "step_4.pt", "step_5.pt"]
    for step in (3, 4, 5):
        ckpt = torch.load(tmp_path / "checkpoints" / f"step_{step}.pt", weights_only=True)
        assert ckpt["step"] == step and ckpt["model"]["weight"].eq(step).all()
    assert load_checkpoint(tmp_path)["step"] == 5
    save_checkpoint(tmp_path, 6, _learner(model, opt), torch.Generator())  # keep=1: last.pt only, numbered ones kept
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == names
    with pytest.raises(ConfigError, match="save_total_limit must be an integer >= 1"):
        TrainConfig(save_total_limit=0)


@pytest.mark.parametrize("content", [b"", b"torn", b"PK\x03\x04 half a zip"])
def test_export_reads_checkpoints_through_the_one_checked_reader(tmp_path, content):
    """`vespo export` loads a checkpoint with `load_checkpoint` (weights_only, field checks): a damaged one is one
    ConfigError naming `--checkpoint` and the file, before any model loads, and nothing is written to `--out`."""
    from vespo.train.launch import export_checkpoint

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("method: vespo\n")
    (run / "checkpoints" / "last.pt").write_bytes(content)
    with pytest.raises(ConfigError, match=r"^--checkpoint: cannot load checkpoint .*last\.pt"):
        export_checkpoint(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_release_free_memory_trims_only_a_heap_with_enough_free_bytes(monkeypatch):
    """A trim makes later allocations fault their pages in again (~20% of a tiny model's step): only a heap holding
    more than TRIM_MIN_FREE_BYTES free is trimmed; without glibc nothing is called."""
    import types

    from vespo.train import system

    calls = []
    for free, trimmed in ((system.TRIM_MIN_FREE_BYTES + 1, True), (system.TRIM_MIN_FREE_BYTES, False)):
        fake = types.SimpleNamespace(mallinfo2=lambda f=free: types.SimpleNamespace(fordblks=f),
                                     malloc_trim=lambda pad: calls.append(pad))  # fmt: skip
        monkeypatch.setattr(system, "_libc", lambda fake=fake: fake)
        calls.clear()
        system.release_free_memory()
        assert calls == ([0] if trimmed else [])
    monkeypatch.setattr(system, "_libc", lambda: None)
    system.release_free_memory()  # another C library: a no-op


def test_a_killed_export_leaves_out_as_it_was_and_the_same_command_then_succeeds(tmp_path):
    """`save_policy` (vespo export, a run's final/) builds the model directory beside --out and renames it into place:
    an interrupt between config.json and the weights leaves --out empty, and what a SIGKILL leaves (a tagged
    temporary directory, no Python clean-up) is removed by the next export, which succeeds."""
    from vespo import outputs
    from vespo.train.runs import save_policy

    class Model:
        def __init__(self, killed: bool):
            self.killed = killed

        def save_pretrained(self, folder):
            (Path(folder) / "config.json").write_text("{}")
            if self.killed:
                raise KeyboardInterrupt
            (Path(folder) / "model.safetensors").write_bytes(b"weights")

    class Tokenizer:
        def save_pretrained(self, folder):
            (Path(folder) / "tokenizer.json").write_text("{}")

    out = tmp_path / "exported"
    out.mkdir()  # the user's new, empty --out
    with pytest.raises(KeyboardInterrupt):
        save_policy(Model(killed=True), Tokenizer(), out)
    assert list(out.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["exported"]
    sigkilled = tmp_path / ".exported.k1ll3d.tmp"
    sigkilled.mkdir()
    (sigkilled / outputs._ATOMIC_TAG).touch()
    (sigkilled / "config.json").write_text("{}")
    save_policy(Model(killed=False), Tokenizer(), out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported"]

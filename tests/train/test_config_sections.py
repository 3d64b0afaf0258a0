"""The config in sections: each section is valid once built, `TrainConfig.flat()` is the flat config it always was
(config.yaml and a sweep cell's identity hash it), and a config's path through a run is short: every helper that
receives a section reads it, and only the loops, their setup and the checks that compare whole configs receive the
whole `TrainConfig`."""

import collections
import dataclasses
import hashlib
import sys
from pathlib import Path

import pytest

from vespo.train.checks import ConfigError
from vespo.train.config import TrainConfig
from vespo.train.config_io import to_yaml
from vespo.train.fields import SECTIONS, BatchSettings, DataSettings, HardwareSettings, OptimizerSettings

SRC = Path(__file__).parents[2] / "src" / "vespo"


def _pinned_config() -> TrainConfig:
    return TrainConfig(method="grpo", staleness=4, lr=1e-3, hparams={"clip_ratio_low": 0.1}, betas=(0.8, 0.9),
                       lora_target_modules=("q",), allow_change=("total_training_steps",), mode="async",
                       max_staleness=6, dataset="reasoning-gym:leg_counting", eval_top_p=0.7)  # fmt: skip


@pytest.mark.parametrize(
    ("make", "yaml_sha", "flat_sha"),
    [
        (TrainConfig, "87ac7428e9c79f51421f8796c68e2b1ce1c10af17c7501dee4d2155499103280",
         "66381795665eccb6426d36aa4ed1c12ce421014f6615da72a28c3e7fa6910c86"),
        (_pinned_config, "29dbb3c472d3474734ea64e7a704526a9b89de3f48a4b8d5386f0c97fe477cde",
         "94d543600fef512bef8a88841278db7b002f7cb19d341ed3cd7b4a357e3829e8"),
    ],
    ids=["default", "async-grpo-rg"],
)  # fmt: skip
def test_flat_and_config_yaml_are_bit_identical_to_the_flat_config(make, yaml_sha, flat_sha):
    """The hashes were taken at 5a9505c, before the sections: same keys, order and values, so a run dir's
    config.yaml and every sweep cell key (a hash of `flat()`) stay what they were."""
    cfg = make()
    assert hashlib.sha256(to_yaml(cfg).encode()).hexdigest() == yaml_sha
    assert hashlib.sha256(repr(cfg.flat()).encode()).hexdigest() == flat_sha
    assert list(cfg.flat())[:3] == ["model", "dataset", "eval_dataset"] and list(cfg.flat())[-1] == (
        "num_completions_to_print"
    )
    assert TrainConfig(**cfg.flat()) == cfg  # one way in: the flat names


def test_each_section_is_valid_once_built_and_frozen():
    """A section checks its own fields and the rules among them, naming the flat field; it cannot be changed."""
    with pytest.raises(ConfigError, match=r"^lr must be"):
        OptimizerSettings(lr=-1.0)
    with pytest.raises(ConfigError, match=r"^rollout_n must be >= 2"):
        BatchSettings(rollout_n=1)
    with pytest.raises(ConfigError, match="bf16 and fp16 are exclusive"):
        HardwareSettings(bf16=True, fp16=True)
    with pytest.raises(ConfigError, match=r"^shuffle must be true or false, got 'false'"):
        BatchSettings(shuffle="false")
    with pytest.raises(ConfigError, match=r"^dataset: "):
        DataSettings(dataset="reasoning-gym:no_such_task")
    batch = BatchSettings(staleness=2, ppo_mini_batch_size=8)  # N and train_batch_size: one setting, kept once
    assert (batch.train_batch_size, batch.staleness, batch.num_mini_batches) == (16, None, 2)
    assert DataSettings().reward_fn == "vespo.rewards:math_reward"
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.rollout_n = 4
    with pytest.raises(TypeError, match="unexpected keyword"):
        TrainConfig(no_such_field=1)
    assert TrainConfig(lr=1e-3).replace(seed=3).flat() == TrainConfig(lr=1e-3, seed=3).flat()
    with pytest.raises(TypeError, match=r"cfg\.replace"):
        dataclasses.replace(TrainConfig(), lr=0.1)


WHOLE_CONFIG = {
    # the loops and what picks one
    "vespo.train.launch.train", "vespo.train.sync.train_sync", "vespo.train.async_.train_async",
    "vespo.train.async_._Steps.__init__",
    # setup: the run's steps, each of which hands its helpers their sections
    "vespo.train.setup.setup_run", "vespo.train.setup.build_learner", "vespo.train.setup.update_settings",
    # what reads or compares the whole config: the machine's check, the run dir's, config.yaml, the warm start's key
    "vespo.train.host.check_host", "vespo.train.host._check_rollout_memory", "vespo.train.host.default_num_threads",
    "vespo.train.host._check_sampler_memory", "vespo.train.resume.check_run", "vespo.train.runs.start_run",
    "vespo.train.config_io.to_yaml", "vespo.embedded.warm_start.WarmStartSpec.of",
}  # fmt: skip
"""The functions that receive a whole `TrainConfig` in a tiny run (before the sections: every helper did)."""


def _trace(argv: list[str]) -> tuple[dict[str, set[str]], set[str], collections.Counter]:
    """Run `vespo train argv` in-process under `sys.setprofile`: (function -> the sections it received, the
    functions that received a whole TrainConfig, attribute reads per section received: by (function, section),
    the reads of that section's fields while the call ran, its callees included)."""
    from vespo.cli import main

    kinds = {cls: name for name, cls in SECTIONS.items()}
    reads: collections.Counter = collections.Counter()  # id(section) -> field reads so far
    fields = {cls: {f.name for f in dataclasses.fields(cls)} for cls in kinds}
    originals = {cls: cls.__getattribute__ for cls in kinds}

    def recording(cls):
        def get(self, name):
            if name in fields[cls]:
                reads[id(self)] += 1
            return originals[cls](self, name)

        return get

    received: dict[str, set[str]] = collections.defaultdict(set)
    whole: set[str] = set()
    read_by: collections.Counter = collections.Counter()
    open_calls: dict[int, list[tuple[str, str, int, int]]] = {}  # id(frame) -> (function, section, id, reads at call)
    own = tuple(str(SRC / "train" / f) for f in ("fields.py", "checks.py", "config.py"))  # the config's own code

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "return" and id(frame) in open_calls:
            for fn, section, sid, before in open_calls.pop(id(frame)):
                read_by[fn, section] += reads[sid] - before
        if event != "call" or not code.co_filename.startswith(str(SRC)) or code.co_filename in own:
            return
        module = frame.f_globals.get("__name__", "?")
        fn = f"{module}.{code.co_qualname}"
        args = [frame.f_locals.get(n) for n in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]]
        for a in args:
            if type(a) is TrainConfig:
                whole.add(fn)
            elif type(a) in kinds:
                received[fn].add(kinds[type(a)])
                open_calls.setdefault(id(frame), []).append((fn, kinds[type(a)], id(a), reads[id(a)]))

    for cls in kinds:
        cls.__getattribute__ = recording(cls)
    sys.setprofile(profile)
    try:
        assert main(argv) == 0
    finally:
        sys.setprofile(None)
        for cls, original in originals.items():
            cls.__getattribute__ = original
    return received, whole, read_by


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["sync", "async"])
def test_no_helper_receives_a_section_it_does_not_read(tmp_path, loop):
    """A tiny embedded run (evaluation, logged completions, a checkpoint), every call recorded: each function given a
    section reads at least one of its fields (itself or through its callees), only `WHOLE_CONFIG` gets the whole
    config (a flat read, `cfg.lr`, is an AttributeError: `test_a_setting_is_read_through_its_section`)."""
    import transformers.models.llama.modeling_llama  # noqa: F401  (imported before tracing: the profile hook is slow)

    import vespo.embedded.warm_start  # noqa: F401
    import vespo.train.launch  # noqa: F401
    import vespo.train.sync  # noqa: F401

    argv = ["train", "--total-training-steps", "2", "--eval-every", "1", "--eval-size", "4", "--sft-steps", "2",
            "--train-batch-size", "2", "--ppo-mini-batch-size", "1", "--rollout-n", "2", "--log-completions",
            "--save-every", "1", "--run-dir", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"),
            "--no-progress", "--mode", loop]  # fmt: skip
    received, whole, read_by = _trace(argv)
    unread = sorted(f"{fn} <- {section}" for fn, sections in received.items() for section in sections
                    if read_by[fn, section] == 0)  # fmt: skip
    assert not unread, unread
    assert whole <= WHOLE_CONFIG, sorted(whole - WHOLE_CONFIG)
    assert {"vespo.train.setup.build_optimizer", "vespo.train.setup.load_data", "vespo.train.setup.evaluate",
            "vespo.train.runs.Run.__init__", "vespo.train.logs.Logger.__init__"} <= set(received)  # fmt: skip
    assert received["vespo.train.setup.build_optimizer"] == {"optimizer"}
    assert received["vespo.train.setup.load_data"] == {"data", "embedded"}


def test_a_setting_is_read_through_its_section():
    """One place per setting: `cfg.optimizer.lr`, never a flat `cfg.lr` (the flat names are for input, `flat()`)."""
    cfg = TrainConfig(lr=0.5)
    assert cfg.optimizer.lr == 0.5 and cfg.flat()["lr"] == 0.5
    with pytest.raises(AttributeError):
        cfg.lr  # noqa: B018

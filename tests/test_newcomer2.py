"""A newcomer's first day, round two (issue 32): thread defaults, one Ctrl-C stops every command (workers included),
interruptible and announced warm starts, veRL configs and parquet data, an evaluable LoRA output, one line for each
bad input, and the numbers a saved run or a log holds."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from _clock import HANG_GUARD_S

from vespo.embedded.task import build_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def _vespo(*argv, **kw):
    return subprocess.run([sys.executable, "-m", "vespo", *argv], capture_output=True, text=True, timeout=600, **kw)


class _Running:
    """A `vespo` subprocess whose stderr is read as it comes (to send SIGINT at the right moment)."""

    def __init__(self, *argv, cwd=None, env=None):
        self.proc = subprocess.Popen([sys.executable, "-m", "vespo", *argv], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)  # fmt: skip
        self.err = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for chunk in iter(lambda: self.proc.stderr.read(1), ""):
            self.err += chunk

    def wait_for(self, predicate, timeout=HANG_GUARD_S):
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.proc.poll() is None, f"exited early ({self.proc.returncode}): {self.err[-2000:]}"
            assert time.monotonic() < deadline, f"timed out waiting: {self.err[-2000:]}"
            time.sleep(0.1)

    def interrupt(self) -> int:
        """SIGINT to this process only (not its group: it must pass it on itself); its exit code. That it stopped
        promptly is read from what it left (cells or SFT steps unfinished, nothing written), not from a clock."""
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=HANG_GUARD_S)
        self._reader.join(timeout=HANG_GUARD_S)
        return code


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ----------------------------------------------------------------------------------------------------------------
# 1. threads


def test_default_threads_one_for_the_embedded_model_and_the_free_cores_otherwise(tmp_path, monkeypatch):
    import vespo.train.config as config
    from vespo.train.config import TrainConfig, default_num_threads

    assert default_num_threads(TrainConfig())[0] == 1
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 1000)  # a small model: at most SMALL_MODEL_THREADS
    monkeypatch.setattr(config, "_usable_cores", lambda: 16)
    cfg = TrainConfig(model=str(model))
    for load, want in ((0.2, 4), (13.6, 2), (40.0, 1)):  # 16 cores, 14 busy: 2 free
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        threads, why = default_num_threads(cfg)
        assert threads == want and f"load {load:.1f}" in why, (load, threads, why)
    monkeypatch.setattr(os, "getloadavg", lambda: (4.0, 4.0, 4.0))
    monkeypatch.setattr(config, "_policy_bytes", lambda *a: 8 << 30)  # an 8 GB model: every free core, shared
    assert default_num_threads(cfg)[0] == 12
    assert default_num_threads(dataclasses.replace(cfg, mode="async", num_samplers=2))[0] == 4


def test_train_says_its_thread_count_once_after_the_input_checks_and_records_it(tmp_path, capsys, monkeypatch):
    import vespo.train.setup
    from vespo.cli import main
    from vespo.train.config_io import load_yaml

    seen = []

    def stop_at_the_model(cfg, **kw):  # the first compute: record the thread count the run got, then stop
        seen.append(torch.get_num_threads())
        raise KeyboardInterrupt

    monkeypatch.setattr(vespo.train.setup, "embedded_policy_path", stop_at_the_model)
    threads = torch.get_num_threads()
    try:
        assert main(["train", "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 130
        err = capsys.readouterr().err.splitlines()
        assert seen == [1] and [line for line in err if "torch thread" in line] == [
            "vespo train: 1 torch thread (the embedded model runs fastest on one); --num-threads N to change"
        ]
        assert load_yaml(tmp_path / "run" / "config.yaml")["num_threads"] == 1  # what the run used
        assert main(["train", "--run-dir", str(tmp_path / "run2"), "--no-progress", "--num-threads", "2"]) == 130
        assert seen == [1, 2] and "torch thread" not in capsys.readouterr().err  # the user's choice: not announced
        assert main(["train", "--run-dir", str(tmp_path / "run3"), "--no-progress", "--reward-fn", "nope:fn"]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1  # a bad input stays one line
    finally:
        torch.set_num_threads(threads)


# ----------------------------------------------------------------------------------------------------------------
# 2. one Ctrl-C stops every command, its workers included


@pytest.mark.slow
def test_one_sigint_stops_a_sweep_and_its_cells(tmp_path):
    """SIGINT to the sweep process alone: no new cell starts, the running one is stopped (it is the sweep's job to
    pass the signal on), one line says what was kept, exit 130, no traceback; rerunning continues."""
    out = tmp_path / "sweep"
    argv = ["sweep", "--out-dir", str(out), "--cache-dir", str(tmp_path / "cache"), "--methods", "vespo", "grpo",
            "--staleness", "1", "--seeds", "0", "1", "--optimizer-steps", "400", "--eval-size", "8", "--eval-n", "1",
            "--jobs", "1", "--extra", "sft_steps", "5", "sft_batch_size", "4", "tensorboard", "False"]  # fmt: skip
    run = _Running(*argv)
    run.wait_for(lambda: len(list((out / "cells").rglob("*.log"))) == 1 and _descendants(run.proc.pid))
    time.sleep(2)
    workers = _descendants(run.proc.pid)
    code = run.interrupt()
    lines = [line for line in run.err.splitlines() if "vespo sweep" in line and "interrupted" in line]
    assert code == 130 and "Traceback" not in run.err, run.err[-3000:]
    assert len(lines) == 1 and "0 of 4 cells finished" in lines[0] and "same command continues" in lines[0], lines
    time.sleep(1)
    assert not [p for p in workers if _alive(p)], "a cell process outlived the sweep"
    assert len(list((out / "cells").rglob("*.log"))) == 1, "no cell may start after the interrupt"


@pytest.mark.slow
def test_one_sigint_stops_a_lab_grid_and_its_worker_processes(tmp_path):
    out = tmp_path / "lab"
    argv = ["lab", "--preset", "v1", "--out-dir", str(out), "--methods", "vespo", "grpo", "--length", "4096",
            "--staleness", "1", "--lr-scale", "1", "--seeds", "0", "1", "2", "--optimizer-steps", "4000",
            "--jobs", "2"]  # fmt: skip
    run = _Running(*argv)
    run.wait_for(lambda: len(_descendants(run.proc.pid)) >= 2)
    time.sleep(2)
    workers = _descendants(run.proc.pid)
    code = run.interrupt()
    assert code == 130 and "Traceback" not in run.err, run.err[-3000:]
    assert run.err.strip().splitlines()[-1].startswith("vespo lab: interrupted; 0 of 6 cells finished"), run.err
    time.sleep(1)
    assert not [p for p in workers if _alive(p)], "a lab worker outlived the grid"


@pytest.mark.slow
def test_one_sigint_stops_an_evaluation_in_one_line(random_model, tmp_path):
    data = tmp_path / "many.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i % 10}+{i % 7}=", "answer": str(i % 10 + i % 7)}) + "\n"
                            for i in range(4000)))  # fmt: skip
    out = tmp_path / "eval"
    run = _Running("eval", "--model", str(random_model), "--benchmarks", str(data), "--k", "2", "--max-new-tokens",
                   "12", "--device", "cpu", "--out", str(out))  # fmt: skip
    run.wait_for(lambda: "many" in run.err)  # generating (the benchmark's progress bar)
    time.sleep(1)
    code = run.interrupt()
    last = run.err.strip().splitlines()[-1]
    assert code == 130 and "Traceback" not in run.err, run.err[-3000:]
    assert last == "vespo eval: interrupted; nothing was written to --out", last
    assert not out.exists()  # a claim that wrote nothing leaves nothing


# ----------------------------------------------------------------------------------------------------------------
# 3. warm starts: kept on Ctrl-C, resumed bit for bit, announced when long


def _spec(cache, **kw):
    from vespo.embedded.warm_start import WarmStartSpec

    return WarmStartSpec(num_operands=2, sft_steps=1500, sft_batch_size=4, cache_dir=str(cache), **kw)


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


@pytest.mark.slow
def test_an_interrupted_warm_start_is_kept_resumed_and_equals_an_uninterrupted_one(tmp_path, capsys):
    from vespo.embedded.warm_start import cache_paths, embedded_policy_path, load_partial, sft_cache_key

    spec = _spec(tmp_path / "a")
    final, partial = cache_paths(spec)
    run = _Running("train", "--cache-dir", spec.cache_dir, "--num-operands", "2", "--sft-steps", "1500",
                   "--sft-batch-size", "4", "--eval-size", "8", "--run-dir", str(tmp_path / "run"))  # fmt: skip
    run.wait_for(lambda: "SFT warm start" in run.err)  # its progress bar: the SFT steps are running
    time.sleep(2)
    code = run.interrupt()
    assert code == 130 and "Traceback" not in run.err, run.err[-2000:]
    last = run.err.strip().splitlines()[-1]
    kept = f"the warm start's progress is kept in {partial} and the next run resumes it"
    assert last == f"vespo train: interrupted; {kept}"
    state = load_partial(partial, sft_cache_key(spec), 1500)
    assert state is not None and 0 < state["step"] < 1500 and not final.exists()  # never mistaken for a finished one
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as `vespo train` ran it: the same arithmetic as the subprocess
    try:
        assert embedded_policy_path(spec) == final
        assert f"resuming at step {state['step']}" in capsys.readouterr().err
        reference = embedded_policy_path(_spec(tmp_path / "b"))
    finally:
        torch.set_num_threads(threads)
    assert not partial.exists()  # published, then the partial state is gone
    got, want = _weights(final), _weights(reference)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_a_partial_warm_start_is_used_only_for_exactly_its_settings(tmp_path):
    from vespo.embedded.warm_start import load_partial, save_partial

    path = tmp_path / "embedded-x.partial.pt"
    state = {"step": 3, "model": {}, "optimizer": {}, "rng": {}, "losses": [], "key": "k", "steps": 10}
    save_partial(path, state)
    assert load_partial(path, "k", 10) is not None
    assert load_partial(path, "other", 10) is None and load_partial(path, "k", 20) is None
    save_partial(path, state | {"step": 10})  # all steps done but never published: not a warm start either
    assert load_partial(path, "k", 10) is None
    path.write_bytes(b"torn")
    assert load_partial(path, "k", 10) is None


def test_a_long_warm_start_says_how_long_and_how_it_is_cached(tmp_path, capsys, monkeypatch):
    import vespo.embedded.warm_start as ws

    monkeypatch.setattr(ws, "ANNOUNCE_S", 0.0)  # any estimate counts as long here
    monkeypatch.setattr(ws, "_PROBE_S", 0.0)
    spec = ws.WarmStartSpec(num_operands=2, sft_steps=6, sft_batch_size=2, cache_dir=str(tmp_path))
    path = ws.embedded_policy_path(spec)
    err = capsys.readouterr().err.splitlines()
    said = [line for line in err if "will take about" in line]
    assert len(said) == 1 and f"cached in {path}" in said[0] and "Ctrl-C keeps its progress" in said[0], err


# ----------------------------------------------------------------------------------------------------------------
# 4. veRL configs and data


def _dry_run(script: str, **env) -> dict:
    """The Hydra overrides of an examples/verl script as one YAML mapping of dotted keys."""
    import yaml

    out = subprocess.run(["bash", str(ROOT / "examples" / "verl" / script)], capture_output=True, text=True,
                         check=True, env={**os.environ, "VESPO_DRY_RUN": "1", **env}).stdout.splitlines()  # fmt: skip
    return {k.lstrip("+"): yaml.safe_load(v) for k, v in (line.split("=", 1) for line in out[1:])}


@pytest.mark.parametrize("script", ["dense_fsdp.sh", "qwen3_30b_a3b_megatron.sh", "code_eurus_megatron.sh"])
def test_vespos_own_verl_examples_load_with_one_warning_line(script, tmp_path, capsys):
    import yaml

    from vespo.train.config import ConfigError
    from vespo.train.config_io import load_yaml

    keys = _dry_run(script)
    path = tmp_path / "verl.yaml"
    path.write_text(yaml.safe_dump(keys))
    with pytest.raises(ConfigError) as refused:  # the run's length is veRL's epochs: the one thing to add
        load_yaml(path)
    assert str(refused.value).count("trainer.total_epochs") == 1 and len(str(refused.value)) < 300
    path.write_text(yaml.safe_dump(keys | {"trainer.total_training_steps": 5}))
    capsys.readouterr()
    got = load_yaml(path)
    warned = capsys.readouterr().err.strip().splitlines()
    assert len(warned) == 1 and "trainer.n_gpus_per_node" in warned[0] and "actor_rollout_ref.rollout.name" in warned[0]
    assert got["total_training_steps"] == 5 and got["ppo_mini_batch_size"] == 256 and got["kl_coef"] == 0.0
    assert got["reward_fn"] == f"{ROOT}/examples/verl/reward_fn.py:compute_score"
    assert got["method"] == keys["actor_rollout_ref.actor.policy_loss.loss_mode"].removeprefix("vespo_")


def test_verl_settings_that_change_the_run_are_refused_together_in_one_short_line(tmp_path):
    import yaml

    from vespo.train.config import ConfigError
    from vespo.train.config_io import load_yaml

    path = tmp_path / "verl.yaml"
    algorithm = {"adv_estimator": "gae", "rollout_correction": {"rollout_is": "token"}}
    path.write_text(yaml.safe_dump({"algorithm": algorithm, "actor_rollout_ref": {"actor": {"ppo_epochs": 4}}}))
    with pytest.raises(ConfigError) as refused:
        load_yaml(path)
    text = str(refused.value)
    assert "\n" not in text and len(text) - len(str(path)) < 350  # one line, not 1.5 KB of key lists
    for key in ("adv_estimator='gae'", "rollout_is='token'", "ppo_epochs=4"):
        assert key in text


def _write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


def test_verl_parquet_data_loads_through_the_record_loader(tmp_path):
    from vespo.data import load_records
    from vespo.rewards.batch import load_reward_fn
    from vespo.train.config import TrainConfig
    from vespo.train.setup import load_data

    rows = [{"data_source": "gsm8k", "prompt": [{"role": "user", "content": f"What is {i}+1?"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)}, "extra_info": {"index": i}}
            for i in range(20)]  # fmt: skip
    _write_parquet(tmp_path / "train.parquet", rows)
    records = load_records(str(tmp_path / "train.parquet"))
    assert (records[3]["prompt"], records[3]["answer"], records[3]["data_source"]) == ("What is 3+1?", "4", "gsm8k")
    cfg = TrainConfig(dataset=str(tmp_path / "train.parquet"), train_batch_size=4, ppo_mini_batch_size=4,
                      reward_fn=f"{ROOT}/examples/verl/reward_fn.py:compute_score")  # fmt: skip
    train, _ = load_data(cfg)  # the trainer's loader, with veRL's own reward function adapted
    reward = load_reward_fn(cfg.reward_fn)
    assert reward(["\\boxed{4}", "\\boxed{5}"], answer=["4", "4"], data_source=["gsm8k"] * 2) == [1.0, 0.0]
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1?"}]
    _write_parquet(tmp_path / "chat.parquet", [rows[0] | {"prompt": chat}])
    with pytest.raises(ValueError, match="chat of 2 messages .system, user.; vespo trains on one user turn"):
        load_records(str(tmp_path / "chat.parquet"))
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match="cannot read as Parquet"):
        load_records(str(tmp_path / "bad.parquet"))


# ----------------------------------------------------------------------------------------------------------------
# 5. LoRA: the final output is a model; checkpoints export to one


@pytest.mark.slow
def test_lora_run_leaves_an_evaluable_merged_model_and_checkpoints_export(random_model, tmp_path):
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    run = tmp_path / "lora"
    argv = ["train", "--model", str(random_model), "--use-peft", "--lora-r", "4", "--num-operands", "2", "--eval-size",
            "8", "--train-batch-size", "2", "--ppo-mini-batch-size", "2", "--rollout-n", "2", "--max-response-length",
            "4", "--total-training-steps", "2", "--eval-every", "0", "--no-tensorboard", "--no-progress",
            "--entropy-coeff", "1", "--lr", "0.01", "--run-dir", str(run)]  # fmt: skip
    done = _vespo(*argv)  # the entropy bonus gives the adapters a gradient whatever the rewards
    assert done.returncode == 0, done.stderr[-2000:]
    assert (run / "final" / "config.json").is_file() and (run / "final" / "adapter" / "adapter_config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(run / "final")
    base = AutoModelForCausalLM.from_pretrained(random_model)
    assert not any("lora" in k for k in merged.state_dict())
    assert any(not torch.equal(v, base.state_dict()[k]) for k, v in merged.state_dict().items())  # adapters merged
    done = _vespo("export", str(run), "--out", str(tmp_path / "exported"))
    assert done.returncode == 0, done.stderr[-2000:]
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported").state_dict()
    assert all(torch.equal(exported[k], v) for k, v in merged.state_dict().items())  # last checkpoint == final
    evaluated = _vespo("eval", "--model", str(run / "final"), "--benchmarks", str(_math_jsonl(tmp_path)), "--k", "1",
                       "--max-new-tokens", "4", "--out", str(tmp_path / "eval"))  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    again = _vespo("export", str(run), "--out", str(tmp_path / "exported"))
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "nothing is replaced" in again.stderr


def _math_jsonl(tmp_path):
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(3)))
    return path


# ----------------------------------------------------------------------------------------------------------------
# 6. one line for each bad input, before the model loads


def _one_error_line(done, *words):
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    for word in words:
        assert word in errors[0], (word, errors[0])
    return errors[0]


def test_eval_of_a_hub_benchmark_offline_is_one_line_before_the_model_loads(random_model, tmp_path):
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path)}
    out = tmp_path / "o"
    done = _vespo("eval", "--model", str(random_model), "--benchmarks", "math500", "--out", str(out), env=env)
    _one_error_line(done, "--benchmarks math500", "HuggingFaceH4/MATH-500", "no cached copy")
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(__import__("importlib").util.find_spec("wandb") is not None, reason="wandb is installed")
def test_wandb_project_without_wandb_is_one_line(tmp_path, capsys):
    from vespo.cli import main

    assert main(["train", "--wandb-project", "p", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "wandb_project needs wandb installed" in err[0] and not (tmp_path / "r").exists()


def test_reward_fn_from_a_file_and_a_hint_for_a_module_that_is_not_importable(tmp_path, monkeypatch):
    from vespo.rewards.batch import load_reward_fn

    (tmp_path / "myreward.py").write_text("def fn(completions, answer, **kw):\n    return [1.0] * len(completions)\n")
    (tmp_path / "broken.py").write_text("import not_a_module_anywhere\n")
    monkeypatch.chdir(tmp_path)
    assert load_reward_fn("./myreward.py:fn")(["a", "b"], answer=["1", "2"]) == [1.0, 1.0]
    assert load_reward_fn(f"{tmp_path}/myreward.py:fn") is load_reward_fn("myreward.py:fn")  # one module per file
    with pytest.raises(ValueError, match=r"myreward.py is here, .* --reward-fn ./myreward.py:fn"):
        load_reward_fn("myreward:fn")
    with pytest.raises(ValueError, match="no such file ./nothere.py"):
        load_reward_fn("./nothere.py:fn")
    with pytest.raises(ValueError, match="loading ./broken.py failed: ModuleNotFoundError"):
        load_reward_fn("./broken.py:fn")
    with pytest.raises(ValueError, match="has no function 'nope'"):
        load_reward_fn("./myreward.py:nope")


def test_a_dataset_without_the_prompt_field_names_its_fields_and_the_flag(tmp_path):
    from vespo.data import load_records

    (tmp_path / "q.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    with pytest.raises(ValueError) as missing:
        load_records(str(tmp_path / "q.jsonl"))
    assert "(no 'prompt' field; the record's fields are ['question', 'answer']: set --prompt-key)" in str(missing.value)
    assert load_records(str(tmp_path / "q.jsonl"), prompt_key="question")[0]["prompt"] == "1+1?"


@pytest.mark.slow
def test_trl_snippet_with_a_hub_id_offline_fails_fast_with_one_message(tmp_path):
    pytest.importorskip("trl")
    snippet = (ROOT / "README.md").read_text().split("```python\nfrom datasets import Dataset")[1].split("```")[0]
    code = "from datasets import Dataset" + snippet.replace("trainer.train()", "")
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=HANG_GUARD_S)  # fmt: skip
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1, done.stderr[-2000:]
    assert last.startswith("ValueError: model 'Qwen/Qwen3-0.6B': the Hugging Face Hub cannot be used"), last


# ----------------------------------------------------------------------------------------------------------------
# 9. numbers a run keeps


def test_interrupt_message_names_the_first_checkpoint_this_run_would_save(tmp_path):
    from vespo.train.config import TrainConfig
    from vespo.train.launch import _interrupted

    cfg = TrainConfig(run_dir=str(tmp_path / "r"), total_training_steps=3, model=str(tmp_path))
    assert "the first is at step 3)" in _interrupted(cfg)
    assert "the first is at step 25)" in _interrupted(dataclasses.replace(cfg, total_training_steps=100))


def test_logged_prompts_are_what_the_model_read_special_tokens_included():
    from vespo.rollout import Rollout
    from vespo.train.setup import completion_rows

    tok = build_tokenizer()
    ids = tok(["1+2=", "10+20="], padding=True, return_tensors="pt")  # left-padded, with <bos>
    response = torch.full((2, 3), tok.eos_token_id)
    rollout = Rollout(torch.cat([ids.input_ids, response], 1), torch.cat([ids.attention_mask, torch.ones(2, 3)], 1),
                      torch.ones(2, 3), torch.zeros(2, 3))  # fmt: skip
    rows = completion_rows(tok, rollout, torch.ones(2), torch.zeros(2), 2)
    assert [r["prompt"] for r in rows] == ["<bos>1+2=", "<bos>10+20="]  # no padding, the BOS the model saw kept


@pytest.mark.slow
def test_a_resumed_runs_config_yaml_feeds_back_with_config(random_model, tmp_path):
    from vespo.train.config_io import load_yaml, parse_args

    run = tmp_path / "r"
    argv = ["train", "--model", str(random_model), "--num-operands", "2", "--eval-size", "8", "--train-batch-size",
            "2", "--ppo-mini-batch-size", "2", "--rollout-n", "2", "--max-response-length", "4", "--eval-every", "0",
            "--no-tensorboard", "--no-progress", "--run-dir", str(run)]  # fmt: skip
    assert _vespo(*argv, "--total-training-steps", "1").returncode == 0
    done = _vespo(*argv, "--total-training-steps", "2", "--resume", "--allow-change", "total_training_steps")
    assert done.returncode == 0, done.stderr[-2000:]
    saved = load_yaml(run / "config.yaml")
    assert saved["resume"] is False and saved["allow_change"] == () and saved["total_training_steps"] == 2
    cfg = parse_args(["--config", str(run / "config.yaml"), "--run-dir", str(tmp_path / "again")])
    assert cfg.total_training_steps == 2 and not cfg.resume


def test_docs_state_the_split_the_code_uses():
    from vespo.embedded.task import embedded_split, held_out_pool

    train, held_out = embedded_split("arithmetic", num_operands=3, max_operand=9, eval_size=200)
    pool = held_out_pool("arithmetic", num_operands=3, max_operand=9)
    text = " ".join((ROOT / "docs" / "training.md").read_text().split())
    assert (len(train), pool, len(held_out)) == (500, 500, 200)
    assert "800 train" not in text and f"{len(train)} training problems and a held-out pool of {pool}" in text

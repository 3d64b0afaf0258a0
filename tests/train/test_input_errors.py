"""One line for each bad input, before the model loads: offline Hub sets, a missing logger, reward functions
from files, datasets without the prompt field, TRL's snippet offline."""

import json
import os
import subprocess
import sys

import pytest
from _clock import HANG_GUARD_S
from _commands import ROOT, vespo


def _one_error_line(done, *words):
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    for word in words:
        assert word in errors[0], (word, errors[0])
    return errors[0]


def test_eval_of_a_hub_benchmark_offline_is_one_line_before_the_model_loads(random_model, tmp_path):
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path)}
    out = tmp_path / "o"
    done = vespo("eval", "--model", str(random_model), "--benchmarks", "math500", "--out", str(out), env=env)
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

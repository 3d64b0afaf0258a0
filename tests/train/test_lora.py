"""LoRA: the final output is a merged, evaluable model, and checkpoints export to one."""

import json

import pytest
import torch
from _commands import vespo


@pytest.mark.slow
def test_lora_run_leaves_an_evaluable_merged_model_and_checkpoints_export(random_model, tmp_path):
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    run = tmp_path / "lora"
    argv = ["train", "--model", str(random_model), "--use-peft", "--lora-r", "4", "--num-operands", "2", "--eval-size",
            "8", "--train-batch-size", "2", "--ppo-mini-batch-size", "2", "--rollout-n", "2", "--max-response-length",
            "4", "--total-training-steps", "2", "--eval-every", "0", "--no-tensorboard", "--no-progress",
            "--entropy-coeff", "1", "--lr", "0.01", "--run-dir", str(run)]  # fmt: skip
    done = vespo(*argv)  # the entropy bonus gives the adapters a gradient whatever the rewards
    assert done.returncode == 0, done.stderr[-2000:]
    assert (run / "final" / "config.json").is_file() and (run / "final" / "adapter" / "adapter_config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(run / "final")
    base = AutoModelForCausalLM.from_pretrained(random_model)
    assert not any("lora" in k for k in merged.state_dict())
    assert any(not torch.equal(v, base.state_dict()[k]) for k, v in merged.state_dict().items())  # adapters merged
    done = vespo("export", str(run), "--out", str(tmp_path / "exported"))
    assert done.returncode == 0, done.stderr[-2000:]
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported").state_dict()
    assert all(torch.equal(exported[k], v) for k, v in merged.state_dict().items())  # last checkpoint == final
    evaluated = vespo("eval", "--model", str(run / "final"), "--benchmarks", str(_math_jsonl(tmp_path)), "--k", "1",
                       "--max-new-tokens", "4", "--out", str(tmp_path / "eval"))  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    again = vespo("export", str(run), "--out", str(tmp_path / "exported"))
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "nothing is replaced" in again.stderr


def _math_jsonl(tmp_path):
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(3)))
    return path

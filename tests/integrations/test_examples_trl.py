"""examples/trl/vespo_grpo.py says where it runs and runs where it says: `--help` before TRL or torch is imported, and
on a CPU (vLLM and bf16 off by default without CUDA, said on stderr) one VESPO step on a local tiny model."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _optional import require

SCRIPT = Path(__file__).parents[2] / "examples" / "trl" / "vespo_grpo.py"
HEAVY = ("torch", "trl", "transformers", "datasets", "vllm")


def _modules_after(argv: list[str]) -> tuple[set[str], str]:
    """The heavy top-level packages imported by the script's `main` for `argv`, and what it printed."""
    code = (
        "import runpy, sys\n"
        f"sys.argv = [{str(SCRIPT)!r}, *{argv!r}]\n"
        "try:\n"
        f"    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    *_, last = done.stderr.strip().splitlines()
    return set(eval(last)), done.stdout + done.stderr  # noqa: S307 (our own printed list)


def test_help_answers_before_trl_or_torch_is_imported():
    """`--help` (38 s before: TRL was imported first) now reads only argparse; it names the CPU/GPU flags."""
    imported, out = _modules_after(["--help"])
    assert imported == set(), imported
    assert "--no-vllm" in out and "--no-bf16" in out and "CPU" in out
    imported, out = _modules_after(["--num-mini-batches", "0"])  # a bad value: one line, still nothing heavy
    assert imported == set() and "argument --num-mini-batches/--staleness: must be an integer >= 1, got 0" in out


def test_vllm_and_bf16_follow_the_hardware_unless_asked_for(monkeypatch):
    """Without CUDA both default to off (said in one line) and run on the CPU; `--vllm` there is refused in one line
    instead of TRL's traceback; with CUDA and vLLM both default to on."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("vespo_trl_example", SCRIPT)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    settings, note = example.hardware_settings(None, None)
    assert settings == {"use_vllm": False, "bf16": False, "use_cpu": True}
    assert note == (
        "vespo_grpo.py: vLLM off (no CUDA device), bf16 off (no CUDA device: fp32 on the CPU); "
        "--vllm / --bf16 to change"
    )
    assert example.hardware_settings(False, True) == ({"use_vllm": False, "bf16": True, "use_cpu": True}, None)
    with pytest.raises(ValueError, match="--vllm needs a CUDA device"):
        example.hardware_settings(True, None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "vllm" else None)
    assert example.hardware_settings(None, None) == ({"use_vllm": True, "bf16": True, "use_cpu": False}, None)
    settings, note = example.hardware_settings(False, False)  # asked for on a GPU: no note, nothing overridden
    assert settings == {"use_vllm": False, "bf16": False, "use_cpu": False} and note is None


@pytest.mark.slow
def test_one_step_on_a_cpu_with_a_local_tiny_model(tmp_path):
    """The script as a user runs it on a CPU: a local tiny model, a .jsonl, one optimizer step of VESPO's loss (its
    W/ESS metrics in TRL's log), fp32, TRL's own generation. Bounded by construction: 1 prompt x 8 responses of at
    most 8 tokens, one step."""
    require("trl")
    from vespo.embedded.task import arithmetic_problems, build_tiny_model, build_tokenizer

    tok = build_tokenizer()
    build_tiny_model(tok, seed=1).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    data = tmp_path / "data.jsonl"
    rows = [{"prompt": p.prompt, "answer": p.answer} for p in arithmetic_problems(8, seed=0)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = ["--model", str(tmp_path / "model"), "--dataset", str(data), "--num-mini-batches", "1",
            "--max-completion-length", "8", "--max-steps", "1", "--output-dir", str(tmp_path / "out")]  # fmt: skip
    env = os.environ | {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "vLLM off (no CUDA device), bf16 off" in done.stderr and "doesn't support bf16" not in done.stderr
    state = json.loads((tmp_path / "out" / "checkpoint-1" / "trainer_state.json").read_text())
    assert state["global_step"] == 1
    logged = state["log_history"][0]
    assert {"loss", "weight/ess", "vespo/Z", "is/log_w_mean"} <= set(logged), logged  # vespo's loss ran
    assert logged["is/log_w_mean"] == 0.0  # one mini-batch per generation: on-policy, log W = 0

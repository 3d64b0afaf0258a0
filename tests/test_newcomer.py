"""A newcomer's first runs (issue 22): quiet under --no-progress, no deprecation noise from vespo's own calls, one
vocabulary across commands, conflicting flags refused, veRL-style nested YAML keys accepted."""

import subprocess
import sys

import pytest

from vespo.embedded.task import build_tiny_model, build_tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("newcomer")
    tok = build_tokenizer()
    build_tiny_model(tok, num_hidden_layers=1).save_pretrained(root / "m")
    tok.save_pretrained(root / "m")
    return root


def _train(tiny, *flags):
    argv = ["--model", str(tiny / "m"), "--num-operands", "2", "--eval-size", "8", "--train-batch-size", "2",
            "--ppo-mini-batch-size", "2", "--rollout-n", "2", "--max-response-length", "4", "--eval-every", "1",
            "--total-training-steps", "1", "--no-tensorboard", *flags]  # fmt: skip
    return subprocess.run([sys.executable, "-m", "vespo", "train", *argv], capture_output=True, text=True, timeout=300)


def test_no_progress_means_no_bars_and_no_deprecation_noise(tiny):
    """--no-progress silences Hugging Face's loading/saving bars too, and vespo's sampler calls the model with the
    installed transformers' current cache argument (no FutureWarning of our making)."""
    done = _train(tiny, "--no-progress", "--run-dir", str(tiny / "run"))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-2000:]
    for noise in ("Loading weights", "Writing model shards", "it/s]", "deprecated", "FutureWarning"):
        assert noise not in out, (noise, out[-2000:])

"""The embedded model's SFT warm start: kept on Ctrl-C, resumed bit for bit, announced when long (its kept state is
used only for exactly its settings: tests/train/test_checkpoints.py)."""

import time
from pathlib import Path

import pytest
import torch
from _commands import Running


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
    run = Running("train", "--cache-dir", spec.cache_dir, "--num-operands", "2", "--sft-steps", "1500",
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


def test_a_long_warm_start_says_how_long_and_how_it_is_cached(tmp_path, capsys, monkeypatch):
    import vespo.embedded.warm_start as ws

    monkeypatch.setattr(ws, "ANNOUNCE_S", 0.0)  # any estimate counts as long here
    monkeypatch.setattr(ws, "_PROBE_S", 0.0)
    spec = ws.WarmStartSpec(num_operands=2, sft_steps=6, sft_batch_size=2, cache_dir=str(tmp_path))
    path = ws.embedded_policy_path(spec)
    err = capsys.readouterr().err.splitlines()
    said = [line for line in err if "will take about" in line]
    assert len(said) == 1 and f"cached in {path}" in said[0] and "Ctrl-C keeps its progress" in said[0], err


def test_a_warm_start_fingerprint_is_the_hash_of_its_weights_and_changes_with_them(tmp_path):
    """`fingerprint`: 12 hex digits of SHA-256 over model.safetensors, by hand; one changed byte changes it."""
    import hashlib

    from vespo.embedded.warm_start import fingerprint

    (tmp_path / "model.safetensors").write_bytes(b"weights" * 1000)
    assert fingerprint(tmp_path) == hashlib.sha256(b"weights" * 1000).hexdigest()[:12]
    (tmp_path / "model.safetensors").write_bytes(b"weights" * 999 + b"weightS")
    assert fingerprint(tmp_path) == hashlib.sha256(b"weights" * 999 + b"weightS").hexdigest()[:12]

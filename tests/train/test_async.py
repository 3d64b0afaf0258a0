"""Asynchronous training: admission arithmetic, shared-memory weights, the vLLM packing path, and end-to-end runs
(lock-step reproducibility and resume, decoupled loss, sampler crash and restart, clean stop on signals)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _clock import HANG_GUARD_S
from _commands import alive, descendants, sigint_default

from vespo.deadline import sigterm_as_interrupt
from vespo.embedded.task import arithmetic_split, build_tiny_model, build_tokenizer
from vespo.rewards import math_reward
from vespo.rollout import pack_rollout, sample
from vespo.train import async_ as async_trainer
from vespo.train import train
from vespo.train.async_ import lag_bucket
from vespo.train.config import TrainConfig
from vespo.train.config_io import parse_args
from vespo.train.logs import read_metrics
from vespo.train.sampler import Schedule, WeightStore, batch_seed

CTX = torch.multiprocessing.get_context("spawn")


# ---------------------------------------------------------------------------------------------------------------
# pieces


def test_admission_counts_lag_in_optimizer_steps():
    s = Schedule(CTX, num_mini_batches=2, max_staleness=3, num_samplers=2, step=0, next_batch=5)
    assert s.admit(0, -1) is None  # nothing published yet
    assert s.admit(0, 0) == 5  # last unit trained at step 0 + 0 + 1: lag 1 <= 3
    assert s.admit(1, 0) == 6  # 2 units ahead: last unit at step 3, lag 3 <= 3
    assert s.admit(0, 0) is None  # 4 ahead: lag 5 > 3
    assert list(s.holding) == [5, 6]
    s.consume(1, trained=True)
    s.consume(1, trained=False)  # a dropped unit frees its slot but does not advance the learner
    assert (s.step.value, s.issued.value - s.consumed.value) == (1, 2)
    assert s.admit(0, 0) is None  # 1 + 2 + 1 - 0 = 4 > 3
    assert s.admit(0, 1) == 7  # with version 1: lag 3
    s.release(1)
    assert list(s.holding) == [7, -1]
    assert batch_seed(3, 7) == 3 * 1_000_003 + 7


def test_lag_buckets():
    assert [lag_bucket(k) for k in (0, 1, 2, 3, 4, 7, 8, 16, 31)] == [
        "0", "1", "2-3", "2-3", "4-7", "4-7", "8-15", "16-31", "16-31"
    ]  # fmt: skip


def test_weight_store_publishes_versions_and_casts():
    tok = build_tokenizer()
    learner, sampler = build_tiny_model(tok, seed=0), build_tiny_model(tok, seed=1).to(torch.bfloat16)
    store = WeightStore(learner, CTX)
    loads = []

    def load(named):
        loads.append(1)
        params = dict(sampler.named_parameters())
        with torch.no_grad():
            for name, t in named:
                params[name].copy_(t)

    assert store.pull(load, -1) == -1 and not loads  # nothing published: version -1, no copy
    store.publish(learner, 7)
    assert store.pull(load, -1) == 7 and store.pull(load, 7) == 7 and len(loads) == 1  # copied once per version
    for (name, a), (_, b) in zip(learner.named_parameters(), sampler.named_parameters(), strict=True):
        assert b.dtype == torch.bfloat16
        torch.testing.assert_close(b, a.detach().to(torch.bfloat16), rtol=0, atol=0, msg=name)


def test_pack_rollout_rebuilds_the_hf_sampler_layout():
    """The vLLM engine's token lists -> Rollout path, checked on what the HF sampler produced."""
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=0)
    prompts = ["1+2=", "3+4+5=", "9="]  # different lengths: left padding
    r = sample(model, tok, prompts, n=2, max_new_tokens=6, generator=torch.Generator().manual_seed(0))
    p = r.prompt_len
    prompt_ids = [row[p - int(m[:p].sum()) : p].tolist() for row, m in zip(r.input_ids, r.attention_mask, strict=True)]
    lengths = r.response_mask.sum(-1).tolist()
    resp = [row[:n].tolist() for row, n in zip(r.response_ids, lengths, strict=True)]
    logps = [row[:n].tolist() for row, n in zip(r.rollout_log_prob, lengths, strict=True)]
    packed = pack_rollout(prompt_ids, resp, logps, pad_id=tok.pad_token_id)
    for field in ("input_ids", "attention_mask", "response_mask", "rollout_log_prob"):
        torch.testing.assert_close(getattr(packed, field), getattr(r, field), rtol=0, atol=0, msg=field)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--async", "--staleness", "4", "--ppo-mini-batch-size", "2", "--max-staleness", "2"], r"needs max_staleness"),
        (["--async", "--sync-every", "3", "--max-staleness", "1"], r"N \+ sync_every - 2 = 2"),
        (["--use-decoupled-loss"], "needs mode=async"),
    ],
)
def test_bad_async_config_fails_at_parse(argv, message):
    with pytest.raises(ValueError, match=message):
        parse_args(argv)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--mode", "later"], r"--mode must be one of \['sync', 'async'\], got 'later'"),
        (["--async", "--sampler-engine", "sglang"], r"--sampler-engine must be one of \['hf', 'vllm'\], got 'sglang'"),
    ],
)
def test_async_choices_are_refused_by_the_parser(argv, message):
    with pytest.raises(ValueError, match=message):  # Literal fields: one line with the accepted choices
        parse_args(argv)


def test_async_flag_and_sigterm_become_one_shutdown_path():
    cfg = parse_args(["--async", "--max-staleness", "8", "--sync-every", "2", "--num-samplers", "2"])
    assert (cfg.async_.mode, cfg.async_.max_staleness, cfg.async_.sync_every, cfg.async_.num_samplers) == (
        "async",
        8,
        2,
        2,
    )
    with pytest.raises(KeyboardInterrupt), sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler interrupts this


# ---------------------------------------------------------------------------------------------------------------
# end to end (each run spawns sampler processes)


@pytest.fixture(scope="module")
def tiny_model(warm_model):
    return str(warm_model.model)


def _cfg(model, run_dir, **kw) -> TrainConfig:
    base = dict(
        mode="async",
        model=model,
        dataset="embedded",
        num_operands=2,
        eval_size=20,
        train_batch_size=4,
        ppo_mini_batch_size=2,
        rollout_n=4,
        micro_batch_size=8,
        max_response_length=8,
        total_training_steps=4,
        max_staleness=1,  # = N + sync_every - 2: lock step, deterministic
        lr=1e-2,
        eval_every=0,
        save_every=2,
        num_threads=1,
        run_dir=str(run_dir),
        progress=False,
        tensorboard=False,
    )
    return TrainConfig(**(base | kw))


def _comparable(rows):
    skip = ("time/", "async/queue", "async/learner_util", "async/sampler_util")
    return [{k: v for k, v in r.items() if not k.startswith(skip)} for r in rows]


@pytest.mark.slow
def test_lock_step_run_is_reproducible_and_resumes_bit_identically(tiny_model, tmp_path):
    train(_cfg(tiny_model, tmp_path / "a"))
    ref = read_metrics(tmp_path / "a")
    # every trained mini-batch carries its version: lags 0 and 1 only (N = 2, lock step), 2 per rollout step
    assert all(r["async/lag_hist/0"] == r["async/lag_hist/1"] == 1 for r in ref)
    summary = json.loads((tmp_path / "a" / "async_summary.json").read_text())
    assert summary["lag_hist"] == {"0": 4, "1": 4} and summary["units_dropped"] == 0
    assert abs(summary["per_lag_bucket"]["0"]["log_w_mean"]) < 1e-4  # lag 0: mu == pi up to batching numerics
    assert abs(summary["per_lag_bucket"]["1"]["log_w_mean"]) > 1e-3  # one update later W != 1
    # interrupted after 2 steps (checkpoint), then resumed to 4: the same numbers as the uninterrupted run
    train(_cfg(tiny_model, tmp_path / "b", total_training_steps=2))
    train(_cfg(tiny_model, tmp_path / "b", resume=True, allow_change=("total_training_steps",)))
    assert _comparable(read_metrics(tmp_path / "b")) == _comparable(ref)


def crash_once_reward(completions, answer, **kwargs):
    """Raises in the first sampler process that calls it (marker file), then grades normally."""
    marker = Path(os.environ["VESPO_TEST_CRASH_MARKER"])
    if not marker.exists():
        marker.write_text("crashed")
        raise RuntimeError("reward server unreachable")
    return math_reward(completions, answer)


def always_crash_reward(completions, answer, **kwargs):
    raise RuntimeError("reward server unreachable")


@pytest.mark.slow
def test_decoupled_loss_and_a_crashed_sampler_restarted(tiny_model, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("VESPO_TEST_CRASH_MARKER", str(tmp_path / "marker"))
    cfg = _cfg(tiny_model, tmp_path / "d", use_decoupled_loss=True, max_staleness=3, total_training_steps=3)
    last = train(cfg.replace(reward_fn="test_async:crash_once_reward"))
    # the first sampler died on its first batch; it was reported and replaced, and the run completed
    assert last["async/sampler_restarts"] == 1.0
    err = capfd.readouterr().err
    assert "sampler 0" in err and "RuntimeError: reward server unreachable" in err and "restarting it (1/3)" in err
    # pi_prox = the learner's weights at the update, so pi / pi_prox is exactly 1; the lag sits in pi_prox / mu
    assert last["is/log_w_min"] == last["is/log_w_max"] == 0.0
    # the learner's phases: scoring under pi_prox (decoupled) and the update, both inside its step
    assert last["time/old_log_prob_s"] > 0 and last["time/update_s"] > 0
    assert last["time/old_log_prob_s"] + last["time/update_s"] + last["async/queue_wait_s"] <= last["time/step_s"]
    summary = json.loads((tmp_path / "d" / "async_summary.json").read_text())
    stale = [v["log_w_mean"] for k, v in summary["per_lag_bucket"].items() if k != "0"]
    # (a lag bucket whose updates all had zero advantage, so the weights did not move, can sit at log W = 0)
    assert stale and max(abs(x) for x in stale) > 1e-3


@pytest.mark.slow
def test_sampler_that_keeps_crashing_fails_the_run_with_its_error(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(async_trainer, "_MAX_RESTARTS", 0)  # the same path as after 3 restarts, without 3 spawns
    message = r"sampler 0 .* exit code 1: RuntimeError: reward server unreachable; 0 restarts"
    with pytest.raises(RuntimeError, match=message):  # fails, never hangs
        train(_cfg(tiny_model, tmp_path / "f", reward_fn="test_async:always_crash_reward"))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigkill"])
def test_stop_leaves_no_orphans(tiny_model, tmp_path, how):
    run_dir = tmp_path / "s"
    argv = [sys.executable, "-m", "vespo", "train", "--async", "--model", tiny_model, "--num-operands", "2"]
    argv += ["--eval-size", "20"]
    argv += ["--train-batch-size", "4", "--ppo-mini-batch-size", "2", "--rollout-n", "4", "--max-staleness", "3"]
    argv += ["--max-response-length", "8", "--total-training-steps", "100000", "--eval-every", "0", "--num-threads"]
    argv += ["1", "--no-progress", "--no-tensorboard", "--run-dir", str(run_dir)]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=sigint_default)  # fmt: skip
    try:
        deadline = time.time() + HANG_GUARD_S
        while not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text():
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.time() < deadline, "no training step (hang guard)"
            time.sleep(0.2)
        samplers = sorted(descendants(proc.pid))  # the fork server and the samplers it forked
        assert len(samplers) >= 2, "no sampler process found"
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole process group
        else:
            os.kill(proc.pid, signal.SIGKILL)  # no shutdown code runs: the kernel's parent-death signal must act
        code = proc.wait(timeout=HANG_GUARD_S)
        deadline = time.time() + HANG_GUARD_S  # the parent-death signal acts at once; teardown on a busy box is slow
        while any(alive(p) for p in samplers) and time.time() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in samplers), "sampler outlived the learner"
        if how == "ctrl-c":
            assert code == 130, proc.stdout.read().decode()
            assert "interrupted" in proc.stdout.read().decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_shuffle_permutes_rows_before_cutting_mini_batches():
    """`shuffle` (veRL's actor option; TRL always shuffles) == the unshuffled update on the permuted batch."""
    from _support import run_update as _update

    from vespo.advantages import group_advantages
    from vespo.train.learner import policy_log_probs

    tok = build_tokenizer()
    prompts = [p.prompt for p in arithmetic_split(num_operands=2, max_operand=9, eval_size=1)[0][:4]]
    results = []
    for shuffle in (True, False):
        model = build_tiny_model(tok, num_hidden_layers=1, seed=0)
        r = sample(model, tok, prompts, n=4, max_new_tokens=6, generator=torch.Generator().manual_seed(0))
        adv = group_advantages(torch.tensor([float(i % 3 == 0) for i in range(16)]), 4)
        cfg = TrainConfig(train_batch_size=4, ppo_mini_batch_size=2, rollout_n=4, micro_batch_size=8, shuffle=shuffle)
        torch.manual_seed(7)
        perm = torch.randperm(16) if not shuffle else torch.arange(16)  # the unshuffled run gets the same order
        r, adv = r.select(perm), adv[perm]
        with torch.no_grad():
            old, _ = policy_log_probs(
                model,
                r,
                torch.arange(16),
                micro_batch_size=cfg.batch.micro_batch_size,
                temperature=cfg.rollout.temperature,
            )
        torch.manual_seed(7)
        hist = _update(model, torch.optim.SGD(model.parameters(), lr=0.1), r, adv, old, cfg)
        results.append(([h["loss/pg"] for h in hist], [p.detach().clone() for p in model.parameters()]))
    (loss_a, params_a), (loss_b, params_b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-5, abs=1e-7)
    for a, b in zip(params_a, params_b, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_vespo_command_imports_no_torch_before_it_starts_the_samplers_server():
    """`vespo train --async` starts the samplers' fork server before its own heavy imports (so the two overlap): the
    command's entry and `vespo.train.forkserver` must not import torch, and only an async argv asks for the server."""
    from vespo.train.forkserver import wants_async

    code = "import sys, vespo, vespo.cli, vespo.train, vespo.train.forkserver; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
    assert wants_async(["--async"]) and wants_async(["--mode", "async"]) and wants_async(["--mode=async"])
    assert not wants_async([]) and not wants_async(["--mode", "sync"]) and not wants_async(["--run-dir", "async"])

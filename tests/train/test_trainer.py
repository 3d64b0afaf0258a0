"""Trainer: config errors before compute, staleness of the mini-batch loop, gradient accumulation, resume after a kill,
and the real from_pretrained / datasets paths on a locally saved tiny model and JSONL file."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from _clock import HANG_GUARD_S
from _support import run_update as _update
from conftest import with_model

from vespo.advantages import group_advantages
from vespo.embedded.task import arithmetic_split, build_tiny_model, build_tokenizer
from vespo.embedded.warm_start import WarmStartSpec, embedded_policy_path
from vespo.losses.core import top_share as _top_share
from vespo.rollout import sample
from vespo.train import train
from vespo.train.config import ConfigError, TrainConfig
from vespo.train.config_io import parse_args
from vespo.train.learner import policy_log_probs
from vespo.train.logs import read_metrics
from vespo.train.setup import build_optimizer, load_data


@pytest.fixture(scope="module")
def local_model_and_data(tmp_path_factory, warm_model):
    """The shared warm-started tiny model (root/model), and JSONL train/eval files of the arithmetic task."""
    root = with_model(tmp_path_factory.mktemp("assets"), warm_model)
    train_set, eval_set = warm_model.train, warm_model.heldout
    for name, rows in (("train.jsonl", train_set), ("eval.jsonl", eval_set)):
        lines = [json.dumps({"question": p.prompt, "solution": p.answer}) for p in rows]
        (root / name).write_text("\n".join(lines) + "\n")
    return root


def _cfg(root, run_dir, **kw) -> TrainConfig:
    base = dict(
        model=str(root / "model"),
        dataset=str(root / "train.jsonl"),
        eval_dataset=str(root / "eval.jsonl"),
        prompt_key="question",
        answer_key="solution",
        train_batch_size=4,
        ppo_mini_batch_size=2,
        rollout_n=4,
        micro_batch_size=4,
        max_response_length=8,
        total_training_steps=3,
        lr=1e-3,
        eval_every=2,
        eval_size=8,
        save_every=1,
        num_threads=1,
        run_dir=str(run_dir),
        progress=False,
        tensorboard=False,
        method="vespo",
    )
    return TrainConfig(**(base | kw))


# ---------------------------------------------------------------------------------------------------------------
# configuration


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--train-batch-size", "6", "--ppo-mini-batch-size", "4"], "must divide"),
        (["--method", "ppo2"], "known methods: \\['aipo'"),
        (["--method", "grpo", "--hparams", "c1_pos", "2"], "unknown hyperparameter"),
        (["--probe-every", "-1"], "probe_every"),
        (["--probe-every", "2", "--async"], "probe_every needs mode=sync"),
    ],
)
def test_bad_config_fails_at_parse(argv, message):
    with pytest.raises(ValueError, match=message):
        parse_args(argv)


def test_a_missing_data_file_is_the_hosts_to_refuse_before_any_compute(tmp_path):
    """The config names a file; whether it is there is this machine's matter (`check_host`, run before any compute):
    a saved config stays valid on a machine without the file."""
    from vespo.train.host import check_host

    cfg = parse_args(["--dataset", "/nonexistent/x.jsonl", "--run-dir", str(tmp_path / "run")])
    with pytest.raises(ConfigError, match="dataset: file not found: /nonexistent/x.jsonl"):
        check_host(cfg)
    with pytest.raises(ConfigError, match="dataset: file not found"):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_missing_dataset_field_fails_before_training(local_model_and_data, tmp_path):
    cfg = _cfg(local_model_and_data, tmp_path / "run", prompt_key="prompt")
    with pytest.raises(ConfigError, match=r"train.jsonl:1: 'prompt' must be a non-empty string, got None"):
        train(cfg)
    assert not (tmp_path / "run").exists()  # nothing was created or computed


def test_yaml_config_with_cli_override(tmp_path):
    (tmp_path / "c.yaml").write_text("method: grpo\nlr: 0.01\nstaleness: 4\nppo_mini_batch_size: 2\n")
    cfg = parse_args(["--config", str(tmp_path / "c.yaml"), "--lr", "0.5"])
    assert (cfg.algorithm.method, cfg.optimizer.lr, cfg.batch.train_batch_size, cfg.batch.num_mini_batches) == (
        "grpo",
        0.5,
        8,
        4,
    )
    (tmp_path / "bad.yaml").write_text("learning_rate: 1\n")
    with pytest.raises(ValueError, match="unknown config key"):
        parse_args(["--config", str(tmp_path / "bad.yaml")])


# ---------------------------------------------------------------------------------------------------------------
# the update loop


def _batch(n_prompts=3, n=4, seed=0):
    tok = build_tokenizer()
    model = build_tiny_model(tok, num_hidden_layers=1, seed=seed)
    prompts = [p.prompt for p in arithmetic_split(num_operands=2, max_operand=9, eval_size=1)[0][:n_prompts]]
    rollout = sample(model, tok, prompts, n=n, max_new_tokens=6, generator=torch.Generator().manual_seed(seed))
    rewards = torch.tensor([float(i % 3 == 0) for i in range(n_prompts * n)])
    return model, rollout, group_advantages(rewards, n)


def test_mini_batches_are_sequential_and_increasingly_stale():
    model, rollout, adv = _batch()
    cfg = TrainConfig(
        method="vespo", train_batch_size=3, ppo_mini_batch_size=1, rollout_n=4, micro_batch_size=4, lr=1e-2
    )
    rows = torch.arange(12)
    with torch.no_grad():
        old, _ = policy_log_probs(
            model, rollout, rows, micro_batch_size=cfg.batch.micro_batch_size, temperature=cfg.rollout.temperature
        )
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optimizer.lr)
    history = _update(model, opt, rollout, adv, old, cfg)
    assert len(history) == cfg.batch.num_mini_batches == 3
    # first mini-batch: the weights have not moved since mu was computed -> W == 1 exactly for every sequence
    assert history[0]["is/log_w_min"] == history[0]["is/log_w_max"] == 0.0
    # later mini-batches see weights updated 1 and 2 times -> W != 1
    assert abs(history[1]["is/log_w_mean"]) > 1e-4 and abs(history[2]["is/log_w_mean"]) > 1e-4
    assert all(h["actor/grad_norm"] > 0 for h in history)


def test_mechanism_metrics_update_size_and_weight_concentration():
    """update_norm is the real step (Adam's first step: lr * sign(g) per weight); top-1% share is a share of sum W."""
    model, rollout, adv = _batch()
    cfg = TrainConfig(
        method="vespo",
        train_batch_size=3,
        ppo_mini_batch_size=1,
        rollout_n=4,
        micro_batch_size=4,
        lr=1e-2,
        log_update_norm=True,
        grad_clip=1e9,
    )
    rows = torch.arange(12)
    with torch.no_grad():
        old, _ = policy_log_probs(
            model, rollout, rows, micro_batch_size=cfg.batch.micro_batch_size, temperature=cfg.rollout.temperature
        )
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optimizer.lr, weight_decay=0.0)
    history = _update(model, opt, rollout, adv, old, cfg)
    n_moved = sum(int((p.grad != 0).sum()) for p in model.parameters() if p.grad is not None)
    first = history[0]["actor/update_norm"]
    assert first == pytest.approx(
        cfg.optimizer.lr * n_moved**0.5, rel=0.02
    )  # bias-corrected Adam: |step| = lr per weight
    assert history[0]["is/top1pct_w_share"] == pytest.approx(1 / 4)  # W == 1 for all 4 sequences: top 1 of 4
    assert all(0 < h["is/top1pct_w_share"] <= 1 for h in history)
    assert _top_share(torch.tensor([0.0, math.log(3.0)])) == pytest.approx(0.75)


@pytest.mark.parametrize("optim, eps", [("sgd", 1e-8), ("adamw_torch", 1e-8), ("adamw_torch", 0.5)])
def test_optimizer_option_sets_the_step_rule(optim, eps):
    """One step on a fixed gradient g: SGD moves -lr * g; AdamW's first step is -lr * g / (|g| + eps) per weight."""
    model, rollout, adv = _batch()
    cfg = TrainConfig(optim=optim, adam_epsilon=eps, lr=0.1, weight_decay=0.0)
    opt = build_optimizer(model, cfg.optimizer)
    before = [p.detach().clone() for p in model.parameters()]
    grads = [torch.linspace(-2.0, 2.0, p.numel()).reshape(p.shape) for p in model.parameters()]
    for p, g in zip(model.parameters(), grads, strict=True):
        p.grad = g.clone()
    opt.step()
    for p, b, g in zip(model.parameters(), before, grads, strict=True):
        expected = -cfg.optimizer.lr * g if optim == "sgd" else -cfg.optimizer.lr * g / (g.abs() + eps)
        torch.testing.assert_close(p.detach() - b, expected, rtol=1e-4, atol=1e-7)


def test_micro_batch_accumulation_equals_one_big_batch():
    results = []
    for micro in (3, 16):
        model, rollout, adv = _batch(n_prompts=4, seed=1)
        for mode in ("token-mean", "seq-mean-token-mean"):
            cfg = TrainConfig(
                method="grpo",
                train_batch_size=4,
                ppo_mini_batch_size=2,
                rollout_n=4,
                micro_batch_size=micro,
                loss_agg_mode=mode,
                lr=1e-3,
            )
            with torch.no_grad():
                old, _ = policy_log_probs(
                    model,
                    rollout,
                    torch.arange(16),
                    micro_batch_size=cfg.batch.micro_batch_size,
                    temperature=cfg.rollout.temperature,
                )
            opt = torch.optim.SGD(model.parameters(), lr=cfg.optimizer.lr)
            hist = _update(model, opt, rollout, adv, old, cfg)
            results.append(([p.detach().clone() for p in model.parameters()], [h["loss/pg"] for h in hist]))
    (p_small, l_small), (p_small2, l_small2), (p_big, l_big), (p_big2, l_big2) = results
    assert l_small == pytest.approx(l_big, rel=1e-5, abs=1e-7)
    assert l_small2 == pytest.approx(l_big2, rel=1e-5, abs=1e-7)
    for a, b in zip(p_small2, p_big2, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_inputs_are_validated_once_per_rollout_batch_not_per_micro_batch(monkeypatch):
    """The fused value check (one host sync) runs once per ppo_update, however many micro-batches there are."""
    import vespo.losses.compute as losses

    calls = []
    real = losses._check_values
    monkeypatch.setattr(losses, "_check_values", lambda *a, **k: calls.append(1) or real(*a, **k))
    model, rollout, adv = _batch(n_prompts=4, seed=1)
    cfg = TrainConfig(method="vespo", train_batch_size=4, ppo_mini_batch_size=2, rollout_n=4, micro_batch_size=3)
    with torch.no_grad():
        old, _ = policy_log_probs(
            model,
            rollout,
            torch.arange(16),
            micro_batch_size=cfg.batch.micro_batch_size,
            temperature=cfg.rollout.temperature,
        )
    _update(model, torch.optim.SGD(model.parameters(), lr=1e-3), rollout, adv, old, cfg)
    assert len(calls) == 1  # 2 mini-batches x 3 micro-batches, one check
    bad = old.clone()
    bad[0, 0] = math.nan  # a valid position: the check names it before any update
    with pytest.raises(ValueError, match="old_log_prob contains NaN"):
        _update(model, torch.optim.SGD(model.parameters(), lr=1e-3), rollout, adv, bad, cfg)


def test_a_non_finite_gradient_skips_the_update_and_is_counted():
    model, rollout, adv = _batch()
    cfg = TrainConfig(method="vespo", train_batch_size=3, ppo_mini_batch_size=1, rollout_n=4, micro_batch_size=4)
    with torch.no_grad():
        old, _ = policy_log_probs(
            model,
            rollout,
            torch.arange(12),
            micro_batch_size=cfg.batch.micro_batch_size,
            temperature=cfg.rollout.temperature,
        )
    before = [p.detach().clone() for p in model.parameters()]
    poison = next(model.parameters()).register_hook(lambda g: torch.full_like(g, math.nan))
    history = _update(model, torch.optim.AdamW(model.parameters(), lr=1e-2), rollout, adv, old, cfg)
    poison.remove()
    assert [h["actor/nonfinite_grad"] for h in history] == [1.0, 1.0, 1.0]
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))  # no NaN reached them
    history = _update(model, torch.optim.AdamW(model.parameters(), lr=1e-2), rollout, adv, old, cfg)
    assert [h["actor/nonfinite_grad"] for h in history] == [0.0, 0.0, 0.0]
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ---------------------------------------------------------------------------------------------------------------
# end to end: real loading paths, logging, resume after a kill


def _params(path):
    from transformers import AutoModelForCausalLM

    return {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(path).state_dict().items()}


def _strip_time(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.mark.slow
def test_gradient_probe_is_logged_at_its_stride(local_model_and_data, tmp_path):
    """`probe_every=2` over 3 rollout steps: the probe's metrics at step 2 only, a cosine in [-1, 1] each."""
    train(_cfg(local_model_and_data, tmp_path / "run", probe_every=2))
    rows = read_metrics(tmp_path / "run")
    probed = [r["step"] for r in rows if "probe/cos_grpo" in r]
    assert probed == [2]
    row = rows[2]
    for key in ("probe/cos_grpo", "probe/cos_reinforce", "probe/cos_grpo_reinforce"):
        assert -1.0 <= row[key] <= 1.0
    assert row["probe/rel_diff_grpo"] >= 0.0 and row["probe/rel_diff_reinforce"] >= 0.0


def test_run_on_local_model_and_jsonl_then_resume_after_kill_matches(local_model_and_data, tmp_path):
    root = local_model_and_data
    steps = 30
    ref_dir = tmp_path / "uninterrupted"
    last = train(_cfg(root, ref_dir, total_training_steps=steps, eval_every=10, sampler_dtype="bfloat16"))
    rows = read_metrics(ref_dir)
    assert [r["step"] for r in rows] == list(range(steps + 1))
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[10] and "eval/accuracy" not in rows[5]
    assert last["actor/num_mini_batches"] == 2.0
    assert rows[1]["mismatch/log_ratio_abs_mean"] > 0  # bf16 sampler vs fp32 trainer: a real mismatch
    for r in rows[1:]:  # the step's phases, each timed, adding up to no more than the step (the rest: bookkeeping)
        phases = [r[f"time/{p}_s"] for p in ("gen", "reward", "ref_log_prob", "update")]
        assert min(phases) >= 0 and r["time/update_s"] > 0 and sum(phases) <= r["time/step_s"]
    assert (ref_dir / "reward.png").stat().st_size > 0 and (ref_dir / "config.yaml").is_file()

    # the same run in a subprocess, SIGKILLed mid-way, then resumed
    run_dir = tmp_path / "killed"
    argv = [
        sys.executable,
        "-m",
        "vespo",
        "train",
        "--model",
        str(root / "model"),
        "--dataset",
        str(root / "train.jsonl"),
        "--eval-dataset",
        str(root / "eval.jsonl"),
        "--prompt-key",
        "question",
        "--answer-key",
        "solution",
        "--train-batch-size",
        "4",
        "--ppo-mini-batch-size",
        "2",
        "--rollout-n",
        "4",
        "--micro-batch-size",
        "4",
        "--max-response-length",
        "8",
        "--total-training-steps",
        str(steps),
        "--lr",
        "1e-3",
        "--eval-every",
        "10",
        "--eval-size",
        "8",
        "--save-every",
        "1",
        "--num-threads",
        "1",
        "--run-dir",
        str(run_dir),
        "--no-progress",
        "--no-tensorboard",
        "--sampler-dtype",
        "bfloat16",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics_file = run_dir / "metrics.jsonl"
    deadline = time.time() + HANG_GUARD_S
    while time.time() < deadline:
        if metrics_file.exists() and len(metrics_file.read_text().splitlines()) >= 4:
            break
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    done_before_kill = len(read_metrics(run_dir)) - 1
    assert 3 <= done_before_kill < steps, "the run must have been killed mid-way"
    with (run_dir / "metrics.jsonl").open("a") as f:  # as if the kill had landed mid-write: a torn last line
        f.write('{"step": 99, "reward/me')

    again = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_GUARD_S)  # the same command continues
    assert again.returncode == 0 and "continuing it (as --resume)" in again.stderr, again.stderr[-2000:]
    assert _strip_time(read_metrics(run_dir)) == _strip_time(rows)
    p_ref, p_res = _params(ref_dir / "final"), _params(run_dir / "final")
    assert all(torch.equal(p_ref[k], p_res[k]) for k in p_ref)


def test_existing_run_dir_needs_resume(local_model_and_data, tmp_path):
    cfg = _cfg(local_model_and_data, tmp_path / "r", total_training_steps=1, eval_every=0)
    train(cfg)
    with pytest.raises(ValueError, match="--resume"):
        train(cfg)


def test_embedded_warm_start_is_cached_speaks_when_building_and_ignores_eval_size(tmp_path, capsys):
    cfg = TrainConfig(cache_dir=str(tmp_path), sft_steps=2, sft_batch_size=4, num_operands=2, eval_size=10)
    path = embedded_policy_path(WarmStartSpec.of(cfg), progress=True)
    err = capsys.readouterr().err
    assert err.startswith("vespo: building the embedded arithmetic policy: 2 SFT steps") and "SFT warm start" in err
    stamp = (path / "config.json").stat().st_mtime_ns
    assert embedded_policy_path(WarmStartSpec.of(cfg)) == path and (path / "config.json").stat().st_mtime_ns == stamp
    assert capsys.readouterr().err == ""  # a cache hit is silent
    assert embedded_policy_path(WarmStartSpec.of(cfg.replace(eval_size=40))) == path  # not a warm-start input
    other = embedded_policy_path(WarmStartSpec.of(cfg.replace(sft_steps=3)))
    assert other != path and (other / "tokenizer.json").is_file()


def test_paper_datasets_by_name_go_through_vespo_data(monkeypatch):
    """`--dataset BytedTsinghua-SIA/DAPO-Math-17k` is deduplicated and reformatted; `--eval-dataset math500` loads the
    benchmark in the paper's prompt format; both as the trainer's records."""
    from vespo.data import benchmarks as data
    from vespo.data.prompts import PROMPT_SUFFIX

    def fake_hub(hub_id, split, **kwargs):
        if hub_id == data.DAPO_MATH_HUB_ID:
            content = f"{data._DAPO_PREFIX}What is 2+3?{data._DAPO_SUFFIX}"
            return [{"prompt": [{"role": "user", "content": content}], "reward_model": {"ground_truth": "5"}}] * 3
        assert (hub_id, split) == ("HuggingFaceH4/MATH-500", "test")
        return [{"problem": "Find x.", "answer": "7"}]

    monkeypatch.setattr(data, "_load_hub", fake_hub)
    cfg = TrainConfig(dataset=data.DAPO_MATH_HUB_ID, eval_dataset="math500", train_batch_size=1, ppo_mini_batch_size=1)
    train_set, held_out = load_data(
        cfg.data, cfg.embedded, eval_size=cfg.run.eval_size, batch_size=cfg.batch.train_batch_size
    )
    assert train_set == [{"prompt": "What is 2+3? " + PROMPT_SUFFIX, "answer": "5"}]
    assert held_out == [{"prompt": "Find x. " + PROMPT_SUFFIX, "answer": "7"}]


def test_trains_on_code_records_with_code_reward_and_refuses_math_reward_for_them(local_model_and_data, tmp_path):
    """The project's code format {"prompt", "tests"} goes through vespo.data and code_reward(completions, tests=...);
    with the default math reward it is refused before the model loads, naming the reward function."""
    tests = [{"input": "", "output": "7\n"}]
    rows = [{"prompt": f"print {i}", "tests": tests, "id": i} for i in range(4)]
    (tmp_path / "code.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _cfg(local_model_and_data, tmp_path / "run", dataset=str(tmp_path / "code.jsonl"), eval_dataset=None)
    cfg = cfg.replace(prompt_key="prompt", total_training_steps=1, eval_every=0)
    with pytest.raises(ConfigError, match="reward_fn vespo.rewards:math_reward .*vespo.rewards:code_reward"):
        train(cfg)
    assert not (tmp_path / "run").exists()
    last = train(cfg.replace(reward_fn="vespo.rewards:code_reward"))
    assert last["reward/mean"] == 0.0  # an untrained character model does not print 7; graded, not crashed
    assert read_metrics(tmp_path / "run")[-1]["step"] == 1


def test_reward_function_gets_trl_keyword_columns(monkeypatch):
    from vespo.rewards.batch import grade_batch as grade

    seen = {}

    def reward(completions, **columns):
        seen.update(columns)
        return [float(c == a) for c, a in zip(completions, columns["answer"], strict=True)]

    records = [{"prompt": "p", "answer": "1", "level": 3}, {"prompt": "q", "answer": "2", "level": 5}]
    assert grade(reward, ["1", "0", "0", "2"], records, n=2)[0].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert seen == {"answer": ["1", "1", "2", "2"], "level": [3, 3, 5, 5]}


def test_train_with_top_p_top_k_and_the_rollout_correction_catalogue(local_model_and_data, tmp_path):
    """`vespo train` at top_p 0.9 / top_k 5 with a veRL-style correction (sequence IS with IcePop bounds and a
    geometric-mean mask, thresholds given on the command line as veRL writes them): the first mini-batch is on-policy
    (log W == 0 exactly, with the truncation: the learner uses the sampled distribution) and the correction logs its
    masked shares and ESS."""
    argv = ["--top-p", "0.9", "--top-k", "5", "--hparams", "rollout_is", "sequence", "rollout_is_threshold", "0.5_2",
            "rollout_rs", "seq_mean_k1", "rollout_rs_threshold", "0.9_1.1"]  # fmt: skip
    cfg = parse_args(argv)
    assert (
        cfg.algorithm.hparams["rollout_is_threshold"] == "0.5_2"
    )  # not the number 0.52 the command-line parser would read
    run_dir = tmp_path / "run"
    cfg = _cfg(local_model_and_data, run_dir, total_training_steps=2, eval_every=0, top_p=0.9, top_k=5,
               hparams=cfg.algorithm.hparams, rollout_logit_noise=0.3)  # fmt: skip
    train(cfg)
    rows = [r for r in read_metrics(run_dir) if "is/log_w_max/first_mini_batch" in r]
    assert len(rows) == 2
    for r in rows:
        assert r["is/log_w_max/first_mini_batch"] == 0.0 and r["is/log_w_mean/first_mini_batch"] == 0.0
        assert 0 <= r["rollout_rs/masked_frac"] <= 1 and 0 < r["rollout_is/ess"] <= 1 and "rollout_is/masked_frac" in r

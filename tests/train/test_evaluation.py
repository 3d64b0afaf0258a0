"""Evaluation: exact pass@k / avg@k arithmetic on fixed outputs, report files, and one tiny end-to-end `vespo eval`."""

import json
import os
import re
from math import comb

import pytest
import torch

from vespo import evaluation
from vespo.evaluation import avg_at_k, mean_pass_at_k, pass_at_k, summarize

MODEL = torch.nn.Linear(1, 1)  # what the fake generation below is given: only its dtype and device are read


def _fake_generation(monkeypatch, texts_for, seen=None):
    """The evaluator's engine replaced: `texts_for(prompt, n)` gives a prompt's n completions."""

    class Engine:
        tokenizer = None

        def __init__(self, n):
            self.n = n

        def generate(self, prompts, generator):
            if seen is not None:
                seen.extend(prompts)
            return [t for p in prompts for t in texts_for(p, self.n)]

    monkeypatch.setattr("vespo.rollout.build_engine", lambda kind, settings, **kw: Engine(settings.n))
    monkeypatch.setattr("vespo.rollout.decode_responses", lambda tokenizer, texts: texts)


def test_pass_at_k_hand_values():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0  # fewer than k wrong samples: some k-subset always passes
    for n, c, k in [(10, 3, 5), (32, 7, 10), (16, 1, 16)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(3, 4, 1)


def test_avg_and_pass_on_fixed_scores():
    scores = [[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0]]
    assert avg_at_k(scores) == 0.5
    assert mean_pass_at_k(scores, 4) == pytest.approx(2 / 3)
    row = summarize("toy", "math", 4, scores, seconds=1.5)
    assert (row.num_problems, row.avg_at_k, row.pass_at_k) == (3, 50.0, pytest.approx(200 / 3))


def test_fixed_model_outputs_through_the_math_verifier(monkeypatch):
    records = [{"prompt": "p1", "answer": "2"}, {"prompt": "p2", "answer": "\\frac{1}{2}"}]
    outputs = {"p1": ["\\boxed{2}", "\\boxed{3}", "2", "none"], "p2": ["\\boxed{0.5}"] * 4}
    _fake_generation(monkeypatch, lambda p, n: outputs[p])
    metrics = evaluation.evaluate_records(MODEL, object(), records, n=4, name="toy")
    # p1: 2 of 4 correct ("2" alone is parsed by the plain-answer fallback), p2: 4 of 4
    assert metrics == {"eval/toy/avg@4": 0.75, "eval/toy/pass@4": 1.0}


def test_report_files(tmp_path):
    rows = [summarize("aime24", "math", 2, [[1, 0]]), summarize("mbpp+", "code", 2, [[0, 1], [0, 0]])]
    md, js = evaluation.write_report(rows, tmp_path, meta={"model": "m"})
    assert md.read_text().splitlines()[2:] == [
        "| aime24 | 1 | 2 | **50.00** | 100.00 | none |",
        "| mbpp+ | 2 | 2 | 25.00 | **50.00** | none |",
    ]  # no partial scores: no note under the table
    payload = json.loads(js.read_text())
    assert payload["meta"] == {"model": "m"} and payload["results"][1]["pass_at_k"] == 50.0


def test_partial_scores_are_counted_and_explained_under_the_table():
    """Issue 42: reasoning-gym's partial credit (scores in (0, 1)) makes avg@k no multiple of 100 / (problems x k);
    the row says how many samples had it and the note how avg@k (averages them) and pass@k (needs 1.0) treat them."""
    scores = [[1.0, 0.5], [0.25, 0.0]]  # 2 problems x k = 2; two partial samples
    row = summarize("reasoning-gym:basic_arithmetic", "task", 2, scores)
    assert (row.num_samples, row.partial_samples) == (4, 2)
    assert row.avg_at_k == pytest.approx(100 * (1.0 + 0.5 + 0.25 + 0.0) / 4)  # 43.75: the scores as they are
    assert row.pass_at_k == pytest.approx(50.0)  # pass@2: only problem 1 has a score of 1.0
    lines = evaluation.markdown_table([row, summarize("toy", "math", 2, [[1, 0]])]).splitlines()
    assert lines[2] == "| reasoning-gym:basic_arithmetic | 2 | 2 | **43.75** | 50.00 | 2 of 4 |"
    assert lines[3] == "| toy | 1 | 2 | **50.00** | 100.00 | none |"
    assert lines[5] == evaluation.PARTIAL_NOTE and "avg@k averages" in lines[5] and "only a score of 1" in lines[5]


def test_evaluation_shows_progress_and_the_time_left_on_stderr(monkeypatch, capsys):
    """Issue 42: an evaluation draws a bar on stderr after every chunk of prompts, with problems done and tqdm's
    estimate of the time left; `progress=False` prints nothing."""
    _fake_generation(monkeypatch, lambda p, n: ["\\boxed{1}"] * n)
    records = [{"prompt": f"p{i}", "answer": "1"} for i in range(4)]
    evaluation.evaluate_records(MODEL, object(), records, n=1, name="heldout", chunk=1)
    err = capsys.readouterr().err
    assert "eval heldout" in err and "problem" in err
    for done in range(1, 5):  # every chunk redrawn, each with a numeric time-left estimate (elapsed<remaining)
        assert re.search(rf"{done}/4 \[\d\d:\d\d<\d\d:\d\d", err), err
    evaluation.evaluate_records(MODEL, object(), records, n=1, name="heldout", chunk=1, progress=False)
    assert capsys.readouterr().err == ""


def test_vespo_eval_end_to_end_on_a_tiny_local_model(tmp_path, capsys):
    from vespo.embedded.task import build_tiny_model, build_tokenizer

    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    bench = tmp_path / "toy.jsonl"
    bench.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(3)))
    argv = ["--model", str(tmp_path / "model"), "--benchmarks", str(bench), "--k", "2", "--max-new-tokens", "6"]
    assert evaluation.cli([*argv, "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "results.json").read_text())["results"][0]
    assert (result["benchmark"], result["num_problems"], result["k"]) == ("toy", 3, 2)
    assert 0.0 <= result["avg_at_k"] <= result["pass_at_k"] <= 100.0
    assert "| toy | 3 | 2 |" in capsys.readouterr().out
    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert [(r["problem"], r["sample"]) for r in rows] == [(i, j) for i in range(3) for j in range(2)]
    assert [r["prompt"] for r in rows[::2]] == ["0+1=", "1+1=", "2+1="]
    assert all(isinstance(r["completion"], str) and r["score"] in (0.0, 1.0) for r in rows)
    assert 100.0 * sum(r["score"] for r in rows) / len(rows) == pytest.approx(result["avg_at_k"])  # the same scores


def test_one_prompt_format_plain_unless_chat_is_asked_for():
    from vespo.embedded.task import build_tokenizer

    tok = build_tokenizer()
    with pytest.raises(ValueError, match="no chat template"):
        evaluation.format_prompts(tok, ["1+2="], chat=True)
    tok.chat_template = (
        "{% for m in messages %}<u>{{ m['content'] }}</u>{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
    )
    assert evaluation.format_prompts(tok, ["1+2="], chat=False) == ["1+2="]  # a plain-trained model stays plain
    assert evaluation.format_prompts(tok, ["1+2="], chat=True) == ["<u>1+2=</u>A:"]


def _evaluate(cfg, records):
    """The trainer's held-out evaluation of `records` as `setup_run` calls it."""
    from vespo.train.setup import evaluate

    chat, chunk = cfg.data.apply_chat_template, cfg.batch.micro_batch_size
    return evaluate(MODEL, object(), records, cfg.run, cfg.sampling, chat=chat, chunk=chunk)


def test_trainer_held_out_evaluation_is_the_shared_evaluator(monkeypatch):
    """`vespo.train.setup.evaluate` goes through `evaluate_records` (same prompts, same verifier) and reports avg@1."""
    from vespo.train.config import TrainConfig

    seen = []
    _fake_generation(monkeypatch, lambda p, n: ["\\boxed{3}"] * n, seen)
    records = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "2+2=", "answer": "4"}]
    assert _evaluate(TrainConfig(eval_n=1), records) == {"eval/accuracy": 0.5}
    assert seen == ["1+2=", "2+2="]


def test_trainer_evaluation_has_a_progress_bar_unless_progress_is_off(monkeypatch, capsys):
    """Issue 42: the trainer's held-out evaluation (step 0 took minutes on a real model, silently) shows the same bar
    as `vespo eval`; `--no-progress` hides it with the training bar."""
    from vespo.train.config import TrainConfig

    _fake_generation(monkeypatch, lambda p, n: ["\\boxed{3}"] * n)
    records = [{"prompt": f"{i}+2=", "answer": "3"} for i in range(3)]
    _evaluate(TrainConfig(micro_batch_size=1), records)
    err = capsys.readouterr().err
    assert "eval heldout" in err and re.search(r"3/3 \[\d\d:\d\d<\d\d:\d\d", err), err
    _evaluate(TrainConfig(micro_batch_size=1, progress=False), records)
    assert capsys.readouterr().err == ""


def test_eval_samples_what_the_trainers_engine_samples(tmp_path):
    """Issue 55: `vespo eval`'s generation is the training loop's: the engine `train_sync` builds from its config (the
    policy itself, KV-cached `vespo.rollout.sample`) given the same prompts and seed returns exactly the completions
    the evaluator returns (one generation path), and the evaluator's engine is that engine, shared with the model."""
    import vespo.rollout
    from vespo.embedded.task import build_tiny_model, build_tokenizer
    from vespo.rollout import build_engine, decode_responses
    from vespo.train.config import TrainConfig

    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, seed=2)
    records = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(3)]
    cfg = TrainConfig(rollout_n=2, max_response_length=6, temperature=1.0, top_k=5)
    engines = []
    real = vespo.rollout.build_engine

    def recorded(*args, **kw):
        engines.append(real(*args, **kw))
        return engines[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vespo.rollout, "build_engine", recorded)
        texts = evaluation.sample_completions(
            model, tokenizer, records, n=2, seed=7, progress=False, max_new_tokens=6, temperature=1.0, top_k=5
        )
    (engine,) = engines
    assert type(engine).__name__ == "HFEngine" and engine.shared and engine.model is model  # no copy, no 2nd path
    trainer = build_engine(cfg.async_.sampler_engine, cfg.sampling, model=model, tokenizer=tokenizer)
    rollout = trainer.generate([r["prompt"] for r in records], torch.Generator().manual_seed(7))  # chunk 0: seed + 0
    flat = decode_responses(tokenizer, rollout)
    assert texts == [flat[0:2], flat[2:4], flat[4:6]]
    assert len({t for group in texts for t in group}) > 1  # sampled, not a constant output


def test_eval_generates_with_the_trainers_thread_count_and_restores_the_callers(tmp_path, capsys, monkeypatch):
    """Issue 55: torch's default (every core) made `vespo eval` ~10x slower per sample than training on a loaded box;
    it now takes `vespo train`'s count for its model (`threads_for`), says so once, honours --num-threads, and gives
    the caller's count back."""
    import vespo.machine as machine
    from vespo.embedded.task import build_tiny_model, build_tokenizer

    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    bench = tmp_path / "toy.jsonl"
    bench.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    seen = []
    _fake_generation(monkeypatch, lambda p, n: seen.append(torch.get_num_threads()) or ["\\boxed{2}"] * n)
    chosen = []
    chose = lambda model, processes=1: chosen.append(model) or (3, "3 torch threads")  # noqa: E731
    monkeypatch.setattr(machine, "threads_for", chose)
    argv = ["--model", str(tmp_path / "model"), "--benchmarks", str(bench), "--k", "1", "--max-new-tokens", "2"]
    before = torch.get_num_threads()
    assert evaluation.cli([*argv, "--out", str(tmp_path / "a")]) == 0
    assert chosen == [str(tmp_path / "model")] and seen == [3] and torch.get_num_threads() == before
    assert "vespo eval: 3 torch threads; --num-threads N to change" in capsys.readouterr().err
    assert evaluation.cli([*argv, "--num-threads", "2", "--out", str(tmp_path / "b")]) == 0
    assert chosen == [str(tmp_path / "model")] and seen == [3, 2] and torch.get_num_threads() == before
    assert "--num-threads N to change" not in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evaluation.cli([*argv, "--num-threads", "0", "--out", str(tmp_path / "c")])
    assert "--num-threads: must be an integer >= 1, got 0" in capsys.readouterr().err and not (tmp_path / "c").exists()


def test_trainer_and_eval_choose_threads_by_one_rule(tmp_path, monkeypatch):
    """`vespo train`'s default (`default_num_threads`) is `threads_for` its model, with its async samplers sharing the
    free cores; `vespo eval` is one process of the same rule."""

    import vespo.machine as machine
    import vespo.train.host as host
    from vespo.train.config import TrainConfig

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 1000)
    monkeypatch.setattr(machine, "usable_cores", lambda: 16)
    monkeypatch.setattr(os, "getloadavg", lambda: (4.0, 4.0, 4.0))
    monkeypatch.setattr(machine, "policy_bytes", lambda *a: 8 << 30)  # every free core: 12 of 16
    cfg = TrainConfig(model=str(model))
    assert host.default_num_threads(cfg) == machine.threads_for(str(model)) and machine.threads_for(str(model))[0] == 12
    async_cfg = cfg.replace(mode="async", num_samplers=2)
    assert host.default_num_threads(async_cfg)[0] == machine.threads_for(str(model), 3)[0] == 4

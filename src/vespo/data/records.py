"""The one record type: ``{"prompt": str, "answer": str}`` (math) or ``{"prompt": str, "tests": list[dict]}`` (code,
test cases in the formats `parse_tests` reads; `vespo.rewards.code_grader` runs them); other columns are kept and
reach the reward function as keyword lists. Checking and local JSON/JSONL loading live here; named sets and
benchmarks in `vespo.data.benchmarks`.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Callable
from pathlib import Path

from vespo.data.limits import check_data_size, check_prompt_size, short_repr

Record = dict
"""A record is a plain dict (see the module docstring), so it travels to TRL, datasets and sampler processes as is."""


def record_kind(record: dict) -> str:
    """``"math"``, ``"code"`` or ``"task"`` (a reasoning-gym item, graded by its task's verifier): the one place the
    kind of a record is decided (by its keys)."""
    return "code" if "tests" in record else "task" if "rg_item" in record else "math"


def check_record(row: object, where: str, *, prompt_key: str = "prompt", answer_key: str = "answer") -> dict:
    """One row as a gradable record ``{"prompt", "answer"}`` or ``{"prompt", "tests"}`` (other columns kept), or a
    ValueError starting with ``where``. Numbers are answers ("6"); null, lists, booleans and empty strings are not."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object with '{prompt_key}' and '{answer_key}' or 'tests'")
    bad = _lone_surrogate(row)
    if bad is not None:
        field, char = bad
        raise ValueError(
            f"{where}: {field} holds a lone surrogate {char!r} (an unpaired \\u escape), which is not text: no "
            "tokenizer or UTF-8 log can hold it; fix or drop the row"
        )
    row = _from_verl_layout(row, where, prompt_key=prompt_key, answer_key=answer_key)
    prompt = row.get(prompt_key)
    if not isinstance(prompt, str) or not prompt.strip():
        hint = f" (no '{prompt_key}' field; the record's fields are {_fields(row)}: set --prompt-key)"
        raise ValueError(
            f"{where}: '{prompt_key}' must be a non-empty string, got {short_repr(prompt)}"
            + hint * (prompt_key not in row)
        )
    check_prompt_size(prompt, f"{where}: '{prompt_key}'")
    has_answer, has_tests = answer_key in row, "tests" in row
    if has_answer == has_tests:
        raise ValueError(
            f"{where}: need exactly one of '{answer_key}' (math) or 'tests' (code); the record's fields are "
            f"{_fields(row)} (set --answer-key)"
        )
    record = {k: v for k, v in row.items() if k not in (prompt_key, answer_key)} | {"prompt": prompt}
    if has_answer:
        answer = row[answer_key]
        number = isinstance(answer, (int, float)) and not isinstance(answer, bool) and math.isfinite(answer)
        if not (number or (isinstance(answer, str) and answer.strip())):
            raise ValueError(f"{where}: '{answer_key}' must be a non-empty string or a number, got {answer!r}")
        record["answer"] = str(answer)
        if "rg_item" in row:  # a reasoning-gym item: its address must be one the grader can rebuild
            from vespo.data.reasoning_gym import check_task_item

            try:
                check_task_item(row["rg_item"])
            except ValueError as exc:
                raise ValueError(f"{where}: 'rg_item' {exc}") from None
    elif not isinstance(row["tests"], list) or not row["tests"] or not all(isinstance(t, dict) for t in row["tests"]):
        raise ValueError(f"{where}: 'tests' must be a non-empty list of test objects (see docs/guides/rewards.md)")
    else:
        try:  # the grader's own parser: a record it accepts can be graded
            parse_tests(row["tests"])
        except (ValueError, TypeError, RecursionError) as exc:
            raise ValueError(f"{where}: 'tests' cannot be graded: {' '.join(str(exc).split())[:200]}") from None
    return record


_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(row: dict) -> tuple[str, str] | None:
    """(the field, e.g. 'tests'[0]['input'], and the character) of the first string in `row`, keys included, holding
    a surrogate code point: JSON's "\\ud800" decodes to one, and it fails only later, where the text is encoded
    (tokenizing, logging), at the same step of every resume. None when every string is text."""
    try:  # the common case at C speed: the whole row encodes (a row of the 1M a data set may hold, in ~5 us)
        json.dumps(row, ensure_ascii=False, skipkeys=True, default=repr).encode()
        return None
    except UnicodeEncodeError:
        pass  # a surrogate somewhere: found below, with the field it is in
    except (TypeError, ValueError, RecursionError):
        pass  # not plain JSON values: walked below
    stack = [(repr(k), k, v) for k, v in reversed(row.items())]
    while stack:
        field, key, value = stack.pop()
        for text, where in ((key, f"{field} (its name)"), (value, field)):
            found = _SURROGATE.search(text) if isinstance(text, str) and not text.isascii() else None
            if found:
                return where, found[0]
        if isinstance(value, dict):
            stack += [(f"{field}[{k!r}]", k, v) for k, v in reversed(value.items())]
        elif isinstance(value, (list, tuple)):
            stack += [(f"{field}[{i}]", None, v) for i, v in reversed(list(enumerate(value)))]
    return None


def _fields(row: dict) -> list:
    names = [str(k) for k in row]
    return names if len(names) <= 12 else [*names[:12], "..."]


def _from_verl_layout(row: dict, where: str, *, prompt_key: str, answer_key: str) -> dict:
    """veRL's data layout (its parquet files: `prompt` a list of chat messages, the answer in
    `reward_model.ground_truth`) as vespo's: the user message's text is the prompt (`--apply-chat-template` wraps it
    in the model's template, as veRL does), the ground truth the answer. Other rows are returned as they are."""
    prompt = row.get(prompt_key)
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "content" in m for m in prompt):
        roles = [m.get("role") for m in prompt]
        if roles != ["user"]:
            raise ValueError(
                f"{where}: '{prompt_key}' is a chat of {len(prompt)} messages ({', '.join(map(str, roles))}); vespo "
                "trains on one user turn: keep only the user message (the chat template is applied with "
                "--apply-chat-template)"
            )
        row = row | {prompt_key: prompt[0]["content"]}
    reward_model = row.get("reward_model")
    if answer_key not in row and "tests" not in row and isinstance(reward_model, dict):
        if "ground_truth" in reward_model:
            row = row | {answer_key: reward_model["ground_truth"]}
    return row


def check_records(
    rows, source: str, *, where: Callable[[int], str] | None = None, skip_bad: bool = False, **keys: str
) -> list[dict]:
    """`check_record` over rows; with ``skip_bad`` bad rows are dropped and counted in a warning instead."""
    where = where or (lambda i: f"{source} row {i}")
    records, bad = [], []
    for i, row in enumerate(rows):
        try:
            records.append(check_record(row, where(i), **keys))
        except ValueError as exc:
            if not skip_bad:
                raise
            bad.append(str(exc))
    if bad:
        warnings.warn(f"{source}: skipped {len(bad)} row(s) that cannot be graded; first: {bad[0]}", stacklevel=2)
    if not records:
        raise ValueError(f"{source}: no records" + (f" ({len(bad)} bad rows skipped)" if bad else ""))
    if len({record_kind(r) for r in records}) != 1:
        raise ValueError(f"{source}: mixes math ('answer') and code ('tests') records")
    return records


def load_parquet(path: str | Path, *, skip_bad: bool = False, **keys: str) -> list[dict]:
    """Local records from a Parquet file (veRL's data format: `prompt` as a chat message list or a string, the answer
    in `answer` or `reward_model.ground_truth`; `check_record`), read with pyarrow (a dependency of `datasets`).
    Errors name the file and row."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata  # the footer alone
    except (OSError, ValueError) as exc:  # ArrowInvalid is a ValueError
        raise ValueError(f"{path}: cannot read as Parquet ({' '.join(str(exc).split())[:200]})") from None
    encoded = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
    check_data_size(str(path), rows=meta.num_rows, size=encoded, what=" uncompressed")
    strings = [c.path for c in meta.schema if c.physical_type == "BYTE_ARRAY"]
    try:  # strings as dictionaries: what they decode to is counted before any of them is decoded
        table = pq.ParquetFile(path, read_dictionary=strings).read()
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read as Parquet ({' '.join(str(exc).split())[:200]})") from None
    check_data_size(str(path), size=sum(_decoded_bytes(c) for c in table.columns), what=" once decoded")
    rows = table.to_pylist()
    return check_records(rows, str(path), where=lambda i: f"{path} row {i}", skip_bad=skip_bad, **keys)


def _decoded_bytes(array) -> int:
    """Bytes an Arrow array's values take once decoded: strings and binaries by length (a dictionary entry at each
    use), lists and structs through their children, fixed-width values by their buffers."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(array, pa.ChunkedArray):
        return sum(_decoded_bytes(chunk) for chunk in array.chunks)
    kind = array.type
    if pa.types.is_dictionary(kind):
        if not _is_text(kind.value_type):
            return _decoded_bytes(array.dictionary_decode())
        return pc.sum(pc.take(pc.binary_length(array.dictionary), array.indices)).as_py() or 0
    if _is_text(kind):
        return pc.sum(pc.binary_length(array)).as_py() or 0
    if pa.types.is_struct(kind):
        return sum(_decoded_bytes(field) for field in array.flatten())
    if pa.types.is_map(kind):
        return _decoded_bytes(array.keys) + _decoded_bytes(array.items)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _decoded_bytes(array.flatten())
    return array.nbytes


def _is_text(kind) -> bool:
    import pyarrow as pa

    return any(t(kind) for t in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                                 pa.types.is_large_binary))  # fmt: skip


MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects a data file may have: a record is a few levels deep (code tests with nested
call arguments a few more), and Python's parser raises RecursionError near 1000."""
_STRING_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def check_json_depth(text: str, source: str, first_line: int = 1) -> None:
    """Refuse JSON text nested deeper than `MAX_JSON_DEPTH` before parsing it (the parser would recurse into it): a
    ValueError naming ``source:line``, the line where that depth is reached (`text` starts at `first_line`). Linear
    time; a bracket count skips the scan for the usual shallow text."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return
    depth = 0
    for match in _STRING_OR_BRACKET.finditer(text):
        bracket = match[0]
        if bracket in ("[", "{"):
            depth += 1
            if depth > MAX_JSON_DEPTH:
                line = first_line + text.count("\n", 0, match.start())
                raise ValueError(f"{source}:{line}: nested more than {MAX_JSON_DEPTH} levels deep; not a record")
        elif bracket in ("]", "}"):
            depth -= 1


def load_jsonl(path: str | Path, *, skip_bad: bool = False, **keys: str) -> list[dict]:
    """Local records, one JSON object a line (or one JSON array in a ``.json`` file): ``{"prompt", "answer"}``
    (math) or ``{"prompt", "tests"}`` (code); `prompt_key` / `answer_key` rename other columns, the rest are kept.

    Prompts are used verbatim (add `math_prompt`'s instruction yourself if you want it). Errors name the file and
    line; with ``skip_bad`` rows that cannot be graded are skipped and counted instead.
    """
    try:
        check_data_size(str(path), size=Path(path).stat().st_size)
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read ({exc})") from None
    if Path(path).suffix == ".json" and text.lstrip().startswith("["):  # one array of records
        check_json_depth(text, str(path))
        try:
            rows = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        check_data_size(str(path), rows=len(rows))
        return check_records(rows, str(path), where=lambda i: f"{path} record {i}", skip_bad=skip_bad, **keys)
    rows, lines, text_lines = [], [], text.splitlines()
    check_data_size(str(path), rows=sum(1 for line in text_lines if line.strip()))
    for lineno, line in enumerate(text_lines, 1):
        if not line.strip():
            continue
        check_json_depth(line, str(path), lineno)
        try:
            rows.append(json.loads(line))
        except ValueError as exc:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({exc})") from None
        lines.append(lineno)
    return check_records(rows, str(path), where=lambda i: f"{path}:{lines[i]}", skip_bad=skip_bad, **keys)


def parse_tests(tests) -> tuple[str, list, list, str | None]:
    """Normalise a problem's tests to ``(mode, sandbox_cases, expected_outputs, fn_name)``."""
    if isinstance(tests, str):
        tests = json.loads(tests)
    if isinstance(tests, dict):
        tests = [tests]
    if not isinstance(tests, list) or not tests or not all(isinstance(t, dict) for t in tests):
        raise ValueError("tests must be a non-empty list of test-case dicts (see docs/guides/rewards.md)")
    if all("assert" in t for t in tests):
        cases = [{"test": t["assert"], "setup": t.get("setup"), "entry_point": t.get("entry_point")} for t in tests]
        if not all(isinstance(c["test"], str) and isinstance(c["setup"] or "", str) for c in cases) or not all(
            c["entry_point"] is None or str(c["entry_point"]).isidentifier() for c in cases
        ):
            raise ValueError(
                "assertion tests need a string 'assert', optional string 'setup' and identifier 'entry_point'"
            )
        return "assert", cases, ["passed"] * len(tests), None
    if all("fn_name" in t and "input" in t and "output" in t for t in tests):
        if not all(isinstance(t["fn_name"], str) and t["fn_name"].isidentifier() for t in tests):
            raise ValueError("function-call tests need an identifier 'fn_name'")
        names = {t["fn_name"] for t in tests}
        if len(names) != 1:
            raise ValueError(f"function-call tests of one problem must share fn_name, got {sorted(names)}")
        args = [_call_args(t["input"]) for t in tests]
        return "call", args, [_json_value(t["output"]) for t in tests], names.pop()
    if all("input" in t and "output" in t for t in tests):
        return "stdio", [str(t["input"]) for t in tests], [str(t["output"]) for t in tests], None
    raise ValueError("a problem's tests must all be stdio {input, output}, call {fn_name, input, output} or {assert}")


def _call_args(value) -> list:
    """Argument list from a list, or from LiveCodeBench's newline-separated JSON values."""
    if isinstance(value, list):
        return value
    return [json.loads(line) for line in str(value).splitlines() if line.strip()]


def _json_value(value):
    return json.loads(value) if isinstance(value, str) else value

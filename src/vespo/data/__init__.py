"""Data: one record type (`records`), one prompt format (`prompts`), and the paper's datasets and benchmarks by name
(`benchmarks`, with `load_records`). Loaded on first use (PEP 562), so `vespo.data.reasoning_gym`'s spec checks run
without the graders' imports (sympy, torch)."""

import importlib

_LAZY = {
    **{name: "vespo.data.benchmarks" for name in ("BENCHMARKS", "Benchmark", "load_records", "resolve_benchmark")},
    **{name: "vespo.data.prompts" for name in ("CODE_INSTRUCTION", "format_prompts", "math_prompt")},
    **{name: "vespo.data.records" for name in ("Record", "check_record", "check_records", "load_jsonl", "record_kind")},
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'vespo.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

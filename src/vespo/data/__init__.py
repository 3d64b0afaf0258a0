"""Data: one record type (`records`), one prompt format (`prompts`), and the paper's datasets and benchmarks by name
(`benchmarks`, with `load_records`). Standard library only: importing it loads no grader, model or dataset library
(`datasets` and reasoning-gym are imported when a source needs them)."""

from vespo.data.benchmarks import BENCHMARKS, Benchmark, load_records, resolve_benchmark
from vespo.data.prompts import CODE_INSTRUCTION, format_prompts, math_prompt
from vespo.data.records import Record, check_record, check_records, load_jsonl, record_kind

__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "CODE_INSTRUCTION",
    "Record",
    "check_record",
    "check_records",
    "format_prompts",
    "load_jsonl",
    "load_records",
    "math_prompt",
    "record_kind",
    "resolve_benchmark",
]

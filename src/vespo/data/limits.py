"""Input limits of data sets (docs/guides/trainer.md, "Input limits"): a data source beyond one is refused in one line
naming it, before its rows are built. Shared by the record loader (`records`) and reasoning-gym's specs."""

from __future__ import annotations

MAX_RECORDS = 1_000_000
"""Most rows a data set may have: each record costs ~0.3 KB of Python objects beyond its text (311 B measured for a
million {"prompt", "answer"} dicts), held by the learner and again by every sampler process. The RL sets in use have
~250K distinct prompts or fewer (veRL's dapo-math-17k.parquet holds its 17K prompts 100 times over:
`--dataset BytedTsinghua-SIA/DAPO-Math-17k` loads them once)."""
MAX_DATA_BYTES = 256 << 20
"""Most text (and other values) a data file may hold once loaded: a JSON/JSONL file's size, a Parquet file's values
decoded (dictionary-encoded strings counted at every use, computed from the dictionaries before any row is built).
The records live in the learner and in every sampler process; a 113 KB dictionary-encoded Parquet file of 200,000
rows decodes into 953 MiB (tests/train/test_input_bombs.py)."""
MAX_PROMPT_CHARS = 1 << 18
"""Longest prompt, in characters: ~64K tokens at ~4 characters a token, twice the 32K-token context of the paper's
Qwen3 models; a longer prompt cannot be trained on, and a record's prompt is tokenised and padded in every batch."""


def check_prompt_size(prompt: str, what: str) -> None:
    """At most `MAX_PROMPT_CHARS` characters in `prompt` (`what` names it in the one-line ValueError)."""
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(
            f"{what} has {len(prompt)} characters; prompts are limited to {MAX_PROMPT_CHARS} (~64K tokens, beyond the "
            "context of the models vespo trains)"
        )


def check_data_size(source: str, *, rows: int | None = None, size: int | None = None, what: str = "") -> None:
    """`rows` within `MAX_RECORDS` and `size` bytes within `MAX_DATA_BYTES` (`what` says how the size was counted); a
    one-line ValueError naming `source` otherwise. Called before the rows are built."""
    if rows is not None and rows > MAX_RECORDS:
        raise ValueError(
            f"{source} has {rows} rows; vespo loads at most {MAX_RECORDS} records (each is held by the learner and by "
            "every sampler): deduplicate or split it"
        )
    if size is not None and size > MAX_DATA_BYTES:
        raise ValueError(
            f"{source} holds {size / 2**20:.0f} MiB{what}; vespo loads at most {MAX_DATA_BYTES >> 20} MiB of data "
            "(held by the learner and by every sampler): deduplicate or split it"
        )


def short_repr(value: object, limit: int = 60) -> str:
    """`repr(value)` cut to `limit` characters: a value quoted in a one-line error."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

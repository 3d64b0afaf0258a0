"""reasoning-gym's procedural tasks as vespo records: ``reasoning-gym:<task>[:key=value...][,<task>...]``.

The options are the task's own config fields plus vespo's ``size`` (items in the training split, default
`TRAIN_SIZE`), ``seed`` (the split's first seed, default 0) and ``format`` (how the answer is asked for, `FORMATS`).

Each task generator (`reasoning_gym.create_dataset`) makes item ``i`` from ``Random(seed + i)``, so a split is a
range of seeds: training uses ``seed .. seed + size - 1``, the held-out split starts `HELD_OUT_OFFSET` later (and
drops any question the training split of the same spec also holds). A record keeps the item's address
(``rg_item``) so the reward can rebuild the entry and grade with the task's own verifier
(`vespo.rewards.reasoning_gym`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import math
import threading

from vespo.data.limits import MAX_RECORDS, check_prompt_size, short_repr
from vespo.deadline import DeadlineExceeded, deadline

PREFIX = "reasoning-gym:"
TRAIN_SIZE = 1000
"""Items per task in the training split unless the spec sets ``size``."""
EVAL_SIZE = 200
"""Items per task in the held-out split (`vespo eval`, and the trainer's held-out set, which keeps `eval_size`)."""
HELD_OUT_OFFSET = 100_000_000
"""Seed distance of the held-out split from the training split: larger than any training size, so the seed ranges of
the two splits never overlap."""
INSTALL = "pip install reasoning-gym"
FORMATS = ("boxed", "tags", "direct")
"""How the prompt asks for the answer (the ``format`` option; the reward reads the answer the same way, see
`vespo.rewards.reasoning_gym.task_answer`): ``boxed`` the paper's step-by-step / ``\\boxed{}`` instruction,
``tags`` reasoning-gym's ``<answer>...</answer>``, ``direct`` the answer alone (small models that cannot yet reason
in a format; the first line is read, from after its last "=")."""
TAGS_INSTRUCTION = "Think step by step, then give only the final answer in the format <answer>answer here</answer>."
DIRECT_INSTRUCTION = "Reply with the final answer only."
VESPO_KEYS = ("size", "seed", "format")

# Input limits of generator options (docs/guides/trainer.md, "Input limits"), checked before a generator is built.
OPTION_SCALE = 10
"""A numeric option of a task may be at most this many times the task's own default for it, in absolute value (or
`OPTION_SCALE` x 10 where the default is smaller or not a number): a task's sizes (terms, digits, rows, words) drive
its prompts' length and its generation time, and its defaults are the scale it is built for."""
SIZE_OPTIONS: dict[str, tuple[int, str]] = {
    "min_terms": (100, "each term adds a number and an operator to the question (1e6 terms made 4 MB prompts)"),
    "max_terms": (100, "each term adds a number and an operator to the question (1e6 terms made 4 MB prompts)"),
    "basic_arithmetic.min_digits": (6, "its division tries every divisor below 10^digits: 7 ms an item at 6 digits, "
                                    "0.16 s at 7, ten times more per digit"),
    "basic_arithmetic.max_digits": (6, "its division tries every divisor below 10^digits: 7 ms an item at 6 digits, "
                                    "0.16 s at 7, ten times more per digit"),
}  # fmt: skip
"""Size-driving options with their own bound and reason, by name (any task) or ``task.name``: tighter than
`OPTION_SCALE` where a task's cost grows faster than its option."""
ITEM_SECONDS = 10.0
"""Longest one item of a spec may take to generate when the spec is read (items take milliseconds; a split of 1000
such items would take hours). Enforced in the main thread, where SIGALRM can interrupt the generator."""


def is_reasoning_gym(source: str | None) -> bool:
    return isinstance(source, str) and source.startswith(PREFIX)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task of a spec: its generator name, size, first seed, and the generator's own config fields."""

    name: str
    size: int = TRAIN_SIZE
    seed: int = 0
    config: tuple[tuple[str, object], ...] = ()
    format: str = "boxed"

    def build(self, *, held_out: bool = False, size: int | None = None):
        """The task's generator for the training split, or for the held-out one (seeds `HELD_OUT_OFFSET` later)."""
        seed = self.seed + (HELD_OUT_OFFSET if held_out else 0)
        return task_dataset(self.name, size or self.size, seed, json.dumps(dict(self.config), sort_keys=True))


KNOWN_TASKS_VERSION = "0.1.25"
KNOWN_TASKS = """
ab acre advanced_geometry aiw arc_1d arc_agi base_conversion basic_arithmetic bf binary_alternation
binary_matrix bitwise_arithmetic boxnet caesar_cipher calendar_arithmetic chain_sum circuit_logic codeio
coin_flip color_cube_rotation complex_arithmetic composite count_bits count_primes countdown course_schedule
cryptarithm decimal_arithmetic decimal_chain_sum dice emoji_mystery family_relationships figlet_font
fraction_simplification futoshiki game_of_life game_of_life_halting gcd graph_color group_anagrams gsm_symbolic
intermediate_integration isomorphic_strings jugs kakurasu knight_swap knights_knaves largest_island lcm
leg_counting letter_counting letter_jumble list_functions mahjong_puzzle manipulate_matrix maze mini_sudoku
modulo_grid n_queens needle_haystack number_filtering number_format number_sequence number_sorting
palindrome_generation palindrome_partitioning path_star polynomial_equations polynomial_multiplication
pool_matrix power_function prime_factorization products propositional_logic puzzle24 quantum_lock ransom_note
rearc rectangle_count rotate_matrix rotten_oranges rubiks_cube rush_hour self_reference sentence_reordering
shortest_path simple_equations simple_geometry simple_integration sokoban spell_backward spiral_matrix
string_insertion string_manipulation string_splitting string_synthesis sudoku survo syllogism time_intervals
tower_of_hanoi tsumego word_ladder word_sequence_reversal word_sorting zebra_puzzles
""".split()
"""reasoning-gym's task registry (`reasoning_gym.factory.DATASETS`) as of `KNOWN_TASKS_VERSION` (tests/e2e/test_cli.py
holds them equal): a task name is checked without importing reasoning-gym (1.4 s) when that version is installed."""


def task_names() -> list[str]:
    """The installed reasoning-gym's tasks: `KNOWN_TASKS` for the version they were read from, else its registry."""
    import importlib.metadata

    if importlib.metadata.version("reasoning-gym") == KNOWN_TASKS_VERSION:
        return list(KNOWN_TASKS)
    import reasoning_gym

    return sorted(reasoning_gym.factory.DATASETS)


def _scalar(text: str) -> object:
    """A config value as YAML reads a scalar (int, float, bool, null) or else the string itself."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (int, float, bool, str)) or value is None else text


def option_bound(name: str, key: str) -> tuple[float, str]:
    """The largest magnitude task `name` accepts for its numeric option `key`, and why (`SIZE_OPTIONS`, else
    `OPTION_SCALE` times the task's default)."""
    if f"{name}.{key}" in SIZE_OPTIONS or key in SIZE_OPTIONS:
        return SIZE_OPTIONS.get(f"{name}.{key}") or SIZE_OPTIONS[key]
    import reasoning_gym

    field = {f.name: f for f in dataclasses.fields(reasoning_gym.factory.DATASETS[name][1])}[key]
    default = field.default
    scale = abs(default) if isinstance(default, (int, float)) and not isinstance(default, bool) else 0
    return OPTION_SCALE * max(scale, 10), f"{OPTION_SCALE}x the larger of 10 and the task's default, {default!r}"


def check_options(name: str, options: dict[str, object]) -> None:
    """Every numeric option of task `name` finite and within `option_bound`: a one-line ValueError otherwise, before
    the generator is built."""
    for key, value in options.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        bound, why = option_bound(name, key)
        if not (math.isfinite(value) and abs(value) <= bound):
            raise ValueError(
                f"{name} option {key}={value!r} is out of range: at most {bound:g} in absolute value ({why})"
            )


def parse_spec(source: str) -> list[TaskSpec]:
    """``reasoning-gym:chain_sum:max_terms=3,basic_arithmetic`` as task specs, each checked against the installed
    generators and their config fields (``size`` and ``seed`` are vespo's) and the input limits (`check_options`,
    `MAX_RECORDS` items in all, one item within `ITEM_SECONDS` and with a prompt within `MAX_PROMPT_CHARS`); a
    one-line ValueError otherwise."""
    import importlib.util

    if importlib.util.find_spec("reasoning_gym") is None:
        raise ValueError(f"{source}: reasoning-gym is not installed ({INSTALL})")
    body, known = source[len(PREFIX) :], task_names()
    if not body.strip():
        raise ValueError(f"{source}: name at least one task, e.g. {PREFIX}chain_sum (tasks: {', '.join(known)})")
    parts = [part.strip().split(":") for part in body.split(",")]
    unknown = [name for name, *_ in parts if name not in known]  # answered before the 1.4 s import of reasoning-gym
    if unknown:
        raise ValueError(f"{source}: unknown reasoning-gym task {unknown[0]!r}; tasks: {', '.join(known)}")
    import reasoning_gym

    specs = []
    for name, *pairs in parts:
        fields = {f.name for f in dataclasses.fields(reasoning_gym.factory.DATASETS[name][1])} - set(VESPO_KEYS)
        options: dict[str, object] = {}
        for pair in pairs:
            key, eq, text = pair.partition("=")
            if not eq or key not in fields | set(VESPO_KEYS):
                raise ValueError(
                    f"{source}: {name} takes key=value options from {sorted(fields | set(VESPO_KEYS))}, got {pair!r}"
                )
            options[key] = _scalar(text)
        size, seed = options.pop("size", TRAIN_SIZE), options.pop("seed", 0)
        form = options.pop("format", "boxed")
        if form not in FORMATS:
            raise ValueError(f"{source}: {name} format must be one of {list(FORMATS)}, got {form!r}")
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_RECORDS:
            raise ValueError(
                f"{source}: {name} size must be an integer in [1, {MAX_RECORDS}] (the records a data set may have), "
                f"got {size!r}"
            )
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
            raise ValueError(f"{source}: {name} seed must be an integer in [0, 2**31), got {seed!r}")
        try:
            check_options(name, options)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None
        spec = TaskSpec(name, size, seed, tuple(sorted(options.items())), form)
        _check_one_item(spec, source)
        specs.append(spec)
    total = sum(spec.size for spec in specs)
    if total > MAX_RECORDS:
        raise ValueError(
            f"{source}: {total} items in all; a data set has at most {MAX_RECORDS} records: set smaller sizes"
        )
    return specs


def _check_one_item(spec: TaskSpec, source: str) -> None:
    """Build `spec`'s generator and its first item: the generator's own checks of its config, `ITEM_SECONDS` and the
    item's prompt size; a one-line ValueError naming `source` otherwise."""
    timed = (
        deadline(ITEM_SECONDS) if threading.current_thread() is threading.main_thread() else contextlib.nullcontext()
    )
    try:
        with timed:
            entry = spec.build(size=1)[0]
    except DeadlineExceeded:
        raise ValueError(
            f"{source}: one item of {spec.name} took over {ITEM_SECONDS:g} s to generate (items take milliseconds): "
            "choose smaller options"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any failure of a third-party generator is a bad config
        raise ValueError(f"{source}: {spec.name} rejects its config {dict(spec.config)}: {exc}") from None
    try:
        check_prompt_size(task_prompt(str(entry["question"]), spec.format), f"{spec.name}'s first prompt")
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def task_prompt(question: str, form: str) -> str:
    """The prompt of a task item in one of `FORMATS`."""
    if form == "boxed":
        from vespo.data.prompts import math_prompt

        return math_prompt(question)
    return f"{question.strip()} {TAGS_INSTRUCTION if form == 'tags' else DIRECT_INSTRUCTION}"


def _record(ds, spec: TaskSpec, index: int, entry: dict) -> dict:
    address = [spec.name, dict(spec.config), ds.seed, len(ds), index, spec.format]
    prompt = task_prompt(entry["question"], spec.format)
    check_prompt_size(prompt, f"{spec.name} item {index}'s prompt")
    return {
        "prompt": prompt,
        "answer": str(entry["answer"]),
        "rg_item": json.dumps(address, sort_keys=True),
    }


def load_reasoning_gym(source: str, *, held_out: bool = False, size: int | None = None) -> list[dict]:
    """Records of every task in `source`: the training split (task after task), or the held-out one (``size`` items
    per task, default `EVAL_SIZE`, distinct questions none of which is in the training split of the same spec;
    tasks interleaved)."""
    if not held_out:
        return [
            _record(ds, spec, i, ds[i]) for spec in parse_spec(source) for ds in [spec.build()] for i in range(len(ds))
        ]
    per_task = []
    for spec in parse_spec(source):
        seen = {item["question"] for item in spec.build()}
        want = size or EVAL_SIZE
        ds = spec.build(held_out=True, size=want * 2)
        entries = ((i, ds[i]) for i in range(len(ds)))
        kept = []
        for i, entry in entries:  # each held-out question once, none from the training split
            if entry["question"] not in seen and len(kept) < want:
                seen.add(entry["question"])
                kept.append(_record(ds, spec, i, entry))
        if not kept:
            raise ValueError(
                f"{source}: every held-out question of {spec.name} is also in its training split of {spec.size} items "
                "(the task has few distinct questions): set a smaller size, or a config with more"
            )
        per_task.append(kept)
    # round-robin over the tasks, so the first eval_size records cover every task
    return [r for row in itertools.zip_longest(*per_task) for r in row if r is not None]


@functools.lru_cache(maxsize=64)
def task_dataset(name: str, size: int, seed: int, config_json: str):
    """reasoning-gym's generator `name` for seeds ``seed .. seed + size - 1`` with its config (cached: generators are
    rebuilt only once per process)."""
    import reasoning_gym

    return reasoning_gym.create_dataset(name, size=size, seed=seed, **json.loads(config_json))


def check_task_item(item: object) -> None:
    """A record's ``rg_item`` is an address the grader can rebuild (`task_entry`): the JSON list ``[task, config, seed,
    size, index, format]`` of an installed task, config fields it has within the input limits (`check_options`), a
    seed of either split, ``0 <= index < size <= MAX_RECORDS`` and a format of `FORMATS`; the generator is built
    (cached). A one-line ValueError otherwise, so a bad record is refused when the data loads, before the model."""
    import reasoning_gym

    if not isinstance(item, str) or len(item) > 1 << 16:
        raise ValueError(f"must be a JSON string of at most 65536 characters, got {short_repr(item)}")
    try:
        address = json.loads(item)
    except ValueError:
        raise ValueError(f"is not JSON: {short_repr(item)}") from None
    if not isinstance(address, list) or len(address) != 6:
        raise ValueError(f"must be [task, config, seed, size, index, format], got {short_repr(address)}")
    name, config, seed, size, index, form = address
    if not isinstance(name, str) or name not in reasoning_gym.factory.DATASETS:
        raise ValueError(f"names an unknown reasoning-gym task {short_repr(name)}")
    fields = {f.name for f in dataclasses.fields(reasoning_gym.factory.DATASETS[name][1])} - set(VESPO_KEYS)
    if not isinstance(config, dict) or not set(config) <= fields:
        raise ValueError(f"config of {name} must be a mapping of its fields {sorted(fields)}, got {short_repr(config)}")
    check_options(name, config)
    integers = all(isinstance(v, int) and not isinstance(v, bool) for v in (seed, size, index))
    if not (integers and 0 <= seed < 2**31 + HELD_OUT_OFFSET and 0 <= index < size <= MAX_RECORDS):
        raise ValueError(
            f"seed, size and index of {name} must be integers with 0 <= seed < 2**31 + {HELD_OUT_OFFSET} and "
            f"0 <= index < size <= {MAX_RECORDS}, got {short_repr(seed)}, {short_repr(size)}, {short_repr(index)}"
        )
    if form not in FORMATS:
        raise ValueError(f"format must be one of {list(FORMATS)}, got {short_repr(form)}")
    try:
        task_dataset(name, size, seed, json.dumps(config, sort_keys=True))
    except Exception as exc:  # noqa: BLE001 - any failure of a third-party generator is a bad config
        raise ValueError(f"config {config} is rejected by {name}: {exc}") from None


def task_entry(item: str) -> tuple[object, dict, str]:
    """The generator, entry and answer format a record's ``rg_item`` ``[name, config, seed, size, index, format]``
    addresses."""
    name, config, seed, size, index, form = json.loads(item)
    ds = task_dataset(name, size, seed, json.dumps(config, sort_keys=True))
    return ds, ds[index], form

"""A table built in slices: each slice run with its own plan.md section, merged into the table only when every slice
is this table's (its task, the preset's variants with the preset's method and aggregation, numbers where numbers
belong, a gate its own values give); a cell in two slices must agree. Every input is read and checked before any file
is written."""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

from vespo.experiments.compare import load_rows
from vespo.experiments.presets import PRESETS, gate
from vespo.experiments.reproduce.designs import read_text
from vespo.experiments.reproduce.plan import (
    PLAN_HEAD,
    PRESET,
    PRIMARY,
    comparison_cells,
    comparisons,
    families,
    section_names,
)
from vespo.experiments.sweep import SweepConfig, preset_config, resolve, variants

SMOKE = {"num_mini_batches": (2, 4), "seeds": (0,), "variants": ("vespo", "grpo"), "num_operands": 3, "eval_size": 10,
         "eval_n": 1, "eval_points": 1, "optimizer_steps": 4, "min_rollout_steps": 1, "ppo_mini_batch_size": 2,
         "rollout_n": 2, "probes": 1}  # fmt: skip
"""`--smoke`: SweepConfig fields of a tiny grid (the paper-long regime otherwise)."""
STRING_COLUMNS = ("task", "variant", "method", "loss_agg_mode", "gate", "collapsed")
"""results.csv columns that hold text; every other column of a slice must hold a number (or be empty)."""


def table_plan(text: str, source: str) -> tuple[list[dict], list[dict]]:
    """(planned comparisons, slices) of plan.md: each section's comparisons as its variants and N define them (a
    comparison planned by several slices once, with every slice's seeds), and per slice its seeds and family sizes."""
    planned: dict[str, dict] = {}
    slices = []
    for i, section in enumerate(text.split(PLAN_HEAD)[1:]):
        m = re.search(r"^Variants (.+?); N = ([\d, ]+); seeds \[([\d, ]*)\]", section, re.M)
        if not m:
            raise ValueError(f"{source}: slice {i + 1} names no variants, N and seeds")
        variants = m.group(1).split(", ")
        ns = tuple(int(x) for x in m.group(2).split(", "))
        seeds = [int(x) for x in m.group(3).split(", ") if x]
        unknown = [v for v in variants if v not in PRESETS[PRESET]]
        if unknown:
            raise ValueError(f"{source}: slice {i + 1} names variants the preset does not: {unknown}")
        by = {c["name"]: c for c in comparisons(variants, ns)}
        names = section_names(section)
        missing = [n for n in names if n not in by]
        if missing:
            raise ValueError(f"{source}: slice {i + 1} plans comparisons its variants and N do not define: {missing}")
        for n in names:
            planned.setdefault(n, by[n] | {"slices": [], "seeds_planned": []})
            planned[n]["slices"].append(i + 1)
            planned[n]["seeds_planned"].append(seeds)
        slices.append({"slice": i + 1, "seeds": seeds, "sizes": families([by[n] for n in names])})
    return list(planned.values()), slices


def slices_run(found: list[dict], rows: list[dict]) -> list[dict]:
    """The comparisons of `found` whose cells all have rows (a table without plan.md: what ran is what it tests)."""
    present = {(r["variant"], int(r["N"])) for r in rows}
    return [c for c in found if all(cell in present for cell in comparison_cells(c))]


def config(out: Path, seeds: list[int] | None, jobs: int, variants: list[str], num_mini_batches: list[int],
           smoke: bool, **fields) -> SweepConfig:  # fmt: skip
    """The SweepConfig of a slice of the paper-long table (the preset's regime under these fields; `--smoke`: `SMOKE`
    and a 2-step warm start cached under `out`, never in the user's cache)."""
    fields |= {"variants": tuple(variants), "num_mini_batches": tuple(num_mini_batches)}
    if seeds is not None:
        fields["seeds"] = tuple(seeds)
    extra = {"tensorboard": "False"} | fields.pop("extra", {})
    if smoke:  # a 2-step warm start cached under out, not in the user's cache
        fields |= SMOKE | {"cache_dir": str(out / "cache")}
        extra |= {"sft_steps": "2"}
    return preset_config(PRESET, out_dir=str(out), jobs=jobs, extra=extra, **fields)


def run_dir(out: Path, cfg: SweepConfig) -> Path:
    """Where a run of `cfg` goes: `out` itself when it holds no table, or only cells of this grid (the same command
    finishing it); else `out/slices/<design>`, so that a new design never rewrites a table that holds other cells."""
    table = out / "results.csv"
    if not table.is_file():
        return out
    cfg = resolve(cfg)
    names = list(variants(cfg))
    grid = {(v, n, s) for v in names for n in cfg.num_mini_batches for s in cfg.seeds}
    held = {(r["variant"], int(r["N"]), int(r["seed"])) for r in load_rows(table, PRIMARY)}
    if held <= grid:
        return out
    ns, seeds = "-".join(map(str, cfg.num_mini_batches)), "-".join(map(str, cfg.seeds))
    tag = hashlib.sha1(" ".join(names).encode()).hexdigest()[:6]
    return out / "slices" / f"N{ns}_seeds{seeds}_{tag}"


CELL_KEY = ("task", "variant", "N", "seed")


def check_slice(rows: list[dict], source: str, tasks: set[str] | None = None) -> None:
    """A slice's results.csv is this table's: a `task` column, the table's task (`tasks`; the preset's when the table
    has none), variants the preset names with the preset's method and aggregation, integer N and seeds, numbers in
    every numeric column, and a gate that its own values give. ValueError naming the first field that is not."""
    from vespo.losses import default_loss_agg_mode

    preset = PRESETS[PRESET]
    tasks = tasks or set(resolve(SweepConfig(preset=PRESET)).task)
    for i, r in enumerate(rows, start=2):  # line 1 is the header
        where = f"{source} line {i}"
        if None in r or None in r.values():
            raise ValueError(f"{where}: not as many fields as the header has")
        if "task" not in r:
            raise ValueError(f"{source}: no task column; a slice of the {PRESET} table names its task "
                             f"({sorted(tasks)})")  # fmt: skip
        if r["task"] not in tasks:
            raise ValueError(f"{where}: task {r['task']!r} is not this table's ({sorted(tasks)}): another task's slice")
        if r["variant"] not in preset:
            raise ValueError(f"{where}: variant {r['variant']!r} is not one of preset {PRESET}'s: {list(preset)}")
        method, hparams, settings = preset[r["variant"]]
        mode = settings.get("loss_agg_mode") or default_loss_agg_mode(method)
        if r.get("method", method) != method or r.get("loss_agg_mode", mode) != mode:
            raise ValueError(f"{where}: variant {r['variant']!r} ran {r.get('method')!r} with "
                             f"{r.get('loss_agg_mode')!r}; preset {PRESET}'s is {method} with {mode}: another "
                             "preset's slice")  # fmt: skip
        for key in ("N", "seed"):
            if not re.fullmatch(r"\d{1,9}", r.get(key) or ""):
                raise ValueError(f"{where}: {key} must be a non-negative integer, got {r.get(key)!r}")
        for key, value in r.items():
            if key in STRING_COLUMNS or value == "":
                continue
            try:
                float(value)
            except ValueError:
                raise ValueError(f"{where}: column {key!r} must hold a number, got {value!r}") from None
        if r.get("collapsed", "False") not in ("True", "False"):
            raise ValueError(f"{where}: collapsed must be True or False, got {r['collapsed']!r}")
        if "gate" in r:
            summary = {k: (float(v) if v != "" else None) for k, v in r.items() if k not in STRING_COLUMNS}
            want = gate(PRESET, method, int(r["N"]), summary)
            if r["gate"] != want:
                raise ValueError(f"{where}: gate {r['gate']!r} is not what the cell's own values give ({want!r})")


def merge_rows(rows: list[dict], extra: list[dict], source: str) -> list[dict]:
    """`rows` with the cells of `extra` (a slice run in another out-dir, `check_slice`d) added; a cell in both must
    hold the same values (ValueError naming it otherwise)."""
    check_slice(extra, source, {r["task"] for r in rows if "task" in r} or None)
    have = {tuple(r[k] for k in CELL_KEY): r for r in rows}
    out = list(rows)
    for r in extra:
        key = tuple(r[k] for k in CELL_KEY)
        if key not in have:
            out.append(r)
            have[key] = r
        elif any(not _same(have[key].get(k, ""), v) for k, v in r.items() if k != "wall_s"):
            raise ValueError(f"{source}: cell {'/'.join(key)} differs from the one already in results.csv")
    return out


def _same(a: str, b: str) -> bool:
    """Two results.csv fields hold the same value (numbers compared as numbers; an empty field is NaN)."""
    try:
        x, y = (float(v) if v != "" else math.nan for v in (a, b))
    except ValueError:
        return a == b
    return (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)


def typed_row(row: dict) -> dict:
    """A results.csv row as the cell summary it was written from (numbers, booleans; an empty field: NaN)."""
    out = {}
    for k, v in row.items():
        if k in ("N", "seed", "rollout_steps", "sft_seed"):
            out[k] = int(v)
        elif v in ("True", "False"):
            out[k] = v == "True"
        else:
            try:
                out[k] = float(v) if v != "" else math.nan
            except ValueError:
                out[k] = v
    return out


def prepare_merge(out: Path, add: list[Path]) -> tuple[list[dict], str]:
    """The merged rows and plan.md of the table and its slices, every input read and checked first (`check_slice`,
    `read_text`, `table_plan`): a ValueError here leaves every file as it was."""
    rows = load_rows(out / "results.csv", PRIMARY)
    check_slice(rows, str(out / "results.csv"), {r["task"] for r in rows if "task" in r} or None)
    texts = [read_text(out / "plan.md")] if (out / "plan.md").exists() or (out / "plan.md").is_symlink() else []
    for d in add:
        extra = load_rows(d / "results.csv", PRIMARY)
        rows = merge_rows(rows, extra, str(d / "results.csv"))
        if not ((d / "plan.md").exists() or (d / "plan.md").is_symlink()):
            raise ValueError(
                f"{d}: no plan.md; a slice of the {PRESET} table is run by `vespo reproduce {PRESET}`, which writes one"
            )
        texts.append(read_text(d / "plan.md"))
        planned = {
            v
            for section in texts[-1].split(PLAN_HEAD)[1:]
            for m in [re.search(r"^Variants (.+?); N = ", section, re.M)]
            if m
            for v in m.group(1).split(", ")
        }
        if not planned:
            raise ValueError(f"{d / 'plan.md'}: no section beginning {PLAN_HEAD!r}: not a slice of the {PRESET} table")
        unplanned = sorted({r["variant"] for r in extra} - planned)
        if unplanned:
            raise ValueError(f"{d}: results.csv holds variants its plan.md does not name: {unplanned}")
    parts = (PLAN_HEAD + part for text in texts for part in text.split(PLAN_HEAD)[1:])
    text = "\n".join(dict.fromkeys(part.strip() + "\n" for part in parts))
    table_plan(text, "the merged plan.md")
    return rows, text

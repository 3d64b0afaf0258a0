"""Designs (issue 53): a question, its cells and comparisons, and each family's power, written once to
plans/<name>.md and committed alone before any of its cells runs (the report reads each design back from git)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from vespo.experiments.compare import load_rows
from vespo.experiments.presets import PRESETS
from vespo.experiments.reproduce import builds
from vespo.experiments.reproduce.paper import RULES
from vespo.experiments.reproduce.plan import (
    ALPHA,
    ASSUMED_SD,
    COST_NOTE,
    LATER,
    PRESET,
    PRIMARY,
    at_n,
    cell_seconds,
    cell_values,
    change_minus_vespo,
    families,
    md,
    own_change,
)
from vespo.experiments.stats import TEST_NAMES, minimal_detectable_difference, seeds_for
from vespo.experiments.sweep import preset_config
from vespo.outputs import read_regular, write_atomic

PLANS = "plans"
DESIGN_DIR = "designs"
DESIGN_FENCE = "```json design"
"""The fenced block of a plan file that holds its design as JSON (what the report and the runner read)."""
PLAN_CAP = 1 << 20
"""The most bytes a plan file may hold (a reader never loads more)."""


def _measured_sd(rows: list[dict], terms_of, ns, metrics=tuple(RULES)) -> dict[str, float]:
    """SD over seeds of the paired differences `terms_of(n)` (a comparison's terms) in `rows`, per N and metric."""
    out = {}
    values = {m: cell_values(rows, m) for m in metrics}
    for metric in metrics:
        for n in ns:
            terms = terms_of(n)
            seeds = set.intersection(*(set(values[metric].get((v, k), {})) for _, v, k in terms))
            d = [sum(sign * values[metric][(v, k)][s] for sign, v, k in terms) for s in sorted(seeds)]
            if len(d) >= 2:
                out[f"{metric} N={n}"] = float(np.std(d, ddof=1))
    return out


def _seed_plan(warm_starts: tuple[int, ...], first: int, count: int) -> list[dict]:
    """`count` fresh seeds from `first` up, split evenly over the warm starts (consecutive blocks)."""
    per = math.ceil(count / len(warm_starts))
    return [{"sft_seed": k, "seeds": list(range(first + i * per, first + (i + 1) * per))}
            for i, k in enumerate(warm_starts)]  # fmt: skip


def _design(name: str, question: str, variants: list[str], ns: list[int], warm: list[dict], found: list[dict],
            sd: dict[str, float], sd_source: str, sweep_fields: dict, why: str, pilot: dict | None = None,
            builds: dict[str, str] | None = None) -> dict:  # fmt: skip
    """A design's JSON: what runs, what is compared, and each family's power at the SD it assumes. With `pilot` the
    warm starts are candidates (the cells run on the first that passes it, `builds.trainable`); with `builds` each
    warm start's build is named (SFT seed -> fingerprint) and no other runs."""
    seeds = len(warm[0]["seeds"]) if pilot else sum(len(w["seeds"]) for w in warm)
    fams = []
    for family, m in families(found).items():
        mdd = minimal_detectable_difference(sd[family], seeds, ALPHA / m)
        fams.append({"family": family, "m": m, "assumed_sd": round(sd[family], 4), "seeds": seeds,
                     "level": ALPHA / m, "mdd": round(mdd, 4)})  # fmt: skip
    cfg = preset_config(PRESET, out_dir="/tmp/unused", jobs=1, variants=tuple(variants), num_mini_batches=tuple(ns),
                        seeds=tuple(range(seeds)), **sweep_fields)  # fmt: skip
    cost = {str(n): round(cell_seconds(cfg, n)) for n in ns}
    d = {"design": name, "question": question, "preset": PRESET, "variants": variants, "num_mini_batches": ns,
         "warm_starts": warm, "sweep": sweep_fields, "comparisons": found, "families": fams,
         "primary_rule": PRIMARY, "alpha": ALPHA, "sd_source": sd_source, "why": why,
         "cost_s_per_cell": cost, "cells": len(variants) * len(ns) * seeds}  # fmt: skip
    return d | ({"pilot": pilot} if pilot else {}) | ({"builds": builds} if builds else {})


def design_confirm_n64(table: list[dict]) -> dict:
    """Issue 53 item 2: VESPO vs GRPO (dual clip 3) at N = 64 on fresh seeds (100 up) from two warm starts, seeds
    from the power calculation for an MDD <= 0.05 at the measured SD of the paired differences (the larger of the two
    checkpoint rules), one comparison per checkpoint rule, best checkpoint primary."""
    target, warm = 0.05, (0, 100)
    sds = _measured_sd(table, lambda n: [[1, "grpo", n], [-1, "vespo", n]], [64])
    sd = max(sds.values())
    need = seeds_for(target, sd, ALPHA)
    need = math.ceil(need / len(warm)) * len(warm)
    found = [at_n("grpo", 64, "confirm-n64: VESPO vs GRPO at N=64")]
    why = (f"seeds: the fewest at which the paired t at alpha = {ALPHA} (one comparison per checkpoint rule) detects "
           f"{target} with 80% power at the measured SD {sd:.4f} ({need} after rounding up to an equal number per "
           f"warm start); warm starts: SFT seeds {list(warm)}, built independently (the table's and a fresh one); "
           "RL seeds 100 up, never used before; both warm starts are the preset's (4,000 SFT steps at lr 1e-3). The "
           "test is the paired t over all pairs whose cells pass the regime gate (a seed whose cell misses it is "
           "dropped from both sides and reported), each warm start's mean difference beside it; whatever it shows "
           "is reported.")  # fmt: skip
    return _design("confirm-n64", "Is VESPO's held-out accuracy above GRPO's (dual clip 3) at N = 64 on seeds it was "
                   "not chosen on?", ["vespo", "grpo"], [64], _seed_plan(warm, 100, need), found,
                   {found[0]["family"]: sd}, "results.csv at the plan's parent commit, grpo - vespo at N = 64: "
                   + ", ".join(f"{k} {v:.4f}" for k, v in sds.items()), {}, why)  # fmt: skip


EQUAL_STEPS = 512
"""Optimizer updates of every cell of the equal-steps design: the preset's count at N = 64 (8 rollout steps x 64), so
N = 64 keeps the table's cell length while N = 4 and 16 get 8x and 4x the updates they had; a multiple of 4, 16 and
64. The paper's 1,500 would take ~3x longer (~21 min a cell on one core, ~5 h for 30 cells on 2 cores)."""


def design_equal_steps(table: list[dict]) -> dict:
    """Issue 53 item 3: VESPO and GRPO at N = 4, 16, 64 with `EQUAL_STEPS` optimizer updates in every cell, 5 fresh
    seeds (200 up) on the table's warm start: each method's own change from N = 4 to 64 (the paper's degradation)
    and GRPO's minus VESPO's, and GRPO vs VESPO at each N."""
    ns = [4, 16, 64]
    at = "equal steps: GRPO vs VESPO at one N"
    drop = "equal steps: change from N=4 to 64"
    found = [at_n("grpo", n, at) for n in ns]
    found += [own_change("vespo", 4, 64, drop), own_change("grpo", 4, 64, drop),
              change_minus_vespo("grpo", 4, 64, drop)]  # fmt: skip
    sd_at = _measured_sd(table, lambda n: [[1, "grpo", n], [-1, "vespo", n]], ns)
    sd_drop = {f"grpo's change minus VESPO's, {k}": v for k, v in _measured_sd(
        table, lambda n: change_minus_vespo("grpo", 4, n, drop)["terms"], [64]).items()}  # fmt: skip
    for v in ("vespo", "grpo"):
        sd_drop |= {f"{v}'s change, {k}": x for k, x in _measured_sd(
            table, lambda n, v=v: own_change(v, 4, n, drop)["terms"], [64]).items()}  # fmt: skip
    sd_at = {f"grpo - vespo, {k}": v for k, v in sd_at.items()}
    sd = {at: max(sd_at.values()), drop: max(sd_drop.values())}
    why = (f"{EQUAL_STEPS} optimizer updates per cell at every N: the paper runs the same number of gradient steps "
           "(1,500) at every N, the preset 64 / 128 / 512 at N = 4 / 16 / 64, so its N axis is also a training-length "
           f"axis. {EQUAL_STEPS} is the preset's count at N = 64 (8 rollout steps of 64 mini-batches), so N = 64 "
           "keeps the table's cell length and N = 4 and 16 get 8x and 4x the updates they had (128 and 32 rollout "
           "steps); it is a multiple of 4, 16 and 64, and every cell generates the same 32,768 responses. The paper's "
           "1,500 would take ~3x longer (~21 min a cell on one core, ~5 h for the 30 cells on 2 cores). 5 seeds "
           "(200-204, fresh) on the table's warm start (SFT seed 0); at the measured SDs they detect only the MDDs "
           "of the table above: a smaller degradation is not seen, and the plan says so before it runs.")  # fmt: skip
    return _design("equal-steps", "Does accuracy fall from N = 4 to 64 when every cell takes the same optimizer "
                   "updates, and by more for GRPO than for VESPO?", ["vespo", "grpo"], ns, _seed_plan((0,), 200, 5),
                   found, sd, "results.csv at the plan's parent commit (preset cells, unequal steps): " +
                   ", ".join(f"{k} {v:.4f}" for k, v in (sd_at | sd_drop).items()),
                   {"optimizer_steps": EQUAL_STEPS, "min_rollout_steps": 1}, why)  # fmt: skip


CORRECTIONS_2026 = {v: PRESETS[PRESET][v] for v in ("dppo-tv", "luspo", "vespo-kltau")}
"""Issue 54's variants of the preset (variant -> method, hparams, settings), each at its sources' defaults:
DPPO-Binary-TV (`dppo_tv`: veRL 0.9.1's and prime-rl's default form; TV threshold 0.15, IS cap C = 20), LUSPO
(`luspo`: TRL's, GSPO's clip bounds 3e-4 / 4e-4, seq-mean-token-sum), and VESPO with Kimi K2.5's squared log-ratio
penalty (`kl_tau` = 1e-3, prime-rl's name and default)."""


def _resolved(method: str, hparams: dict) -> str:
    """A method's hyperparameters as it resolves them (its defaults under `hparams`), or `hparams` where the method
    is not registered in this checkout."""
    from vespo.losses import available_methods, validate_hparams

    return str(validate_hparams(method, **hparams) if method in available_methods() else hparams or "(defaults)")


QUESTION_2026 = "Does DPPO, LUSPO or VESPO with the squared log-ratio penalty differ from VESPO at N = 4 or 64?"
"""Issue 54's question (designs corrections-2026 and corrections-2026b)."""


def _corrections(table: list[dict], family: str = "at one N · 2025-26 corrections (issue 54)"):
    """Issue 54's family, its comparisons (each of `CORRECTIONS_2026` vs VESPO at N = 4 and 64), the SD it assumes
    (the median over the table's 2025-26 corrections of their paired differences' SD with VESPO) and those SDs."""
    ns = [4, 64]
    found = [at_n(v, n, family) for v in CORRECTIONS_2026 for n in ns]  # DPPO, LUSPO, VESPO + penalty vs VESPO
    sds = {}
    for v in LATER:
        sds |= {f"{v} {k}": x for k, x in _measured_sd(table, lambda n, v=v: [[1, v, n], [-1, "vespo", n]],
                                                       ns).items()}  # fmt: skip
    return family, found, float(np.median(list(sds.values()))) if sds else ASSUMED_SD["at one N"], sds


def _variants_text() -> str:
    """Issue 54's variants with the hyperparameters they resolve to (what a plan says runs)."""
    return "; ".join(f"{v} = {m} {_resolved(m, h)}" for v, (m, h, _) in CORRECTIONS_2026.items())


def design_corrections_2026(table: list[dict]) -> dict:
    """Issue 54 item 5: DPPO, LUSPO and VESPO with the squared log-ratio penalty against VESPO at N = 4 and 64, 5
    seeds (the table's 0-4 on its warm start, so they pair with the table's 2025-26 corrections), in a Holm family of
    their own (the 2025-26 corrections'; the earlier family of issue 40 is left as its plans made it)."""
    ns, (family, found, sd, sds) = [4, 64], _corrections(table)
    why = ("5 seeds (0-4) on the table's warm start (SFT seed 0), VESPO run again beside them under the same code; "
           f"the variants at their sources' defaults: {_variants_text()}. One Holm family of their 6 comparisons (the "
           "2025-26 corrections' own, as issue 40's were; issue 40's family stays as its plans made it, so no earlier "
           "family grows after its results). Assumed SD: the median over the table's 2025-26 corrections of the SD of "
           "their paired differences with VESPO (their runaways make the largest uninformative). N = 4 runs first "
           "(cheap), N = 64 after.")  # fmt: skip
    d = _design("corrections-2026", QUESTION_2026, ["vespo", *CORRECTIONS_2026], ns, _seed_plan((0,), 0, 5), found,
                {family: sd}, "results.csv at the plan's parent commit: " +
                ", ".join(f"{k} {v:.4f}" for k, v in sds.items()), {}, why)  # fmt: skip
    return d | {"variant_defs": {v: [m, h, s] for v, (m, h, s) in CORRECTIONS_2026.items()}}


def _preset_cfg(k: int):
    """The preset's sweep of one VESPO cell on SFT seed `k`'s warm start (what `builds.fingerprints` builds)."""
    return preset_config(PRESET, out_dir="/tmp/unused", jobs=1, variants=("vespo",), num_mini_batches=(4,), seeds=(0,),
                         extra={"sft_seed": str(k)})  # fmt: skip


def design_corrections_2026b(table: list[dict]) -> dict:
    """Issue 54 item 5 on a build this machine makes: corrections-2026's comparisons, seeds and family, its warm
    start the first of SFT seeds 0, 1 whose build passes `builds.PILOT` (corrections-2026 named the table's build of
    SFT seed 0, which no later machine has rebuilt); each candidate's build named by its fingerprint."""
    family = "2025-26 corrections on a named build (issue 54, corrections-2026b)"  # a family name is a design's own
    (family, found, sd, sds), candidates, rule = _corrections(table, family), [0, 1], builds.PILOT
    named = builds.fingerprints(candidates, _preset_cfg)  # built once here (cached), never a cell
    why = (f"corrections-2026's variants at their sources' defaults ({_variants_text()}), its 6 comparisons, RL "
           "seeds 0-4 and Holm family, VESPO run again beside them, on a warm start this machine builds: the table's "
           "build of SFT seed 0 is not rebuilt by later machines (the same settings built weights starting at 0.12, "
           "0.19-0.21 and 0.23-0.25 on three machines, and the 0.12 one did not train), so the plan names each "
           "candidate's build (" + ", ".join(f"SFT seed {k}: {v}" for k, v in named.items()) + ") and fixes the "
           "rule before any cell: the cells run on the first candidate, in that order, whose pilot cell "
           f"({rule['variant']}, N = {rule['num_mini_batches']}, RL seed {rule['seed']}, in no comparison) rises "
           f"{rule['min_rise']} or more in best held-out accuracy above its start; a candidate that fails is reported "
           "and not run, and a machine that builds another fingerprint runs none. The pilot conditions on VESPO "
           "training at N = 4 on one seed outside the design. Assumed SD as corrections-2026's. N = 4 runs first "
           "(cheap), N = 64 after.")  # fmt: skip
    out = _design("corrections-2026b", QUESTION_2026, ["vespo", *CORRECTIONS_2026], [4, 64],
                  [{"sft_seed": k, "seeds": list(range(5))} for k in candidates], found, {family: sd},
                  "results.csv at the plan's parent commit: " + ", ".join(f"{k} {v:.4f}" for k, v in sds.items()), {},
                  why, pilot=dict(rule), builds=named)  # fmt: skip
    return out | {"variant_defs": {v: [m, h, x] for v, (m, h, x) in CORRECTIONS_2026.items()}}


DESIGNS = {"confirm-n64": design_confirm_n64, "equal-steps": design_equal_steps,
           "corrections-2026": design_corrections_2026, "corrections-2026b": design_corrections_2026b}  # fmt: skip
"""Design name -> its builder (from the committed table's results.csv, for the SDs it assumes)."""


def design_text(d: dict) -> str:
    """A plan file: the design in words and tables, and the JSON block the runner and the report read."""
    lines = [f"# paper-long design `{d['design']}`: written once, committed alone before any of its cells runs", "",
             d["question"], "",
             f"Variants {', '.join(d['variants'])}; N = {', '.join(map(str, d['num_mini_batches']))}; "
             + ("one warm start, the first that passes the pilot rule, of " if "pilot" in d else "")
             + "; ".join(f"SFT seed {w['sft_seed']}" + (f" (build {d['builds'][str(w['sft_seed'])]})" if "builds" in d
                         else "") + f": RL seeds {w['seeds'][0]}-{w['seeds'][-1]}" for w in d["warm_starts"])
             + f"; {d['cells']} cells"
             + (f"; sweep settings {d['sweep']}" if d["sweep"] else "") + ".", "",
             f"Primary rule: {RULES[d['primary_rule']]}; the final checkpoint's verdicts are secondary. Test: "
             f"{TEST_NAMES['paired_t']}, on the seeds whose cells pass the regime gate, Holm over each family per rule "
             f"(alpha = {d['alpha']}); differences are fractions of held-out accuracy (0-1), the paper's in points.",
             "", "Comparisons: " + "; ".join(c["name"] for c in d["comparisons"]) + ".", "",
             "| family | m | assumed per-seed SD (fraction) | seeds | Holm first-step level | MDD at 80% power |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for f in d["families"]:
        lines.append(f"| {md(f['family'])} | {f['m']} | {f['assumed_sd']:.4f} | {f['seeds']} | {f['level']:.3g} | "
                     f"{f['mdd']:.4f} |")  # fmt: skip
    cost = ", ".join(f"N = {n}: {s / 60:.0f} min" for n, s in d["cost_s_per_cell"].items())
    lines += ["", f"Why: {d['why']}", "", f"SD source: {d['sd_source']}.", "",
              f"Estimated time per cell on one core ({COST_NOTE}): {cost}.", "", DESIGN_FENCE,
              json.dumps(d, indent=1, ensure_ascii=True), "```", ""]  # fmt: skip
    return "\n".join(lines)


def parse_design(text: str, source: str) -> dict:
    """The design JSON of a plan file (ValueError naming `source` when it has none)."""
    start = text.find(DESIGN_FENCE)
    end = text.find("\n```", start + len(DESIGN_FENCE)) if start >= 0 else -1
    if start < 0 or end < 0:
        raise ValueError(f"{source}: no {DESIGN_FENCE!r} block; a design's plan file is written by --plan-only")
    try:
        d = json.loads(text[start + len(DESIGN_FENCE) : end])
    except ValueError as exc:
        raise ValueError(f"{source}: its design block is not JSON ({exc})") from None
    keys = {"design", "variants", "num_mini_batches", "warm_starts", "comparisons"}
    if not isinstance(d, dict) or not keys <= set(d):
        raise ValueError(f"{source}: its design block lacks design / variants / num_mini_batches / warm_starts / "
                         "comparisons")  # fmt: skip
    return d


def read_text(path: Path) -> str:
    """A plan file's text: a regular file (never through a link), UTF-8, at most `PLAN_CAP` bytes; else one
    ValueError naming it."""
    try:
        return read_regular(path, cap=PLAN_CAP).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        why = "a symbolic link" if path.is_symlink() else exc.strerror or str(exc)
        raise ValueError(f"{path}: cannot read ({why}); a plan must be a regular file") from None


def write_plan(out: Path, name: str) -> Path:
    """Write plans/<name>.md once, from `DESIGNS[name]` and the table's results.csv: an existing plan file is never
    rewritten (a new design gets a new name)."""
    path = out / PLANS / f"{name}.md"
    if path.exists() or path.is_symlink():
        raise ValueError(f"{path} exists: a plan is written once; a new design gets a name of its own")
    d = DESIGNS[name](load_rows(out / "results.csv", PRIMARY))
    for other in sorted(path.parent.glob("*.md")):  # the report keys each family's registration by its name
        shared = {c["family"] for c in d["comparisons"]} & {
            c["family"] for c in parse_design(read_text(other), str(other))["comparisons"]
        }
        if shared:
            raise ValueError(f"design {name}: its family {sorted(shared)[0]!r} is also {other.name}'s; a family "
                             "belongs to one design")  # fmt: skip
    text = design_text(d)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    return path

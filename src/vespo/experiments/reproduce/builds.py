"""A design's warm starts as builds (issues 53, 54): the same SFT settings build other weights on another CPU, and
some builds do not train, so a design may name the build (`fingerprint`) of each candidate warm start and a pilot
rule, both fixed in its plan before any cell runs: its cells run on the first candidate whose pilot cell (one seed
outside the design, in no comparison) rises `min_rise` above its start, and only on a machine that builds it."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path

from vespo.experiments.sweep import SweepConfig, cells, sweep
from vespo.outputs import read_regular, write_atomic

PILOT = {"variant": "vespo", "num_mini_batches": 4, "seed": 900, "min_rise": 0.05}
"""The pilot rule of a design over candidate builds: VESPO at N = 4 on RL seed 900 (no design's seed) must rise 0.05
(four binomial SDs of a 1,000-sample held-out accuracy near 0.2) in best held-out accuracy above its start. Builds
seen so far either rose 0.14-0.23 (VESPO, N = 4) or 0.005-0.007."""
PILOTS = "pilots.csv"
"""A design's pilot cells, one row per candidate tried (designs/<name>/pilots.csv)."""
PILOTS_CAP = 1 << 20
"""The most bytes a pilots.csv may hold (a reader never loads more)."""


def build_fingerprint(cfg: SweepConfig) -> str:
    """Build (once, cached) the warm start of `cfg`'s cells; its fingerprint (which weights they start from)."""
    from vespo.embedded.warm_start import WarmStartSpec, embedded_policy_path, fingerprint
    from vespo.experiments.sweep.cells import train_config

    return fingerprint(embedded_policy_path(WarmStartSpec.of(train_config(cfg, cells(cfg)[0]))))


def fingerprints(sft_seeds: list[int], cfg_of: Callable[[int], SweepConfig]) -> dict[str, str]:
    """SFT seed (as text) -> the fingerprint of the build this machine makes of it (what a plan names)."""
    return {str(k): build_fingerprint(cfg_of(k)) for k in sft_seeds}


def check_build(d: dict, k: int, cfg: SweepConfig) -> str:
    """The fingerprint of SFT seed `k`'s build here, when it is the one design `d` names; else one ValueError."""
    named, here = d["builds"][str(k)], build_fingerprint(cfg)
    if here != named:
        raise ValueError(f"design {d['design']}: its plan names build {named} of SFT seed {k}, this machine builds "
                         f"{here}: its cells would start from another policy (docs/guides/paper.md, 'A warm start is "
                         "a build'); run it where the build matches, or write a design of its own")  # fmt: skip
    return here


def _rows(path: Path) -> list[dict]:
    """A design's pilots.csv rows (a regular file, never through a link; none before its first pilot)."""
    return list(csv.DictReader(io.StringIO(read_regular(path, cap=PILOTS_CAP).decode()))) if path.exists() else []


def trainable(where: Path, d: dict, jobs: int, cfg_of: Callable[..., SweepConfig]) -> dict | None:
    """The first of design `d`'s candidate warm starts whose pilot cell passes its rule (`PILOT`), or None; each
    candidate's build is checked first and each pilot tried is recorded in designs/<name>/pilots.csv (kept: a rerun
    reads its pilots instead of running them again). `cfg_of(k, seeds, variants, ns, out)` is the sweep of a cell."""
    rule, path = d["pilot"], where / PILOTS
    done = {int(r["sft_seed"]): r for r in _rows(path)}
    for w in d["warm_starts"]:
        k = w["sft_seed"]
        if k not in done:
            cfg = cfg_of(k, [rule["seed"]], [rule["variant"]], [rule["num_mini_batches"]], where / f"pilot-sft{k}")
            build = check_build(d, k, cfg)
            (cell,) = sweep(cfg)
            start, best = float(cell["initial_eval_acc"]), float(cell["best_eval_acc"])
            done[k] = {"sft_seed": k, "warm_start": build, "variant": rule["variant"], "N": rule["num_mini_batches"],
                       "seed": rule["seed"], "initial_eval_acc": start, "best_eval_acc": best,
                       "rise": round(best - start, 6), "passed": best - start >= rule["min_rise"]}  # fmt: skip
            where.mkdir(parents=True, exist_ok=True)
            text = io.StringIO()
            out = csv.DictWriter(text, fieldnames=list(done[k]))
            out.writeheader()
            out.writerows(done.values())
            write_atomic(path, text.getvalue())
        row = done[k]
        verdict = "passes" if str(row["passed"]) == "True" else f"fails (< {rule['min_rise']}): not run"
        print(f"design {d['design']}: SFT seed {k} (build {row['warm_start']}) pilot {row['variant']} N = {row['N']} "
              f"seed {row['seed']}: {float(row['initial_eval_acc']):.3f} -> {float(row['best_eval_acc']):.3f}, "
              f"{verdict}", flush=True)  # fmt: skip
        if str(row["passed"]) == "True":
            return w
    return None

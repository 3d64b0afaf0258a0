"""`vespo reproduce paper-long`: the paper's staleness table on 128-token responses, where VESPO's and GRPO's updates
differ (`vespo sweep --preset paper-long`, docs/guides/paper.md, "The long-response regime": the 41-step chain task,
the paper's AdamW settings, N in {4, 16, 64, 128}), into benchmarks/results/paper_long/ (resumable; per-cell runs
under cells/ are not committed).

Before any cell runs it prints, and writes to plan.md, the slice's design (`plan`): its comparisons (VESPO against
each baseline at each N, and each baseline's change from N = 4 to 64 against VESPO's, under both checkpoint rules; the
2025-26 corrections in families of their own), per family the assumed per-seed SD of the paired differences, the
seeds, the family size m and the minimal detectable difference (MDD) at 80% power at Holm's first-step level
0.05 / m, and the estimated wall time.

Designs (issue 53, `designs`): `--design NAME --plan-only` writes plans/NAME.md once; commit that file alone;
`--design NAME` then runs its cells (refused while the plan is not committed) into designs/NAME/ (one sweep per warm
start: `sft<seed>/`) and its summaries into designs/NAME/results.csv. The report reads every design's comparisons
from the plan file as git holds it at the commit that added it (`registration`).

The report (after the cells, or `--report-only`) writes verdicts.png and verdicts.md / verdicts.json / verdicts.csv
(`verdicts`): every planned comparison with our difference, its paired t over the seeds whose cells pass the regime
gate, the Holm-adjusted p over its family, the verdict, the gate values and the gradient probe's cosines; a family
whose plan does not strictly precede its results is exploratory (shown, never bolded). A table built in slices:
`--report-only --add-results DIR...` adds the slices' cells and plans (`slices`). `--smoke --out-dir DIR`: VESPO and
GRPO on the 3-step chain at N = 2 and 4, one seed, a 2-step warm start in DIR (CI).
"""

from __future__ import annotations

import csv
import datetime
import io
import json
from pathlib import Path

from vespo.experiments.compare import load_rows
from vespo.experiments.reproduce import builds
from vespo.experiments.reproduce.designs import DESIGN_DIR, PLANS, parse_design, read_text
from vespo.experiments.reproduce.paper import plot_verdicts
from vespo.experiments.reproduce.plan import PRIMARY, UNPLANNED, comparisons, csv_safe
from vespo.experiments.reproduce.registration import (
    committed_designs,
    design_plan_commit,
    plan_committed,
    registration,
    table_plan_commit,
)
from vespo.experiments.reproduce.slices import config, slices_run, table_plan, typed_row
from vespo.experiments.reproduce.verdicts import caveats, verdicts, verdicts_markdown
from vespo.experiments.sweep import SweepConfig, cells, sweep, write_tables
from vespo.outputs import write_atomic

OUT = Path("benchmarks/results/paper_long")


def design_results(out: Path, d: dict) -> list[dict]:
    """A design's results.csv rows (designs/<name>/results.csv; none before its first seed finishes)."""
    path = out / DESIGN_DIR / d["design"] / "results.csv"
    return load_rows(path, PRIMARY) if path.is_file() else []


def _families(comparisons: list[dict]) -> dict[str, list[dict]]:
    fams: dict[str, list[dict]] = {}
    for c in comparisons:
        fams.setdefault(c["family"], []).append(c)
    return fams


def table_verdicts(out: Path, table: list[dict]) -> tuple[list[dict], dict, list[dict]]:
    """(verdicts, registration, slices) of the table's results.csv rows: every comparison plan.md plans, and those the
    cells allow but no slice planned in families of their own (`UNPLANNED`)."""
    variants = list(dict.fromkeys(r["variant"] for r in table))
    ran = slices_run(comparisons(variants, tuple(sorted({int(r["N"]) for r in table}))), table)
    slices = []
    if (out / "plan.md").exists() or (out / "plan.md").is_symlink():
        plan, slices = table_plan(read_text(out / "plan.md"), str(out / "plan.md"))
        names = {c["name"] for c in plan}  # what the cells allow and no plan named: families of their own
        plan += [c | {"family": c["family"] + UNPLANNED} for c in ran if c["name"] not in names]
    else:
        plan = ran
    reg = registration(out, _families(plan), "results.csv", table_plan_commit)
    return verdicts(table, plan), reg, slices


def design_verdicts(out: Path) -> tuple[list[dict], dict, set[int]]:
    """(verdicts, registration, seeds) of every design in plans/, each read as git holds it at the commit that added
    it; a plan file changed after that commit makes its families exploratory."""
    found, reg, seeds = [], {}, set()
    for d in committed_designs(out):
        rows = design_results(out, d)
        seeds |= {int(r["seed"]) for r in rows}
        got = registration(out, _families(d["comparisons"]), f"{DESIGN_DIR}/{d['design']}/results.csv",
                           design_plan_commit(d["design"]))  # fmt: skip
        if d["changed"]:
            got = {f: g | {"class": "exploratory", "why": g["why"] + "; the plan file changed after its commit"}
                   for f, g in got.items()}  # fmt: skip
        reg |= got
        found += [r | {"design": d["design"]} for r in verdicts(rows, d["comparisons"])]
    return found, reg, seeds


def report(out: Path, rows: list[dict] | None = None, dest: Path | None = None) -> list[dict]:
    """verdicts.md / .json / .csv (and verdicts.png) of the table (`rows`, else out's results.csv) and of every
    design in plans/, written to `dest` (default `out`: a report into another directory reads the same git)."""
    dest = out if dest is None else dest
    table = rows if rows is not None else (load_rows(out / "results.csv", PRIMARY)
                                           if (out / "results.csv").exists() else [])  # fmt: skip
    found, reg, slices = table_verdicts(out, table) if table else ([], {}, [])
    designed, reg_d, seeds = design_verdicts(out)
    found, reg, seeds = found + designed, reg | reg_d, seeds | {int(r["seed"]) for r in table}
    for r in found:
        r["caveat"] = caveats(r, reg)
        r["registration"] = reg.get(r["family"], {}).get("class", "exploratory")
    write_atomic(dest / "verdicts.md", verdicts_markdown(found, sorted(seeds), reg, slices))
    units = {"diff": "fraction of held-out accuracy (0-1), per seed summed over the comparison's terms",
             "paper_diff_pct": "points (%) of the paper's average accuracy"}  # fmt: skip
    write_atomic(dest / "verdicts.json", json.dumps({"units": units, "registration": reg, "verdicts": found}, indent=1))
    keys = list(dict.fromkeys(k for r in found for k in r))
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=keys, restval="")
    w.writeheader()
    w.writerows([{k: csv_safe(v if not isinstance(v, list) else json.dumps(v)) for k, v in r.items()} for r in found])
    write_atomic(dest / "verdicts.csv", text.getvalue())
    if table:
        plot_verdicts(table, dest)
    return found


def _cell(row: dict) -> tuple:
    """A design cell's identity in its results.csv: warm start, seed, variant, N."""
    return int(row["sft_seed"]), int(row["seed"]), row["variant"], int(row["N"])


def run_design(out: Path, name: str, jobs: int, ns: list[int] | None, until: datetime.datetime | None) -> None:
    """Run a committed design's cells seed by seed (the design's seeds interleaved over its warm starts, so pairs
    finish together), each seed a sweep of the design's variants into designs/<name>/sft<k>/ (a warm start is built,
    on one thread, by the first sweep that needs it); after each seed, designs/<name>/results.csv and the report. No
    seed starts after `until` (UTC). The results.csv already there is kept: a run of other N adds its cells to it,
    and a cell run again replaces its own row only. A design that names its builds runs only where they are built;
    one with a pilot runs on the first candidate warm start its pilot trains on (`builds`)."""
    import torch

    torch.set_num_threads(1)
    plan_committed(out, name)
    d = parse_design(read_text(out / PLANS / f"{name}.md"), name)
    ns = ns or d["num_mini_batches"]
    bad = [n for n in ns if n not in d["num_mini_batches"]]
    if bad:
        raise ValueError(f"--num-mini-batches {bad}: design {name} plans N = {d['num_mini_batches']} only")
    where = out / DESIGN_DIR / name

    def cfg_of(k: int, seeds: list[int], variants=d["variants"], n=ns, at: Path | None = None) -> SweepConfig:
        return config(at or where / f"sft{k}", seeds, jobs, variants, n, False, extra={"sft_seed": str(k)},
                      **d["sweep"])  # fmt: skip

    cfgs = {w["sft_seed"]: cfg_of(w["sft_seed"], w["seeds"]) for w in d["warm_starts"]}
    for c in cfgs.values():
        cells(c)  # every cell validated before any runs
    warm = d["warm_starts"]
    if "pilot" in d:  # candidates in the plan's order: the first its pilot trains on, or none
        warm = [w for w in [builds.trainable(where, d, jobs, cfg_of)] if w is not None]
        if not warm:
            print(f"design {name}: no candidate warm start passes its pilot rule; no cell runs", flush=True)
            return
    for w in warm if "builds" in d else []:
        builds.check_build(d, w["sft_seed"], cfgs[w["sft_seed"]])
    order = [(w["sft_seed"], s) for i in range(max(len(w["seeds"]) for w in warm))
             for w in warm if i < len(w["seeds"]) for s in [w["seeds"][i]]]  # fmt: skip
    done = where / "results.csv"  # kept: a run of other N (or after its cells/ are gone) adds to it, never drops
    summaries = [typed_row(r) for r in load_rows(done, PRIMARY)] if done.exists() else []
    for k, s in order:
        if until is not None and datetime.datetime.now(datetime.timezone.utc) >= until:
            print(f"design {name}: {until:%H:%M} UTC reached; no more seeds start (rerun to continue)", flush=True)
            break
        new = [r | {"sft_seed": k} for r in sweep(cfg_of(k, [s]))]
        rerun = {_cell(r) for r in new}
        summaries = [r for r in summaries if _cell(r) not in rerun] + new
        where.mkdir(parents=True, exist_ok=True)
        write_tables(where, summaries, eval_prompts=cfgs[k].eval_size * cfgs[k].eval_n)
        report(out)

"""Lab v2 staleness grid and failure-mode table: does stale training collapse where the paper says it does?

One command: `python benchmarks/bench_lab_v2.py [--length 256] [--lr 0.03] [--optimizer-steps 512]
[--adam-epsilon 1e-8] [--staleness 1 16 64] [--seeds 0 1 2 3 4] [--jobs 2] [--out DIR]` writes
benchmarks/results/lab_v2/{results.json, results.md, failure_modes.md, lab_v2.png} (cells/*.json, gitignored, keep
finished cells). Methods vespo grpo gspo sapo cispo topr reinforce, plus vespo with log W / T
(`length_norm="linear"`, the paper's length-normalisation ablation), Adam steps of 64 sequences (groups of 8), the
lab's defaults otherwise. The defaults give every cell >= 8 rollout steps and a step size at which on-policy
REINFORCE still learns. Every number is mean ± 95% CI over seeds; a difference is bold only when Welch's test,
Holm-corrected over the table's comparisons, gives p < 0.05. `--smoke --out DIR`: every arm on a tiny chain (V = 16,
T = 8), N in {1, 2}, one seed, 2 Adam steps of 8 sequences (seconds; CI).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from vespo.experiments.lab import LabCell, LabConfig
from vespo.experiments.lab_model import ChainSpec, run_chain_cell
from vespo.experiments.stats import format_ci, holm, mean_ci, welch

OUT = Path(__file__).parent / "results" / "lab_v2"
ARMS = {  # arm name -> (registered method, hyperparameters)
    "vespo": ("vespo", ()),
    "grpo": ("grpo", ()),
    "gspo": ("gspo", ()),
    "sapo": ("sapo", ()),
    "cispo": ("cispo", ()),
    "topr": ("topr", ()),
    "reinforce": ("reinforce", ()),
    "vespo_lin": ("vespo", (("length_norm", "linear"),)),
}
STALENESS = (1, 16, 64)  # the default grid; tables and plots read N from the cells


SMOKE_LAB = {"mini_batch_size": 8, "rollout_n": 4, "eval_points": 1}
SMOKE_CHAIN = {"vocab": 16, "rank": 4, "eval_samples": 16}
"""`--smoke`: the lab and chain settings of a tiny cell."""


def _run(job: tuple[str, int, int, int, float, int, float, bool]) -> dict:
    arm, length, n, seed, lr, steps, eps, smoke = job
    method, hp = ARMS[arm]
    cfg = LabConfig(
        optimizer_steps=steps, lr=lr, adam_epsilon=eps, **({"eval_points": 4} | (SMOKE_LAB if smoke else {}))
    )
    spec = ChainSpec(**SMOKE_CHAIN) if smoke else ChainSpec()
    out = run_chain_cell(cfg, LabCell(method, length, n, 1.0, seed, hp), spec)
    out["summary"]["arm"] = arm
    return out


def _values(rows: list[dict], arm: str, n: int, key: str) -> list[float]:
    return [r[key] for r in rows if r["arm"] == arm and r["staleness"] == n]


def _cell(rows, arm, n, key, digits=2):
    return format_ci(_values(rows, arm, n, key), digits)


def _staleness(rows: list[dict]) -> list[int]:
    return sorted({r["staleness"] for r in rows})


def tables(rows: list[dict], results: list[dict], length: int, args: argparse.Namespace) -> tuple[str, str]:
    """results.md (every arm x N: final E[R], final mean length, truncation) and failure_modes.md."""
    seeds = len({r["seed"] for r in rows})
    staleness = _staleness(rows)
    start = rows[0]
    head = [
        f"# Lab v2, T = {length}: {seeds} seeds, {args.optimizer_steps} Adam steps (lr {args.lr:g}, "
        f"eps {args.adam_epsilon:g}) "
        "of 64 sequences, groups of 8",
        "",
        f"Initial policy: E[R] = {start['initial_reward']:.3f} (fixed evaluation sample of "
        f"{ChainSpec().eval_samples} responses, common random numbers), "
        f"mean length {start['initial_length_mean']:.0f}, "
        f"truncated {start['initial_truncated']:.2f}, token accuracy {start['initial_token_accuracy']:.3f}; "
        f"success threshold q = {start['threshold']:.3f}. Cells: mean ± 95% CI over seeds.",
        "",
    ]
    md = list(head)
    for key, title in (
        ("collapsed", "Collapsed seeds (final E[R] < 0.5 x initial), share"),
        ("final_reward", "Final E[R]"),
        ("final_length_mean", "Final mean response length"),
        ("final_truncated", "Final truncated share"),
        ("final_token_accuracy", "Final token accuracy"),
    ):
        md += [f"## {title}", "", "| arm | " + " | ".join(f"N={n}" for n in staleness) + " |"]
        md.append("|---" * (len(staleness) + 1) + "|")
        for arm in ARMS:
            digits = 0 if "length" in key else 2 if key == "collapsed" else 3
            md.append(f"| {arm} | " + " | ".join(_cell(rows, arm, n, key, digits) for n in staleness) + " |")
        md.append("")

    # ---- VESPO against every other arm at each N > 1 on final E[R]: Welch, Holm over all these comparisons
    pairs = [(arm, n) for n in staleness if n > 1 for arm in ARMS if arm != "vespo"]
    vespo = {n: _values(rows, "vespo", n, "final_reward") for n in staleness}
    adjusted = holm([welch(_values(rows, arm, n, "final_reward"), vespo[n]) for arm, n in pairs])
    md += [
        "## Final E[R]: each arm minus VESPO",
        "",
        f"Welch's t-test, two-sided, Holm-corrected over {len(pairs)} comparisons; bold = adjusted p < 0.05.",
        "",
        "| arm | " + " | ".join(f"N={n}" for n in staleness if n > 1) + " |",
        "|---" * (len([n for n in staleness if n > 1]) + 1) + "|",
    ]
    cell = {}
    for (arm, n), p in zip(pairs, adjusted, strict=True):
        diff = np.mean(_values(rows, arm, n, "final_reward")) - np.mean(vespo[n])
        text = f"{diff:+.3f}, p={p:.2g}"
        cell[arm, n] = f"**{text}**" if p < 0.05 else text
    for arm in ARMS:
        if arm != "vespo":
            md.append(f"| {arm} | " + " | ".join(cell[arm, n] for n in staleness if n > 1) + " |")
    md.append("")

    # ---- failure modes: each a comparison with a stated criterion; p Holm-adjusted over the whole table
    tests = []  # (name, criterion, a-values, b-values, direction)
    for n in (16, 64):
        tests.append(
            (
                f"REINFORCE collapses at N={n}",
                f"final E[R] at N={n} < 0.5 x initial, and below N=1",
                _values(rows, "reinforce", n, "final_reward"),
                _values(rows, "reinforce", 1, "final_reward"),
                "less",
            )
        )
    for arm in ("sapo", "cispo"):
        tests.append(
            (
                f"{arm.upper()} degrades with N",
                "final E[R] at N=64 below N=1",
                _values(rows, arm, 64, "final_reward"),
                _values(rows, arm, 1, "final_reward"),
                "less",
            )
        )
    for n in (16, 64):
        tests.append(
            (
                f"length normalisation (vespo log W/T) pushes length up, N={n}",
                "final mean length of vespo_lin above vespo",
                _values(rows, "vespo_lin", n, "final_length_mean"),
                _values(rows, "vespo", n, "final_length_mean"),
                "greater",
            )
        )
    for n in (16, 64):
        others = [v for arm in ("vespo", "grpo", "gspo") for v in _values(rows, arm, n, "final_length_mean")]
        tests.append(
            (
                f"TOPR suppresses length, N={n}",
                "final mean length of TOPR below vespo/grpo/gspo pooled",
                _values(rows, "topr", n, "final_length_mean"),
                others,
                "less",
            )
        )
    raw = [welch(a, b) for _, _, a, b, _ in tests]
    adjusted = holm(raw)
    fm = head + [
        "# Failure modes in lab v2",
        "",
        "Reproduced = the difference has the predicted sign and Welch's test, Holm-corrected over the rows of this",
        "table, gives p < 0.05 (bold). A collapse also needs the mean below half the initial E[R].",
        "",
        "| failure mode | criterion | measured (a) | reference (b) | p (Holm) | reproduced |",
        "|---|---|---|---|---|---|",
    ]
    initial = start["initial_reward"]
    for (name, crit, a, b, direction), p in zip(tests, adjusted, strict=True):
        diff = np.mean(a) - np.mean(b)
        ok = p < 0.05 and (diff < 0 if direction == "less" else diff > 0)
        if name.startswith("REINFORCE collapses"):
            ok = ok and np.mean(a) < 0.5 * initial
        digits = 0 if "length" in crit else 3
        cells = [format_ci(a, digits), format_ci(b, digits), f"{p:.2g}"]
        if ok:
            cells = [f"**{c}**" for c in cells]
        fm.append(f"| {name} | {crit} | " + " | ".join(cells) + f" | {'yes' if ok else 'no'} |")
    on_policy = _values(rows, "reinforce", 1, "final_reward")
    fm += [
        "",
        f"On-policy REINFORCE (N=1) learns: final E[R] {format_ci(on_policy, 3)} from {initial:.3f} at step 0 "
        f"({sum(v > initial for v in on_policy)} of {len(on_policy)} seeds above the start).",
    ]
    # VESPO's variance bound (Prop. 3.1) on every mini-batch of every VESPO cell
    held = [
        v for r in results if r["summary"]["arm"] in ("vespo", "vespo_lin") for v in r["per_k"]["bound_holds"] if v == v
    ]
    fm += [
        "",
        f"VESPO's variance bound (Prop. 3.1) on batches: mean(phi^2) <= mean(K phi W) held on a share "
        f"{np.mean(held):.4f} of the (cell, mini-batch index) averages ({len(held)} of them; 1.0 = every mini-batch "
        "of every rollout, as the proposition says it must).",
    ]
    lw = {
        n: mean_ci(
            [
                r["per_k"]["log_w_mean"][-1]
                for r in results
                if r["summary"]["arm"] == "vespo" and r["summary"]["staleness"] == n
            ]
        )[0]
        for n in staleness
    }
    fm.append(
        "Mean sequence log W of the stalest mini-batch (vespo): "
        + ", ".join(f"N={n}: {v:.1f}" for n, v in lw.items())
        + "."
    )
    return "\n".join(md) + "\n", "\n".join(fm) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    """lab_v2.png: final E[R], mean length and token accuracy vs N per arm, mean and 95% CI over seeds; every CI
    clipped to its metric's range (E[R] and accuracy in [0, 1], length in [0, T])."""
    from vespo.plots import Panel, Series, panel_figure, save_figure

    staleness = _staleness(rows)
    longest = max(r["length"] for r in rows)  # T: no response is longer
    panels = []
    for key, label, bounds in (
        ("final_reward", "final E[R]", (0.0, 1.0)),
        ("final_length_mean", "final mean length (tokens)", (0.0, float(longest))),
        ("final_token_accuracy", "final token accuracy", (0.0, 1.0)),
    ):
        panel = Panel(label, "staleness N", label, bounds=bounds, xscale="log2", xticks=staleness)
        for arm in ARMS:
            stats = [mean_ci(_values(rows, arm, n, key)) for n in staleness]
            panel.series[arm] = Series(staleness, [s[0] for s in stats], yerr=[s[1] for s in stats])
        panels.append(panel)
    panels[0].hline = rows[0]["initial_reward"]
    title = "mean and 95% CI over seeds; dotted: the initial policy's E[R]"
    save_figure(panel_figure([panels], title=title, panel_size=(4.2, 3.2)), path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.03)
    ap.add_argument("--optimizer-steps", type=int, default=512)
    ap.add_argument("--adam-epsilon", type=float, default=1e-8)
    ap.add_argument("--staleness", type=int, nargs="+", default=list(STALENESS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", "--out-dir", type=Path, default=OUT, help="output directory (benchmarks/results/lab_v2)")
    ap.add_argument("--smoke", action="store_true", help="a tiny chain, N in {1, 2}, one seed, in seconds (CI)")
    args = ap.parse_args()
    if args.smoke:
        args.length, args.optimizer_steps, args.staleness, args.seeds, args.jobs = 8, 2, [1, 2], [0], 1
    out = args.out
    staleness = sorted(set(args.staleness))
    if 1 not in staleness or any(args.optimizer_steps % n for n in staleness):
        ap.error("--staleness must include 1 and divide --optimizer-steps")
    cells_dir = out / "cells"
    cells_dir.mkdir(parents=True, exist_ok=True)
    settings = (args.lr, args.optimizer_steps, args.adam_epsilon, args.smoke)
    jobs = [(arm, args.length, n, s, *settings) for s in args.seeds for n in staleness[::-1] for arm in ARMS]
    eps = "" if args.adam_epsilon == 1e-8 else f"_eps{args.adam_epsilon:g}"  # default cells keep their names
    eps += "_smoke" if args.smoke else ""
    path = {j: cells_dir / f"{j[0]}_T{j[1]}_N{j[2]}_seed{j[3]}_lr{j[4]:g}_steps{j[5]}{eps}.json" for j in jobs}
    todo = [j for j in jobs if not path[j].is_file()]
    with ProcessPoolExecutor(args.jobs) as pool:
        for job, result in zip(todo, pool.map(_run, todo, chunksize=1), strict=True):
            path[job].write_text(json.dumps(result))
            s = result["summary"]
            print(f"{job}: E[R] {s['initial_reward']:.3f} -> {s['final_reward']:.3f}", file=sys.stderr, flush=True)
    results = [json.loads(path[j].read_text()) for j in jobs]
    rows = [r["summary"] for r in results]
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    md, fm = tables(rows, results, args.length, args)
    (out / "results.md").write_text(md)
    (out / "failure_modes.md").write_text(fm)
    plot(rows, out / "lab_v2.png")
    print(fm)


if __name__ == "__main__":
    main()

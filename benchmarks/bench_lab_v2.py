"""Lab v2 staleness grid and failure-mode table: does stale training collapse where the paper says it does?

One command: `python benchmarks/bench_lab_v2.py [--length 256] [--lr 0.03] [--optimizer-steps 512]
[--adam-epsilon 1e-8] [--num-mini-batches 1 16 64] [--seeds 0 1 2 3 4] [--jobs 2] [--out DIR]` writes
benchmarks/results/lab_v2/{results.json, results.md, failure_modes.md, lab_v2.png} (cells/*.json, gitignored, keep
finished cells). Methods vespo grpo gspo sapo cispo topr reinforce, plus vespo with log W / T
(`length_norm="linear"`, the paper's length-normalisation ablation), Adam steps of 64 sequences (groups of 8), the
lab's defaults otherwise, the chain pinned at the reward these results were measured with (threshold reward, success
quantile 0.75, min length T/4). The defaults give every cell >= 8 rollout steps and a step size at which on-policy
REINFORCE still learns. Every number is mean ± 95% CI over seeds. Tests fit the design: every cell shares the initial
policy and a seed fixes the sampling stream, so arms are paired over seeds (paired t-test); where a seed collapsed the
outcome is bimodal and the test is Fisher's exact test on collapsed seeds (`vespo.experiments.stats.choose_test`);
never a t-test on collapsed/not outcomes. Holm over each table; each table states its test. A difference is bold only
when its adjusted p < 0.05. `--report-only --out DIR` rewrites the tables from DIR/results.json (the per-mini-batch
lines are kept from the earlier failure_modes.md when the cells are gone). `--smoke --out DIR`: every arm on a tiny
chain (V = 16, T = 8), N in {1, 2}, one seed, 2 Adam steps of 8 sequences (seconds; CI).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from vespo.argv import warn_renamed
from vespo.experiments.lab import LabCell, LabConfig
from vespo.experiments.lab_model import ChainSpec, run_chain_cell
from vespo.experiments.stats import compare, fisher_exact, format_ci, holm, mean_ci, paired_t

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
NUM_MINI_BATCHES = (1, 16, 64)  # the default grid; tables and plots read N from the cells


SMOKE_LAB = {"mini_batch_seqs": 8, "rollout_n": 4, "eval_points": 1}
SMOKE_CHAIN = {"vocab": 16, "rank": 4, "eval_samples": 16}
CHAIN = {"success_quantile": 0.75, "min_length": 0.25, "reward": "threshold"}
"""The reward lab_v2* were measured with (pinned: the lab's default reward may change)."""
"""`--smoke`: the lab and chain settings of a tiny cell."""


def _run(job: tuple[str, int, int, int, float, int, float, bool]) -> dict:
    arm, length, n, seed, lr, steps, eps, smoke = job
    method, hp = ARMS[arm]
    cfg = LabConfig(
        optimizer_steps=steps, lr=lr, adam_epsilon=eps, **({"eval_points": 4} | (SMOKE_LAB if smoke else {}))
    )
    spec = ChainSpec(**(SMOKE_CHAIN | CHAIN)) if smoke else ChainSpec(**CHAIN)
    out = run_chain_cell(cfg, LabCell(method, length, n, 1.0, seed, hp), spec)
    out["summary"]["arm"] = arm
    return out


def _values(rows: list[dict], arm: str, n: int, key: str) -> list[float]:
    return [r[key] for r in rows if r["arm"] == arm and r["staleness"] == n]


def _by_seed(rows: list[dict], arm: str, n: int, key: str) -> dict[int, float]:
    return {r["seed"]: r[key] for r in rows if r["arm"] == arm and r["staleness"] == n}


def _test(a: dict, b: dict, ca: dict | None = None, cb: dict | None = None) -> tuple[float, str, str]:
    """(p, test, note) for a vs b ({seed: value}): `stats.compare`'s choice (Fisher on collapsed seeds where one
    collapsed, else paired t over the shared seeds)."""
    groups = {("a", 0): a, ("b", 0): b}
    flags = None if ca is None else {("a", 0): ca, ("b", 0): cb}
    (c,) = compare(groups, "b", test="auto", collapsed=flags)
    note = f"✗ {c.collapsed[0]}/{c.n[0]} vs {c.collapsed[1]}/{c.n[1]}" if c.test == "fisher" else ""
    return c.p, c.test, note


_TAG = {"paired_t": "t", "fisher": "F", "welch": "Welch", "wilcoxon": "W", "bootstrap": "B"}


def _cell(rows, arm, n, key, digits=2):
    return format_ci(_values(rows, arm, n, key), digits)


def _staleness(rows: list[dict]) -> list[int]:
    return sorted({r["staleness"] for r in rows})


def tables(rows: list[dict], results: list[dict] | None, length: int, args: argparse.Namespace) -> tuple[str, str]:
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

    # ---- every other arm against VESPO at each N on final E[R]: paired t / Fisher by design, Holm over the table
    pairs = [(arm, n) for n in staleness if n > 1 for arm in ARMS if arm != "vespo"]
    vespo = {n: _values(rows, "vespo", n, "final_reward") for n in staleness}
    flags = {(arm, n): {s: bool(v) for s, v in _by_seed(rows, arm, n, "collapsed").items()} for arm in ARMS
             for n in staleness}  # fmt: skip
    tested = [
        _test(_by_seed(rows, arm, n, "final_reward"), _by_seed(rows, "vespo", n, "final_reward"),
              flags[(arm, n)], flags[("vespo", n)])
        for arm, n in pairs
    ]  # fmt: skip
    adjusted = holm([p for p, _, _ in tested])
    md += [
        "## Final E[R]: each arm minus VESPO",
        "",
        "Test per comparison, by design: the arms share the initial policy and a seed fixes every arm's sampling "
        "stream, so they are paired over seeds (paired t-test [t]); where a seed of either side collapsed the outcome "
        "is bimodal, so the test is Fisher's exact test on collapsed seeds [F] (counts shown). Two-sided, "
        f"Holm-corrected over the {len(pairs)} comparisons of this table (N > 1); bold = adjusted p < 0.05. Not "
        "tested at N = 1: there every token-mean arm is the same algorithm as VESPO (phi(1) = 1, no clip binds) and "
        "its runs are identical to VESPO's, seed for seed (the design is paired).",
        "",
        "| arm | " + " | ".join(f"N={n}" for n in staleness if n > 1) + " |",
        "|---" * (len([n for n in staleness if n > 1]) + 1) + "|",
    ]
    cell = {}
    for (arm, n), (_, test, note), p in zip(pairs, tested, adjusted, strict=True):
        diff = np.mean(_values(rows, arm, n, "final_reward")) - np.mean(vespo[n])
        text = f"{diff:+.3f}, p={p:.2g} [{_TAG[test]}]" + (f" {note}" if note else "")
        cell[arm, n] = f"**{text}**" if p < 0.05 else text
    for arm in ARMS:
        if arm != "vespo":
            md.append(f"| {arm} | " + " | ".join(cell[arm, n] for n in staleness if n > 1) + " |")
    md.append("")

    # ---- failure modes: each a comparison with a stated criterion; p Holm-adjusted over the whole table
    tests = []  # (name, criterion, a-values, b-values, direction, p, test tag)

    def collapse_row(name, crit, arm, n):  # collapse is an event: Fisher's exact test on collapsed seeds vs N = 1
        ca, cb = _by_seed(rows, arm, n, "collapsed"), _by_seed(rows, arm, 1, "collapsed")
        p = fisher_exact(sum(map(bool, ca.values())), len(ca), sum(map(bool, cb.values())), len(cb))
        a, b = _values(rows, arm, n, "final_reward"), _values(rows, arm, 1, "final_reward")
        tag = f"F ✗ {sum(map(bool, ca.values()))}/{len(ca)} vs {sum(map(bool, cb.values()))}/{len(cb)}"
        tests.append((name, crit, a, b, "less", p, tag))

    ns = [n for n in (16, 64) if n in staleness]
    for n in ns:
        collapse_row(f"REINFORCE collapses at N={n}", f"collapsed seeds at N={n} (final E[R] < 0.5 x initial) vs N=1",
                     "reinforce", n)  # fmt: skip
    for arm in ("sapo", "cispo"):
        if 64 in staleness:
            collapse_row(f"{arm.upper()} degrades with N", "collapsed seeds at N=64 vs N=1", arm, 64)
    for n in ns:  # lengths: paired over seeds (a collapse makes them bimodal too: read with the collapse counts)
        a, b = _by_seed(rows, "vespo_lin", n, "final_length_mean"), _by_seed(rows, "vespo", n, "final_length_mean")
        seeds = sorted(set(a) & set(b))
        p = paired_t([a[s] for s in seeds], [b[s] for s in seeds])
        tests.append((f"length normalisation (vespo log W/T) pushes length up, N={n}",
                      "final mean length of vespo_lin above vespo (same seeds)", [a[s] for s in seeds],
                      [b[s] for s in seeds], "greater", p, "t"))  # fmt: skip
    for n in ns:  # TOPR against the per-seed mean of vespo, grpo and gspo: paired over seeds
        per = [_by_seed(rows, arm, n, "final_length_mean") for arm in ("topr", "vespo", "grpo", "gspo")]
        seeds = sorted(set.intersection(*(set(d) for d in per)))
        a = [per[0][s] for s in seeds]
        b = [float(np.mean([d[s] for d in per[1:]])) for s in seeds]
        tests.append((f"TOPR suppresses length, N={n}", "final mean length of TOPR below the per-seed mean of "
                      "vespo/grpo/gspo", a, b, "less", paired_t(a, b), "t"))  # fmt: skip
    adjusted = holm([t[5] for t in tests])
    fm = head + [
        "# Failure modes in lab v2",
        "",
        "Reproduced = the difference has the predicted sign and its test, Holm-corrected over the rows of this",
        "table, gives p < 0.05 (bold). Tests by design: a collapse is an event, so collapse rows use Fisher's exact",
        "test on collapsed seeds [F] (never a t-test on collapsed/not outcomes); length rows are paired over the",
        "seeds (paired t-test [t]: one initial policy, a seed fixes every arm's sampling stream).",
        "",
        "| failure mode | criterion | measured (a) | reference (b) | test | p (Holm) | reproduced |",
        "|---|---|---|---|---|---|---|",
    ]
    initial = start["initial_reward"]
    for (name, crit, a, b, direction, _, tag), p in zip(tests, adjusted, strict=True):
        diff = np.mean(a) - np.mean(b)
        ok = p < 0.05 and (diff < 0 if direction == "less" else diff > 0)
        if name.startswith("REINFORCE collapses"):
            ok = ok and np.mean(a) < 0.5 * initial
        digits = 0 if "length" in crit else 3
        cells = [format_ci(a, digits), format_ci(b, digits), tag, f"{p:.2g}"]
        if ok:
            cells = [f"**{c}**" if c != tag else c for c in cells]
        fm.append(f"| {name} | {crit} | " + " | ".join(cells) + f" | {'yes' if ok else 'no'} |")
    on_policy = _values(rows, "reinforce", 1, "final_reward")
    fm += [
        "",
        f"On-policy REINFORCE (N=1) learns: final E[R] {format_ci(on_policy, 3)} from {initial:.3f} at step 0 "
        f"({sum(v > initial for v in on_policy)} of {len(on_policy)} seeds above the start).",
    ]
    if results is None:  # --report-only without the cells: keep the per-mini-batch lines of the earlier report
        old = (
            (args.out / "failure_modes.md").read_text().splitlines()
            if (args.out / "failure_modes.md").is_file()
            else []
        )
        fm += [""] + [line for line in old if line.startswith(("VESPO's variance bound", "Mean sequence log W"))]
        return "\n".join(md) + "\n", "\n".join(fm) + "\n"
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
    from vespo.plots import N_AXIS, Panel, Series, panel_figure, save_figure

    staleness = _staleness(rows)
    longest = max(r["length"] for r in rows)  # T: no response is longer
    panels = []
    for key, label, bounds in (
        ("final_reward", "final E[R]", (0.0, 1.0)),
        ("final_length_mean", "final mean length (tokens)", (0.0, float(longest))),
        ("final_token_accuracy", "final token accuracy", (0.0, 1.0)),
    ):
        panel = Panel(label, N_AXIS, label, bounds=bounds, xscale="log2", xticks=staleness)
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
    ap.add_argument(
        "--num-mini-batches",
        "--staleness",
        type=int,
        nargs="+",
        default=list(NUM_MINI_BATCHES),
        help="values of N, the mini-batches per rollout step (--staleness: old name, deprecated)",
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", "--out-dir", type=Path, default=OUT, help="output directory (benchmarks/results/lab_v2)")
    ap.add_argument("--smoke", action="store_true", help="a tiny chain, N in {1, 2}, one seed, in seconds (CI)")
    ap.add_argument("--report-only", action="store_true", help="rewrite the tables from OUT/results.json")
    args = ap.parse_args()
    warn_renamed(ap.prog, sys.argv[1:], {"--staleness": "--num-mini-batches"})
    if args.report_only:
        rows = json.loads((args.out / "results.json").read_text())
        md, fm = tables(rows, None, args.length, args)
        (args.out / "results.md").write_text(md)
        (args.out / "failure_modes.md").write_text(fm)
        print(fm)
        return
    if args.smoke:
        args.length, args.optimizer_steps, args.num_mini_batches, args.seeds, args.jobs = 8, 2, [1, 2], [0], 1
    out = args.out
    staleness = sorted(set(args.num_mini_batches))
    if 1 not in staleness or any(args.optimizer_steps % n for n in staleness):
        ap.error("--num-mini-batches must include 1 and divide --optimizer-steps")
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

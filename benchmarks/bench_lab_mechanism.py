"""Why VESPO collapses in the lab at N = 64: the momentum echo, measured per mini-batch, and remedies for it.

One command: `python benchmarks/bench_lab_mechanism.py [--seeds 0 1 2 3 4] [--num-mini-batches 64] [--jobs 1] [--out-dir
DIR]` writes benchmarks/results/lab_mechanism/{results.md,results.json,per_k.csv,lab_mechanism.png} (cells/*.json,
git-ignored, keep finished cells: the command resumes). Setting: lab v2's collapse setting (`bench_lab_v2.py`'s
defaults, the chain pinned at the reward it was measured with: threshold reward, success quantile 0.75, min length
T/4), T = 256, lr 0.03, 512 Adam steps of 64 sequences (groups of 8), grad_clip 1.0. Arms (`ARMS`): VESPO and GRPO
under Adam (beta1 0.9), VESPO with beta1 = 0, and VESPO with two VESPO-aware remedies (Z = mean phi of the mini-batch,
at most 1): `step_scale=mean_phi` (the step times Z, the trainer's control) and `momentum_scale=mean_phi` (Adam's
first moment times Z before each step: the echo dies with phi). Per mini-batch index k it reports the share of the
step from the current gradient (`vespo.diagnostics.momentum_share`), the current gradient's part of the step ||u_g||
against the whole update, the gradient norm, mean log W and mean phi. Tests: each arm against plain VESPO (Adam, beta1
0.9) over the same seeds (a seed fixes the sampling stream; the initial policy is shared: paired): Fisher's exact test
on collapsed seeds where a seed collapsed, else the paired t-test (`vespo.experiments.stats.compare`), Holm over the
table. `--smoke --out-dir DIR`: every arm on a tiny chain (V = 16, T = 8), N = 2, one seed, 4 steps (CI).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from vespo.argv import warn_renamed
from vespo.experiments.lab import LabCell, LabConfig
from vespo.experiments.lab_model import ChainSpec, run_chain_cell
from vespo.experiments.stats import TEST_NAMES, compare, fisher_exact, format_ci, holm, paired_t

OUT = Path(__file__).parent / "results" / "lab_mechanism"
ARMS = {  # arm -> (method, LabConfig overrides)
    "vespo": ("vespo", {}),
    "vespo beta1=0": ("vespo", {"beta1": 0.0}),
    "vespo step×Z": ("vespo", {"step_scale": "mean_phi"}),
    "vespo momentum×Z": ("vespo", {"momentum_scale": "mean_phi"}),
    "grpo": ("grpo", {}),
}
BASE = {"vespo beta1=0": "vespo", "vespo step×Z": "vespo", "vespo momentum×Z": "vespo", "grpo": "vespo"}
"""Each arm's comparison: against plain VESPO under Adam (beta1 0.9)."""
SETTING = {"length": 256, "lr": 0.03, "optimizer_steps": 512}
CHAIN = {"success_quantile": 0.75, "min_length": 0.25, "reward": "threshold"}
"""The v2 chain as lab_v2 measured it (pinned: the lab's default reward may change)."""
SMOKE_LAB = {"mini_batch_seqs": 8, "rollout_n": 4, "eval_points": 1}
SMOKE_CHAIN = {"vocab": 16, "rank": 4, "eval_samples": 16}
K_SHOWN = (0, 1, 2, 4, 8, 16, 32, 63)


def _run(job: tuple[str, int, int, bool]) -> dict:
    arm, n, seed, smoke = job
    method, overrides = ARMS[arm]
    size = SMOKE_LAB | {"optimizer_steps": 4} if smoke else {"optimizer_steps": SETTING["optimizer_steps"]}
    cfg = LabConfig(lr=SETTING["lr"], **({"eval_points": 4} | size | overrides))
    spec = ChainSpec(**(SMOKE_CHAIN | CHAIN)) if smoke else ChainSpec(**CHAIN)
    out = run_chain_cell(cfg, LabCell(method, 8 if smoke else SETTING["length"], n, 1.0, seed), spec)
    out["summary"]["arm"] = arm
    return out


def run(seeds: list[int], num_mini_batches: list[int], jobs: int, out: Path, smoke: bool = False) -> list[dict]:
    cells = out / "cells"
    cells.mkdir(parents=True, exist_ok=True)
    jobs_all = [(arm, n, seed, smoke) for n in num_mini_batches for seed in seeds for arm in ARMS]  # seed-major: paired
    path = {j: cells / f"{j[0].replace(' ', '_').replace('×', 'x')}_N{j[1]}_seed{j[2]}{'_smoke' if smoke else ''}.json"
            for j in jobs_all}  # fmt: skip
    todo = [j for j in jobs_all if not path[j].is_file()]
    with ProcessPoolExecutor(jobs) as pool:
        for j, res in zip(todo, pool.map(_run, todo), strict=True):
            path[j].write_text(json.dumps(res))
            s = res["summary"]
            print(f"{j[0]} N={j[1]} seed={j[2]}: final E[R] {s['final_reward']:.3f}", flush=True)
    return [json.loads(path[j].read_text()) for j in jobs_all]


def _mean_k(results: list[dict], arm: str, n: int, key: str) -> np.ndarray:
    runs = [r["per_k"][key] for r in results if (r["summary"]["arm"], r["summary"]["staleness"]) == (arm, n)]
    return np.nanmean(np.asarray(runs, dtype=float), axis=0)


def report(results: list[dict], out: Path, command: str) -> str:
    rows = [r["summary"] for r in results]
    ns = sorted({r["staleness"] for r in rows})
    arms = [a for a in ARMS if any(r["arm"] == a for r in rows)]
    seeds = sorted({r["seed"] for r in rows})
    text = [
        "# Lab mechanism: VESPO's collapse at N = 64 is Adam's momentum echo",
        "",
        f"Command: `{command}`. Lab v2 chain (threshold reward, success quantile 0.75, min length T/4: lab_v2's), T = "
        f"{SETTING['length']}, lr {SETTING['lr']}, {SETTING['optimizer_steps']} Adam steps of 64 sequences (groups of "
        f"8), grad_clip 1.0; seeds {seeds} (one initial policy; a seed fixes the sampling stream of every arm: "
        "paired). Collapsed = final E[R] < 0.5 x initial. E[R] on the fixed 1,024-response evaluation sample (SE <= "
        "0.016).",
        "",
    ]
    for n in ns:
        text += [
            f"## N = {n}: final E[R] and regime diagnostics (means over seeds)",
            "",
            "| arm | final E[R] | ✗ collapsed | clip | KL stalest | sd log W stalest | mean log W stalest | φ̄ stalest "
            "| g-share stalest |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for arm in arms:
            rs = [r for r in rows if (r["arm"], r["staleness"]) == (arm, n)]
            if not rs:
                continue

            def m(key, rs=rs):
                v = [r[key] for r in rs if r.get(key) is not None and math.isfinite(r[key])]
                return f"{np.mean(v):.3g}" if v else "–"

            lw = _mean_k(results, arm, n, "log_w_mean")[-1]
            text.append(
                f"| {arm} | {format_ci([r['final_reward'] for r in rs])} | {sum(r['collapsed'] for r in rs)}/{len(rs)} "
                f"| {m('grad_clipped_frac')} | {m('kl_mu_pi_stalest')} | {m('log_w_std_stalest')} | {lw:.3g} | "
                f"{m('mean_phi_stalest')} | {m('momentum_share_stalest')} |"
            )
        groups = {(a, n): {r["seed"]: r["final_reward"] for r in rows if (r["arm"], r["staleness"]) == (a, n)}
                  for a in arms}  # fmt: skip
        flags = {(a, n): {r["seed"]: bool(r["collapsed"]) for r in rows if (r["arm"], r["staleness"]) == (a, n)}
                 for a in arms}  # fmt: skip
        raw = []
        for arm, base in BASE.items():
            if (arm, n) in groups and groups[(arm, n)] and groups.get((base, n)):
                sub = {(arm, n): groups[(arm, n)], (base, n): groups[(base, n)]}
                (c,) = compare(sub, base, test="auto", collapsed={k: flags[k] for k in sub})
                ca, cb = sum(flags[(arm, n)].values()), sum(flags[(base, n)].values())
                pf = fisher_exact(ca, len(flags[(arm, n)]), cb, len(flags[(base, n)]))
                raw.append((arm, base, c, ca, cb, pf))
        if raw:
            q = holm([c.p for *_, c, _, _, _ in [(a, b, c, ca, cb, pf) for a, b, c, ca, cb, pf in raw]])
            qf = holm([pf for *_, pf in raw])
            text += [
                "",
                f"Tests at N = {n}, each arm against plain VESPO (Adam, beta1 0.9) over the same seeds: the test the "
                "design calls for (`stats.choose_test`: Fisher's exact test on collapsed seeds where a seed "
                "collapsed — the outcome is then bimodal — else the paired t-test), Holm over the table's rows; "
                "and Fisher's exact test on the collapse counts for every row (Holm separately). **Bold** = "
                "adjusted p < 0.05.",
                "",
                "| arm − base | diff in final E[R] | test | p (Holm) | collapsed: arm vs base | Fisher p (Holm) |",
                "|---|---|---|---|---|---|",
            ]
            for (arm, base, c, ca, cb, _), qa, qb in zip(raw, q, qf, strict=True):
                d = f"{c.diff:+.3f}"
                pa, pb = f"{qa:.3g}", f"{qb:.3g}"
                if qa < 0.05:
                    d, pa = f"**{d}**", f"**{pa}**"
                if qb < 0.05:
                    pb = f"**{pb}**"
                text.append(f"| {arm} − {base} | {d} | {TEST_NAMES[c.test]} | {pa} | {ca}/{c.n[0]} vs {cb}/{c.n[1]} "
                            f"| {pb} |")  # fmt: skip
            drift = []  # the mechanism itself, a continuous per-seed outcome: paired t over the shared seeds
            for arm, base in BASE.items():
                for key, label in (("log_w_mean", "mean log W, stalest"), ("momentum_share", "g-share, stalest")):
                    a = {r["summary"]["seed"]: r["per_k"][key][-1] for r in results
                         if (r["summary"]["arm"], r["summary"]["staleness"]) == (arm, n)}  # fmt: skip
                    b = {r["summary"]["seed"]: r["per_k"][key][-1] for r in results
                         if (r["summary"]["arm"], r["summary"]["staleness"]) == (base, n)}  # fmt: skip
                    seeds_ab = sorted(set(a) & set(b))
                    if len(seeds_ab) >= 2:
                        x, y = [a[s] for s in seeds_ab], [b[s] for s in seeds_ab]
                        drift.append((arm, base, label, float(np.mean(x)), float(np.mean(y)), paired_t(x, y)))
            if drift:
                qd = holm([d[-1] for d in drift])
                text += [
                    "",
                    "The mechanism per seed, at the stalest mini-batch (means over rollout steps; continuous, so the "
                    f"paired t-test over the same seeds, Holm over these {len(drift)} rows):",
                    "",
                    "| arm − base | quantity | arm | base | p (Holm) |",
                    "|---|---|---|---|---|",
                ]
                for (arm, base, label, x, y, _), q in zip(drift, qd, strict=True):
                    pq = f"**{q:.3g}**" if q < 0.05 else f"{q:.3g}"
                    text.append(f"| {arm} − {base} | {label} | {x:.3g} | {y:.3g} | {pq} |")
        text.append("")
        if n > 1:
            ks = [k for k in K_SHOWN if k < n]
            text += [
                f"## N = {n}: per mini-batch index k (means over seeds and rollout steps)",
                "",
                "g-share = ||u_g|| / (||u_g|| + ||u_m||), the current gradient's share of the Adam step (1 = no "
                "momentum); ||u_g|| / ||update|| = the current gradient's part of the step over the step actually "
                "taken; grad = gradient norm after clipping.",
                "",
                "| arm | quantity | " + " | ".join(f"k={k}" for k in ks) + " |",
                "|---|---|" + "---|" * len(ks),
            ]
            for arm in arms:
                if not any((r["arm"], r["staleness"]) == (arm, n) for r in rows):
                    continue
                per = {key: _mean_k(results, arm, n, key) for key in
                       ("momentum_share", "update_g_norm", "update_norm", "grad_norm_clipped", "log_w_mean",
                        "mean_phi")}  # fmt: skip
                ratio = per["update_g_norm"] / np.maximum(per["update_norm"], 1e-300)
                for label, vals in (("g-share", per["momentum_share"]), ("‖u_g‖/‖update‖", ratio),
                                    ("grad", per["grad_norm_clipped"]), ("update", per["update_norm"]),
                                    ("mean log W", per["log_w_mean"]), ("φ̄", per["mean_phi"])):  # fmt: skip
                    if np.all(np.isnan(vals)):
                        continue
                    text.append(f"| {arm} | {label} | " + " | ".join(f"{vals[k]:.2g}" for k in ks) + " |")
            text.append("")
    (out / "results.md").write_text("\n".join(text) + "\n")
    (out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    with (out / "per_k.csv").open("w", newline="") as f:
        w = csv.writer(f)
        keys = list(results[0]["per_k"])
        w.writerow(["arm", "staleness", "seed", "k", *keys])
        for r in results:
            s = r["summary"]
            for k in range(s["staleness"]):
                w.writerow([s["arm"], s["staleness"], s["seed"], k, *(r["per_k"][key][k] for key in keys)])
    _plot(results, arms, max(ns), out)
    return "\n".join(text)


def _plot(results: list[dict], arms: list[str], n: int, out: Path) -> None:
    from vespo.plots import Panel, Series, category_color, panel_figure, save_figure

    keys = (("momentum_share", "g-share of the step", (0.0, 1.0), None),
            ("update_g_norm", "‖u_g‖ (current gradient's part)", None, "log"),
            ("update_norm", "update norm", None, "log"),
            ("log_w_mean", "mean sequence log W", None, None))  # fmt: skip
    panels = []
    for key, label, bounds, scale in keys:
        panel = Panel(label, "mini-batch index k", label, bounds=bounds, yscale=scale)
        for i, arm in enumerate(arms):
            if any((r["summary"]["arm"], r["summary"]["staleness"]) == (arm, n) for r in results):
                vals = _mean_k(results, arm, n, key)
                panel.series[arm] = Series(np.arange(len(vals)), vals, style={"color": category_color(i)})
        panels.append(panel)
    save_figure(panel_figure([panels], title=f"N = {n}, means over seeds and rollout steps"), out / "lab_mechanism.png")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument(
        "--num-mini-batches",
        "--staleness",
        type=int,
        nargs="+",
        default=[64],
        help="values of N, the mini-batches per rollout step (--staleness: old name, deprecated)",
    )
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out-dir", type=Path, default=OUT)
    ap.add_argument("--smoke", action="store_true", help="tiny cells, one seed, in seconds (CI)")
    a = ap.parse_args()
    warn_renamed(ap.prog, sys.argv[1:], {"--staleness": "--num-mini-batches"})
    seeds, ns = ([0], [2]) if a.smoke else (a.seeds, a.num_mini_batches)
    cmd = f"python benchmarks/bench_lab_mechanism.py --seeds {' '.join(map(str, seeds))} --num-mini-batches "
    cmd += " ".join(map(str, ns))
    print(report(run(seeds, ns, a.jobs, a.out_dir, a.smoke), a.out_dir, cmd))

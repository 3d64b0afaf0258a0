"""The long-regime cell's cost (issue 39): one rollout step of a `paper-long` cell, code at REV against this checkout.

One command: `python benchmarks/bench_long_cell.py [--before REV] [--repeats 3] [--staleness 64] [--after-flags
...]`. Runs the first rollout step of the `vespo sweep --preset paper-long` cell (VESPO, seed 0: the 41-step chain,
128-token responses, 8 prompts x 8 responses per mini-batch, N mini-batches: generation of 64 N sequences, then N
optimizer steps), as the sweep runs it (a fresh `vespo train` process on one torch thread, the preset's config from
`sweep.train_config`, with evaluation, checkpoints and the gradient probe off), with the code at REV and with this
checkout, alternating, and reports each arm's wall time and the phases the loop logs (generation, update). A full
cell is 8 such rollout steps plus 5 evaluations and process start. `--after-flags` adds `vespo train` flags to this
checkout's arm only (`--before HEAD --after-flags --bypass-mode`: what bypass mode saves on the same code). The warm
start is the preset's, shared by both arms (built first if missing: ~10-17 min on one core). Writes
benchmarks/results/long_cell.{json,md} (with `--after-flags`: long_cell_<flags>.*). The code at REV is read with
`git archive` (the repository is not touched). `--smoke --out-dir DIR`: REV = HEAD, the 3-step chain at N = 2 on a
2-step warm start in DIR, one repeat (CI).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_workbench_speed import _checkout

from vespo.experiments.sweep import cells, preset_config, resolve, train_config
from vespo.outputs import write_atomic
from vespo.train.config_io import to_yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"


def _flags(staleness: int, cache: Path, smoke: bool, tmp: Path) -> list[str]:
    """The preset cell's `vespo train` flags (its config, written into `tmp`), cut to one rollout step with nothing
    but generation and the update."""
    fields = {"num_operands": 3, "ppo_mini_batch_size": 2, "rollout_n": 2} if smoke else {}
    cfg = resolve(preset_config("paper-long", variants=("vespo",), num_mini_batches=(staleness,), seeds=(0,),
                                cache_dir=str(cache), out_dir=str(cache / "unused"), **fields))  # fmt: skip
    cut = {"total_training_steps": 1, "eval_every": 0, "probe_every": 0, "save_every": 1000}
    if smoke:
        cut["sft_steps"] = 2
    path = tmp / "cell.yaml"
    write_atomic(path, to_yaml(dataclasses.replace(train_config(cfg, cells(cfg)[0]), run_dir=None, **cut)))
    return ["--config", str(path)]


def _run(src: Path, argv: list[str], run_dir: Path) -> dict:
    code = f"import sys; from vespo.cli import main; sys.exit(main({['train', *argv, '--run-dir', str(run_dir)]!r}))"
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], env=os.environ | {"PYTHONPATH": str(src)},
                          capture_output=True, text=True)  # fmt: skip
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"the cell failed with {src}:\n{done.stderr[-2000:]}")
    row = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    keep = ("time/step_s", "time/gen_s", "time/update_s", "reward/mean", "response/length_mean", "loss/pg")
    return {"wall_s": wall} | {k: row[k] for k in keep if k in row}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", default="d1f0aa5", help="git revision to compare against")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--staleness", type=int, default=64)
    p.add_argument("--out-dir", type=Path, default=OUT, help="where long_cell.{json,md} go")
    p.add_argument("--cache-dir", type=Path, default=None, help="warm-start cache (default: vespo's)")
    p.add_argument("--smoke", action="store_true", help="REV = HEAD, a tiny cell, one repeat (CI)")
    p.add_argument(
        "--after-flags",
        nargs=argparse.REMAINDER,
        default=[],
        help="vespo train flags for this checkout's arm only (last on the line), e.g. --bypass-mode",
    )
    args = p.parse_args()
    if args.smoke:
        args.before, args.repeats, args.staleness = "HEAD", 1, 2
        args.out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=args.out_dir if args.smoke else None))
    cache = args.cache_dir or (tmp / "cache" if args.smoke else Path.home() / ".cache" / "vespo")
    argv = _flags(args.staleness, cache, args.smoke, tmp)
    _checkout(args.before, tmp / "before")
    arms = {"before": tmp / "before" / "src", "after": ROOT / "src"}
    runs: dict[str, list[dict]] = {name: [] for name in arms}
    for i in range(args.repeats):
        for name, src in arms.items():
            runs[name].append(_run(src, argv + (args.after_flags if name == "after" else []), tmp / f"{name}{i}"))
            print(name, i, runs[name][-1], flush=True)

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    ratios = {k: med("before", k) / med("after", k) for k in ("wall_s", "time/gen_s", "time/update_s")}
    result = {"before": args.before, "after_flags": args.after_flags, "staleness": args.staleness, "runs": runs,
              "speedup": ratios,
              "load": os.getloadavg()}  # fmt: skip
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = "_".join(["long_cell", *(f.strip("-") for f in args.after_flags)])  # long_cell_bypass-mode.md, ...
    write_atomic(args.out_dir / f"{stem}.json", json.dumps(result, indent=2, default=str))
    md = [
        f"One rollout step of the `paper-long` cell at N = {args.staleness} (VESPO, seed 0; "
        f"`python benchmarks/bench_long_cell.py --before {args.before} --staleness {args.staleness}"
        f"{' --after-flags ' + ' '.join(args.after_flags) if args.after_flags else ''}`), arms alternated, "
        f"{args.repeats} repeats, "
        f"one torch thread each, load average {result['load'][0]:.1f} on 2 cores at the end. Medians, seconds:",
        "",
        "| arm | process wall | generation | update | training reward |",
        "|---|---|---|---|---|",
    ]
    flags = f", {' '.join(args.after_flags)}" if args.after_flags else ""
    for name in arms:
        label = f"before ({args.before})" if name == "before" else f"after (this checkout{flags})"
        md.append(f"| {label} | {med(name, 'wall_s'):.1f} | {med(name, 'time/gen_s'):.1f} | "
                  f"{med(name, 'time/update_s'):.1f} | {med(name, 'reward/mean'):.4f} |")  # fmt: skip
    md += ["", "Speed-up (before / after, medians): " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()) + "."]
    write_atomic(args.out_dir / f"{stem}.md", "\n".join(md) + "\n")
    print("\n".join(md))
    shutil.rmtree(tmp)  # the two checkouts and the runs (the warm-start cache is outside it unless --smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())

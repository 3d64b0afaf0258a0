"""Sandbox throughput: programs graded per second, the hardened grader vs the one it replaced, side by side.

Run: `python benchmarks/bench_sandbox.py [--programs 40 --rounds 3]` (about a minute on 2 shared cores); writes
benchmarks/results/sandbox.{json,md}.

The baseline is the previous sandbox (`vespo.sandbox` at commit ``021cfc6``: one ``python -I`` child per
program, results in a JSON file, assertion tests inside the child), read from git and loaded under another name.
Both run the same programs with ``num_workers`` threads, in paired rounds (old, new, new, old) so machine noise hits
both alike; the ratio is the median of the per-round ratios. Workloads: stdin/stdout (a+b, 4 cases), function call
(4 cases) and assertion tests (HumanEval-style ``check(candidate)``, which now also starts the trusted checker).
`--smoke --out-dir DIR`: 2 programs, one paired round, one worker (seconds; CI).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from vespo.rewards import run_in_sandbox

RESULTS = Path(__file__).parent / "results"
BASELINE_COMMIT = "021cfc6"
STDIO = ("a, b = map(int, input().split())\nprint(a + b)\n", [f"{i} {i}\n" for i in range(4)])
CALL = ("def add(a, b):\n    return a + b\n", [[i, i] for i in range(4)])
CHECK = "def check(candidate):\n    for i in range(4):\n        assert candidate(i, i) == 2 * i\n\ncheck(add)\n"


def load_baseline(workdir: Path):
    """The pre-hardening sandbox module, from git, importable as ``vespo_baseline_sandbox``."""
    repo = Path(__file__).resolve().parents[1]
    package = workdir / "vespo_baseline_sandbox"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("sandbox.py", "_sandbox_child.py"):
        text = subprocess.run(
            ["git", "-C", str(repo), "show", f"{BASELINE_COMMIT}:src/vespo/rewards/{name}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        (package / name).write_text(
            text.replace(
                "from vespo.rewards import _sandbox_child", "from vespo_baseline_sandbox import _sandbox_child"
            )
        )
    sys.path.insert(0, str(workdir))
    return importlib.import_module("vespo_baseline_sandbox.sandbox").run_in_sandbox


def workloads(old: bool) -> dict[str, tuple[str, list, str, str | None]]:
    """name -> (program, cases, mode, fn_name) in the format of the old or the new API."""
    check = CHECK if old else {"test": CHECK, "entry_point": "add"}
    return {
        "stdio": (*STDIO, "stdio", None),
        "call": (*CALL, "call", "add"),
        "assert": (CALL[0], [check], "assert", None),
    }


def runs_per_s(run, workload, programs: int, workers: int) -> float:
    program, cases, mode, fn_name = workload
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda _: run(program, cases, mode=mode, fn_name=fn_name), range(programs)))
    elapsed = time.perf_counter() - start
    bad = [r.errors for r in results if any(r.errors)]
    assert not bad, bad[:1]
    return programs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=40, help="programs per timed batch")
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds (old, new, new, old) per workload")
    parser.add_argument("--workers", type=int, default=2, help="sandboxes at once (the machine has 2 cores)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="where sandbox.{json,md} go")
    parser.add_argument("--smoke", action="store_true", help="2 programs, one round, in seconds (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.programs, args.rounds, args.workers = 2, 1, 1
    warm = min(4, args.programs)
    with tempfile.TemporaryDirectory() as tmp:
        old_run = load_baseline(Path(tmp))
        rows = []
        for name in workloads(old=False):
            old_w, new_w = workloads(old=True)[name], workloads(old=False)[name]
            runs_per_s(old_run, old_w, warm, args.workers), runs_per_s(run_in_sandbox, new_w, warm, args.workers)
            old, new = [], []
            for _ in range(args.rounds):
                a = runs_per_s(old_run, old_w, args.programs, args.workers)
                b = runs_per_s(run_in_sandbox, new_w, args.programs, args.workers)
                b2 = runs_per_s(run_in_sandbox, new_w, args.programs, args.workers)
                a2 = runs_per_s(old_run, old_w, args.programs, args.workers)
                old += [a, a2]
                new += [b, b2]
            ratios = [o / n for o, n in zip(old, new, strict=True)]
            rows.append(
                {
                    "workload": name,
                    "old_runs_per_s": statistics.median(old),
                    "new_runs_per_s": statistics.median(new),
                    "slowdown_median_of_ratios": statistics.median(ratios),
                    "old_rounds": old,
                    "new_rounds": new,
                }
            )
            print(
                f"{name:7s} old {rows[-1]['old_runs_per_s']:6.1f}/s  new {rows[-1]['new_runs_per_s']:6.1f}/s  "
                f"slowdown x{rows[-1]['slowdown_median_of_ratios']:.2f}"
            )
    meta = {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "root": os.geteuid() == 0,
        "programs": args.programs,
        "rounds": args.rounds,
        "workers": args.workers,
        "baseline": BASELINE_COMMIT,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "sandbox.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = ["| workload | old runs/s | new runs/s | slowdown (median of paired ratios) |", "|---|---|---|---|"]
    lines += [
        f"| {r['workload']} | {r['old_runs_per_s']:.1f} | {r['new_runs_per_s']:.1f} | "
        f"x{r['slowdown_median_of_ratios']:.2f} |"
        for r in rows
    ]
    (args.out_dir / "sandbox.md").write_text(
        f"Sandbox throughput, {meta['workers']} workers, {meta['programs']} programs x {2 * meta['rounds']} "
        f"batches per side, root={meta['root']}, {meta['machine']}\n\n" + "\n".join(lines) + "\n"
    )


if __name__ == "__main__":
    main()

"""The README's command 1, `vespo train` with no arguments, run as a user runs it, and its metrics as a summary.

`python benchmarks/bench_default_train.py` runs `vespo train --no-progress` in a fresh directory (so the run dir is
the default `runs/vespo`, the warm start the default cache's) and writes
benchmarks/results/default_train/summary.json: the training reward per step, the held-out accuracy per evaluation,
and the README's two summaries of them (training reward: mean of the first 5 and of the last 10 steps; held-out: the
first and the last evaluation), with the CPU it ran on (`vespo.machine.cpu_signature`). The run is deterministic on
its one torch thread and one CPU, so the same commit on the same kind of CPU gives the same file (another vector ISA
sums in another order and the sampled tokens drift apart); `docs/gen_results.py` puts its numbers in the README and
tests/e2e/test_readme.py reruns its first steps against it.
`--steps K` runs only the first K steps (`--total-training-steps K`), `--smoke --out-dir DIR` two steps into DIR.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from vespo.machine import cpu_signature
from vespo.outputs import write_atomic

OUT = Path(__file__).resolve().parent / "results" / "default_train"
FIRST, LAST = 5, 10  # steps averaged at the start and at the end of the training-reward curve


def run(extra: list[str], workdir: Path) -> list[dict]:
    """Run `vespo train --no-progress *extra` in `workdir` (this interpreter's vespo) and return its metrics rows."""
    command = [sys.executable, "-m", "vespo", "train", "--no-progress", *extra]
    subprocess.run(command, cwd=workdir, check=True)
    return [json.loads(line) for line in (workdir / "runs" / "vespo" / "metrics.jsonl").read_text().splitlines()]


def summarise(rows: list[dict]) -> dict:
    """Training reward per step, held-out accuracy per evaluation, and the README's summaries of both."""
    reward = {r["step"]: r["reward/mean"] for r in rows if "reward/mean" in r}
    heldout = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    steps = sorted(reward)
    first = [reward[s] for s in steps[:FIRST]]
    last = [reward[s] for s in steps[-LAST:]]
    evals = sorted(heldout)
    return {
        "steps": len(steps),
        "reward_per_step": [reward[s] for s in steps],
        "heldout_per_eval": {str(s): heldout[s] for s in evals},
        "reward_first": sum(first) / len(first),
        "reward_last": sum(last) / len(last),
        "heldout_first": heldout[evals[0]] if evals else None,
        "heldout_last": heldout[evals[-1]] if evals else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, default=OUT, help="where summary.json goes")
    ap.add_argument("--steps", type=int, default=None, help="run only the first K steps (--total-training-steps K)")
    ap.add_argument("--smoke", action="store_true", help="two steps, no evaluation after step 0 (CI)")
    args = ap.parse_args(argv)
    extra = ["--total-training-steps", "2", "--eval-every", "0"] if args.smoke else []
    if args.steps is not None:
        extra += ["--total-training-steps", str(args.steps)]
    with tempfile.TemporaryDirectory(prefix="vespo-command1-") as tmp:
        rows = run(extra, Path(tmp))
    summary = {"command": "vespo train" + "".join(f" {a}" for a in extra), "cpu": cpu_signature(), **summarise(rows)}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out_dir / "summary.json", json.dumps(summary, indent=1) + "\n")
    print(
        f"{summary['command']}: training reward {summary['reward_first']:.3f} -> {summary['reward_last']:.3f}, "
        f"held-out {summary['heldout_first']} -> {summary['heldout_last']} ({args.out_dir / 'summary.json'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

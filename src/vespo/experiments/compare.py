"""`vespo compare`: which differences in a sweep's results survive a significance test.

Reads a sweep's results.csv (one row per cell: variant, N, seed, metrics), compares every variant with a baseline at
every N by Welch's t-test or a paired bootstrap over seeds, corrects for the number of comparisons (Holm), and writes
a markdown table where bold means significant at the stated level, nothing else.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from vespo.experiments.stats import compare, format_ci, markdown_grid
from vespo.outputs import check_output_file, write_atomic

METRICS = ("final_eval_acc", "best_eval_acc", "final_train_reward")


def load_groups(path: Path, metric: str) -> dict[tuple[str, object], dict[int, float]]:
    """results.csv -> {(variant, N): {seed: value}}; a one-line ValueError for a missing file or column."""
    try:
        rows = list(csv.DictReader(path.open(newline="")))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not rows:
        raise ValueError(f"{path}: no rows")
    missing = [k for k in ("variant", "N", "seed", metric) if k not in rows[0]]
    if missing:
        raise ValueError(f"{path}: no column(s) {missing}; columns are {list(rows[0])}")
    groups: dict[tuple[str, object], dict[int, float]] = {}
    for r in rows:
        groups.setdefault((r["variant"], int(r["N"])), {})[int(r["seed"])] = float(r[metric])
    return groups


def markdown(groups, baseline: str, test: str, metric: str, alpha: float = 0.05) -> str:
    """The comparison table: per variant and N, mean ± 95% CI and the difference to the baseline with its
    Holm-adjusted p-value; bold = significant at `alpha` after correction."""
    results = compare(groups, baseline, test=test)
    ns = sorted({n for _, n in groups})
    variants = list(dict.fromkeys(v for v, _ in groups))
    by = {(c.method, c.column): c for c in results}
    name = {"welch": "Welch's t-test (unpaired)", "bootstrap": "paired bootstrap over seeds (10,000 resamples)"}[test]
    lines = [
        f"### {metric}: each variant vs `{baseline}`",
        "",
        f"Test: {name}, two-sided, Holm-corrected over {len(results)} comparisons, alpha = {alpha}. "
        "Cells: mean ± 95% CI over seeds; below it the difference to the baseline and its adjusted p-value. "
        "**Bold** = significant after correction; nothing else is bold.",
        "",
    ]

    def cell(v: str, n: int) -> str:
        values = groups.get((v, n))
        if values is None:
            return "–"
        text = format_ci(list(values.values()))
        c = by.get((v, n))
        if c is not None:
            delta = f"{c.diff:+.3f}, p={c.p_adjusted:.3g}"
            text += f"<br>{'**' + delta + '**' if c.significant(alpha) else delta}"
        return text

    lines += markdown_grid(variants, ns, cell)
    return "\n".join(lines) + "\n"


def cli(argv: list[str]) -> int:
    """`vespo compare RESULTS.csv [--baseline grpo] [--metric final_eval_acc] [--test welch|bootstrap]`."""
    p = argparse.ArgumentParser(prog="vespo compare", description=__doc__.split("\n")[0])
    p.add_argument("results", type=Path, help="a sweep's results.csv")
    p.add_argument("--baseline", default="grpo", help="variant every other variant is compared with")
    p.add_argument("--metric", choices=METRICS, default="final_eval_acc")
    p.add_argument("--test", choices=("welch", "bootstrap"), default="welch")
    p.add_argument("--alpha", type=float, default=0.05, help="family-wise significance level, in (0, 1)")
    p.add_argument("--out", type=Path, default=None, help="write the table here (markdown) as well as to stdout")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file (never the input)")
    args = p.parse_args(argv)
    if not 0 < args.alpha < 1:
        p.error(f"--alpha must be in (0, 1), got {args.alpha}")
    try:
        if args.out is not None:
            check_output_file(args.out, label="--out", inputs=[args.results], overwrite=args.overwrite)
        groups = load_groups(args.results, args.metric)
    except ValueError as exc:
        p.error(str(exc))
    if not any(v == args.baseline for v, _ in groups):
        p.error(f"--baseline {args.baseline!r} is not a variant of {args.results}: {sorted({v for v, _ in groups})}")
    text = markdown(groups, args.baseline, args.test, args.metric, args.alpha)
    sys.stdout.write(text)
    if args.out is not None:
        write_atomic(args.out, text)
    return 0

"""`vespo compare`: which differences in a sweep's results survive a significance test.

Reads a sweep's results.csv (one row per cell: variant, N, seed, metrics), compares every variant with a baseline at
every N with the test that fits the design (`--test auto`, `vespo.experiments.stats.choose_test`: paired t over
shared seeds, Fisher's exact test on collapse counts where a seed collapsed; or a test named with `--test`),
corrects for the number of comparisons (Holm), and writes a markdown table where bold means significant at the
stated level, nothing else; then the regime diagnostics per variant and N when results.csv has them.
"""

from __future__ import annotations

import csv
import io
import math
import re
import sys
from pathlib import Path

import numpy as np

from vespo.argv import ArgumentParser
from vespo.experiments.stats import TEST_NAMES, TESTS, compare, format_ci, markdown_grid
from vespo.outputs import check_output_file, read_regular, write_atomic

METRICS = ("final_eval_acc", "best_eval_acc", "final_train_reward")
COLLAPSE_METRICS = ("final_eval_acc", "final_train_reward", "final_reward")
"""Metrics a collapse makes bimodal (a collapsed seed ends near 0): compared on collapse counts where a seed collapsed.
A collapse is the run's own flag (`collapsed` in results.csv: final held-out accuracy, or the lab's final E[R],
below `collapse_ratio` x its start, 0.5 by default); the best checkpoint is usually taken before a collapse, so
`best_eval_acc` keeps the paired t-test."""
DIAGNOSTICS = (
    ("grad_clipped_frac", "clip"),
    ("kl_mu_pi_stalest", "KL"),
    ("log_w_std_stalest", "sd log W"),
    ("mean_phi_stalest", "φ̄"),
    ("momentum_share_stalest", "g-share"),
    ("clip_frac_stalest", "tok-clip"),
    ("probe_cos_grpo", "cos·GRPO"),
    ("probe_cos_reinforce", "cos·REINF"),
)
"""Regime diagnostics of a cell summary (`vespo.diagnostics`) and their short table labels: share of optimizer steps
cut by grad_clip; at the stalest mini-batch, k3 KL(mu || pi) per token, std of log W over sequences, mean phi (VESPO
family), the share of the optimizer step from the current gradient rather than Adam's momentum, the share of tokens a
clipping method clipped, and the gradient probe's cosines of the method's gradient to GRPO's and plain REINFORCE's
(the direct measure of whether a table can tell the methods apart)."""
DIAGNOSTICS_NOTE = (
    "clip = share of optimizer steps cut by grad_clip; at the stalest mini-batch (mean over rollout steps): KL = k3 "
    "KL(mu || pi) per token, sd log W = std of sequence log W, φ̄ = mean VESPO weight, g-share = share of the "
    "optimizer step from the current gradient rather than momentum, tok-clip = share of tokens the method clipped; "
    "cos·GRPO, cos·REINF = cosine of the method's gradient to GRPO's and plain REINFORCE's on the same stale "
    "mini-batch and weights (gradient probe; 1 = the same update) (`vespo.diagnostics`)"
)


MAX_RESULTS_BYTES = 64 << 20
"""Largest results.csv `load_rows` reads: a cell's row is ~1 KB, so ~60,000 cells (the paper's long table has 163)."""
_INTEGER = re.compile(r"-?[0-9]+")


def load_rows(path: Path, metric: str) -> list[dict]:
    """results.csv rows, each checked: a variant name, N and seed as integers (a sweep writes 4, never 4.0), `metric`
    a finite number, `collapsed` (when present) a boolean, and no (variant, N, seed) twice (a later row would
    silently replace an earlier one's seed). A one-line ValueError naming the row (its line) and the field otherwise,
    and for a missing file or column. Read as a regular file (never a FIFO or a symlink) of at most
    `MAX_RESULTS_BYTES`."""
    try:
        text = read_regular(path, cap=MAX_RESULTS_BYTES).decode()
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    if not rows:
        raise ValueError(f"{path}: no rows")
    missing = [k for k in ("variant", "N", "seed", metric) if k not in rows[0]]
    if missing:
        raise ValueError(f"{path}: no column(s) {missing}; columns are {list(rows[0])}")
    seen: dict[tuple, int] = {}
    for line, row in enumerate(rows, 2):  # line 1 is the header
        problem = _row_problem(row, metric)
        if problem:
            raise ValueError(f"{path}:{line}: {problem}")
        key = (row["variant"], int(row["N"]), int(row["seed"]))
        if key in seen:
            raise ValueError(
                f"{path}:{line}: variant {key[0]!r} at N = {key[1]}, seed {key[2]} is also on line {seen[key]}; each "
                "(variant, N, seed) must appear once (merge slices with their own tool, which refuses overlaps)"
            )
        seen[key] = line
    return rows


def _row_problem(row: dict, metric: str) -> str | None:
    """What is wrong with one results.csv row (None: nothing), naming the field."""
    if None in row or any(v is None for v in row.values()):
        return f"has {'more' if None in row else 'fewer'} fields than the header"
    if not row["variant"].strip():
        return "variant is empty"
    for name in ("N", "seed"):
        if not _INTEGER.fullmatch(row[name]):
            return f"{name} must be an integer (as the sweep writes it), got {row[name]!r:.40}"
    try:
        value = float(row[metric])
    except ValueError:
        return f"{metric} must be a number, got {row[metric]!r:.40}"
    if not math.isfinite(value):
        return f"{metric} must be finite, got {row[metric]!r:.40}"
    if "collapsed" in row and row["collapsed"].strip().lower() not in _FLAGS:
        return f"collapsed must be True/False or 1/0, got {row['collapsed']!r:.40}"
    return None


def load_groups(path: Path, metric: str) -> dict[tuple[str, object], dict[int, float]]:
    """results.csv -> {(variant, N): {seed: value}}; a one-line ValueError for a missing file or column."""
    return _groups(load_rows(path, metric), metric)


def _groups(rows: list[dict], column: str, convert=float) -> dict[tuple[str, object], dict[int, object]]:
    groups: dict[tuple[str, object], dict[int, object]] = {}
    for r in rows:
        groups.setdefault((r["variant"], int(r["N"])), {})[int(r["seed"])] = convert(r[column])
    return groups


def comparison_inputs(rows: list[dict], metric: str) -> tuple[dict, dict | None]:
    """results.csv rows -> (`{(variant, N): {seed: value}}`, the collapse flags `{(variant, N): {seed: bool}}` when
    the metric is one a collapse makes bimodal and the rows have them, else None): what `markdown` and
    `vespo.experiments.stats.compare` take, so every table of a sweep is tested the same way."""
    bimodal = "collapsed" in rows[0] and metric in COLLAPSE_METRICS
    return _groups(rows, metric), (_groups(rows, "collapsed", _flag) if bimodal else None)


_FLAGS = ("true", "false", "1", "0", "1.0", "0.0")


def _flag(text: str) -> bool:
    """A results.csv boolean: True/False (sweep) or 1/0 (lab); `load_rows` refuses anything else."""
    return text.strip().lower() in ("true", "1", "1.0")


def design_statement(results, test: str, alpha: float) -> str:
    """The one line a table states its test with, and why it fits."""
    used = sorted({c.test for c in results}, key=list(TEST_NAMES).index)
    if test != "auto":
        why = {"welch": "unpaired", "fisher": "collapse counts"}.get(test, "paired over the seeds both sides ran")
        head = f"Test: {TEST_NAMES[test]} ({why})"
    else:
        head = (
            "Test per comparison, by design: a seed fixes the initial policy and random streams of every method, so "
            "runs sharing seeds are paired (paired t-test); where a seed collapsed the outcome is bimodal (Fisher's "
            "exact test on collapsed seeds); Welch's t-test where the seeds differ. Used here: "
            + (", ".join(f"{TEST_NAMES[t]} [{_TAG[t]}]" for t in used) or "none")
        )
    return f"{head}; two-sided, Holm-corrected over {len(results)} comparisons, alpha = {alpha}."


_TAG = {"paired_t": "t", "wilcoxon": "W", "bootstrap": "B", "welch": "Welch", "fisher": "F"}


def markdown(groups, baseline: str, test: str, metric: str, alpha: float = 0.05, *, collapsed=None) -> str:
    """The comparison table: per variant and N, mean ± 95% CI and the difference to the baseline with its
    Holm-adjusted p-value and the test's tag (and for Fisher the collapsed seeds per side); bold = significant at
    `alpha` after correction. `collapsed` = {(variant, N): {seed: bool}} enables Fisher's test (`--test auto`)."""
    results = compare(groups, baseline, test=test, collapsed=collapsed)
    ns = sorted({n for _, n in groups})
    variants = list(dict.fromkeys(v for v, _ in groups))
    by = {(c.method, c.column): c for c in results}
    lines = [
        f"### {metric}: each variant vs `{baseline}`",
        "",
        design_statement(results, test, alpha)
        + " Cells: mean ± 95% CI over seeds; below it the difference to the baseline, the adjusted p-value and the "
        "test [tag]. **Bold** = significant after correction; nothing else is bold.",
        "",
    ]

    def cell(v: str, n: int) -> str:
        values = groups.get((v, n))
        if values is None:
            return "–"
        text = format_ci(list(values.values()))
        c = by.get((v, n))
        if c is not None:
            delta = f"{c.diff:+.3f}, p={c.p_adjusted:.3g} [{_TAG[c.test]}]"
            if c.test == "fisher" and c.collapsed is not None:
                delta = f"✗ {c.collapsed[0]}/{c.n[0]} vs {c.collapsed[1]}/{c.n[1]}, " + delta
            text += f"<br>{'**' + delta + '**' if c.significant(alpha) else delta}"
        return text

    lines += markdown_grid(variants, ns, cell)
    return "\n".join(lines) + "\n"


def diagnostics_markdown(cells: dict[tuple[str, object], list[dict]], title: str, first: str = "variant") -> str:
    """The regime diagnostics (`DIAGNOSTICS`) per row and column, means over seeds: `cells[(row, N)]` = the summary
    rows of that cell's seeds. Empty when no summary has a diagnostic (results written before they existed)."""
    present = [(k, label) for k, label in DIAGNOSTICS if any(k in r for rows in cells.values() for r in rows)]
    if not present:
        return ""

    def cell(row: str, n: object) -> str:
        parts = []
        for key, label in present:
            values = [float(r[key]) for r in cells.get((row, n), []) if r.get(key) not in (None, "")]
            values = [v for v in values if math.isfinite(v)]
            if values:
                parts.append(f"{label} {np.mean(values):.3g}")
        return " · ".join(parts) or "–"

    rows = list(dict.fromkeys(r for r, _ in cells))
    ns = sorted({n for _, n in cells})
    lines = [f"### {title}: regime diagnostics (mean over seeds)", "", DIAGNOSTICS_NOTE + ".", ""]
    return "\n".join([*lines, *markdown_grid(rows, ns, cell, first)]) + "\n"


def cli(argv: list[str]) -> int:
    """`vespo compare RESULTS.csv [--baseline grpo] [--metric final_eval_acc] [--test auto|paired_t|...]`."""
    p = ArgumentParser(prog="vespo compare", description=__doc__.split("\n")[0])
    p.add_argument("results", type=Path, help="a sweep's results.csv")
    p.add_argument("--baseline", default="grpo", help="variant every other variant is compared with")
    p.add_argument("--metric", choices=METRICS, default="final_eval_acc")
    p.add_argument(
        "--test",
        choices=TESTS,
        default="auto",
        help="auto: paired t over shared seeds, Fisher's exact test on collapse counts where a seed collapsed (final "
        "metrics), Welch where seeds differ; or one test for every comparison",
    )
    p.add_argument("--alpha", type=float, default=0.05, help="family-wise significance level, in (0, 1)")
    p.add_argument("--out", type=Path, default=None, help="write the table here (markdown) as well as to stdout")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file (never the input)")
    args = p.parse_args(argv)
    if not 0 < args.alpha < 1:
        p.error(f"--alpha must be in (0, 1), got {args.alpha}")
    try:
        if args.out is not None:
            check_output_file(args.out, label="--out", inputs=[args.results], overwrite=args.overwrite)
        rows = load_rows(args.results, args.metric)
    except ValueError as exc:
        p.error(str(exc))
    groups, collapsed = comparison_inputs(rows, args.metric)
    if not any(v == args.baseline for v, _ in groups):
        p.error(f"--baseline {args.baseline!r} is not a variant of {args.results}: {sorted({v for v, _ in groups})}")
    if args.test == "fisher" and collapsed is None:
        p.error(f"--test fisher needs a `collapsed` column and a final metric ({', '.join(COLLAPSE_METRICS[:2])})")
    text = markdown(groups, args.baseline, args.test, args.metric, args.alpha, collapsed=collapsed)
    cells: dict[tuple[str, object], list[dict]] = {}
    for r in rows:
        cells.setdefault((r["variant"], int(r["N"])), []).append(r)
    regime = diagnostics_markdown(cells, args.metric)
    text += "\n" + regime if regime else ""
    sys.stdout.write(text)
    if args.out is not None:
        write_atomic(args.out, text)
    return 0

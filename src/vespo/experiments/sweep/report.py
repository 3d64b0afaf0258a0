"""A sweep's tables: each cell summarised from its metrics (`summarize`, with the regime diagnostics a gate checks),
then results.csv and results.md over the grid."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np

from vespo.experiments.sweep.config import Cell
from vespo.outputs import read_regular, write_atomic

PROBE_METRICS = ("cos_grpo", "cos_reinforce", "cos_grpo_reinforce", "rel_diff_grpo", "rel_diff_reinforce",
                 "cos_split_half")  # fmt: skip
"""The gradient probe's metrics (`vespo.diagnostics.gradient_probe`) a cell summary reports as `probe_<name>`."""


def regime_summary(rows: list[dict]) -> dict:
    """A run's regime diagnostics from its metrics rows: the share of optimizer steps cut by grad_clip; the
    diagnostics of the stalest mini-batch (`vespo.diagnostics`), means over rollout steps; the gradient probe's, means
    over the probed steps (None where not logged: mean phi or the token clip share of a method without them, a run
    without probes or whose probed batches had no gradient, or metrics that predate them). What `gate` checks."""
    from vespo.diagnostics import MEAN_PHI, PROBE_PREFIX

    def mean(key: str) -> float | None:  # over the steps that logged a finite value (nan: undefined at that step)
        values = [r[key] for r in rows if key in r and np.isfinite(r[key])]
        return float(np.mean(values)) if values else None

    def stalest(key: str) -> float | None:
        return mean(f"{key}/last_mini_batch")

    clipped = [r["actor/grad_clipped"] for r in rows if "actor/grad_clipped" in r]
    return {
        "grad_clipped_frac": float(np.mean(clipped)) if clipped else float("nan"),
        "kl_mu_pi_stalest": stalest("is/kl_mu_pi"),
        "log_w_std_stalest": stalest("is/log_w_std"),
        "mean_phi_stalest": stalest(MEAN_PHI),
        "momentum_share_stalest": stalest("actor/momentum_share"),
        "clip_frac_stalest": stalest("clip/frac"),
        **{f"probe_{name}": mean(f"{PROBE_PREFIX}{name}") for name in PROBE_METRICS},
    }


def summarize(cell: Cell, rows: list[dict], collapse_ratio: float) -> dict:
    """Final training reward (mean of the last quarter of rollout steps); held-out accuracy at the start, at the end
    (final checkpoint) and at its best evaluation (the paper's checkpoint selection); collapse; the mean response
    length over the first and the last fifth of rollout steps; the regime diagnostics (`regime_summary`)."""
    from vespo.losses import default_loss_agg_mode

    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    tail = rewards[-max(1, len(rewards) // 4) :]
    lengths = [r["response/length_mean"] for r in rows if "response/length_mean" in r]
    regime = regime_summary(rows)
    return {
        "task": cell.task,
        "variant": cell.variant,
        "method": cell.method,
        "loss_agg_mode": cell.settings.get("loss_agg_mode") or default_loss_agg_mode(cell.method),
        "N": cell.num_mini_batches,
        "seed": cell.seed,
        "rollout_steps": len(rewards),
        "final_train_reward": float(np.mean(tail)),
        "initial_eval_acc": evals[0],
        "final_eval_acc": evals[-1],
        "best_eval_acc": max(evals[1:] or evals),
        "collapsed": bool(evals[-1] < collapse_ratio * evals[0]),
        "grad_clipped_frac": regime.pop("grad_clipped_frac"),
        "initial_length": float(np.mean(lengths[: max(1, len(lengths) // 5)])) if lengths else float("nan"),
        "final_length": float(np.mean(lengths[-max(1, len(lengths) // 5) :])) if lengths else float("nan"),
        **regime,
    }


def write_tables(out_dir: Path, summaries: list[dict], *, eval_prompts: int = 0) -> None:
    """results.csv (per cell) and results.md: mean ± 95% CI over seeds, one row per variant (its method and
    aggregation said), one column per N, and the evaluation noise floor beside the held-out tables. Differences are
    not marked here: `vespo compare results.csv` tests them."""
    from vespo.experiments.compare import diagnostics_markdown
    from vespo.experiments.stats import format_ci, markdown_grid

    keys = list(dict.fromkeys(k for s in summaries for k in s))  # a cell summarised before a column existed: empty
    f = io.StringIO(newline="")
    w = csv.DictWriter(f, fieldnames=keys, restval="")
    w.writeheader()
    w.writerows(summaries)
    write_atomic(out_dir / "results.csv", f.getvalue())
    ns = sorted({s["N"] for s in summaries})
    names = list(dict.fromkeys(s["variant"] for s in summaries))
    lines = ["Variants: " + "; ".join(_describe(v, summaries) for v in names) + ".", ""]
    steps = {n: max(s["rollout_steps"] for s in summaries if s["N"] == n) for n in ns}
    lines += ["Rollout steps per cell: " + ", ".join(f"N={n}: {steps[n]}" for n in ns) + ".", ""]
    tables = (
        ("final_train_reward", "Final training reward"),
        ("final_eval_acc", "Held-out accuracy, final checkpoint"),
        ("best_eval_acc", "Held-out accuracy, best checkpoint (the paper's selection)"),
        ("grad_clipped_frac", "Share of optimizer steps cut by grad_clip"),
        ("initial_length", "Response length (tokens), first fifth of rollout steps"),
        ("final_length", "Response length (tokens), last fifth of rollout steps"),
    )
    missed = [f"{s['variant']}/N={s['N']}/seed {s['seed']}: {s['gate'].removeprefix('missed: ')}"
              for s in summaries if s.get("gate", "ok") != "ok"]  # fmt: skip
    if any("gate" in s for s in summaries):
        lines += [f"Regime gate: {len(summaries) - len(missed)} of {len(summaries)} cells pass"
                  + (f"; missed: {'; '.join(missed)}." if missed else "."), ""]  # fmt: skip
    for metric, title in tables:

        def cell(v: str, n: int, metric: str = metric) -> str:
            sel = [s for s in summaries if s["variant"] == v and s["N"] == n]
            return format_ci([s[metric] for s in sel]) + " ✗" * sum(s["collapsed"] for s in sel) if sel else "–"

        lines += [f"### {title} (mean ± 95% CI over seeds; ✗ = collapsed seeds)", ""]
        lines += markdown_grid(names, ns, cell)
        lines.append("")
        if "eval" in metric:
            lines += [_noise_floor(summaries, eval_prompts), ""]
        if metric == "best_eval_acc":  # the regime the accuracies were measured in, beside them
            cells = {(v, n): [s for s in summaries if s["variant"] == v and s["N"] == n] for v in names for n in ns}
            lines += [diagnostics_markdown(cells, "Held-out accuracy"), ""]
    write_atomic(out_dir / "results.md", "\n".join(lines) + "\n")


def _describe(variant: str, summaries: list[dict]) -> str:
    s = next(s for s in summaries if s["variant"] == variant)
    return f"`{variant}` = {s['method']} with {s['loss_agg_mode']}"


_SAME_AT_N1 = ("vespo", "grpo", "cispo", "bapo")  # W == 1 on-policy: the same step in exact arithmetic at N = 1


def _noise_floor(summaries: list[dict], eval_prompts: int) -> str:
    """The evaluation's binomial SD at the warm start's accuracy, and the N = 1 gap between methods that take the same
    step there (their difference is noise: seed-level sampling divergence plus evaluation noise)."""
    from vespo.experiments.stats import binomial_sd

    init = float(np.mean([s["initial_eval_acc"] for s in summaries]))
    text = f"Noise floor: warm-start held-out accuracy {init:.3f}"
    if eval_prompts:
        text += f"; binomial SD of one evaluation ({eval_prompts} samples) {binomial_sd(init, eval_prompts):.3f}"
    same = {}
    for s in summaries:
        if s["N"] == 1 and s["variant"] in _SAME_AT_N1:
            same.setdefault(s["variant"], []).append(s["final_eval_acc"])
    if len(same) >= 2:
        means = {v: float(np.mean(x)) for v, x in same.items()}
        text += (
            f"; N = 1 gap between {', '.join(sorted(means))} (identical there): "
            f"{max(means.values()) - min(means.values()):.3f}"
        )
    return text + "."


def read_summary(path: Path) -> dict | None:
    """A cell's summary.json, or None when it is not a regular file holding a JSON object."""
    try:
        saved = json.loads(read_regular(path, 1 << 22))
    except (OSError, ValueError, RecursionError):
        return None
    return saved if isinstance(saved, dict) else None

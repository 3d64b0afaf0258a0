"""`vespo lab`: an exact sequence-level workbench where response length T and N (`num_mini_batches`, the paper's
staleness ratio gbs/mbs) are free knobs.

Two presets (`--preset`): v2 (default, `vespo.experiments.lab_model`) is a shared-parameter autoregressive policy over
a 1,024-token vocabulary with EOS, so length varies and is learned; v1 (below) is the original independent-position
lab, kept so its published results stay reproducible.

The policy is one categorical distribution per position, pi(y) = prod_t softmax(theta_t)[y_t] with theta of shape
(T, V): log-probs are exact and cost a gather, so T = 8192 and N = 64 run in seconds on a CPU. The reward is
verifiable and sequence-level, R(y) = 1[#{t : y_t = 0} >= k], with k set so that the initial policy succeeds about a
quarter of the time. Every registered loss (`vespo.available_methods()`) trains it through `compute_policy_loss`,
with the trainer's protocol: a rollout batch of N mini-batches sampled from mu = pi_old (optionally through a sampler
whose logits carry seeded Gaussian noise: a train-inference mismatch whose per-token KL is computed exactly), group
advantages, then N sequential optimizer steps. Per mini-batch index it records what explains a collapse: sequence
log W, ESS of W, the gradient norm before clipping, the size of the parameter update, and which sequences carry the
gradient (share of the per-sequence score coefficient held by the top 1%).
"""

from __future__ import annotations

import csv
import io
import json
import math
import signal
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from vespo.advantages import group_advantages
from vespo.experiments.compare import diagnostics_markdown
from vespo.experiments.compare import markdown as compare_markdown
from vespo.experiments.grid import GridInterrupted, claim_grid_dir, settings_key
from vespo.experiments.lab_config import LabCell, LabConfig, cells
from vespo.experiments.lab_model import LAB_STEP_METRICS, cell_result, lab_step, run_chain_cell
from vespo.outputs import write_atomic

Tensor = torch.Tensor

# --------------------------------------------------------------------------------------------------------------------
# The exact policy


def init_logits(length: int, vocab: int, p_correct: float, *, seed: int, jitter: float = 0.5) -> Tensor:
    """(T, V) logits whose probability of the correct token (id 0) averages about `p_correct` per position.

    Positions get seeded jitter so they start at different accuracies, as tokens of a real response do.
    """
    gen = torch.Generator().manual_seed(seed)
    logits = torch.zeros(length, vocab, dtype=torch.float64)
    logits[:, 0] = math.log(p_correct * (vocab - 1) / (1.0 - p_correct))
    return logits + jitter * torch.randn(length, vocab, generator=gen, dtype=torch.float64)


def token_log_probs(logits: Tensor, tokens: Tensor) -> Tensor:
    """Exact log pi(y_t) of every token: (T, V) logits, (B, T) tokens -> (B, T); differentiable in `logits`."""
    log_p = torch.log_softmax(logits, dim=-1)  # (T, V)
    return log_p[torch.arange(logits.shape[0]), tokens]  # (B, T)


def sample_tokens(logits: Tensor, count: int, gen: torch.Generator, chunk: int = 64) -> Tensor:
    """`count` i.i.d. sequences from the per-position categoricals: (count, T) int64, by inverse CDF (in chunks)."""
    cdf = torch.softmax(logits.detach(), dim=-1).cumsum(-1)[:, :-1].float()  # (T, V-1)
    out = []
    for start in range(0, count, chunk):
        u = torch.rand(min(chunk, count - start), logits.shape[0], 1, generator=gen)  # (b, T, 1)
        out.append((u > cdf).sum(-1))  # (b, T): number of CDF steps below u
    return torch.cat(out)


def success_threshold(logits: Tensor, z: float = 0.67) -> int:
    """Correct tokens needed for reward 1: the initial mean count plus z standard deviations (~25 % succeed)."""
    p = torch.softmax(logits.detach(), dim=-1)[:, 0]  # (T,)
    mean, sd = float(p.sum()), float((p * (1 - p)).sum().sqrt())
    return min(len(p), max(1, math.ceil(mean + z * sd)))


def rewards_of(tokens: Tensor, threshold: int) -> Tensor:
    """Verifiable sequence reward: 1 when at least `threshold` tokens are the correct token 0, else 0. (B,)."""
    return ((tokens == 0).sum(-1) >= threshold).to(torch.float64)


def expected_reward(logits: Tensor, threshold: int) -> float:
    """Exact E_pi[R]: the Poisson-binomial tail P(#correct >= threshold), by dynamic programming over positions."""
    p = torch.softmax(logits.detach(), dim=-1)[:, 0]  # (T,)
    dist = torch.zeros(len(p) + 1, dtype=torch.float64)
    dist[0] = 1.0
    for t, pt in enumerate(p.tolist()):
        dist[1 : t + 2] = dist[1 : t + 2] * (1 - pt) + dist[: t + 1] * pt
        dist[0] *= 1 - pt
    return float(dist[threshold:].sum())


def mismatch_kl(sampler_logits: Tensor, logits: Tensor) -> float:
    """Exact sequence-level KL(pi_sampler || pi) = sum_t KL of the per-position categoricals."""
    log_q, log_p = torch.log_softmax(sampler_logits, -1), torch.log_softmax(logits, -1)
    return float((log_q.exp() * (log_q - log_p)).sum())


# --------------------------------------------------------------------------------------------------------------------
# One cell


def run_cell(cfg: LabConfig, cell: LabCell) -> dict:
    """Train one cell; returns its summary, its reward curve and its per-mini-batch-index mechanism metrics."""
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(cell.seed)
    theta = torch.nn.Parameter(init_logits(cell.length, cfg.vocab, cfg.p_correct, seed=cfg.init_seed))
    lr = cfg.lr * cell.lr_scale
    if cfg.optim == "adamw_torch":
        opt = torch.optim.AdamW([theta], lr=lr, betas=(cfg.beta1, 0.99), eps=cfg.adam_epsilon, weight_decay=0.0)
    else:
        opt = torch.optim.SGD([theta], lr=lr)
    threshold = success_threshold(theta)
    n, m = cell.num_mini_batches, cfg.mini_batch_seqs
    mask = torch.ones(m, cell.length, dtype=torch.float64)
    start = expected_reward(theta, threshold)
    curve = [(0, start, float("nan"))]
    per_k = {k: torch.zeros(n, dtype=torch.float64) for k in LAB_STEP_METRICS}
    rollout_steps = cfg.optimizer_steps // n
    finite = True
    for r in range(rollout_steps):
        # 1. a rollout batch of N mini-batches from the sampler (pi_old, plus the injected mismatch)
        with torch.no_grad():
            old_logits = theta.detach().clone()
            noise = cfg.rollout_logit_noise * torch.randn(old_logits.shape, generator=gen, dtype=old_logits.dtype)
            sampler_logits = old_logits + noise
            tokens = sample_tokens(sampler_logits, n * m, gen)  # (N*M, T)
            rollout_lp = token_log_probs(sampler_logits, tokens) if cfg.rollout_logit_noise > 0 else None
            old_lp = token_log_probs(old_logits, tokens)  # (N*M, T): mu, recomputed by the "trainer"
            rewards = rewards_of(tokens, threshold)  # (N*M,)
            adv = group_advantages(rewards, cfg.rollout_n)  # (N*M,)
            order = torch.randperm(n * m, generator=gen)
        # 2. N sequential optimizer steps; mini-batch k is k steps staler than the first
        for k in range(n):
            idx = order[k * m : (k + 1) * m]
            lp = token_log_probs(theta, tokens[idx])  # (M, T)
            rollout = None if rollout_lp is None else rollout_lp[idx]
            stats = lab_step(cfg, cell, opt, [theta], lp, old_lp[idx], adv[idx], mask, k, rollout_lp=rollout)
            for key, value in stats.items():
                per_k[key][k] += value / rollout_steps
        finite = finite and bool(torch.isfinite(theta).all())
        exact = (r + 1) % max(1, rollout_steps // cfg.eval_points) == 0 or r + 1 == rollout_steps
        curve.append(((r + 1) * n, expected_reward(theta, threshold) if exact else float("nan"), float(rewards.mean())))
    kl = mismatch_kl(sampler_logits, old_logits)
    return cell_result(cfg, cell, n, start, curve[-1][1], curve, per_k, finite, sampler_kl=kl)


# --------------------------------------------------------------------------------------------------------------------
# The grid, tables and figures


def _group(rows: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["method"], row["length"], row["lr_scale"], row["staleness"]), []).append(row)
    return groups


def write_tables(out: Path, results: list[dict], preset: str = "v2") -> None:
    """results.csv (one row per cell), results.md (per T and lr: mean ± 95% CI over seeds and each method against
    vespo, with the test the design calls for (`vespo.experiments.stats.choose_test`: paired t over the shared seeds,
    Fisher's exact test on collapsed seeds where one collapsed), Holm-corrected within the table, bold =
    significant; then the regime diagnostics per method and N), mechanism.csv (per mini-batch index); `preset` says
    whether E[R] is exact (v1) or estimated on v2's evaluation sample."""
    rows = [r["summary"] for r in results]
    f = io.StringIO(newline="")  # cells from before a column existed leave it empty
    writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)), restval="")
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(out / "results.csv", f.getvalue())
    methods = list(dict.fromkeys(r["method"] for r in rows))
    baseline = "vespo" if "vespo" in methods else methods[0]
    what = "exact expected reward (v1)" if preset == "v1" else "expected reward on the fixed evaluation sample (v2)"
    lines = [f"# vespo lab: final {what}", ""]
    for t in sorted({r["length"] for r in rows}):
        for s in sorted({r["lr_scale"] for r in rows}):
            table = [g for g in rows if (g["length"], g["lr_scale"]) == (t, s)]
            groups = {(g["method"], g["staleness"]): {} for g in table}
            collapsed = {key: {} for key in groups}
            cells = {key: [] for key in groups}
            for g in table:
                groups[(g["method"], g["staleness"])][g["seed"]] = g["final_reward"]
                collapsed[(g["method"], g["staleness"])][g["seed"]] = bool(g["collapsed"])
                cells[(g["method"], g["staleness"])].append(g)
            title = f"T = {t}, lr x {s:g}"
            lines.append(compare_markdown(groups, baseline, "auto", title, collapsed=collapsed))
            lines.append(diagnostics_markdown(cells, title, first="method"))
    collapsed = sorted({(r["method"], r["length"], r["lr_scale"], r["staleness"]) for r in rows if r["collapsed"]})
    lines.append(
        "Collapsed (a seed below collapse_ratio of the start): "
        + (", ".join(f"{m} T={t} lr x {s:g} N={n}" for m, t, s, n in collapsed) or "none")
    )
    lines.append("")
    initial = sorted({(r["length"], round(r["initial_reward"], 3)) for r in rows})
    lines.append("Initial expected reward per T: " + ", ".join(f"T={t}: {v}" for t, v in initial))
    write_atomic(out / "results.md", "\n".join(lines) + "\n")
    f = io.StringIO(newline="")
    writer = csv.writer(f)
    keys = list(results[0]["per_k"])
    writer.writerow(["method", "length", "staleness", "lr_scale", "seed", "k", *keys])
    for r in results:
        s = r["summary"]
        for k in range(s["staleness"]):
            vals = [r["per_k"][key][k] for key in keys]
            writer.writerow([s["method"], s["length"], s["staleness"], s["lr_scale"], s["seed"], k, *vals])
    write_atomic(out / "mechanism.csv", f.getvalue())


def plot(out: Path, results: list[dict]) -> None:
    """lab_reward.png: final expected reward vs N per (T, lr), mean and 95% CI over seeds (clipped to [0, 1]);
    lab_mechanism.png: per-k metrics at the largest N."""
    from vespo.experiments.stats import mean_ci
    from vespo.plots import N_AXIS, Panel, Series, panel_figure, save_figure

    rows = [r["summary"] for r in results]
    lengths, scales = sorted({r["length"] for r in rows}), sorted({r["lr_scale"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    groups = _group(rows)
    grid = []
    for t in lengths:
        row = []
        for s in scales:
            panel = Panel(f"T={t}, lr x {s:.3g}", N_AXIS, "final E[R]", bounds=(0.0, 1.0), xscale="log2")
            for method in methods:
                ns = sorted(n for (m_, t_, s_, n) in groups if (m_, t_, s_) == (method, t, s))
                stats = [mean_ci([g["final_reward"] for g in groups[(method, t, s, n)]]) for n in ns]
                if ns:
                    panel.series[method] = Series(ns, [m for m, _ in stats], yerr=[h for _, h in stats])
                    panel.xticks = ns
            row.append(panel)
        grid.append(row)
    save_figure(panel_figure(grid, title="mean and 95% CI over seeds"), out / "lab_reward.png")

    n_max, t_max, s_max = max(r["staleness"] for r in rows), max(lengths), max(scales)
    keys = (  # (metric, axis label, range, scale)
        ("log_w_mean", "mean sequence log W", None, None),
        ("ess", "normalised ESS of W", (0.0, 1.0), None),
        ("top1_share", "gradient share of top 1%", (0.0, 1.0), None),
        ("grad_norm", "gradient norm", None, "log"),
        ("update_norm", "update norm", None, "log"),
        ("momentum_share", "share of the step from the current gradient", (0.0, 1.0), None),
    )
    panels = []
    for key, label, bounds, scale in keys:
        if not all(key in r["per_k"] for r in results):  # cells from before the metric existed
            continue
        panel = Panel(label, "mini-batch index k", label, bounds=bounds, yscale=scale)
        for method in methods:
            runs = [
                r["per_k"][key]
                for r in results
                if (r["summary"]["method"], r["summary"]["length"], r["summary"]["staleness"], r["summary"]["lr_scale"])
                == (method, t_max, n_max, s_max)
            ]
            if runs:
                mean = np.mean(runs, axis=0)
                panel.series[method] = Series(np.arange(len(mean)), mean)
        panels.append(panel)
    title = f"per mini-batch index, T={t_max}, N={n_max}, lr x {s_max:.3g}"
    save_figure(panel_figure([panels], title=title), out / "lab_mechanism.png")


_GRID_ONLY = ("out_dir", "overwrite_output_dir", "jobs", "methods", "length", "num_mini_batches", "lr_scale", "seeds")
"""LabConfig fields that do not change one cell's result (where it is written, parallelism, the grid's axes)."""
_KEYED_AS = {"num_mini_batches": "staleness", "mini_batch_seqs": "mini_batch_size"}
"""Fields renamed after lab grids were run -> the name a cell's key hashes them under, so finished cells keep their
files (`cell_file`)."""


def cell_file(cfg: LabConfig, cell: LabCell) -> str:
    """A finished cell's JSON file name: the cell's name and a hash of every setting it depends on, so a cell is
    reused only for exactly the same settings."""
    settings = {k: v for k, v in asdict(cfg).items() if k not in _GRID_ONLY} | asdict(cell)
    key = settings_key({_KEYED_AS.get(k, k): v for k, v in settings.items()})
    return f"{cell.name.replace('/', '_')}_{key}.json"


def _run_chain(cfg: LabConfig, cell: LabCell) -> dict:
    return run_chain_cell(cfg, cell, cfg.chain)


LAB_OUTPUTS = ("cells", "results.csv", "results.md", "mechanism.csv", "lab_reward.png", "lab_mechanism.png")
"""What a lab grid writes in its out_dir (the manifest of its marker, `vespo.outputs`)."""


def lab(cfg: LabConfig) -> list[dict]:
    """Run the grid (parallel processes) in its claimed out_dir, write tables and figures; returns the per-cell
    results."""
    grid = cells(cfg)
    columns = {"method", "length", "staleness", "lr_scale", "seed", "initial_reward"}  # `cell_result`'s, either preset
    with claim_grid_dir("lab", cfg.out_dir, LAB_OUTPUTS, overwrite=cfg.overwrite_output_dir, columns=columns):
        return _run_grid(cfg, grid)


def _run_grid(cfg: LabConfig, grid: list[LabCell]) -> list[dict]:
    out = Path(cfg.out_dir)
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    done = out / "cells"  # one JSON per finished cell: an interrupted grid resumes where it stopped
    done.mkdir(exist_ok=True)
    todo = [c for c in grid if not (done / cell_file(cfg, c)).is_file()]
    pool = ProcessPoolExecutor(cfg.jobs, initializer=_worker_ignores_sigint)
    try:
        futures = {pool.submit(run_cell if cfg.preset == "v1" else _run_chain, cfg, cell): cell for cell in todo}
        for fut in tqdm(as_completed(futures), total=len(grid), initial=len(grid) - len(todo), desc="vespo lab"):
            write_atomic(done / cell_file(cfg, futures[fut]), json.dumps(fut.result()))  # kept as soon as finished
    except KeyboardInterrupt:
        _stop_workers(pool)
        finished = sum((done / cell_file(cfg, c)).is_file() for c in grid)
        raise GridInterrupted(
            f"{finished} of {len(grid)} cells finished and kept in {done}; the same command continues the grid"
        ) from None
    pool.shutdown()
    results = [json.loads((done / cell_file(cfg, c)).read_text()) for c in grid]
    write_tables(out, results, cfg.preset)
    plot(out, results)
    print(f"{len(grid)} cells in {time.perf_counter() - t0:.0f} s -> {out}/results.md")
    return results


def _worker_ignores_sigint() -> None:
    """A cell process leaves Ctrl-C to the grid, which stops every worker at once (`_stop_workers`): no traceback
    per worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel the cells not started and end the running ones now (a cell is kept only once finished)."""
    processes = list(getattr(pool, "_processes", {}).values())  # the executor's own workers
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        proc.terminate()
    for proc in processes:
        proc.join(timeout=5)

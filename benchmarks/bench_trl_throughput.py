"""Throughput of `vespo train` vs TRL's `GRPOTrainer(loss_type="vespo")`, side by side in one CPU run.

Run: `.venv/bin/python benchmarks/bench_trl_throughput.py` (about 2 minutes on 2 shared cores); writes
benchmarks/results/trl_throughput.{json,csv,png} and prints a summary table. `--smoke --out-dir DIR` runs every arm
through the same code in seconds (a 2-step warm start, no warm-up run, 2 rollout steps of 4 prompts x 2, 1 repeat).

Both trainers get the same SFT-warm-started embedded model (the embedded task's tiny Llama + character tokenizer,
copied to a temp dir and loaded from there by both), the same embedded arithmetic train split, the same reward
(`vespo.rewards.math_reward`), the same batch geometry and N (mini-batches per rollout step), the same optimiser
(AdamW, constant LR, same betas, grad clip 1.0), the same number of samples, and the same torch thread count. Each is
warmed up by one short untimed run, then timed runs alternate (vespo, TRL, vespo, TRL, ...) so shared-CPU noise hits
both alike; the repeats use seeds 0, 1, ... (the same seeds for both) and the reported figures are means over repeats.
Default: 8 prompts x n=8, N=4, 16 new tokens, 50 rollout steps (200 optimizer steps, 3,200 samples) per run, 3
repeats, 1 torch thread (a ~0.2M-parameter model is far faster single-threaded on a shared 2-core box; with 2 threads
both trainers slow down by an order of magnitude from oversubscription and the ratio measures contention, not code).

Batch mapping (one process; TRL counts batches in *completions*, vespo in *prompts*):

    vespo TrainConfig                        TRL GRPOConfig
    train_batch_size    = P prompts          generation_batch_size       = P * n completions (derived)
    rollout_n           = n                  num_generations             = n
    ppo_mini_batch_size = P / N prompts      per_device_train_batch_size = (P / N) * n completions
    (N = num_mini_batches)                   steps_per_generation        = N
                                             gradient_accumulation_steps = 1 (one optimizer step per mini-batch)
    total_training_steps = S rollouts        max_steps                   = S * N optimizer steps
    micro_batch_size >= mini-batch rows      (the mini-batch is one forward/backward in both)
    max_response_length, temperature, lr     max_completion_length, temperature, learning_rate
    betas, grad_clip                         adam_beta1/2, max_grad_norm; lr_scheduler_type="constant"

TRL generates `generation_batch_size` completions every `steps_per_generation` optimizer steps, computes
old log-probs once for that batch (because steps_per_generation > gradient_accumulation_steps), shuffles it and
feeds one slice of `per_device_train_batch_size` rows to each of the N optimizer steps: the same N mini-batches per
rollout step as vespo's N sequential mini-batches (vespo keeps rollout order instead of shuffling; both are valid).

Measured quantities, per trainer and run:
  * loop_s: wall time of the training loop. vespo: the sum of its per-rollout-step `time/step_s` (rollout, reward,
    old log-probs, N updates, metrics; excludes the untimed run-management tail: final checkpoint, plot, save).
    TRL: `on_train_begin` to the last `on_step_end` (a TrainerCallback), which includes its per-step bookkeeping.
  * e2e_s: wall time of the whole call (vespo: `train(cfg)`; TRL: build the trainer + `train()`), i.e. including
    model loading and each trainer's setup and teardown. The async arm's samplers fork from a server this process
    starts once (`vespo.train.forkserver`, in the untimed warm-up), as in any long-lived process (a notebook, a
    sweep driver); a fresh `vespo train --async` process starts it beside its own imports
    (benchmarks/bench_step_profile.py measures that start-up).
  * optimizer steps/s, rollout samples/s (completions) and generated tokens/s (completion tokens including <eos>),
    all over loop_s (and tokens/s also over e2e_s).
  * reward: mean training reward (fraction of correct sampled completions) over the last `--reward-window` rollout
    steps, after the same number of samples. vespo: its logged `reward/mean`; TRL: a thin wrapper around
    `math_reward` that records the rewards and completion lengths of every batch it grades.

Losses are each library's own VESPO with its defaults (vespo: token-mean aggregation, c1/c2 = (2, 3) / (3, 2);
TRL: the same gamma parameters, its DAPO-style normaliser), so rewards agree in expectation but are not identical.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from vespo.argv import warn_renamed

RESULTS = Path(__file__).parent / "results"
METRICS = (
    "loop_s",
    "gen_share",
    "reward_share",
    "e2e_s",
    "steps_per_s",
    "samples_per_s",
    "tokens_per_s",
    "tokens_per_s_e2e",
    "reward_start",
    "reward",
)


@dataclasses.dataclass
class Bench:
    prompts: int
    n: int
    num_mini_batches: int
    max_new_tokens: int
    steps: int
    temperature: float
    lr: float
    threads: int
    reward_window: int
    model_dir: str
    work_dir: str
    async_prompts: int = 0
    async_max_staleness: int = 0

    @property
    def mini_prompts(self) -> int:
        return self.prompts // self.num_mini_batches


# ----------------------------------------------------------------------------------------------------------------
# vespo


def vespo_config(b: Bench, *, steps: int, seed: int, run_dir: str, variant: str = "sync"):
    """The sync arms use the shared geometry ("shuffle" with `shuffle=True`); "async" generates `async_prompts`
    prompts per batch (mini-batch as sync) with lag bounded by `async_max_staleness`, and runs proportionally more
    rollout steps (same samples)."""
    from vespo.train.config import TrainConfig

    prompts = b.async_prompts if variant == "async" else b.prompts
    extra = {"mode": "async", "max_staleness": b.async_max_staleness} if variant == "async" else {}
    if variant == "shuffle":
        extra = {"shuffle": True}  # mini-batches cut from a shuffled rollout batch, as TRL does
    return TrainConfig(
        model=b.model_dir,
        dataset="embedded",
        method="vespo",
        reward_fn=f"{__name__}:REWARD",  # math_reward behind the same timing wrapper TRL gets
        train_batch_size=prompts,
        ppo_mini_batch_size=b.mini_prompts,
        rollout_n=b.n,
        micro_batch_size=b.mini_prompts * b.n,  # one forward/backward per mini-batch, as TRL with grad accumulation 1
        total_training_steps=steps * b.prompts // prompts,
        lr=b.lr,
        max_response_length=b.max_new_tokens,
        temperature=b.temperature,
        seed=seed,
        run_dir=run_dir,
        save_every=10**6,  # only the final checkpoint
        eval_every=0,  # no held-out evaluation (TRL does none either)
        num_threads=b.threads,
        tensorboard=False,
        progress=False,
        **extra,
    )


def run_vespo(b: Bench, *, steps: int, seed: int, tag: str, variant: str = "sync") -> dict:
    from vespo.train import train  # the `vespo train` entry: sync or async per cfg.mode
    from vespo.train.logs import read_metrics

    run_dir = Path(b.work_dir) / f"vespo-{variant}-{tag}"
    cfg = vespo_config(b, steps=steps, seed=seed, run_dir=str(run_dir), variant=variant)
    REWARD.reset()
    t0 = time.perf_counter()
    train(cfg)
    e2e = time.perf_counter() - t0
    rows = [r for r in read_metrics(run_dir) if "reward/mean" in r]
    seqs = cfg.batch.train_batch_size * b.n
    per = b.prompts // cfg.batch.train_batch_size  # rollout steps per sync rollout step: rewards are regrouped to match
    rewards = [statistics.fmean(r["reward/mean"] for r in rows[i : i + per]) for i in range(0, len(rows), per)]
    return summarise(
        b,
        loop_s=sum(r["time/step_s"] for r in rows),
        gen_s=sum(r["time/gen_s"] for r in rows),
        reward_s=REWARD.seconds or sum(r.get("time/reward_s", 0.0) for r in rows),
        e2e_s=e2e,
        opt_steps=int(sum(r["actor/num_mini_batches"] for r in rows)),
        rewards=rewards,
        samples=seqs * len(rows),
        tokens=sum(r["response/length_mean"] * seqs for r in rows),
    )


# ----------------------------------------------------------------------------------------------------------------
# TRL


class _RecordingReward:
    """`math_reward` plus a record of each graded batch: mean reward, completions, completion tokens, seconds.

    Both trainers call the same wrapper (vespo through `reward_fn="<this module>:REWARD"`), so its overhead is equal.
    """

    def __init__(self):
        from vespo.rewards import math_reward

        self._fn = math_reward
        self.__name__ = "math_reward"  # TRL names the reward metric after the function
        self.reset()

    def reset(self) -> None:
        self.batches: list[tuple[float, int, int | None]] = []
        self.seconds = 0.0

    def __call__(self, completions, answer, completion_ids=None, **kwargs):
        t = time.perf_counter()
        scores = self._fn(completions, answer)
        self.seconds += time.perf_counter() - t
        # TRL passes completion ids ending at (and including) <eos>; vespo passes strings only (its metrics count)
        tokens = None if completion_ids is None else sum(len(ids) for ids in completion_ids)
        self.batches.append((sum(scores) / len(scores), len(scores), tokens))
        return scores


REWARD = _RecordingReward()


def trl_trainer(b: Bench, *, steps: int, seed: int, out_dir: str, reward):
    import transformers
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from vespo.embedded.task import arithmetic_split
    from vespo.train.config import TrainConfig

    defaults = TrainConfig()
    task = defaults.embedded
    train_set, _ = arithmetic_split(
        num_operands=task.num_operands, max_operand=task.max_operand, eval_size=defaults.run.eval_size
    )
    dataset = Dataset.from_dict({"prompt": [p.prompt for p in train_set], "answer": [p.answer for p in train_set]})
    args = GRPOConfig(
        output_dir=out_dir,
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=b.num_mini_batches,  # one log per rollout step, like vespo
        seed=seed,
        loss_type="vespo",
        num_generations=b.n,
        per_device_train_batch_size=b.mini_prompts * b.n,
        steps_per_generation=b.num_mini_batches,
        gradient_accumulation_steps=1,
        max_steps=steps * b.num_mini_batches,
        max_completion_length=b.max_new_tokens,
        temperature=b.temperature,
        top_p=1.0,
        learning_rate=b.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=defaults.optimizer.betas[0],
        adam_beta2=defaults.optimizer.betas[1],
        weight_decay=defaults.optimizer.weight_decay,
        max_grad_norm=defaults.optimizer.grad_clip,
        beta=0.0,  # no KL / reference model (vespo's default too)
        scale_rewards="group",  # A = (R - mean) / std per group, vespo's norm_adv_by_std=True
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(b.model_dir, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(b.model_dir)

    class Clock(TrainerCallback):
        start = end = None

        def on_train_begin(self, *a, **k):
            Clock.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            Clock.end = time.perf_counter()

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.remove_callback(PrinterCallback)  # no log dicts on stdout (vespo's progress bar is off too)
    generate, Clock.gen_s = trainer._generate, 0.0

    def timed_generate(*args, **kwargs):  # diagnostic only: time spent in TRL's generation (incl. decoding)
        t = time.perf_counter()
        out = generate(*args, **kwargs)
        Clock.gen_s += time.perf_counter() - t
        return out

    trainer._generate = timed_generate
    return trainer, Clock


def run_trl(b: Bench, *, steps: int, seed: int, tag: str) -> dict:
    reward = REWARD
    reward.reset()
    t0 = time.perf_counter()
    trainer, clock = trl_trainer(b, steps=steps, seed=seed, out_dir=str(Path(b.work_dir) / f"trl-{tag}"), reward=reward)
    trainer.train()
    e2e = time.perf_counter() - t0
    return summarise(
        b,
        loop_s=clock.end - clock.start,
        e2e_s=e2e,
        gen_s=clock.gen_s,
        reward_s=reward.seconds,
        opt_steps=trainer.state.global_step,
        rewards=[r for r, _, _ in reward.batches],
        samples=sum(c for _, c, _ in reward.batches),
        tokens=sum(t for _, _, t in reward.batches),
    )


# ----------------------------------------------------------------------------------------------------------------
# Driver


def summarise(b: Bench, *, loop_s, gen_s, reward_s, e2e_s, opt_steps, rewards, samples, tokens) -> dict:
    return {
        "loop_s": loop_s,
        "gen_share": gen_s / loop_s,
        "reward_share": reward_s / loop_s,
        "e2e_s": e2e_s,
        "opt_steps": opt_steps,
        "rollout_steps": len(rewards),
        "samples": samples,
        "tokens": tokens,
        "steps_per_s": opt_steps / loop_s,
        "samples_per_s": samples / loop_s,
        "tokens_per_s": tokens / loop_s,
        "tokens_per_s_e2e": tokens / e2e_s,
        "reward_start": statistics.fmean(rewards[: b.reward_window]),
        "reward": statistics.fmean(rewards[-b.reward_window :]),
        "reward_curve": rewards,
    }


def prepare_model(work_dir: Path, *, smoke: bool = False) -> str:
    """The SFT-warm-started embedded model + tokenizer (built once by vespo and cached), copied to a temp dir. In a
    smoke run, a 2-step warm start built in `work_dir` (nothing written to the user's cache)."""
    from vespo.embedded.warm_start import WarmStartSpec, embedded_policy_path
    from vespo.train.config import TrainConfig

    spec = WarmStartSpec(sft_steps=2, cache_dir=str(work_dir / "cache")) if smoke else WarmStartSpec.of(TrainConfig())
    src = embedded_policy_path(spec)
    dst = work_dir / "model"
    shutil.copytree(src, dst)
    return str(dst)


ARMS = {
    "vespo": ("vespo train (sync)", "tab:blue"),
    "vespo-shuffle": ("vespo train, shuffled mini-batches", "tab:cyan"),
    "vespo-async": ("vespo train --async", "tab:green"),
    "trl": ("TRL GRPOTrainer", "tab:gray"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per rollout step (P)")
    parser.add_argument("--n", type=int, default=8, help="completions per prompt")
    parser.add_argument(
        "--num-mini-batches",
        "--staleness",
        type=int,
        default=4,
        help="N: optimizer steps per rollout batch (--staleness: old name, deprecated)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--steps", type=int, default=50, help="rollout steps per timed run")
    parser.add_argument("--warmup-steps", type=int, default=2, help="rollout steps of the untimed warm-ups (0: none)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per trainer, alternated")
    parser.add_argument("--first-seed", type=int, default=0, help="repeat i uses seed first_seed + i")
    parser.add_argument("--reward-window", type=int, default=10, help="last rollout steps averaged for the reward")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default: vespo train's)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (learner, each sampler)")
    parser.add_argument("--arms", nargs="+", default=["vespo", "vespo-async", "trl"], choices=list(ARMS))
    parser.add_argument("--async-prompts", type=int, default=None, help="async arm: prompts per batch (default P/2)")
    parser.add_argument(
        "--async-max-staleness", type=int, default=None, help="async arm: lag bound (default N - 1, sync's own)"
    )
    parser.add_argument("--out", default="trl_throughput", help="results file stem under --out-dir")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="where the results go (benchmarks/results)")
    parser.add_argument("--no-save", action="store_true", help="print only; do not write the results")
    parser.add_argument("--smoke", action="store_true", help="every arm in a tiny setting, in seconds (CI)")
    a = parser.parse_args()
    warn_renamed(parser.prog, sys.argv[1:], {"--staleness": "--num-mini-batches"})
    if a.smoke:  # the same code path on a tiny geometry; every arm
        a.prompts, a.n, a.num_mini_batches, a.max_new_tokens, a.steps, a.warmup_steps = 4, 2, 2, 4, 2, 0
        a.repeats, a.reward_window, a.arms = 1, 1, list(ARMS)
    if a.prompts % a.num_mini_batches:
        parser.error("--num-mini-batches must divide --prompts")
    if "trl" not in a.arms:
        parser.error("--arms must include trl (ratios are taken against it)")

    import logging

    import transformers

    from vespo.train.config import TrainConfig

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory(prefix="bench_trl_") as tmp:
        b = Bench(
            prompts=a.prompts,
            n=a.n,
            num_mini_batches=a.num_mini_batches,
            max_new_tokens=a.max_new_tokens,
            steps=a.steps,
            temperature=a.temperature,
            lr=a.lr if a.lr is not None else TrainConfig().optimizer.lr,
            threads=a.threads,
            reward_window=min(a.reward_window, a.steps),
            model_dir=prepare_model(Path(tmp), smoke=a.smoke),
            work_dir=tmp,
            async_prompts=a.async_prompts or a.prompts // 2,
            async_max_staleness=a.async_max_staleness if a.async_max_staleness is not None else a.num_mini_batches - 1,
        )
        runners = {
            "vespo": run_vespo,
            "vespo-shuffle": functools.partial(run_vespo, variant="shuffle"),
            "vespo-async": functools.partial(run_vespo, variant="async"),
            "trl": run_trl,
        }
        runners = {name: runners[name] for name in a.arms}
        t_start = time.perf_counter()
        for name, run in runners.items() if a.warmup_steps else ():  # untimed warm-up: imports, allocator, kernels
            t = time.perf_counter()
            run(b, steps=a.warmup_steps, seed=1000, tag="warmup")
            print(f"warm-up {name}: {time.perf_counter() - t:.1f}s", flush=True)
        runs: dict[str, list[dict]] = {name: [] for name in runners}
        for rep in range(a.repeats):
            for name, run in runners.items():
                r = run(b, steps=a.steps, seed=a.first_seed + rep, tag=f"rep{rep}")
                runs[name].append(r)
                print(
                    f"repeat {rep} {name:13s}: loop {r['loop_s']:6.1f}s  {r['samples_per_s']:7.1f} samples/s  "
                    f"{r['tokens_per_s']:7.1f} tok/s  reward(last {b.reward_window}) {r['reward']:.3f}",
                    flush=True,
                )
        total_s = time.perf_counter() - t_start
    report(a, b, runs, total_s)


def report(a, b: Bench, runs: dict[str, list[dict]], total_s: float) -> None:
    import transformers
    import trl

    samples = {r["samples"] for rs in runs.values() for r in rs}
    steps = {r["opt_steps"] for rs in runs.values() for r in rs}
    assert len(samples) == 1 and len(steps) == 1, f"unequal work: samples {samples}, optimizer steps {steps}"
    mean = {name: {m: statistics.fmean(r[m] for r in rs) for m in METRICS} for name, rs in runs.items()}
    sd = {
        name: {m: statistics.stdev(r[m] for r in rs) if len(rs) > 1 else 0.0 for m in METRICS}
        for name, rs in runs.items()
    }
    ratio = {  # None where TRL's value is 0 (a reward of 0 in a smoke run)
        name: {m: mean[name][m] / mean["trl"][m] if mean["trl"][m] else None for m in METRICS}
        for name in runs
        if name != "trl"
    }
    summary = {
        "command": " ".join(["python", "benchmarks/bench_trl_throughput.py", *sys.argv[1:]]),
        "setup": {
            "prompts_per_rollout": b.prompts,
            "n": b.n,
            "num_mini_batches": b.num_mini_batches,
            "max_new_tokens": b.max_new_tokens,
            "rollout_steps": b.steps,
            "optimizer_steps": b.steps * b.num_mini_batches,
            "samples_per_run": b.steps * b.prompts * b.n,
            "temperature": b.temperature,
            "lr": b.lr,
            "torch_threads": b.threads,
            "repeats": a.repeats,
            "reward_window": b.reward_window,
            "arms": list(runs),
            "async_arm": {"prompts_per_batch": b.async_prompts, "max_staleness": b.async_max_staleness},
            "trl_config": {
                "num_generations": b.n,
                "per_device_train_batch_size": b.mini_prompts * b.n,
                "steps_per_generation": b.num_mini_batches,
                "gradient_accumulation_steps": 1,
                "generation_batch_size": b.prompts * b.n,
                "max_steps": b.steps * b.num_mini_batches,
            },
        },
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
            "python": platform.python_version(),
        },
        "vespo_source": vespo_source(),
        "machine": platform.processor() or platform.machine(),
        "benchmark_wall_s": round(total_s, 1),
        "mean": {name: {m: round(v, 4) for m, v in ms.items()} for name, ms in mean.items()},
        "sd_over_repeats": {name: {m: round(v, 4) for m, v in ms.items()} for name, ms in sd.items()},
        "ratio_over_trl": {
            name: {m: None if v is None else round(v, 3) for m, v in rs.items()} for name, rs in ratio.items()
        },
        "runs": runs,
    }
    print_table(summary)
    if a.no_save:
        return
    out_dir = a.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{a.out}.json").write_text(json.dumps(summary, indent=2) + "\n")
    with open(out_dir / f"{a.out}.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["trainer", "repeat", *METRICS, "samples", "tokens", "opt_steps"])
        for name, rs in runs.items():
            for i, r in enumerate(rs):
                writer.writerow(
                    [name, i, *(round(r[m], 4) for m in METRICS), r["samples"], round(r["tokens"]), r["opt_steps"]]
                )
            writer.writerow([name, "mean", *(round(mean[name][m], 4) for m in METRICS), "", "", ""])
            writer.writerow([name, "sd", *(round(sd[name][m], 4) for m in METRICS), "", "", ""])
        for name, rs in ratio.items():
            cells = ("" if rs[m] is None else round(rs[m], 3) for m in METRICS)
            writer.writerow([f"{name}/trl", "ratio", *cells, "", "", ""])
    plot(summary, out_dir / f"{a.out}.png")
    print(f"wrote {out_dir}/{a.out}.{{json,csv,png}}")


def vespo_source() -> dict:
    """The commit the measured vespo code comes from, and whether src/vespo had uncommitted edits at run time."""
    import subprocess

    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    return {"commit": git("rev-parse", "--short", "HEAD"), "src_dirty": bool(git("status", "--porcelain", "src/vespo"))}


def print_table(s: dict) -> None:
    rows = [
        ("loop wall time (s)", "loop_s", ".1f"),
        ("  share of loop in generation", "gen_share", ".2f"),
        ("  share of loop in reward grading", "reward_share", ".2f"),
        ("end-to-end wall time (s)", "e2e_s", ".1f"),
        ("optimizer steps / s", "steps_per_s", ".3f"),
        ("rollout samples / s", "samples_per_s", ".1f"),
        ("generated tokens / s", "tokens_per_s", ".1f"),
        (f"reward, first {s['setup']['reward_window']} rollout steps", "reward_start", ".3f"),
        (f"reward, last {s['setup']['reward_window']} rollout steps", "reward", ".3f"),
    ]
    st, names = s["setup"], list(s["mean"])
    print(
        f"\n{st['prompts_per_rollout']} prompts x n={st['n']}, N={st['num_mini_batches']}, "
        f"{st['max_new_tokens']} new tokens, {st['samples_per_run']} samples per run, {st['repeats']} repeats, "
        f"{st['torch_threads']} thread(s) per process; means over repeats (sd); ratios vs TRL"
    )
    print(f"{'metric':36s} " + " ".join(f"{n:>22s}" for n in names))
    for label, key, fmt in rows:
        cells = []
        for n in names:
            cell = f"{s['mean'][n][key]:{fmt}} ({s['sd_over_repeats'][n][key]:{fmt}})"
            if n != "trl" and key != "reward" and key != "reward_start" and s["ratio_over_trl"][n][key] is not None:
                cell += f" {s['ratio_over_trl'][n][key]:.2f}x"
            cells.append(f"{cell:>22s}")
        print(f"{label:36s} " + " ".join(cells))


def plot(s: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("rollout samples / s", "samples_per_s"),
        ("generated tokens / s", "tokens_per_s"),
        (f"reward (last {s['setup']['reward_window']} steps)", "reward"),
    ]
    names = list(s["mean"])
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(15, 3.6))
    for ax, (title, key) in zip(axes, panels, strict=False):
        values = [s["mean"][n][key] for n in names]
        ax.bar(range(len(names)), values, color=[ARMS[n][1] for n in names])
        for i, n in enumerate(names):
            pts = [r[key] for r in s["runs"][n]]
            ax.plot([i] * len(pts), pts, "k.", ms=5)
        ax.set_xticks(range(len(names)), names, fontsize=8, rotation=30, ha="right")
        ax.set(title=title, xlabel="arm", ylabel=title)
        ax.grid(axis="y", alpha=0.3)
    ax = axes[-1]
    for n in names:  # training reward vs samples, mean over repeats
        curves = [r["reward_curve"] for r in s["runs"][n]]
        mean_curve = [statistics.fmean(c[i] for c in curves) for i in range(min(map(len, curves)))]
        ax.plot(
            [(i + 1) * s["setup"]["prompts_per_rollout"] * s["setup"]["n"] for i in range(len(mean_curve))],
            mean_curve,
            color=ARMS[n][1],
            label=n,
        )
    ax.set(xlabel="samples", ylabel="training reward", title="training reward (mean over repeats)", ylim=(0, 1))
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)  # beside the data
    ax.grid(alpha=0.3)
    st = s["setup"]
    fig.suptitle(
        f"CPU, {st['torch_threads']} thread(s)/process: {st['prompts_per_rollout']} prompts x {st['n']}, "
        f"N={st['num_mini_batches']}, {st['max_new_tokens']} tokens, {st['samples_per_run']} samples/run, "
        f"{st['repeats']} repeats (dots)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    main()

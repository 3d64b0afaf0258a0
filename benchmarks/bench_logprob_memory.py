"""Peak memory of one update's log-probs, before and after chunking (issue 31): the (B, T, V) logits or not.

One command: `python benchmarks/bench_logprob_memory.py` (a few minutes per arm on one core) writes
benchmarks/results/logprob_memory.{json,md}; `--smoke --out-dir DIR` runs the same code on a tiny model in seconds.

Model: a random-init `LlamaForCausalLM` with SmolLM2-135M's shape (vocab 49,152, hidden 576, MLP 1,536, 30 layers, 9
heads, 3 KV heads, tied embeddings; 134.5M parameters, fp32, as `vespo train` runs on CPU). Batch: 64 sequences of a
32-token prompt and 128 response tokens (random ids; every response token is real). One update-style step: the
learner's log-probs of the batch under grad (temperature 1, no top-p/top-k, no entropy), a token-mean loss of them,
and its backward (no optimizer step). Arms, each in a fresh subprocess so that `ru_maxrss` (peak resident set size)
is its own:

  * before: `response_log_probs` as it was at commit 472095f (copied verbatim below): the model's forward returns
    (B, P + T, V) logits, then fp32 log-softmax over V on the response positions, then gather;
  * after: `vespo.rollout.response_log_probs`: the decoder body's hidden states, and the lm_head + log-softmax on the
    response positions in chunks of `LOG_PROB_CHUNK_BYTES`, each recomputed in the backward.

Each arm runs under two allocator settings: glibc's defaults (what a user's process gets), and a fixed 1 MiB mmap
threshold (`MALLOC_MMAP_THRESHOLD_=1048576`: every large tensor is its own mapping, returned to the OS when freed), so
the RSS follows the live tensors. With the defaults, glibc raises its mmap threshold after the first large free
(up to 32 MiB), serves later tensors from its heap and keeps freed heap memory resident: several GB at this batch.

Both arms compute the same loss (checked here to 1e-4). The model's own activations are the same in both arms;
`--gradient-checkpointing` (the default here, `vespo train --gradient-checkpointing`) keeps them small so the
logits' share is visible and the before arm fits a shared 24 GB machine; `--no-gradient-checkpointing` measures the
trainer's default setting (the model's activations for 64 x 160 tokens alone then take several GB).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                    max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=100000.0)  # fmt: skip
TINY = dict(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=64)  # fmt: skip


def old_response_log_probs(model, rollout, *, temperature=1.0, top_p=1.0, top_k=0, with_entropy=False):
    """`vespo.rollout.hf.response_log_probs` at commit 472095f, verbatim (the before arm)."""
    import torch

    from vespo.rollout.hf import OUTSIDE_LOG_PROB, _position_ids, processed_logits

    p = rollout.prompt_len
    logits = model(
        input_ids=rollout.input_ids,
        attention_mask=rollout.attention_mask,
        position_ids=_position_ids(rollout.attention_mask),
    ).logits  # (B, P + T, V)
    logits = logits[:, p - 1 : -1].float()  # (B, T, V): position t predicts response token t
    logp_all = processed_logits(logits, temperature, top_p, top_k).log_softmax(-1)
    logp = logp_all.gather(-1, rollout.response_ids[..., None]).squeeze(-1)  # (B, T)
    if top_p < 1.0 or top_k > 0:  # outside the set: probability 0, a finite floor without gradient
        logp = torch.where(torch.isinf(logp), OUTSIDE_LOG_PROB, logp)
    logp = logp * rollout.response_mask
    entropy = None
    if with_entropy:
        probs = logp_all.exp()
        entropy = -torch.where(probs > 0, probs * logp_all, 0.0).sum(-1) * rollout.response_mask  # 0 log 0 = 0
    return logp, entropy


def _rss_mib() -> float:
    """Current resident set size (Linux /proc), MiB."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(arm: str, a: argparse.Namespace) -> dict:
    """One arm in this (fresh) process: build the model and batch, run log-probs + loss + backward, report memory."""
    import torch
    import transformers

    from vespo.rollout import Rollout, response_log_probs

    torch.set_num_threads(a.threads)
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**(TINY if a.smoke else SMOLLM2_135M)))
    if a.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    v = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, v, (a.batch, a.prompt_len + a.response_len), generator=g)  # (B, P + T)
    rollout = Rollout(ids, torch.ones_like(ids), torch.ones(a.batch, a.response_len, dtype=torch.long),
                      torch.zeros(a.batch, a.response_len))  # fmt: skip
    setup_rss, setup_peak = _rss_mib(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    fn = {"before": old_response_log_probs, "after": response_log_probs}[arm]
    t0 = time.perf_counter()
    logp, _ = fn(model, rollout, temperature=1.0)  # (B, T)
    mask = rollout.response_mask
    loss = -(logp * mask).sum() / mask.sum()  # token-mean
    loss.backward()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux -> MiB
    return {
        "arm": arm,
        "loss": loss.item(),
        "setup_rss_mib": round(setup_rss, 1),
        "setup_peak_rss_mib": round(setup_peak, 1),
        "peak_rss_mib": round(peak, 1),
        "peak_over_setup_mib": round(peak - setup_rss, 1),
        "seconds": round(seconds, 1),
        "parameters": sum(p.numel() for p in model.parameters()),
    }


ALLOCATORS = {"glibc-default": {}, "mmap-threshold-1MiB": {"MALLOC_MMAP_THRESHOLD_": "1048576"}}
"""Allocator settings (environment of the arm's process): glibc's defaults, and a fixed mmap threshold."""


def run_arm(arm: str, allocator: str, argv: list[str]) -> dict:
    """`worker(arm)` in a fresh Python process under `allocator`'s environment; its one JSON line."""
    env = os.environ | ALLOCATORS[allocator]
    out = subprocess.run([sys.executable, __file__, *argv, "--worker", arm], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"arm {arm} ({allocator}) failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return {"allocator": allocator} | json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64, help="sequences")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--response-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per arm (default 1: a shared machine)")
    ap.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--arms", nargs="+", default=["before", "after"], choices=["before", "after"])
    ap.add_argument("--allocators", nargs="+", default=list(ALLOCATORS), choices=list(ALLOCATORS))
    ap.add_argument("--out-dir", type=Path, default=RESULTS, help="where logprob_memory.{json,md} go")
    ap.add_argument("--smoke", action="store_true", help="a tiny model and batch, seconds (CI)")
    ap.add_argument("--worker", choices=["before", "after"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.smoke:  # one allocator setting: each arm's process costs its imports
        a.batch, a.prompt_len, a.response_len, a.allocators = 4, 4, 8, a.allocators[:1]
    if a.worker:
        print(json.dumps(worker(a.worker, a)))
        return
    argv = [f"--batch={a.batch}", f"--prompt-len={a.prompt_len}", f"--response-len={a.response_len}",
            f"--threads={a.threads}", "--gradient-checkpointing" if a.gradient_checkpointing else
            "--no-gradient-checkpointing", *(["--smoke"] if a.smoke else [])]  # fmt: skip
    load = os.getloadavg()
    t0 = time.perf_counter()
    rows = [run_arm(arm, alloc, argv) for alloc in a.allocators for arm in a.arms]
    losses = [r["loss"] for r in rows]
    assert max(losses) - min(losses) < 1e-4 * max(1.0, abs(losses[0])), f"the arms disagree on the loss: {rows}"
    summary = {
        "command": " ".join(["python", "benchmarks/bench_logprob_memory.py", *sys.argv[1:]]),
        "model": "tiny Llama (smoke)" if a.smoke else "random-init Llama, SmolLM2-135M's shape",
        "model_config": TINY if a.smoke else SMOLLM2_135M,
        "batch": {"sequences": a.batch, "prompt_tokens": a.prompt_len, "response_tokens": a.response_len},
        "gradient_checkpointing": a.gradient_checkpointing,
        "torch_threads": a.threads,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {_mem_total_gib():.0f} GiB RAM",
        "load_average_at_start": [round(x, 2) for x in load],
        "versions": _versions(),
        "wall_s": round(time.perf_counter() - t0, 1),
        "arms": rows,
    }
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / "logprob_memory.json").write_text(json.dumps(summary, indent=2) + "\n")
    (a.out_dir / "logprob_memory.md").write_text(markdown(summary))
    print(markdown(summary))
    print(f"wrote {a.out_dir}/logprob_memory.{{json,md}}")


def markdown(s: dict) -> str:
    b = s["batch"]
    lines = [
        "# Peak RSS of one update's log-probs: full (B, T, V) logits vs chunked",
        "",
        f"`{s['command']}`; {s['model']}; {b['sequences']} sequences x ({b['prompt_tokens']} prompt + "
        f"{b['response_tokens']} response) tokens, fp32, gradient checkpointing "
        f"{'on' if s['gradient_checkpointing'] else 'off'}, {s['torch_threads']} torch thread(s); {s['machine']}, "
        f"load average {s['load_average_at_start'][0]} at start; torch {s['versions']['torch']}, transformers "
        f"{s['versions']['transformers']}. Each arm in a fresh process: log-probs + token-mean loss + backward.",
        "",
        "| allocator | arm | peak RSS (MiB) | RSS after setup (MiB) | peak - setup (MiB) | loss | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in s["arms"]:
        lines.append(
            f"| {r['allocator']} | {r['arm']} | {r['peak_rss_mib']:.0f} | {r['setup_rss_mib']:.0f} | "
            f"{r['peak_over_setup_mib']:.0f} | {r['loss']:.6f} | {r['seconds']} |"
        )
    lines += ["", "seconds: wall time of log-probs + loss + backward on a shared machine (not a speed comparison)."]
    return "\n".join(lines) + "\n"


def _mem_total_gib() -> float:
    with open("/proc/meminfo") as fh:
        return int(fh.readline().split()[1]) / 2**20


def _versions() -> dict:
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}


if __name__ == "__main__":
    main()

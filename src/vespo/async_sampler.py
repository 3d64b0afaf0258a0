"""Sampler side of asynchronous training (`vespo train --async`): versioned weights in shared memory, admission
control, and the sampler process that turns prompts into scored, versioned rollout batches.

Policy version = the learner's optimizer step count when the weights were published. A sample's lag is the learner's
step when it trains on the sample minus that version: the paper's staleness N - 1 of a sync run's last mini-batch.
The behaviour log-probs mu are the sampler's own, recorded at generation time (`vespo.rollout.sample`).
See docs/training.md, "Asynchronous training".
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import sys
import time
import traceback
from dataclasses import dataclass

import torch

Tensor = torch.Tensor
_POLL_S = 0.005  # admission / stop polling interval of an idle sampler


class WeightStore:
    """The learner's parameters in one shared-memory buffer plus a version counter, guarded by one lock.

    `publish` copies the learner's weights in and bumps the version; `pull` copies them out into a sampler's model
    (casting to its dtype) when the version changed. Readers never see a half-written buffer (same lock).
    """

    def __init__(self, model: torch.nn.Module, ctx):
        params = list(model.named_parameters())  # tied weights appear once
        self.names = [n for n, _ in params]
        self.shapes = [tuple(p.shape) for _, p in params]
        self.flat = torch.zeros(sum(p.numel() for _, p in params), dtype=params[0][1].dtype).share_memory_()
        self.version = ctx.Value("q", -1, lock=False)
        self.lock = ctx.Lock()

    @torch.no_grad()
    def publish(self, model: torch.nn.Module, version: int) -> None:
        with self.lock:
            offset = 0
            for _, p in model.named_parameters():
                self.flat[offset : offset + p.numel()].copy_(p.detach().reshape(-1))
                offset += p.numel()
            self.version.value = version

    def named_tensors(self) -> list[tuple[str, Tensor]]:
        """(name, view into the shared buffer) pairs; read them under `lock`."""
        out, offset = [], 0
        for name, shape in zip(self.names, self.shapes, strict=True):
            n = int(torch.Size(shape).numel())
            out.append((name, self.flat[offset : offset + n].view(shape)))
            offset += n
        return out

    def pull(self, load, known_version: int) -> int:
        """Call `load(named_tensors)` if a newer version than `known_version` is published; return the version held."""
        if self.version.value == known_version:
            return known_version
        with self.lock:
            load(self.named_tensors())
            return self.version.value


class Schedule:
    """Admission control shared by the learner and the samplers (AReaL's `max_head_offpolicyness`, in optimizer steps).

    A sampler holding weights of version v may start a batch of N units (mini-batches) only if the batch's last unit
    will be trained within `max_staleness` steps of v, assuming every unit ahead of it is trained in order:
        step + (units in flight) + N - 1 - v <= max_staleness.
    Samplers thus never generate what would be dropped; the learner still drops anything that arrives too late (out
    of order with several samplers) and counts it. Counters are raw shared integers guarded by `lock`.
    """

    def __init__(self, ctx, *, units_per_batch: int, max_staleness: int, num_samplers: int, step: int, next_batch: int):
        self.units_per_batch, self.max_staleness = units_per_batch, max_staleness
        self.lock = ctx.Lock()
        self.step = ctx.Value("q", step, lock=False)  # learner optimizer steps done
        self.issued = ctx.Value("q", 0, lock=False)  # units admitted since this process group started
        self.consumed = ctx.Value("q", 0, lock=False)  # units the learner trained on, dropped, or declared lost
        self.next_batch = ctx.Value("q", next_batch, lock=False)  # id of the next batch (seeds its prompts, noise)
        self.holding = ctx.Array("q", [-1] * num_samplers, lock=False)  # batch id each sampler is generating, or -1

    def admit(self, rank: int, version: int) -> int | None:
        """A batch id for sampler `rank` to generate with weights `version`, or None if it would come too late."""
        with self.lock:
            in_flight = self.issued.value - self.consumed.value
            last_lag = self.step.value + in_flight + self.units_per_batch - 1 - version
            if version < 0 or last_lag > self.max_staleness:
                return None
            batch = self.next_batch.value
            self.next_batch.value += 1
            self.issued.value += self.units_per_batch
            self.holding[rank] = batch
            return batch

    def release(self, rank: int) -> None:
        with self.lock:
            self.holding[rank] = -1

    def consume(self, units: int, *, trained: bool) -> None:
        """The learner took `units` off the queue (one trained unit advances its step)."""
        with self.lock:
            self.consumed.value += units
            self.step.value += int(trained)


def batch_seed(seed: int, batch: int) -> int:
    """Seed of batch `batch`'s prompt draw and sampling noise: the batch's content depends on (seed, batch, weights)."""
    return (seed * 1_000_003 + batch) % (2**63)


@dataclass
class SampledBatch:
    """One generated batch as it travels through the queue (plain arrays: no shared-memory handles to leak)."""

    batch: int
    version: int
    rank: int
    rollout: dict  # Rollout fields as numpy arrays
    rewards: object  # (B,) numpy
    advantages: object  # (B,) numpy
    gen_s: float  # generation seconds
    reward_s: float  # reward + advantage seconds
    idle_s: float  # seconds the sampler waited (admission, full queue) since its previous batch
    created: float  # time.time() when put on the queue


# ----------------------------------------------------------------------------------------------------------------
# Engines: how a sampler generates. HF (tested here) and vLLM (GPU; not run here).


class HFEngine:
    """`vespo.rollout.sample` on a private copy of the policy (in `sampler_dtype`)."""

    def __init__(self, policy_path: str, cfg):
        from vespo.trainer import _DTYPES, load_policy

        self.model, self.tokenizer = load_policy(policy_path)
        self.model.to(_DTYPES[cfg.sampler_dtype]).eval().requires_grad_(False)
        self.cfg = cfg

    @torch.no_grad()
    def load(self, named: list[tuple[str, Tensor]]) -> None:
        params = dict(self.model.named_parameters())
        for name, t in named:
            params[name].copy_(t)

    def generate(self, prompts: list[str], seed: int):
        from vespo.rollout import sample

        cfg = self.cfg
        return sample(
            self.model,
            self.tokenizer,
            prompts,
            n=cfg.rollout_n,
            max_new_tokens=cfg.max_response_length,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            generator=torch.Generator().manual_seed(seed),
            logit_noise_std=cfg.rollout_logit_noise,
        )


class VLLMEngine:
    """vLLM in the sampler's own process; each published version is pushed in place with the model runner's
    `load_weights` (as TRL's colocate mode and veRL's sharding manager do), then the prefix cache is reset.

    Log-probs are vLLM's "processed" ones (after temperature), vespo's convention when top_p = 1 (with top_p < 1,
    check whether the vLLM version in use reports them before or after truncation). Needs CUDA: written against
    vLLM's `LLM` API with the in-process driver worker, and not run here; `pack_rollout` is tested on HF samples.
    """

    def __init__(self, policy_path: str, cfg):
        from vllm import LLM

        self.tokenizer = _tokenizer(policy_path)
        self.llm = LLM(
            model=str(policy_path),
            dtype=cfg.sampler_dtype,
            seed=cfg.seed,
            logprobs_mode="processed_logprobs",
        )
        self.cfg = cfg

    def load(self, named: list[tuple[str, Tensor]]) -> None:
        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
        runner.model.load_weights(named)
        self.llm.reset_prefix_cache()

    def generate(self, prompts: list[str], seed: int):
        from vllm import SamplingParams

        cfg = self.cfg
        params = SamplingParams(
            n=cfg.rollout_n,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_tokens=cfg.max_response_length,
            logprobs=0,  # the sampled token's log-prob only
            seed=seed,
        )
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        prompt_ids, response_ids, logps = [], [], []
        for out in outputs:
            for comp in out.outputs:
                prompt_ids.append(list(out.prompt_token_ids))
                response_ids.append(list(comp.token_ids))
                logps.append([d[t].logprob for d, t in zip(comp.logprobs, comp.token_ids, strict=True)])
        return pack_rollout(prompt_ids, response_ids, logps, pad_id=self.tokenizer.pad_token_id)


def _tokenizer(path: str):
    """The policy's tokenizer alone (vLLM loads the weights itself); pad = eos when unset, as `load_policy`."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def pack_rollout(prompt_ids: list[list[int]], response_ids: list[list[int]], logps: list[list[float]], *, pad_id: int):
    """Token lists from an inference engine -> `Rollout` (prompt left-padded, response right-padded, mask = tokens
    generated up to and including <eos>, sampler log-probs 0 on padding), the layout `vespo.rollout.sample` returns."""
    from vespo.rollout import Rollout

    b = len(prompt_ids)
    p, t = max(map(len, prompt_ids)), max(1, max(map(len, response_ids)))
    ids = torch.full((b, p + t), pad_id, dtype=torch.long)
    attn = torch.zeros(b, p + t, dtype=torch.long)
    lp = torch.zeros(b, t)
    for i, (pi, ri, li) in enumerate(zip(prompt_ids, response_ids, logps, strict=True)):
        ids[i, p - len(pi) : p] = torch.tensor(pi, dtype=torch.long)
        attn[i, p - len(pi) : p] = 1
        ids[i, p : p + len(ri)] = torch.tensor(ri, dtype=torch.long)
        attn[i, p : p + len(ri)] = 1
        lp[i, : len(li)] = torch.tensor(li, dtype=torch.float32)
    return Rollout(ids, attn, attn[:, p:].clone(), lp)


ENGINES = {"hf": HFEngine, "vllm": VLLMEngine}


# ----------------------------------------------------------------------------------------------------------------
# The sampler process


def _die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no orphans even if the learner is SIGKILLed)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the learner's shutdown path still terminates us
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def sampler_main(rank, cfg, policy_path, problems, store, schedule, batches, events, stop, parent) -> None:
    """Process entry point: generate scored batches with the newest admitted weights until `stop` is set.

    Errors are reported on `events` as ("error", rank, traceback) and end the process with exit code 1; the learner
    decides whether to restart it. SIGINT is ignored (Ctrl-C reaches the whole process group; the learner stops us).
    """
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _sample_loop(rank, cfg, policy_path, problems, store, schedule, batches, events, stop)
    except Exception:
        events.put(("error", rank, traceback.format_exc()))
        sys.exit(1)
    finally:
        if stop.is_set():
            batches.cancel_join_thread()  # the learner has stopped reading: do not block exit flushing a batch


def _sample_loop(rank, cfg, policy_path, problems, store, schedule, batches, events, stop) -> None:
    import transformers

    from vespo.advantages import group_advantages
    from vespo.rollout import decode_responses
    from vespo.trainer import format_prompts, load_reward_fn

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(cfg.num_threads or max(1, (os.cpu_count() or 1) // (cfg.num_samplers + 1)))
    reward_fn = load_reward_fn(cfg.reward_fn)
    engine = ENGINES[cfg.sampler_engine](policy_path, cfg)
    version = store.pull(engine.load, -1)
    events.put(("ready", rank, None))
    idle_since = time.perf_counter()
    while not stop.is_set():
        version = store.pull(engine.load, version)  # newest published weights
        batch = schedule.admit(rank, version)
        if batch is None:
            time.sleep(_POLL_S)
            continue
        t0 = time.perf_counter()
        seed = batch_seed(cfg.seed, batch)
        order = torch.randperm(len(problems), generator=torch.Generator().manual_seed(seed))
        chosen = [problems[i] for i in order[: cfg.train_batch_size].tolist()]
        rollout = engine.generate(format_prompts(engine.tokenizer, chosen, cfg.apply_chat_template), seed)
        t1 = time.perf_counter()
        answers = [p.answer for p in chosen for _ in range(cfg.rollout_n)]
        rewards = torch.tensor(reward_fn(decode_responses(engine.tokenizer, rollout), answers), dtype=torch.float32)
        advantages = group_advantages(rewards, cfg.rollout_n, norm_by_std=cfg.norm_adv_by_std)  # (B,)
        t2 = time.perf_counter()
        item = SampledBatch(
            batch=batch,
            version=version,
            rank=rank,
            rollout={k: v.numpy() for k, v in vars(rollout).items()},
            rewards=rewards.numpy(),
            advantages=advantages.numpy(),
            gen_s=t1 - t0,
            reward_s=t2 - t1,
            idle_s=t0 - idle_since,
            created=time.time(),
        )
        while not stop.is_set():
            try:
                batches.put(item, timeout=0.5)
                break
            except queue.Full:
                continue
        schedule.release(rank)
        idle_since = t2  # waiting on a full queue or on admission counts as idle

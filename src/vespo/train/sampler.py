"""Sampler side of asynchronous training (`vespo train --async`): versioned weights in shared memory, admission
control, and the sampler process that turns prompts into scored, versioned rollout batches.

Policy version = the learner's optimizer step count when the weights were published. A sample's lag is the learner's
step when it trains on the sample minus that version: the paper's staleness N - 1 of a sync run's last mini-batch.
The behaviour log-probs mu are the sampler's own, recorded at generation time (`vespo.rollout.sample`).
See docs/guides/trainer.md, "Asynchronous training".
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import sys
import time
import traceback
import typing
from dataclasses import dataclass

import torch

from vespo.train.shm import check_shared_memory  # one line, never torch's "unable to allocate shared memory"

if typing.TYPE_CHECKING:
    from vespo.rollout.types import SamplingSettings

Tensor = torch.Tensor
_POLL_S = 0.005  # admission / stop polling interval of an idle sampler
POOL_SHARED_BYTES = 1 << 20
"""Shared memory beside the weights: the pool's locks, counters, queues and stop event (56 KB measured: each
semaphore and heap arena takes a page of /dev/shm), with room to spare."""


class WeightStore:
    """The learner's parameters in one shared-memory buffer plus a version counter, guarded by one lock.

    `publish` copies the learner's weights in and bumps the version; `pull` copies them out into a sampler's model
    (casting to its dtype) when the version changed. Readers never see a half-written buffer (same lock).
    """

    def __init__(self, model: torch.nn.Module, ctx):
        check_shared_memory(self.shared_bytes(model))
        params = list(model.named_parameters())  # tied weights appear once
        self.names = [n for n, _ in params]
        self.shapes = [tuple(p.shape) for _, p in params]
        self.flat = torch.zeros(sum(p.numel() for _, p in params), dtype=params[0][1].dtype).share_memory_()
        self.version = ctx.Value("q", -1, lock=False)
        self.lock = ctx.Lock()

    @staticmethod
    def shared_bytes(model: torch.nn.Module) -> int:
        """Bytes of shared memory (/dev/shm) a store of `model` takes: its one buffer of every parameter (tied ones
        once, LoRA adapters included) in the first one's dtype, plus `POOL_SHARED_BYTES`. `model` may live on the
        meta device: the check before a run counts a policy it has not loaded (`vespo.train.host`)."""
        params = [p for _, p in model.named_parameters()]
        return sum(p.numel() for p in params) * params[0].element_size() + POOL_SHARED_BYTES

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

    def __init__(
        self, ctx, *, num_mini_batches: int, max_staleness: int, num_samplers: int, step: int, next_batch: int
    ):
        self.num_mini_batches, self.max_staleness = num_mini_batches, max_staleness
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
            last_lag = self.step.value + in_flight + self.num_mini_batches - 1 - version
            if version < 0 or last_lag > self.max_staleness:
                return None
            batch = self.next_batch.value
            self.next_batch.value += 1
            self.issued.value += self.num_mini_batches
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
class SamplerSpec:
    """What a sampler process reads of the run: its torch threads, the reward function (`module:function`), the
    engine and its sampling settings, the run's seed (each batch's prompts and noise, `batch_seed`), the prompts per
    batch (train_batch_size), and how prompts and advantages are made (`make_batch`)."""

    threads: int
    reward_fn: str
    engine: str
    sampling: SamplingSettings
    seed: int
    batch_size: int
    chat: bool
    norm_by_std: bool


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
# The sampler process


def _die_with_parent(learner: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies: the fork server (vespo.train.forkserver), which exits
    when the learner does, so no sampler outlives a SIGKILLed learner."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the learner's shutdown path still terminates us
        pass
    # A forked child inherits the write end of the server's liveness pipe (Python keeps it for grandchildren we never
    # make); while we held it the server could not see the learner's death (EOF) and exit.
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if getattr(server, "_forkserver_alive_fd", None) is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    try:
        os.kill(learner, 0)
    except ProcessLookupError:  # the learner died before prctl took effect
        os._exit(1)


def sampler_main(rank, cfg: SamplerSpec, policy_path, problems, store, schedule, batches, events, stop, parent,
                 environ) -> None:  # fmt: skip
    """Process entry point: generate scored batches with the newest admitted weights until `stop` is set. `environ`
    is the learner's environment when it started this sampler (the fork server keeps the one it started with).

    Errors are reported on `events` as ("error", rank, traceback) and end the process with exit code 1; the learner
    decides whether to restart it. A failure of the grading host is ("host", rank, message): the learner stops the
    run, since a restarted sampler would only score zeros again. SIGINT is ignored (Ctrl-C reaches the whole process
    group; the learner stops us).
    """
    from vespo.rewards.batch import GraderHostError  # deferred like every import of the loop (the fork server has them)

    _die_with_parent(parent)
    os.environ.clear()
    os.environ.update(environ)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _sample_loop(rank, cfg, policy_path, problems, store, schedule, batches, events, stop)
    except GraderHostError as exc:
        events.put(("host", rank, str(exc)))
        sys.exit(1)
    except Exception:
        events.put(("error", rank, traceback.format_exc()))
        sys.exit(1)
    finally:
        if stop.is_set():
            batches.cancel_join_thread()  # the learner has stopped reading: do not block exit flushing a batch


def _sample_loop(rank, cfg: SamplerSpec, policy_path, problems, store, schedule, batches, events, stop) -> None:
    import transformers

    from vespo.rewards.batch import load_reward_fn
    from vespo.rollout import build_engine
    from vespo.train.produce import make_batch

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(cfg.threads)
    reward_fn = load_reward_fn(cfg.reward_fn)
    engine = build_engine(cfg.engine, cfg.sampling, policy_path=policy_path, seed=cfg.seed)
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
        chosen = [problems[i] for i in order[: cfg.batch_size].tolist()]
        scored = make_batch(engine, chosen, reward_fn, torch.Generator().manual_seed(seed), group=cfg.sampling.n,
                            chat=cfg.chat, norm_by_std=cfg.norm_by_std)  # fmt: skip
        t2 = time.perf_counter()
        item = SampledBatch(
            batch=batch,
            version=version,
            rank=rank,
            rollout={k: v.numpy() for k, v in vars(scored.rollout).items()},
            rewards=scored.rewards.numpy(),
            advantages=scored.advantages.numpy(),
            gen_s=scored.gen_s,
            reward_s=scored.reward_s,
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

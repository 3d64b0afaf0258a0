"""Asynchronous training with bounded staleness: `vespo train --async` (config `mode: async`).

`num_samplers` sampler processes (vespo.train.sampler) each hold their own copy of the policy, draw prompts, generate
`rollout_n` responses per prompt recording their own log-probs mu, grade them and compute group advantages, and put
the batch, tagged with its policy version, on a bounded queue. The learner (this module, `train_async`) reads top to
bottom: take a mini-batch -> drop it if it lags more than `max_staleness` optimizer steps -> one optimizer step with
the trainer's own `ppo_update` (mu into the loss as old_log_prob; or, with `use_decoupled_loss`, the learner's
current weights as pi_prox and mu as rollout_log_prob) -> publish weights to shared memory every `sync_every` steps
-> log, evaluate, checkpoint every `train_batch_size / ppo_mini_batch_size` steps (one "rollout step", as in sync).
Design choices, metrics and what is not reproducible: docs/guides/trainer.md, "Asynchronous training".
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import queue
import sys
import time

import numpy as np
import torch

from vespo.checkpoints import ASYNC, NEXT_BATCH
from vespo.deadline import sigterm_as_interrupt
from vespo.outputs import OwnedDir, write_atomic
from vespo.rewards.batch import GraderHostError
from vespo.rollout import Rollout
from vespo.train.config import TrainConfig
from vespo.train.fields import AsyncSettings, BatchSettings
from vespo.train.forkserver import sampler_context
from vespo.train.sampler import SampledBatch, SamplerSpec, Schedule, WeightStore, batch_seed, sampler_main
from vespo.train.setup import completion_rows, setup_run, update_settings
from vespo.train.step_metrics import rollout_metrics, to_floats
from vespo.train.system import clock, release_free_memory

_MAX_RESTARTS = 3  # sampler crashes tolerated per run before the run fails
_STARTUP_S = 600.0  # a sampler that is not ready (model loaded, weights pulled) after this long fails the run
_STALL_S = 1800.0  # no batch from live samplers for this long = hung generation: fail instead of waiting forever
_JOIN_S = 10.0  # grace period for samplers to exit on stop before they are terminated, then killed


_NO_MESSAGE_AT_START = (
    "no error message: it died before vespo code ran. Samplers are started by Python's fork server, which re-imports "
    "the main module: a script that calls vespo.train.train must do so under `if __name__ == '__main__':`."
)


@dataclasses.dataclass
class Unit:
    """One mini-batch as the learner trains on it: rows of one sampled batch, all generated with `version`."""

    batch: int
    version: int
    rollout: Rollout
    rewards: torch.Tensor  # (b,)
    advantages: torch.Tensor  # (b,)
    busy_s: float  # this unit's share of the sampler's generation + reward time
    gen_s: float  # this unit's share of generation time
    reward_s: float  # this unit's share of grading time
    queued_s: float  # seconds its batch sat in the queue


class SamplerPool:
    """The learner's handle on the samplers: spawn, feed weights, receive units, watch health, restart, stop."""

    def __init__(self, ctx, spec: SamplerSpec, cfg: AsyncSettings, batch: BatchSettings, policy_path: str,
                 problems: list, model, *, step: int, next_batch: int):  # fmt: skip
        """`spec`: what each sampler reads; `cfg` and `batch`: the pool's own settings (samplers, staleness window,
        mini-batches and their rows, shuffle)."""
        self.spec, self.cfg, self.batch, self.policy_path, self.problems = spec, cfg, batch, str(policy_path), problems
        self.device = next(model.parameters()).device  # the learner's: units are moved there on arrival
        self.ctx = ctx  # `sampler_context`
        self.store = WeightStore(model, self.ctx)
        self.schedule = Schedule(
            self.ctx,
            num_mini_batches=batch.num_mini_batches,
            max_staleness=cfg.max_staleness,
            num_samplers=cfg.num_samplers,
            step=step,
            next_batch=next_batch,
        )
        # admission keeps at most max_staleness + 1 units in flight; the bound below never blocks admitted work
        self.batches = self.ctx.Queue(maxsize=cfg.max_staleness // batch.num_mini_batches + 1 + cfg.num_samplers)
        self.events = self.ctx.Queue()
        self.stop = self.ctx.Event()
        self.procs: list = [None] * cfg.num_samplers
        self.errors: dict[int, str] = {}
        self.units: collections.deque[Unit] = collections.deque()
        self.received: set[int] = set()
        self.next_batch = next_batch  # 1 + the largest batch id received: where a resumed run continues
        self.restarts = self.lost_batches = 0
        self.busy_s = self.idle_s = 0.0  # sampler seconds generating + grading / waiting, summed over batches received
        self._last_arrival = time.perf_counter()

    # --- lifecycle
    def start(self, model, version: int) -> None:
        self.store.publish(model, version)
        for rank in range(self.cfg.num_samplers):
            self._spawn(rank)
        self._wait_ready(set(range(self.cfg.num_samplers)))
        self._last_arrival = time.perf_counter()

    def _spawn(self, rank: int) -> None:
        args = (rank, self.spec, self.policy_path, self.problems, self.store, self.schedule, self.batches, self.events)
        proc = self.ctx.Process(
            target=sampler_main,
            args=(*args, self.stop, os.getpid(), dict(os.environ)),
            name=f"vespo-sampler-{rank}",
            daemon=True,
        )
        proc.start()
        self.procs[rank] = proc

    def _wait_ready(self, ranks: set[int]) -> None:
        """Wait until `ranks` have loaded their model and pulled the weights. A sampler that dies before that fails
        the run at once (start-up errors repeat; restarting would not help)."""
        deadline = time.perf_counter() + _STARTUP_S
        while ranks:
            try:
                kind, rank, payload = self.events.get(timeout=0.5)
            except queue.Empty:
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"sampler(s) {sorted(ranks)} not ready after {_STARTUP_S:.0f} s") from None
                for rank in sorted(ranks):
                    if self.procs[rank].exitcode is not None:
                        self._drain_events()
                        error = self.errors.pop(rank, "").strip() or _NO_MESSAGE_AT_START
                        raise RuntimeError(
                            f"sampler {rank} died while starting (exit code {self.procs[rank].exitcode}):\n{error}"
                        ) from None
                continue
            if kind == "ready":
                ranks.discard(rank)
            else:
                self._note(kind, rank, payload)

    def close(self) -> None:
        """Stop every sampler: ask, wait `_JOIN_S`, then SIGTERM, then SIGKILL. Idempotent."""
        self.stop.set()
        deadline = time.perf_counter() + _JOIN_S
        for proc in self.procs:
            if proc is not None:
                proc.join(timeout=max(0.0, deadline - time.perf_counter()))
        for proc in self.procs:
            if proc is not None and proc.is_alive():
                proc.terminate()
                proc.join(timeout=2.0)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        for q in (self.batches, self.events):
            q.cancel_join_thread()
            q.close()

    # --- learner side
    def next_unit(self) -> tuple[Unit, float]:
        """The next mini-batch in arrival order, and the seconds the learner waited for it."""
        t0 = time.perf_counter()
        while not self.units:
            try:
                self._receive(self.batches.get(timeout=0.5))
            except queue.Empty:
                self._check_health()
                if time.perf_counter() - self._last_arrival > _STALL_S:
                    raise RuntimeError(
                        f"no rollout batch for {_STALL_S:.0f} s although the samplers are alive (hung generation?)"
                    ) from None
        return self.units.popleft(), time.perf_counter() - t0

    def _receive(self, item: SampledBatch) -> None:
        self._last_arrival = time.perf_counter()
        self.received.add(item.batch)
        self.next_batch = max(self.next_batch, item.batch + 1)
        self.busy_s += item.gen_s + item.reward_s
        self.idle_s += item.idle_s
        rollout = Rollout(**{k: torch.from_numpy(v).to(self.device) for k, v in item.rollout.items()})
        rewards, advantages = (torch.from_numpy(a).to(self.device) for a in (item.rewards, item.advantages))
        if self.batch.shuffle:  # as ppo_update does in sync mode, seeded by the batch so resume reproduces it
            gen = torch.Generator().manual_seed(batch_seed(self.spec.seed, item.batch))
            order = torch.randperm(rewards.numel(), generator=gen)
            rollout, rewards, advantages = rollout.select(order), rewards[order], advantages[order]
        num_mini_batches, rows = self.batch.num_mini_batches, self.batch.ppo_mini_batch_size * self.batch.rollout_n
        queued = max(0.0, time.time() - item.created)
        for j in range(num_mini_batches):
            sl = slice(j * rows, (j + 1) * rows)
            self.units.append(
                Unit(
                    batch=item.batch,
                    version=item.version,
                    rollout=rollout.select(sl),
                    rewards=rewards[sl],
                    advantages=advantages[sl],
                    busy_s=(item.gen_s + item.reward_s) / num_mini_batches,
                    gen_s=item.gen_s / num_mini_batches,
                    reward_s=item.reward_s / num_mini_batches,
                    queued_s=queued,
                )
            )

    def _drain_events(self) -> None:
        while True:
            try:
                kind, rank, payload = self.events.get_nowait()
            except queue.Empty:
                return
            self._note(kind, rank, payload)

    def _note(self, kind: str, rank: int, payload: str) -> None:
        """Keep a sampler's error for when its death is handled; a grading-host failure stops the run at once."""
        if kind == "host":
            raise GraderHostError(f"sampler {rank}: {payload}")
        if kind == "error":
            self.errors[rank] = payload

    def _check_health(self) -> None:
        self._drain_events()
        for rank, proc in enumerate(self.procs):
            if proc.exitcode is not None:
                self._handle_death(rank)

    def _handle_death(self, rank: int) -> None:
        """Report a dead sampler, write off the batch it was generating, and restart it (or fail the run)."""
        proc = self.procs[rank]
        while True:  # batches it finished before dying are still good
            try:
                self._receive(self.batches.get_nowait())
            except queue.Empty:
                break
        time.sleep(0.1)  # let its last error message arrive
        self._drain_events()
        holding = self.schedule.holding[rank]
        if holding >= 0 and holding not in self.received:
            self.schedule.consume(self.batch.num_mini_batches, trained=False)  # its units will never arrive
            self.lost_batches += 1
        self.schedule.release(rank)
        error = self.errors.pop(rank, "").strip()
        last = error.splitlines()[-1] if error else "no error message (killed?)"
        message = f"sampler {rank} (pid {proc.pid}) died with exit code {proc.exitcode}: {last}"
        if self.restarts >= _MAX_RESTARTS:
            detail = f"\n{error}" if error else ""
            raise RuntimeError(f"{message}; {self.restarts} restarts already, giving up{detail}")
        self.restarts += 1
        print(f"vespo train --async: {message}; restarting it ({self.restarts}/{_MAX_RESTARTS})", file=sys.stderr)
        self._spawn(rank)
        self._wait_ready({rank})


# ----------------------------------------------------------------------------------------------------------------
# Lag statistics


def lag_bucket(lag: int) -> str:
    """Lag buckets for per-lag metrics: 0, 1, 2-3, 4-7, 8-15, ..."""
    if lag < 2:
        return str(lag)
    lo = 1 << (lag.bit_length() - 1)
    return f"{lo}-{2 * lo - 1}"


class LagStats:
    """Per-lag accumulators of one logging window and of the whole run (the run's go to async_summary.json)."""

    def __init__(self):
        self.window: dict[str, list[float]] = collections.defaultdict(list)
        self.run: dict[str, list[float]] = collections.defaultdict(list)

    def add(self, key: str, value: float) -> None:
        self.window[key].append(value)
        self.run[key].append(value)

    def flush(self) -> dict[str, float]:
        """Means over the window (counts for `lag_hist/*` and `dropped`), then reset it."""
        out = {}
        for key, vals in self.window.items():
            counted = key.startswith("lag_hist/") or key == "units_dropped"
            out[f"async/{key}"] = float(len(vals)) if counted else float(np.mean(vals))
        self.window.clear()
        return out

    def summary(self) -> dict:
        hist = {k.removeprefix("lag_hist/"): len(v) for k, v in self.run.items() if k.startswith("lag_hist/")}
        buckets = sorted({k.split("/")[0] for k in self.run if k.startswith("lag_") and "/" in k} - {"lag_hist"})
        return {
            "lag_hist": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
            "units_dropped": len(self.run.get("units_dropped", [])),
            "per_lag_bucket": {
                b.removeprefix("lag_"): {
                    m: float(np.mean(self.run[f"{b}/{m}"]))
                    for m in ("log_w_mean", "weight_ess")
                    if f"{b}/{m}" in self.run
                }
                | {"units": len(self.run.get(f"{b}/log_w_mean", []))}
                for b in buckets
            },
        }


# ----------------------------------------------------------------------------------------------------------------
# The learner loop


def train_async(cfg: TrainConfig, out: OwnedDir) -> dict[str, float]:
    """Run asynchronous RL training per `cfg` (mode == "async") in the claimed run dir `out`; returns the
    last step's metrics."""
    settings = update_settings(cfg, num_mini_batches=1, shuffle=False)  # one update per queued mini-batch
    ctx = sampler_context()  # started by `vespo train --async` already, else now: beside the learner's setup
    state = setup_run(cfg, out, settings)  # the thread count, chosen there for the learner and every sampler
    run, learner, tokenizer = state.run, state.learner, state.tokenizer
    model = learner.model
    next_batch = state.loop[ASYNC][NEXT_BATCH] if ASYNC in state.loop else 0
    opt_step = state.start * cfg.batch.num_mini_batches  # = the policy version of the learner's current weights
    spec = SamplerSpec(threads=state.threads, reward_fn=cfg.data.reward_fn, engine=cfg.async_.sampler_engine,
                       sampling=cfg.sampling, seed=cfg.run.seed, batch_size=cfg.batch.train_batch_size,
                       chat=cfg.data.apply_chat_template, norm_by_std=cfg.algorithm.norm_adv_by_std)  # fmt: skip
    pool = SamplerPool(ctx, spec, cfg.async_, cfg.batch, state.policy_path, state.train_set, model, step=opt_step,
                       next_batch=next_batch)  # fmt: skip
    steps = _Steps(cfg, pool, learner, run, tokenizer)
    metrics, t_loop = run.logger.last, time.perf_counter()
    with sigterm_as_interrupt(), contextlib.closing(pool):
        pool.start(model, opt_step)
        run.begin()
        for step in range(state.start + 1, cfg.batch.total_training_steps + 1):
            metrics = steps.step(step, opt_step)
            opt_step = steps.opt_step
            if run.end_step(step, metrics, learner, state.gen, show="async/lag_mean", loop=steps.checkpoint()):
                break
    summary = steps.stats.summary() | {
        "loop_s": time.perf_counter() - t_loop,
        "sampler_restarts": pool.restarts,
        "lost_batches": pool.lost_batches,
        "samples_dropped": steps.dropped_total,
    }
    write_atomic(run.dir / "async_summary.json", json.dumps(summary, indent=2) + "\n")
    run.finish(model, tokenizer)
    return metrics


class _Steps:
    """The learner's rollout steps: N mini-batches off the queue, each trained on (or dropped when too stale), then
    the step's metrics; keeps the policy version (`opt_step`), the lag statistics and the samples dropped."""

    def __init__(self, cfg: TrainConfig, pool: SamplerPool, learner, run, tokenizer):
        self.pool, self.learner, self.run, self.tokenizer = pool, learner, run, tokenizer
        self.n, self.cfg, self.rollout, self.record = cfg.batch.num_mini_batches, cfg.async_, cfg.rollout, cfg.run
        self.device = next(learner.model.parameters()).device
        self.stats, self.dropped_total, self.opt_step = LagStats(), 0, 0

    def checkpoint(self) -> dict:
        """The loop's own checkpoint entries: where the samplers' batches continue."""
        return {ASYNC: {NEXT_BATCH: self.pool.next_batch}}

    def step(self, step: int, opt_step: int) -> dict[str, float]:
        """Rollout step `step` from policy version `opt_step`: its metrics (like the sync trainer's, once per
        train_batch_size prompts)."""
        pool, self.opt_step = self.pool, opt_step
        t0, waited, busy0, idle0 = time.perf_counter(), 0.0, pool.busy_s, pool.idle_s
        per_unit: list[dict[str, float]] = []
        rewards = []
        while len(per_unit) < self.n:
            # 1. the next mini-batch off the queue; too stale -> dropped (counted, never trained on)
            unit, wait_s = pool.next_unit()
            waited += wait_s
            lag = self.opt_step - unit.version
            if lag > self.cfg.max_staleness:
                pool.schedule.consume(1, trained=False)
                self.stats.add("units_dropped", lag)
                self.dropped_total += unit.rollout.response_mask.shape[0]
                continue
            per_unit.append(self._train(unit, lag))
            rewards.append(unit.rewards)
            if self.record.log_completions and len(per_unit) == 1:  # the step's first mini-batch
                rows = completion_rows(self.tokenizer, unit.rollout, unit.rewards, unit.advantages,
                                       self.record.num_completions_to_print)  # fmt: skip
                self.run.logger.log_completions(rows, step)
        # 5. log (like the sync trainer, once per train_batch_size prompts)
        release_free_memory()  # the updates' freed transients go back to the OS
        step_s = time.perf_counter() - t0
        metrics = _step_metrics(per_unit, rewards, self.n) | self.stats.flush()
        metrics["async/lag_max"] = max(float(k.rpartition("/")[2]) for k in metrics if "lag_hist/" in k)
        busy, idle = pool.busy_s - busy0, pool.idle_s - idle0
        return metrics | {"time/step_s": step_s, "async/queue_wait_s": waited,
                          "async/learner_util": 1 - waited / step_s,
                          "async/sampler_util": busy / max(busy + idle, 1e-9),
                          "async/policy_version": float(self.opt_step),
                          "async/samples_dropped_total": float(self.dropped_total),
                          "async/sampler_restarts": float(pool.restarts)}  # fmt: skip

    def _train(self, unit: Unit, lag: int) -> dict[str, float]:
        """One optimizer step on `unit`; its metrics."""
        learner, device, decoupled = self.learner, self.device, self.cfg.use_decoupled_loss
        # 2. old log-probs: mu as the sampler recorded it (the behaviour policy itself), or with the
        # decoupled loss pi_prox = the learner's weights right now, mu then entering as rollout_log_prob
        mu = unit.rollout.rollout_log_prob  # (b, T)
        t_score = clock(device)
        old_log_prob = learner.log_probs(unit.rollout) if decoupled else mu
        t_old = clock(device)
        # 3. one optimizer step on it, then publish every sync_every steps
        ref_log_prob = learner.reference_log_probs(unit.rollout)
        rollout_log_prob = mu if decoupled and self.rollout.use_rollout_log_prob else None
        update = learner.update(unit.rollout, unit.advantages, old_log_prob, ref_log_prob=ref_log_prob,
                                rollout_log_prob=rollout_log_prob)  # fmt: skip
        t_update = clock(device)
        self.opt_step += 1
        self.pool.schedule.consume(1, trained=True)
        if self.opt_step % self.cfg.sync_every == 0:
            self.pool.store.publish(learner.model, self.opt_step)
        # 4. per-unit metrics, by lag (no train-inference gap: the sampler's weights are not the learner's)
        times = (t_score, t_old, t_update)
        length = self.rollout.max_response_length
        return _unit_metrics(unit, update, old_log_prob, lag, self.stats, times, max_response_length=length,
                             decoupled=decoupled)  # fmt: skip


def _unit_metrics(unit, update: dict, old_log_prob, lag: int, stats: LagStats, times, *, max_response_length: int,
                  decoupled: bool) -> dict:  # fmt: skip
    """One trained mini-batch's metrics as floats (its rollout, its update, the sampler's and the learner's seconds),
    and its log W / ESS added to the lag statistics (with the `decoupled` loss the stale part of W is pi_prox /
    mu)."""
    t_score, t_old, t_update = times
    m = to_floats(rollout_metrics(unit.rewards, unit.rollout, max_response_length) | update)
    m["time/gen_s"], m["time/reward_s"], m["async/queue_age_s"] = unit.gen_s, unit.reward_s, unit.queued_s
    m["time/old_log_prob_s"], m["time/update_s"] = t_old - t_score, t_update - t_old
    bucket = f"lag_{lag_bucket(lag)}"
    log_w = m.get("is/log_w_mean", 0.0)
    if decoupled:
        mu, mask = unit.rollout.rollout_log_prob, unit.rollout.response_mask
        log_w = float(((old_log_prob - mu) * mask).sum(-1).mean())
    stats.add(f"lag_hist/{lag}", 1.0)
    stats.add("lag_mean", float(lag))
    stats.add(f"{bucket}/log_w_mean", log_w)
    if "weight/ess" in m:
        stats.add(f"{bucket}/weight_ess", m["weight/ess"])
    return m


def _step_metrics(per_unit: list[dict], rewards: list[torch.Tensor], num_mini_batches: int) -> dict[str, float]:
    """A rollout step's metrics from its N mini-batches: means, except the seconds (sampler time behind the step's
    samples, overlapped with the learner, and the learner's own), which add up; reward over all its samples."""
    metrics = {k: float(np.mean([u[k] for u in per_unit])) for k in per_unit[0]}
    for key in ("time/gen_s", "time/reward_s", "time/old_log_prob_s", "time/update_s"):
        metrics[key] = float(np.sum([u[key] for u in per_unit]))
    all_rewards = torch.cat(rewards)
    metrics["reward/mean"] = float(all_rewards.mean())
    metrics["reward/std"] = float(all_rewards.std()) if all_rewards.numel() > 1 else 0.0
    metrics["actor/num_mini_batches"] = float(num_mini_batches)
    return metrics

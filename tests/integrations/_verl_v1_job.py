"""One rank of veRL 0.9.1's V1 `separate_async` training step with a vespo loss, on CPU; started by
tests/integrations/test_verl_v1.py.

Usage: RANK=r WORLD_SIZE=n MASTER_ADDR=... MASTER_PORT=... python _verl_v1_job.py MODEL_DIR OUT_JSON

What runs is veRL's own code: `PPOTrainerSeparateAsync.step` (its `parameter_sync_step` loop, the decoupled-mode
`_compute_old_log_prob` that snapshots pi_old through `DetachActorWorker.save_model_to_cpu` / `restore_model_from_cpu`,
the base trainer's `_balance_batch`, `_compute_advantage` (GRPO, veRL's rollout-correction weights) and
`_update_actor`), on a `DetachActorWorker` (FSDP2 engine, role "actor" as separate_async builds it with
`hybrid_engine=False`) from veRL's `ppo_trainer` config with the example's V1 lines.
Three things V1 needs a cluster for are stood in for here, each as small as the step allows:
- TransferQueue (Ray actors): `_LocalKV` keeps each sample's fields in this process and assembles a batch with
  veRL's own `list_of_dict_to_tensordict` (how the agent loop builds what it puts), a field jagged in the
  partition coming back nested, as TQ's controller keeps nestedness per field;
- the Ray worker group: `_LocalGroup` does what veRL's dispatch and `tqbridge` do around a worker call (fetch the
  batch, add `extra_info` as non-tensor data, `BatchData.chunk` across data-parallel ranks, `BatchData.concat`
  of every rank's output, write tensor outputs back), with torch.distributed in place of Ray;
- rollout: the samples are put as the agent loop and reward loop put them (per-sample prompt/response ids,
  rollout log-probs, rm_scores), and the replay buffer hands them out one mini-batch at a time.
The optimizer is SGD with lr 1 and no clipping, so rank 0 can replay the step with `vespo.compute_policy_loss`.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from _verl_cpu import copy_snapshots_to_host  # noqa: E402
from _verl_ranks import run_ranks  # noqa: E402
from _verl_worker_job import P, R, compose, make_batch, reference_log_probs  # noqa: E402

SYNC_STEPS = 4  # trainer.v1.separate_async.parameter_sync_step: mini-batches per weight version
PROMPTS = 2  # ppo_mini_batch_size (prompts per mini-batch)
N = 2  # rollout.n responses per prompt
MINI = PROMPTS * N  # sequences per mini-batch
SEQS = SYNC_STEPS * MINI  # train_batch_size * n
MICRO = 1  # ppo_micro_batch_size_per_gpu

# name, veRL loss_mode, hparams given as overrides, loss_agg_mode, rollout_is level (None: no rollout correction)
SCENARIOS = [
    ("vespo", "vespo", {"c1_pos": 1.5, "c2_neg": 4.0}, "token-mean", None),
    ("vespo_is_sequence", "vespo", {}, "token-mean", "sequence"),
    ("gspo", "vespo_gspo", {"clip_ratio_low": 0.05, "clip_ratio_high": 0.08}, "seq-mean-token-mean", None),
]

# the V1 lines of examples/verl/v1_separate_async_megatron.sh at this test's sizes, less the weight-sync backend: the
# worker builds its checkpoint engine in init_model, and nccl's needs cupy and a GPU (no weight sync runs here)
V1_LINES = [
    "trainer.use_v1=True",
    "trainer.v1.trainer_mode=separate_async",
    f"trainer.v1.separate_async.parameter_sync_step={SYNC_STEPS}",
    "trainer.v1.sampler.max_off_policy_threshold=2",
    "trainer.v1.sampler.max_off_policy_strategy=wait",
    "actor_rollout_ref.hybrid_engine=False",  # separate_async then builds a pure actor: DetachActorWorker, "actor"
    "algorithm.rollout_correction.bypass_mode=False",
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.calculate_log_probs=True",
    f"data.train_batch_size={SYNC_STEPS * PROMPTS}",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS}",
    f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
    f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
    f"actor_rollout_ref.rollout.n={N}",
    "actor_rollout_ref.actor.shuffle=False",
]


class _LocalKV:
    """TransferQueue's `kv_batch_get` / `kv_batch_put` over samples kept in this process (see the module doc)."""

    def __init__(self):
        self.rows: dict[tuple[str, str], dict] = {}
        self.tags: dict[tuple[str, str], dict] = {}
        self.jagged: set[str] = set()

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        from tensordict.tensorclass import NonTensorStack
        from transfer_queue import KVBatchMeta

        for name, value in fields.items() if fields is not None else ():
            parts = value.tolist() if isinstance(value, NonTensorStack) else list(value.unbind(0))
            for key, part in zip(keys, parts, strict=True):
                self.rows.setdefault((partition_id, key), {})[name] = part
            shapes = {tuple(p.shape) for p in parts if isinstance(p, torch.Tensor)}
            if len(shapes) > 1 or (value.is_nested if isinstance(value, torch.Tensor) else False):
                self.jagged.add(name)
        for key, tag in zip(keys, tags or [{} for _ in keys], strict=True):
            self.tags.setdefault((partition_id, key), {}).update(tag)
        return KVBatchMeta(
            keys=list(keys), tags=[dict(self.tags[(partition_id, k)]) for k in keys], partition_id=partition_id
        )

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        from verl.utils import tensordict_utils as tu

        rows = [self.rows[(partition_id, k)] for k in keys]
        names = select_fields or list(rows[0])
        td = tu.list_of_dict_to_tensordict([{n: r[n] for n in names if n in r} for r in rows])
        for name in names:
            value = td.get(name, None)
            if name in self.jagged and isinstance(value, torch.Tensor) and not value.is_nested:
                td[name] = torch.nested.as_nested_tensor(list(value.unbind(0)), layout=torch.jagged)
        return td


class _LocalGroup:
    """veRL's worker group for this process's DetachActorWorker: dispatch, TQ bridge and collect (module doc)."""

    def __init__(self, worker, kv: _LocalKV, rank: int, world: int):
        self.worker, self.kv, self.rank, self.world = worker, kv, rank, world
        self._dispatch_info = {}
        self.snapshots: list[str] = []  # save/restore/clear calls, in order
        self.update_metrics: list[dict] = []  # what each update_actor returned (one per mini-batch)

    def _query_dispatch_info(self, role):
        return list(range(self.world))  # one data-parallel rank per process

    def _run(self, name, meta):
        from verl.protocol import BatchData
        from verl.utils import tensordict_utils as tu

        base, extra = divmod(len(meta.keys), self.world)  # TQ's BatchMeta.chunk: contiguous, remainder first
        start = self.rank * base + min(self.rank, extra)
        keys = meta.keys[start : start + base + (self.rank < extra)]
        td = self.kv.kv_batch_get(keys, meta.partition_id, select_fields=meta.fields)
        for key, value in meta.extra_info.items():
            tu.assign_non_tensor_data(td, key, value)
        out = getattr(self.worker, name)(td)
        outs = [None] * self.world
        dist.all_gather_object(outs, out)
        return BatchData(outs).concat()

    def compute_log_prob(self, meta):
        from tensordict.tensorclass import NonTensorStack

        out = self._run("compute_log_prob", meta)
        fields = [k for k, v in out.items() if isinstance(v, torch.Tensor | NonTensorStack)]
        return self.kv.kv_batch_put(meta.keys, meta.partition_id, fields=out.select(*fields))

    def update_actor(self, meta):
        from verl.utils import tensordict_utils as tu

        out = self._run("update_actor", meta)
        self.update_metrics.append(dict(tu.get(out, "metrics")))
        return out

    def save_model_to_cpu(self, n):
        self.snapshots.append(f"save {n}")
        self.worker.save_model_to_cpu(n)

    def restore_model_from_cpu(self, n):
        self.snapshots.append(f"restore {n}")
        self.worker.restore_model_from_cpu(n)

    def clear_cpu_model(self, n):
        self.snapshots.append(f"clear {n}")
        self.worker.clear_cpu_model(n)


class _ReplayBuffer:
    """The replay buffer's `sample`: the next mini-batch of finished groups, in the order they were put."""

    def __init__(self, kv: _LocalKV, keys: list[str]):
        self.kv, self.keys = kv, keys
        self.served = 0

    def sample(self, global_steps, partition_id, batch_size):
        from transfer_queue import KVBatchMeta

        n_rows = batch_size * N  # batch_size counts prompt groups
        keys = self.keys[self.served : self.served + n_rows]
        self.served += n_rows
        tags = [dict(self.kv.tags[(partition_id, k)]) for k in keys]
        return KVBatchMeta(keys=keys, tags=tags, partition_id=partition_id), {}


def put_rollouts(kv: _LocalKV, batch: dict, rollout: torch.Tensor, rewards: torch.Tensor) -> list[str]:
    """Each sequence's fields as veRL's agent loop puts them (`AgentLoopOutput.as_dict` plus its ids and
    positions); rm_scores as the reward loop writes them (the score on the last response token)."""
    from verl.utils import tensordict_utils as tu

    keys, rows = [], []
    for i in range(SEQS):
        p_mask, r_mask = batch["attention_mask"][i, :P].bool(), batch["response_mask"][i].bool()
        prompt, response = batch["prompts"][i][p_mask], batch["responses"][i][r_mask]
        rm = torch.zeros(len(response))
        rm[-1] = rewards[i]
        ids = torch.cat([prompt, response])
        keys.append(f"p{i // N}_{i % N}_0")  # {uid}_{session_id}_{index}, the agent loop's key format
        rows.append(
            {
                "prompts": prompt,
                "responses": response,
                "response_mask": torch.ones_like(response),
                "loss_mask": torch.ones_like(response),
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "position_ids": torch.arange(len(ids)),
                "rollout_log_probs": rollout[i][r_mask].float(),
                "rm_scores": rm,
                "uid": f"p{i // N}",
            }
        )
    tags = [{"status": "success", "seq_len": len(r["input_ids"]), "global_steps": 1} for r in rows]
    kv.kv_batch_put(keys, "train", fields=tu.list_of_dict_to_tensordict(rows), tags=tags)
    return keys


def grpo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """(SEQS,) GRPO advantage by hand: (r - group mean) / (group std + 1e-6), unbiased std over the N responses."""
    r = rewards.view(-1, N)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).reshape(-1)


def run_scenario(model_dir, name, loss_mode, hparams, agg, level, rank, world):
    from transformers import AutoModelForCausalLM
    from verl.experimental.separation.engine_workers import DetachActorWorker
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1 import trainer_base
    from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode, PPOTrainerSeparateAsync
    from verl.utils import fsdp_utils
    from verl.utils.config import omega_conf_to_dataclass

    import vespo
    from vespo.integrations.verl import vespo_method

    extra = [*V1_LINES, "algorithm.rollout_correction.rollout_is_threshold=1e9"]
    cfg = compose(model_dir, loss_mode, hparams, agg, level, world, extra=tuple(extra))
    worker = DetachActorWorker(cfg.actor_rollout_ref, role="actor")
    worker.init_model()
    # veRL's own snapshot helper on host-resident shards: do the saved tensors share the live parameters' storage?
    module = worker.actor.engine.module
    state, _ = fsdp_utils.fsdp2_sharded_save_to_cpu.unwrapped(module)
    live = {n: (p._local_tensor if hasattr(p, "_local_tensor") else p) for n, p in module.named_parameters()}
    aliases = all(t.data_ptr() == live[n].data_ptr() for n, (t, _) in state.items())

    ref_model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32)
    batch, g = make_batch(ref_model.config.vocab_size, b=SEQS)
    mask = batch["response_mask"].float()
    with torch.no_grad():
        lp0 = reference_log_probs(ref_model, batch)  # pi_old: the weights every mini-batch of the cycle must see
    rollout = (lp0 + 0.1 * torch.randn(SEQS, R, generator=g)) * mask  # the inference engine's log-probs
    rewards = torch.rand(SEQS, generator=g)

    kv = _LocalKV()
    keys = put_rollouts(kv, batch, rollout, rewards)
    group = _LocalGroup(worker, kv, rank, world)

    # veRL's trainer object without its cluster set-up (__init__ starts Ray, TQ and the rollout servers): the
    # attributes step() reads, as __init__ / init() set them
    trainer = object.__new__(PPOTrainerSeparateAsync)
    trainer.config = cfg
    trainer.parameter_sync_step = cfg.trainer.v1.separate_async.parameter_sync_step
    trainer.hybrid_rollout_config = omega_conf_to_dataclass(cfg.trainer.v1.separate_async.hybrid_rollout)
    trainer.current_mode = HybridEngineMode.TRAINER  # after on_step_begin's switch_to_trainer
    trainer.global_steps, trainer.local_trigger_step, trainer.timing_raw = 1, 0, {}
    trainer._step_sample_wait_seconds, trainer._step_wait_samples = 0.0, 0
    trainer.use_critic = trainer.use_reference_policy = False
    trainer.actor_rollout_wg = group
    trainer.replay_buffer = _ReplayBuffer(kv, keys)
    trainer.reward_loop_manager = SimpleNamespace(reward_loop_worker_handles=["reward loop"])  # scores already put
    trainer.tokenizer = SimpleNamespace(eos_token_id=2)
    trainer._add_batch_to_generate = lambda: None  # prepare_step's refill of the rollout queue

    calls = []
    registered = core_algos.POLICY_LOSS_REGISTRY[loss_mode]

    def spy(**kw):
        config = kw["config"]
        calls.append(
            {
                "rows": int(kw["response_mask"].shape[0]),
                "tokens": int(kw["response_mask"].sum()),
                "hparams": dict(config.policy_loss.hparams),
                "rollout_is": config.policy_loss.rollout_is,
                "bypass_mode": config.policy_loss.bypass_mode,
                "is_weights": kw["rollout_is_weights"] is not None,
                "loss_agg_mode": kw["loss_agg_mode"],
                "global_batch_info": {k: v for k, v in config.global_batch_info.items() if v is not None},
            }
        )
        return registered(**kw)

    before = {k: v.detach().clone() for k, v in ref_model.state_dict().items()}
    core_algos.POLICY_LOSS_REGISTRY[loss_mode] = spy
    trainer_base.tq, real_tq = kv, trainer_base.tq
    metrics: dict = {}
    try:
        trainer.step(metrics, trainer.timing_raw)
    finally:
        core_algos.POLICY_LOSS_REGISTRY[loss_mode] = registered
        trainer_base.tq = real_tq
    after = dict(worker.actor.engine.get_per_tensor_param()[0])

    stored = kv.kv_batch_get(keys, "train", select_fields=["old_log_probs", "advantages"])
    old_err = max(float((o - lp0[i][mask[i].bool()]).abs().max()) for i, o in enumerate(stored["old_log_probs"]))
    adv_err = max(float((a - grpo_advantages(rewards)[i]).abs().max()) for i, a in enumerate(stored["advantages"]))
    result = {
        "calls": calls,
        "snapshots": group.snapshots,
        "snapshot_aliases": aliases,
        "old_log_prob_err": old_err,
        "advantage_err": adv_err,
        "updates": group.update_metrics,
        "served": trainer.replay_buffer.served,
    }
    if rank == 0:
        # replay: mini-batch k's loss at the weights after k SGD steps, pi_old = the cycle's first weights
        method = vespo_method(loss_mode)
        adv = grpo_advantages(rewards)[:, None] * mask
        ref_losses, drift = [], []
        for k in range(SYNC_STEPS):
            rows = slice(k * MINI, (k + 1) * MINI)
            sub = {key: v[rows] for key, v in batch.items()}
            lp = reference_log_probs(ref_model, sub)
            drift.append(float(((lp.detach() - lp0[rows]) * mask[rows]).abs().max()))  # pi_k vs pi_old
            correction = {} if level is None else {"rollout_log_prob": rollout[rows], "rollout_is_threshold": None}
            loss, _ = vespo.compute_policy_loss(
                method,
                log_prob=lp,
                old_log_prob=lp0[rows],
                advantages=adv[rows],
                response_mask=mask[rows],
                loss_agg_mode=agg,
                **correction,
                **hparams,
            )
            ref_model.zero_grad()
            loss.backward()
            with torch.no_grad():
                for p in ref_model.parameters():
                    p -= p.grad  # SGD, lr 1
            ref_losses.append(float(loss.detach()))
        param_err = max(float((ref_model.state_dict()[k] - after[k].float()).abs().max()) for k in after)
        moved = max(float((before[k] - after[k].float()).abs().max()) for k in after)
        result.update(
            {
                "ref_losses": ref_losses,
                "drift": drift,
                "param_err": param_err,
                "moved": moved,
                "params_compared": len(after),
                "metrics": {k: v for k, v in metrics.items() if k.startswith("actor/")},
            }
        )
    return result


if __name__ == "__main__":
    run_ranks(run_scenario, SCENARIOS, *sys.argv[1:3], setup=(copy_snapshots_to_host,))

"""One rank of veRL's real actor update with a vespo loss, on CPU; started by tests/integrations/test_verl_workers.py.

Usage: RANK=r WORLD_SIZE=n MASTER_ADDR=... MASTER_PORT=... python _verl_worker_job.py MODEL_DIR OUT_JSON

For each scenario it composes veRL's `ppo_trainer` config with the override lines of docs/guides/verl.md, builds
`verl.workers.engine_workers.ActorRolloutRefWorker` (FSDP2 engine), runs `compute_log_prob` and `update_actor` on
this rank's shard (as veRL's dispatch chunks it) and records what the registered loss saw per micro-batch, the
metrics veRL returned and, on rank 0, the parameter update next to a reference computed with
`vespo.compute_policy_loss` on the full batch. The optimizer is SGD with lr 1 and no clipping, so the update is
minus the gradient veRL's engine accumulated.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _verl_ranks import run_ranks  # noqa: E402

B, P, R = 8, 5, 6  # sequences, max prompt length, max response length
MICRO = 2  # ppo_micro_batch_size_per_gpu: 4 micro-batches on 1 rank, 2 per rank on 2 ranks

# name, veRL loss_mode, hparams given as overrides, loss_agg_mode, rollout_is level (None: no rollout correction)
SCENARIOS = [
    ("vespo", "vespo", {"c1_pos": 1.5, "c2_neg": 4.0}, "token-mean", None),
    ("gspo", "vespo_gspo", {"clip_ratio_low": 0.05, "clip_ratio_high": 0.08}, "seq-mean-token-mean", None),
    ("vespo_is_token", "vespo", {}, "token-mean", "token"),
    ("vespo_is_sequence", "vespo", {}, "token-mean", "sequence"),
    ("topr_is_token", "vespo_topr", {"ratio_level": "geometric"}, "seq-mean-token-sum", "token"),
]


def compose(
    model_dir: str, loss_mode: str, hparams: dict, agg: str, rollout_is: str | None, world: int, extra: tuple = ()
):
    """veRL's ppo_trainer config with the documented vespo lines and CPU settings, resolved as main_ppo does;
    `extra` overrides come last (Hydra: the last value of a key wins)."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    overrides = [
        # the lines docs/guides/verl.md gives users
        "actor_rollout_ref.actor.policy_loss._target_=vespo.integrations.verl.VespoPolicyLossConfig",
        f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}",
        *[f"+actor_rollout_ref.actor.policy_loss.hparams.{k}={v}" for k, v in hparams.items()],
        "+actor_rollout_ref.actor.policy_loss.rollout_is=${algorithm.rollout_correction.rollout_is}",
        "+actor_rollout_ref.actor.policy_loss.bypass_mode=${algorithm.rollout_correction.bypass_mode}",
        f"algorithm.rollout_correction.rollout_is={rollout_is or 'null'}",
        f"actor_rollout_ref.actor.loss_agg_mode={agg}",
        # a tiny local model on CPU: FSDP2, eager attention, fp32 throughout, no torch.compile
        f"actor_rollout_ref.model.path={model_dir}",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={B}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
        "actor_rollout_ref.rollout.n=1",
        # SGD with lr 1 and no clipping: the parameter update is exactly minus the accumulated gradient
        "actor_rollout_ref.actor.optim.optimizer=SGD",
        "actor_rollout_ref.actor.optim.lr=1.0",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "actor_rollout_ref.actor.optim.clip_grad=1e9",
        "trainer.device=cpu",
        f"trainer.n_gpus_per_node={world}",
        *extra,
    ]
    cfg_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=cfg_dir, version_base=None):
        cfg = hydra_compose(config_name="ppo_trainer", overrides=overrides)
    OmegaConf.resolve(cfg)
    return cfg


def make_batch(vocab: int, b: int = B):
    """b left-padded prompts and right-padded responses of varied lengths, in the layout veRL's trainer builds."""
    g = torch.Generator().manual_seed(0)
    p_len = torch.randint(2, P + 1, (b,), generator=g)
    r_len = torch.randint(1, R + 1, (b,), generator=g)
    r_len[0] = R  # one full-length response
    prompts = torch.zeros(b, P, dtype=torch.long)
    responses = torch.zeros(b, R, dtype=torch.long)
    p_mask = torch.zeros(b, P, dtype=torch.long)
    r_mask = torch.zeros(b, R, dtype=torch.long)
    for i in range(b):
        prompts[i, P - p_len[i] :] = torch.randint(5, vocab, (int(p_len[i]),), generator=g)
        p_mask[i, P - p_len[i] :] = 1
        responses[i, : r_len[i]] = torch.randint(5, vocab, (int(r_len[i]),), generator=g)
        r_mask[i, : r_len[i]] = 1
    attention_mask = torch.cat([p_mask, r_mask], 1)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    advantages = torch.randn(b, 1, generator=g).expand(b, R) * r_mask  # sequence advantage broadcast, as veRL
    return {
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "prompts": prompts,
        "responses": responses,
        "response_mask": r_mask,
        "advantages": advantages.contiguous(),
    }, g


def reference_log_probs(model, batch) -> torch.Tensor:
    """(B, R) log-probs of the response tokens under the HF model, padded positions zero."""
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits  # (B, P + R, V)
    logp = torch.log_softmax(logits[:, P - 1 : -1].float(), -1)  # position t predicts token t + 1
    return logp.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1) * batch["response_mask"]


def shard(td, rank: int, world: int):
    from verl.utils import tensordict_utils as tu

    return tu.chunk_tensordict(td, world)[rank]


def to_worker_td(batch: dict, extra: dict):
    """veRL's trainer-side conversion: padded batch -> TensorDict -> no-padding (nested) layout."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    td = tu.get_tensordict({**batch, **extra})
    td = left_right_2_no_padding(td)
    tu.assign_non_tensor(td, temperature=1.0)
    return td


def run_scenario(model_dir, name, loss_mode, hparams, agg, level, rank, world):
    from transformers import AutoModelForCausalLM
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.utils.padding import no_padding_2_padding

    import vespo
    from vespo.integrations.verl import vespo_method

    cfg = compose(model_dir, loss_mode, hparams, agg, level, world)
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor")
    worker.init_model()

    ref_model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32)
    batch, g = make_batch(ref_model.config.vocab_size)
    mask = batch["response_mask"].bool()

    # 1. veRL's forward pass (compute_log_prob) against the HF model on this rank's rows
    td = to_worker_td(batch, {})
    tu.assign_non_tensor(td, calculate_entropy=False, compute_loss=False)
    local = shard(td, rank, world)
    out = worker.compute_log_prob(local)
    verl_lp = no_padding_2_padding(tu.get(out, "log_probs"), local).float()
    rows = slice(rank * B // world, (rank + 1) * B // world)
    lp_ref = reference_log_probs(ref_model, batch)  # (B, R), requires grad
    log_prob_err = float(((verl_lp - lp_ref[rows].detach()) * mask[rows]).abs().max())

    # 2. stale behaviour policy and (optionally) an inference engine with its own log-probs
    old = (lp_ref.detach() + 0.25 * torch.randn(B, R, generator=g)) * mask
    extra = {"old_log_probs": old}
    rollout = w = None
    if level is not None:
        rollout = (old + 0.1 * torch.randn(B, R, generator=g)) * mask
        # veRL's own weights w = min(pi_old / pi_rollout, C); C large so that W = pi / pi_rollout exactly
        w, _ = compute_rollout_correction_weights(
            old - rollout, mask.float(), rollout_is=level, rollout_is_threshold=1e6
        )
        extra["rollout_is_weights"] = w

    # 3. spy on the registered loss: what each micro-batch call received (a pass-through wrapper)
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
                "is_weights": kw["rollout_is_weights"] is not None,
                "loss_agg_mode": kw["loss_agg_mode"],
                "global_batch_info": {k: v for k, v in config.global_batch_info.items() if v is not None},
            }
        )
        return registered(**kw)

    core_algos.POLICY_LOSS_REGISTRY[loss_mode] = spy
    td = to_worker_td(batch, extra)
    tu.assign_non_tensor(
        td,
        calculate_entropy=False,
        global_batch_size=B,
        mini_batch_size=B,
        epochs=1,
        seed=42,
        dataloader_kwargs={"shuffle": False},
        compute_loss=True,
    )
    before = {k: v.detach().clone() for k, v in ref_model.state_dict().items()}
    try:
        out = worker.update_actor(shard(td, rank, world))
    finally:
        core_algos.POLICY_LOSS_REGISTRY[loss_mode] = registered
    metrics = tu.get(out, "metrics") if out is not None else {}
    after = dict(worker.actor.engine.get_per_tensor_param()[0])  # veRL's own full-parameter gather (HF names)

    result = {"log_prob_err": log_prob_err, "calls": calls}
    if rank == 0:
        # 4. reference: vespo's public loss on the full batch, the same hyperparameters, autograd gradient
        method = vespo_method(loss_mode)
        kw = dict(log_prob=lp_ref, old_log_prob=old, advantages=batch["advantages"], response_mask=mask.float())
        if rollout is None:
            correction = {}
        elif method == "vespo":  # veRL's weights are untruncated, so W = pi / pi_rollout: the rollout log-probs
            correction = {"rollout_log_prob": rollout, "rollout_is_threshold": None}
        else:  # the other methods multiply their per-token loss by veRL's weight, as veRL's built-ins do
            correction = {"rollout_is_weights": w, "rollout_is_level": level}
        ref_loss, _ = vespo.compute_policy_loss(method, loss_agg_mode=agg, **correction, **kw, **hparams)
        # the same loss without what the scenario configures (its hparams, its rollout correction)
        ablated_loss, _ = vespo.compute_policy_loss(method, loss_agg_mode=agg, **kw)
        ref_loss.backward()
        grads = {k: p.grad for k, p in ref_model.named_parameters()}
        grad_err, grad_scale, compared = 0.0, 0.0, 0
        for k, g_ref in grads.items():
            update = before[k] - after[k].float()  # SGD, lr 1: minus the gradient veRL accumulated
            grad_err = max(grad_err, float((update - g_ref).abs().max()))
            grad_scale = max(grad_scale, float(g_ref.abs().max()))
            compared += 1
        result.update(
            {
                "metrics": {k: v for k, v in metrics.items() if k.startswith(("actor/", "loss", "grad_norm"))},
                "ref_loss": float(ref_loss.detach()),
                "ablated_loss": float(ablated_loss.detach()),
                "grad_err": grad_err,
                "grad_scale": grad_scale,
                "params_compared": compared,
            }
        )
    return result


if __name__ == "__main__":
    run_ranks(run_scenario, SCENARIOS, *sys.argv[1:3])

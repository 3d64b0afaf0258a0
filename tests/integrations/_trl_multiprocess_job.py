"""One process of a 2-process CPU `VespoGRPOTrainer` (accelerate MULTI_CPU on gloo); started by test_integration_trl.

Usage: RANK=r WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... python _trl_multiprocess_job.py OUT_JSON

Each process owns two micro-batches of one optimizer step (gradient_accumulation_steps=2) and accumulates their
gradient through `_compute_loss`, as TRL's `training_step` does. The adaptive controller must decide on the four
micro-batches of both processes: the processes' mean gradient (what DDP averages) must equal one pass of
`vespo.compute_policy_loss` over all four, and both processes must report the same chosen kernel.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path[:0] = [os.path.dirname(__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]  # tests/

METHODS = {  # method -> (hparams making the control active on these batches, metrics of the chosen kernel)
    "vespo_selfnorm": ({}, ("adaptive/Z_pos", "adaptive/Z_neg")),
    "vespo_moment": ({"moment_target_pos": 1.0, "moment_target_neg": 1.0}, ("adaptive/c2_pos", "adaptive/c2_neg")),
    "vespo_ess": ({"ess_target": 0.9}, ("adaptive/tau_pos", "adaptive/tau_neg")),
}


def main(out_path: str) -> None:
    torch.set_num_threads(1)
    from datasets import Dataset
    from test_integration_trl import _config, _digit_reward, _inputs

    import vespo
    from vespo.embedded.task import arithmetic_problems, build_tiny_model, build_tokenizer
    from vespo.integrations.trl import VespoGRPOConfig, VespoGRPOTrainer

    rank = int(os.environ["RANK"])
    tokenizer = build_tokenizer()
    dataset = Dataset.from_dict({"prompt": [p.prompt for p in arithmetic_problems(16, seed=0)]})
    results = {}
    for method, (hp, keys) in METHODS.items():
        cfg = _config(
            VespoGRPOConfig, os.path.join(os.path.dirname(out_path), f"out{rank}"), gradient_accumulation_steps=2,
            vespo_method=method, vespo_hparams=hp,
        )  # fmt: skip
        trainer = VespoGRPOTrainer(
            model=build_tiny_model(tokenizer, seed=3), reward_funcs=_digit_reward, args=cfg,
            train_dataset=dataset, processing_class=tokenizer,
        )  # fmt: skip
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 2
        assert trainer.accelerator.num_processes == 2
        mbs = [_inputs(tokenizer, 20 + i) for i in range(4)]  # every process builds all four; owns 2 * rank + (0, 1)
        g = torch.Generator().manual_seed(7)
        for i, mb in enumerate(mbs):  # stale behaviour log-probs, shifted per micro-batch so their W differ
            with torch.no_grad():
                lp, _ = trainer._log_probs(trainer.model, mb, compute_entropy=False)
            mb["old_per_token_logps"] = lp + (0.4 * (i % 2) - 0.2) + 0.5 * torch.randn(lp.shape, generator=g)
        total = sum(mb["completion_mask"].sum() for mb in mbs)
        for mb in mbs:
            mb["num_items_in_batch"] = total  # TRL's global token count of the generation batch
        mine = mbs[2 * rank : 2 * rank + 2]
        trainer._buffered_inputs, trainer._vespo_context = mine, None
        trainer.model.zero_grad()
        for step, mb in enumerate(mine):
            trainer._step = step
            trainer._compute_loss(trainer.model, mb).backward()
        grad = torch.cat([p.grad.flatten() for p in trainer.model.parameters()])
        dist.all_reduce(grad)
        grad /= 2  # DDP's average over processes

        # reference: one pass over all four micro-batches in one call (no context: the call is the whole batch)
        trainer.model.zero_grad()
        one = {
            k: torch.cat([mb[k] for mb in mbs])
            for k in (
                "prompt_ids",
                "prompt_mask",
                "completion_ids",
                "completion_mask",
                "advantages",
                "old_per_token_logps",
            )
        }
        lp, _ = trainer._log_probs(trainer.model, one, compute_entropy=False)
        loss, metrics = vespo.compute_policy_loss(
            method, log_prob=lp, old_log_prob=one["old_per_token_logps"], advantages=one["advantages"],
            response_mask=one["completion_mask"], **hp,
        )  # fmt: skip
        loss.backward()
        ref = torch.cat([p.grad.flatten() for p in trainer.model.parameters()])
        ctx = trainer._vespo_context[1]
        both = [torch.zeros_like(ctx.log_w) for _ in range(2)]
        dist.all_gather(both, ctx.log_w)
        trainer._flush_vespo_metrics()  # one gather over processes for the pending micro-batch metrics
        results[method] = {
            "rel_err": float((grad - ref).norm() / ref.norm()),
            "ref_norm": float(ref.norm()),
            # per key: both micro-batches' values, gathered (averaged) over processes by the trainer
            "chosen": {k: trainer._metrics["train"][k][-2:] for k in keys},
            "ref_chosen": {k: float(metrics[k]) for k in keys},
            "context_rows": int(ctx.log_w.numel()),
            "same_context": bool(torch.equal(both[0], both[1])),
        }
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()  # a gloo group left to interpreter teardown can abort the process ("terminate called")


if __name__ == "__main__":
    main(sys.argv[1])

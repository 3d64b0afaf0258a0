"""The one batch producer of both loops (the sync loop and every async sampler): records -> prompts ->
`Engine.generate` (n responses each, the sampler's log-probs recorded) -> rewards -> group advantages."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from vespo.advantages import group_advantages
from vespo.data import format_prompts
from vespo.rewards.batch import grade_batch
from vespo.rollout import Engine, Rollout, decode_responses
from vespo.train.system import release_free_memory


@dataclass
class ScoredBatch:
    """A rollout batch ready for the learner."""

    rollout: Rollout
    rewards: torch.Tensor  # (B,) on the rollout's device
    advantages: torch.Tensor  # (B,) group-relative (paper Eq. 2's A)
    grading: dict[str, float]  # the reward function's own counts (timeouts, verifier errors), `RewardList.metrics`
    gen_s: float
    reward_s: float


def make_batch(
    engine: Engine,
    records: list[dict],
    reward_fn: Callable[..., list[float]],
    generator: torch.Generator,
    *,
    group: int,
    chat: bool,
    norm_by_std: bool,
    clock: Callable[[], float] = time.perf_counter,
) -> ScoredBatch:
    """`group` responses per record from `engine` (its weights as they are: a loop syncs them first; `group` is
    the engine's n), prompts in the chat template when `chat`, graded by `reward_fn` (TRL's signature,
    `grade_batch`), with group advantages (divided by the group's std when `norm_by_std`). `clock` times generation
    and grading (the sync loop passes one that waits for CUDA)."""
    t0 = clock()
    prompts = format_prompts(engine.tokenizer, [r["prompt"] for r in records], chat=chat)
    rollout = engine.generate(prompts, generator)
    release_free_memory()  # generation's transients, before the update's activations need the room
    t_gen = clock()
    rewards, grading = grade_batch(reward_fn, decode_responses(engine.tokenizer, rollout), records, group)
    rewards = rewards.to(rollout.response_mask.device)  # (B,)
    advantages = group_advantages(rewards, group, norm_by_std=norm_by_std)  # (B,)
    return ScoredBatch(rollout, rewards, advantages, grading, t_gen - t0, clock() - t_gen)

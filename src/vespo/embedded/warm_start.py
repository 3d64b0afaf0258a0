"""The embedded task's SFT warm start: a brief supervised run on half-wrong demonstrations, so that the tiny model
solves some but not all problems and RL has a signal to sharpen; cached on disk by the hash of its settings."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import transformers

from vespo.embedded.task import (
    SCRATCHPAD,
    Problem,
    build_tiny_model,
    build_tokenizer,
    embedded_split,
    scratchpad_noise,
    solution_text,
)


@dataclass(frozen=True)
class WarmStartSpec:
    """Everything the embedded policy depends on: the task and its split, the SFT settings, and the cache dir."""

    task: str = "arithmetic"
    num_operands: int = 3
    max_operand: int = 9
    sft_steps: int | None = None
    sft_lr: float = 3e-3
    sft_batch_size: int = 32
    sft_label_noise: float = 0.5
    sft_seed: int = 0
    cache_dir: str = "~/.cache/vespo"

    @classmethod
    def of(cls, settings: object) -> WarmStartSpec:
        """The spec of any settings object with these attribute names (a `TrainConfig`, a sweep's config)."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})


SFT_STEPS = {"arithmetic": 400, "chain": 8000, "scratchpad": 3000}
"""Default SFT steps of each embedded task's warm start (`sft_steps` None)."""


def sft_steps_of(cfg: WarmStartSpec) -> int:
    """SFT steps of the warm start: `sft_steps`, or the task's default."""
    return SFT_STEPS[cfg.task] if cfg.sft_steps is None else cfg.sft_steps


def sft_cache_key(cfg: WarmStartSpec) -> str:
    """Hash of everything the embedded warm start depends on (so sweeps over methods/N/seeds reuse one)."""
    keys = (
        "num_operands",
        "max_operand",
        "sft_steps",
        "sft_lr",
        "sft_batch_size",
        "sft_seed",
        "sft_label_noise",
    )
    # arithmetic keeps its existing cache entries; chain format 3 = the lag-3 running sum (earlier layouts: 1, 2);
    # scratchpad format 3 = free-length sums whose demonstrations err more when they show less work
    task = {} if cfg.task == "arithmetic" else {"task": cfg.task, "format": 3}
    fields = {k: getattr(cfg, k) for k in keys} | {"sft_steps": sft_steps_of(cfg)}
    blob = json.dumps(fields | task | {"v": 2}, sort_keys=True)  # v2: training set apart from eval_size
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def embedded_policy_path(cfg: WarmStartSpec, *, progress: bool = False) -> Path:
    """Build (once) and cache the SFT-warm-started tiny model + tokenizer; return its directory. Building says so on
    stderr at once (it takes from seconds to minutes), with a progress bar when `progress`."""
    path = Path(cfg.cache_dir).expanduser() / f"embedded-{sft_cache_key(cfg)}"
    if (path / "config.json").is_file():
        return path
    print(
        f"vespo: building the embedded {cfg.task} policy: {sft_steps_of(cfg)} SFT steps, cached in {path} "
        "(once per warm-start setting)",
        file=sys.stderr,
        flush=True,
    )
    task = {"num_operands": cfg.num_operands, "max_operand": cfg.max_operand}
    train_set, _ = embedded_split(cfg.task, **task, eval_size=1)  # the training set does not depend on eval_size
    tokenizer = build_tokenizer()
    positions = max(256, 2 * (4 * cfg.num_operands + 16))  # the chain task's prompt + response grow with it
    model = build_tiny_model(tokenizer, seed=cfg.sft_seed, max_position_embeddings=positions)
    with torch.random.fork_rng(devices=[]):
        sft_warm_start(
            model,
            tokenizer,
            train_set,
            steps=sft_steps_of(cfg),
            lr=cfg.sft_lr,
            batch_size=cfg.sft_batch_size,
            seed=cfg.sft_seed,
            label_noise=cfg.sft_label_noise,
            progress=progress,
        )
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:  # atomic publish; a concurrent process may have won the race, which is fine (same content)
        tmp.rename(path)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def sft_warm_start(
    model: transformers.PreTrainedModel,
    tokenizer: transformers.PreTrainedTokenizerBase,
    problems: list[Problem],
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    label_noise: float = 0.0,
    progress: bool = False,
) -> list[float]:
    """Supervised fine-tuning on `solution_text` targets (loss on response tokens + <eos> only); returns the losses.

    With probability `label_noise` a demonstration's boxed answer is off by 1-3 (its partial sums stay right), so the
    warm-started policy is uncertain about the final answer: it solves some but not all problems, and RL has a
    verifiable signal to sharpen (docs/training.md).
    """
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, desc="SFT warm start", unit="step", mininterval=1.0)
    for _ in range(steps):
        batch = rng.choices(problems, k=batch_size)
        prompt_ids = [tokenizer(p.prompt).input_ids for p in batch]
        texts = []
        for p in batch:
            if p.prompt.startswith(SCRATCHPAD):  # all, half or none of the running sums; less work, more errors
                keep = rng.choice((0.0, 0.5, 1.0))
                noisy = rng.random() < scratchpad_noise(label_noise, keep)
                texts.append(solution_text(p, noisy_rng=rng if noisy else None, keep=keep, step_rng=rng))
            else:
                texts.append(solution_text(p, noisy_rng=rng if rng.random() < label_noise else None))
        target_ids = [tokenizer(t, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for t in texts]
        width = max(len(a) + len(b) for a, b in zip(prompt_ids, target_ids, strict=True))
        ids = torch.full((batch_size, width), tokenizer.pad_token_id)
        labels = torch.full((batch_size, width), -100)
        mask = torch.zeros((batch_size, width), dtype=torch.long)
        for i, (a, b) in enumerate(zip(prompt_ids, target_ids, strict=True)):  # right padding is fine for training
            ids[i, : len(a) + len(b)] = torch.tensor(a + b)
            labels[i, len(a) : len(a) + len(b)] = torch.tensor(b)
            mask[i, : len(a) + len(b)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    if bar is not None:
        bar.close()
    model.eval()
    return losses

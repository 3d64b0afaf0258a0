"""The embedded task's SFT warm start: a brief supervised run on half-wrong demonstrations, so that the tiny model
solves some but not all problems and RL has a signal to sharpen; cached on disk by the hash of its settings."""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import transformers

from vespo import checkpoints
from vespo.checkpoints import LOSSES, MODEL, OPTIMIZER, RNG, SETTINGS_KEY, STEP, TOTAL_STEPS, WARM_START
from vespo.embedded.task import (
    SCRATCHPAD,
    Problem,
    build_tiny_model,
    build_tokenizer,
    embedded_split,
    scratchpad_noise,
    solution_text,
)
from vespo.outputs import atomic_dir, read_regular


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
    def of(cls, cfg) -> WarmStartSpec:
        """The spec of a `TrainConfig`: its embedded section and its run's cache dir."""
        return cls(**{f.name: getattr(cfg.embedded, f.name) for f in fields(cls) if f.name != "cache_dir"},
                   cache_dir=cfg.run.cache_dir)  # fmt: skip


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
    stderr at once, and when it will take over `ANNOUNCE_S` it says how long, measured from its first steps.

    Cache: the finished policy is the directory `embedded-<key>` (`sft_cache_key`), published by an atomic rename
    once every step has run, and the only thing ever read as a warm start. An unfinished one (Ctrl-C, a crash) leaves
    `embedded-<key>.partial.pt` (`PARTIAL`: a `vespo.checkpoints` warm-start checkpoint of step, weights, optimizer and
    RNG state, saved every `SAVE_EVERY_S` and on Ctrl-C); the next build with the same settings continues from it,
    bit for bit as if uninterrupted, and deletes it once the policy is published."""
    key = sft_cache_key(cfg)
    path, partial = cache_paths(cfg)
    if (path / "config.json").is_file():
        return path
    steps = sft_steps_of(cfg)
    state = load_partial(partial, key, steps)
    resumed = f", resuming at step {state[STEP]} from {partial}" if state else ""
    print(
        f"vespo: building the embedded {cfg.task} policy: {steps} SFT steps, cached in {path} "
        f"(once per warm-start setting){resumed}",
        file=sys.stderr,
        flush=True,
    )
    task = {"num_operands": cfg.num_operands, "max_operand": cfg.max_operand}
    train_set, _ = embedded_split(cfg.task, **task, eval_size=1)  # the training set does not depend on eval_size
    tokenizer = build_tokenizer()
    positions = max(256, 2 * (4 * cfg.num_operands + 16))  # the chain task's prompt + response grow with it
    model = build_tiny_model(tokenizer, seed=cfg.sft_seed, max_position_embeddings=positions)

    def announce(seconds: float, measured: int) -> None:
        print(
            f"vespo: the warm start will take about {_duration(seconds)} more on this machine ({steps} SFT steps, "
            f"time measured over {measured}); it is cached in {path} and built once per warm-start setting, and "
            f"Ctrl-C keeps its progress in {partial.name} for the next run to resume",
            file=sys.stderr,
            flush=True,
        )

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the cached weights must not depend on the caller's thread count (nor on its load)
    try:
        _build(model, tokenizer, train_set, cfg, steps, progress, state, partial, key, announce)
    finally:
        torch.set_num_threads(threads)
    try:  # published whole (`atomic_dir`); a concurrent process may have won the race, which is fine (same content)
        with atomic_dir(path) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    except OSError:
        if not path.is_dir():
            raise
    partial.unlink(missing_ok=True)  # ours (a concurrent build of the same key would have written the same)
    return path


def _build(model, tokenizer, train_set, cfg, steps, progress, state, partial, key, announce) -> None:
    """The SFT run of `embedded_policy_path`, saving its progress to `partial` (RNG streams forked: the caller's are
    left as they were)."""
    with torch.random.fork_rng(devices=[]):
        sft_warm_start(
            model,
            tokenizer,
            train_set,
            steps=steps,
            lr=cfg.sft_lr,
            batch_size=cfg.sft_batch_size,
            seed=cfg.sft_seed,
            label_noise=cfg.sft_label_noise,
            progress=progress,
            state=state,
            save=lambda snapshot: save_partial(partial, snapshot | {SETTINGS_KEY: key, TOTAL_STEPS: steps}),
            announce=announce,
        )


def fingerprint(path: Path) -> str:
    """The first 12 hex digits of the SHA-256 of a built warm start's weights (model.safetensors): which build a cell
    started from. The same settings on another CPU build other weights (float sums in another order drift apart over
    thousands of SFT steps), so cells are paired only within one build."""
    return hashlib.sha256(read_regular(Path(path) / "model.safetensors", cap=MAX_WEIGHTS_BYTES)).hexdigest()[:12]


MAX_WEIGHTS_BYTES = 1 << 30
"""The most `fingerprint` reads: far above an embedded policy's weights (a few MiB)."""


def cache_paths(cfg: WarmStartSpec) -> tuple[Path, Path]:
    """(the finished warm start's directory, the file an unfinished one is kept in) for these settings."""
    path = Path(cfg.cache_dir).expanduser() / f"embedded-{sft_cache_key(cfg)}"
    return path, path.with_name(path.name + PARTIAL)


def unfinished(cfg: WarmStartSpec) -> Path | None:
    """The kept state of an unfinished warm start of these settings, if there is one and no finished one."""
    path, partial = cache_paths(cfg)
    return partial if partial.is_file() and not (path / "config.json").is_file() else None


PARTIAL = ".partial.pt"
"""Suffix of an unfinished warm start's state beside the cache entry it will become (`embedded_policy_path`)."""
SAVE_EVERY_S = 30.0
"""An unfinished warm start is saved at most this often (and on Ctrl-C): a crash loses at most this much work."""
ANNOUNCE_S = 30.0
"""A warm start estimated to take longer than this says so, with its estimate, after its first steps."""
_PROBE_S = 2.0
"""Wall time over which the first steps are timed for the estimate (the first step, slower, is left out)."""


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def save_partial(path: Path, snapshot: dict) -> None:
    """Write an unfinished warm start's state (`vespo.checkpoints.save`: atomic, a reader sees the old state or the
    new one, never a torn file)."""
    checkpoints.save(path, WARM_START, snapshot)


def load_partial(path: Path, key: str, steps: int) -> dict | None:
    """The unfinished warm start saved at `path` when it is one of exactly these settings (`key`, `steps`); None
    otherwise: no file, another setting, or a file `vespo.checkpoints.load` refuses (damaged, foreign: never trusted;
    one stderr line says so), and the build starts over."""
    if not path.is_file():
        return None
    try:
        state = checkpoints.load(path, WARM_START, label="vespo: warm start")
    except checkpoints.CheckpointError as exc:
        print(f"{exc}; building it from step 0", file=sys.stderr)
        return None
    return state if state[SETTINGS_KEY] == key and state[TOTAL_STEPS] == steps else None


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
    state: dict | None = None,
    save: Callable[[dict], None] | None = None,
    announce: Callable[[float, int], None] | None = None,
) -> list[float]:
    """Supervised fine-tuning on `solution_text` targets (loss on response tokens + <eos> only); returns the losses.

    With probability `label_noise` a demonstration's boxed answer is off by 1-3 (its partial sums stay right), so the
    warm-started policy is uncertain about the final answer: it solves some but not all problems, and RL has a
    verifiable signal to sharpen (docs/guides/trainer.md).

    Interruptible: Ctrl-C stops the loop at the end of the running step and raises KeyboardInterrupt; `save(snapshot)`
    receives the state to continue from (step, weights, optimizer, RNG streams, losses) then and every `SAVE_EVERY_S`;
    `state`, such a snapshot, continues the run with the same result as an uninterrupted one.
    `announce(seconds_left, steps_timed)` is called once when the steps left are estimated, from the pace of the
    first steps, to take over `ANNOUNCE_S`.
    """
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    start, losses = _restore(state, model, opt, rng) if state is not None else (0, [])
    model.train()

    def snapshot(step: int) -> dict:
        rngs = {"python": rng.getstate(), "torch": torch.get_rng_state()}
        return {STEP: step, MODEL: model.state_dict(), OPTIMIZER: opt.state_dict(), RNG: rngs, LOSSES: losses}

    bar = _progress_bar(steps, start) if progress else None
    tick, t_saved = _pacer(start, steps, announce), time.perf_counter()
    try:
        with _sigint_between_steps() as stop:
            for step in range(start, steps):
                _sft_step(model, tokenizer, problems, opt, rng, batch_size, label_noise, losses)
                if stop.is_set():  # Ctrl-C: the step that was running has finished; keep the work, then stop
                    if save is not None and step + 1 < steps:
                        save(snapshot(step + 1))
                    raise KeyboardInterrupt
                now = tick(step)
                if save is not None and now - t_saved >= SAVE_EVERY_S and step + 1 < steps:
                    save(snapshot(step + 1))
                    t_saved = now
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    finally:
        if bar is not None:
            bar.close()
    model.eval()
    return losses


def _progress_bar(steps: int, start: int):
    """The warm start's tqdm bar over its `steps`, from `start`."""
    from tqdm.auto import tqdm

    return tqdm(total=steps, initial=start, desc="SFT warm start", unit="step", mininterval=1.0)


def _restore(state: dict, model, opt: torch.optim.Optimizer, rng: random.Random) -> tuple[int, list[float]]:
    """Load a warm start's snapshot (weights, optimizer, RNG streams) in place; (its step, its losses)."""
    model.load_state_dict(state[MODEL])
    opt.load_state_dict(state[OPTIMIZER])
    rng.setstate(state[RNG]["python"])
    torch.set_rng_state(state[RNG]["torch"])
    return state[STEP], list(state[LOSSES])


def _pacer(start: int, steps: int, announce: Callable[[float, int], None] | None) -> Callable[[int], float]:
    """`tick(step)` after each SFT step: the time now; once the steps after the first (untimed: allocation, warm-up)
    have run `_PROBE_S`, `announce(seconds_left, steps_timed)` when more than `ANNOUNCE_S` is left."""
    t_probe, probing = time.perf_counter(), announce is not None

    def tick(step: int) -> float:
        nonlocal t_probe, probing
        now = time.perf_counter()
        if step == start:
            t_probe = now  # the first step (allocation, warm-up) is not timed
        elif probing and now - t_probe >= _PROBE_S:
            probing = False
            left = (steps - step - 1) * (now - t_probe) / (step - start)
            if left > ANNOUNCE_S:
                announce(left, step - start)
        return now

    return tick


@contextlib.contextmanager
def _sigint_between_steps():
    """While the SFT loop runs in the main thread, Ctrl-C (SIGINT) or SIGTERM (a grid's or a scheduler's stop) sets
    the returned event instead of raising inside a step (which could leave an optimizer step half applied); the loop
    stops at the end of the step. Elsewhere (a worker thread cannot set handlers) the event stays unset and the
    signals act as usual."""
    stop = threading.Event()
    try:
        previous = {s: signal.signal(s, lambda signum, frame: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        yield stop
        return
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _sft_step(model, tokenizer, problems, opt, rng, batch_size, label_noise, losses) -> None:
    """One SFT step on a batch drawn from `rng`; appends its loss to `losses` after the optimizer step."""
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

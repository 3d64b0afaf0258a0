"""The embedded default: a locally built character tokenizer, a tiny causal LM and a synthetic arithmetic task.

Everything here runs without the Hugging Face Hub, so `vespo train` with no arguments works on a fresh CPU box.
The task's answers are written as `\\boxed{...}` and graded by the same math reward as real math
(docs/guides/trainer.md).
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
BOXED = "\\boxed"
# Characters of short math-like text; `\boxed` is one token so an answer costs len(digits) + 3 tokens.
_CHARS = string.digits + string.ascii_letters + " +-*/=()[]{}<>.,:;?!^_'\\|%$&#@~\n\t\""


def build_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A character-level tokenizer (plus a `\\boxed` token) built with the `tokenizers` library, no download.

    Plain prompt format, no chat template: encoding prepends `<bos>`, generation stops at `<eos>`, padding is on the
    left (as decoder-only generation needs). Unknown characters map to `<unk>`.
    """
    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, UNK, BOXED, *_CHARS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # one pre-token per character, except the literal `\boxed` (regex alternation is tried left to right)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\\boxed|[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # concatenate tokens back without separators
    bos_id = vocab[BOS]
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, bos_id)])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",
        model_max_length=512,
    )


def build_tiny_model(
    tokenizer: transformers.PreTrainedTokenizerBase, *, seed: int = 0, **overrides
) -> transformers.PreTrainedModel:
    """A freshly initialised `LlamaForCausalLM` of ~0.2M parameters sized to `tokenizer`; `overrides` edit its config.

    Defaults: hidden 64, 3 layers, 4 heads (2 KV heads), MLP 192, tied embeddings, fp32. Seeded for reproducibility.
    """
    cfg = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    unknown = set(overrides) - set(transformers.LlamaConfig().to_dict())
    if unknown:
        raise ValueError(f"unknown LlamaConfig fields in overrides: {sorted(unknown)}")
    cfg.update(overrides)
    with torch.random.fork_rng(devices=[]):  # seed the init without touching the caller's RNG stream
        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    return model.float().eval()


@dataclass(frozen=True)
class Problem:
    """One task item in the same schema as `vespo.data`'s JSONL records: prompt text and ground-truth answer."""

    prompt: str
    answer: str


def arithmetic_problems(count: int, *, seed: int, num_operands: int = 3, max_operand: int = 9) -> list[Problem]:
    """`count` sums of `num_operands` integers in [0, max_operand], e.g. prompt "3+8+5=" with answer "16".

    Deterministic in `seed`; different seeds give (mostly) disjoint draws, so a held-out set is just another seed.
    """
    if count < 1 or num_operands < 2 or max_operand < 1:
        raise ValueError(f"need count>=1, num_operands>=2, max_operand>=1; got {count}, {num_operands}, {max_operand}")
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        xs = [rng.randint(0, max_operand) for _ in range(num_operands)]
        out.append(Problem(prompt="+".join(map(str, xs)) + "=", answer=str(sum(xs))))
    return out


CHAIN_LAG = 3
"""Chain task: each new digit is the previous digit plus the digit `CHAIN_LAG` places back (mod 10)."""
_STEPS = " steps: "


def chain_sequence(seed_digits: list[int], steps: int) -> list[int]:
    """The seed digits followed by `steps` terms of x_t = (x_{t-1} + x_{t-LAG}) mod 10 (a lagged-Fibonacci chain)."""
    xs = list(seed_digits)
    for _ in range(steps):
        xs.append((xs[-1] + xs[-CHAIN_LAG]) % 10)
    return xs


def chain_problems(count: int, *, seed: int, num_operands: int) -> list[Problem]:
    """`count` chain problems: `CHAIN_LAG` random seed digits, answer the digit after `num_operands` more steps.

    Prompt "20 steps: =2 =9 =1 " (20 steps from seeds 2, 9, 1); the solution writes each step as the addend it takes
    (the digit three places back) and the new running digit, "23 92 13 ... \\boxed{d}", so the answer depends on every
    step and the length is a knob (`chain_response_tokens`). Every dependency sits at a fixed
    offset of at most 3 * CHAIN_LAG - 1 tokens whatever the length, and each step's addend is written out (a copy,
    learnable on its own) before the sum that needs it, so a tiny model learns it by SFT (docs/guides/trainer.md).
    Deterministic in `seed`.
    """
    if count < 1 or num_operands < 2:
        raise ValueError(f"need count >= 1 and num_operands >= 2, got {count}, {num_operands}")
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        seeds = [rng.randint(0, 9) for _ in range(CHAIN_LAG)]
        answer = chain_sequence(seeds, num_operands)[-1]
        out.append(Problem(prompt=f"{num_operands}{_STEPS}" + "".join(f"={d} " for d in seeds), answer=str(answer)))
    return out


def chain_response_tokens(num_operands: int) -> int:
    """Tokens of a chain solution: 3 per step (addend, digit, space), then `\\boxed`, "{", the digit, "}", <eos>."""
    return 3 * num_operands + 5


SCRATCHPAD = "sum "
"""Prompt prefix of the scratchpad task (free-length sums: the running sums are optional)."""


def scratchpad_problems(count: int, *, seed: int, num_operands: int, max_operand: int) -> list[Problem]:
    """`count` free-length sums, prompt "sum 3+8+5+1+9=": the response may write running sums before the boxed
    answer, or not. Deterministic in `seed`. The warm start's demonstrations that show less work are wrong more often
    (`scratchpad_noise`), so writing the sums pays and the response length is what RL changes."""
    problems = arithmetic_problems(count, seed=seed, num_operands=num_operands, max_operand=max_operand)
    return [Problem(SCRATCHPAD + p.prompt, p.answer) for p in problems]


def scratchpad_noise(label_noise: float, keep: float) -> float:
    """Share of wrong boxed answers among scratchpad demonstrations that keep a share `keep` of the running sums:
    1.5 - keep times `label_noise` (0.75 / 0.5 / 0.25 at label_noise 0.5 for none / half / all of them), the stand-in
    for a teacher that errs more when it does not show its work; the average over keep in {0, 1/2, 1} is label_noise."""
    return min(1.0, label_noise * (1.5 - keep))


def scratchpad_response_tokens(num_operands: int, max_operand: int) -> int:
    """Most tokens of a scratchpad solution: every running sum but the last with its comma, `\\boxed{`, the answer,
    `}` and <eos>."""
    width = len(str(num_operands * max_operand))
    return (num_operands - 2) * (width + 1) + width + 4


def embedded_split(
    task: str, *, num_operands: int, max_operand: int, eval_size: int, train_size: int = 20_000
) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out) problems of an embedded task: "arithmetic" (`arithmetic_split`), "chain" or "scratchpad".

    The held-out pool is fixed by the task's shape (`held_out_pool`) and the evaluation uses its first `eval_size`
    problems, so the training set (and the warm start's cache key) does not move with `eval_size`. Chain and
    scratchpad draw `train_size` training problems and the pool from fixed seeds, pool prompts removed from training.
    """
    pool = check_eval_size(task, num_operands=num_operands, max_operand=max_operand, eval_size=eval_size)
    if task == "arithmetic":
        train, held_out = arithmetic_split(num_operands=num_operands, max_operand=max_operand, eval_size=pool)
        return train, held_out[:eval_size]
    if task == "chain":
        draw = lambda count, seed: chain_problems(count, seed=seed, num_operands=num_operands)  # noqa: E731
    elif task == "scratchpad":
        shape = {"num_operands": num_operands, "max_operand": max_operand}
        draw = lambda count, seed: scratchpad_problems(count, seed=seed, **shape)  # noqa: E731
    else:
        raise ValueError(f"task must be 'arithmetic', 'chain' or 'scratchpad', got {task!r}")
    held_out = draw(pool, 1)
    seen = {p.prompt for p in held_out}
    train = [p for p in draw(train_size, 0) if p.prompt not in seen]
    return train, held_out[:eval_size]


def check_eval_size(task: str, *, num_operands: int, max_operand: int, eval_size: int) -> int:
    """The task's held-out pool size, once `eval_size` is checked to fit in it (ValueError otherwise)."""
    pool = held_out_pool(task, num_operands=num_operands, max_operand=max_operand)
    if not 1 <= eval_size <= pool:
        raise ValueError(f"eval_size must be in [1, {pool}] for task {task} (its held-out pool), got {eval_size}")
    return pool


def check_task(task: str, *, num_operands: int, max_operand: int, eval_size: int, max_response_length: int) -> None:
    """The embedded task's settings fit together: `eval_size` within the held-out pool, and a response length that
    holds a whole solution where every step is written out (chain, scratchpad); one-line ValueError otherwise."""
    check_eval_size(task, num_operands=num_operands, max_operand=max_operand, eval_size=eval_size)
    if task == "scratchpad":
        need = scratchpad_response_tokens(num_operands, max_operand)
        if max_response_length < need:
            raise ValueError(
                f"task=scratchpad with num_operands={num_operands}, max_operand={max_operand} needs "
                f"max_response_length >= {need} (every running sum written out), got {max_response_length}"
            )
    if task == "chain":
        need = chain_response_tokens(num_operands)
        if num_operands < 2 or max_response_length < need:
            raise ValueError(
                f"task=chain with num_operands={num_operands} needs num_operands >= 2 and "
                f"max_response_length >= {need} (3 * num_operands + 5), got {max_response_length}"
            )


def held_out_pool(task: str, *, num_operands: int, max_operand: int) -> int:
    """Size of a task's fixed held-out pool: 1000 drawn problems (chain, scratchpad), or for arithmetic half its
    distinct sums up to 500 (the pool of 3 one-digit operands is 500 of 1000)."""
    if task != "arithmetic":
        return 1000
    if num_operands < 2 or max_operand < 1:
        raise ValueError(f"need num_operands >= 2 and max_operand >= 1, got {num_operands}, {max_operand}")
    return min(500, (max_operand + 1) ** num_operands // 2)


def solution_text(
    problem: Problem,
    *,
    noisy_rng: random.Random | None = None,
    keep: float = 1.0,
    step_rng: random.Random | None = None,
) -> str:
    """The SFT target: running partial sums, then the boxed answer ("3+8+5=" -> "11,16 \\boxed{16}"; a chain problem
    "20 steps: =2 =9 =1 " -> "23 92 13 ... \\boxed{d}", `chain_problems`; a scratchpad problem "sum 6+6+0+4+8=" ->
    "12,12,16,\\boxed{24}").

    With `noisy_rng`, the boxed answer is replaced by a wrong one (off by 1-3; never negative, mod 10 for chains).
    A scratchpad solution keeps each running sum with probability `keep` (drawn from `step_rng`; all of them
    without one), so demonstrations write all, some or none of them.
    """
    if _STEPS in problem.prompt:
        steps, seeds = problem.prompt.split(_STEPS)
        xs = chain_sequence([int(x) for x in seeds.replace("=", "").split()], int(steps))
        answer = xs[-1]
        if noisy_rng is not None:
            answer = (answer + noisy_rng.choice((-3, -2, -1, 1, 2, 3))) % 10
        return "".join(f"{xs[t - CHAIN_LAG]}{xs[t]} " for t in range(CHAIN_LAG, len(xs))) + f"{BOXED}{{{answer}}}"
    scratch = problem.prompt.startswith(SCRATCHPAD)
    xs = [int(x) for x in problem.prompt.removeprefix(SCRATCHPAD).rstrip("=").split("+")]
    partial = [sum(xs[: i + 1]) for i in range(1, len(xs))]
    answer = int(problem.answer)
    if noisy_rng is not None:
        offset = noisy_rng.randint(1, 3)
        answer = answer + offset if answer < offset or noisy_rng.random() < 0.5 else answer - offset
    if not scratch:
        return ",".join(map(str, partial)) + f" {BOXED}{{{answer}}}"
    steps = [x for x in partial[:-1] if step_rng is None or step_rng.random() < keep]
    return "".join(f"{x}," for x in steps) + f"{BOXED}{{{answer}}}"


def arithmetic_split(*, num_operands: int, max_operand: int, eval_size: int) -> tuple[list[Problem], list[Problem]]:
    """All distinct sums (operand order matters) shuffled with a fixed seed: (train, held-out of `eval_size`).

    The split is fixed by the task shape alone, so every run and seed sees the same held-out problems.
    """
    if num_operands < 2 or max_operand < 1:
        raise ValueError(f"need num_operands >= 2 and max_operand >= 1, got {num_operands}, {max_operand}")
    space = (max_operand + 1) ** num_operands
    if not 0 < eval_size < space:
        raise ValueError(f"eval_size must be in [1, {space - 1}] for this task, got {eval_size}")
    rng = random.Random(0)
    codes = rng.sample(range(space), space)
    problems = []
    for code in codes:
        xs = [(code // (max_operand + 1) ** i) % (max_operand + 1) for i in range(num_operands)]
        problems.append(Problem(prompt="+".join(map(str, xs)) + "=", answer=str(sum(xs))))
    return problems[eval_size:], problems[:eval_size]

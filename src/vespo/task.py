"""The embedded default: a locally built character tokenizer, a tiny causal LM and a synthetic arithmetic task.

Everything here runs without the Hugging Face Hub, so `vespo train` with no arguments works on a fresh CPU box.
The task's answers are written as `\\boxed{...}` and graded by the same math reward as real math (docs/training.md).
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


def solution_text(problem: Problem) -> str:
    """The SFT target for an arithmetic problem: running partial sums, then the boxed answer ("11,16 \\boxed{16}")."""
    xs = [int(x) for x in problem.prompt.rstrip("=").split("+")]
    partial = [sum(xs[: i + 1]) for i in range(1, len(xs))]
    return ",".join(map(str, partial)) + f" {BOXED}{{{problem.answer}}}"

"""A tiny GGUF file written with the `gguf` package: llama architecture, a byte-level BPE tokenizer with a chat
template (SmolLM2's layout), some tensors quantised to Q8_0, so vespo's GGUF path runs in the default suite."""

from pathlib import Path

import numpy as np

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_symbols() -> list[str]:
    """GPT-2's byte-to-unicode table: the 256 symbols a byte-level BPE vocabulary starts from."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes, extra = {b: b for b in printable}, 0
    for b in range(256):
        if b not in codes:
            codes[b] = 256 + extra
            extra += 1
    return [chr(codes[b]) for b in range(256)]


def write_tiny_gguf(path: Path, *, hidden: int = 32, layers: int = 2, heads: int = 2, kv_heads: int = 1, seed: int = 0):
    """Write a random tiny llama GGUF at `path` (Q8_0 blocks of 32 need `hidden` a multiple of 32)."""
    import gguf

    rng = np.random.default_rng(seed)
    merges = ["Ġ t", "Ġ a", "h e", "i n", "1 2"]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *_byte_symbols(), *(m.replace(" ", "") for m in merges)]
    ff, head_dim = 2 * hidden, hidden // heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-test")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_rope_dimension_count(head_dim)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    def weight(name: str, shape: tuple[int, int], *, q8: bool = False) -> None:
        array = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        if q8:
            packed = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, array)

    weight("token_embd.weight", (len(tokens), hidden), q8=True)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        weight(f"blk.{i}.attn_q.weight", (hidden, hidden))
        weight(f"blk.{i}.attn_k.weight", (kv_heads * head_dim, hidden))
        weight(f"blk.{i}.attn_v.weight", (kv_heads * head_dim, hidden))
        weight(f"blk.{i}.attn_output.weight", (hidden, hidden))
        weight(f"blk.{i}.ffn_gate.weight", (ff, hidden), q8=True)
        weight(f"blk.{i}.ffn_up.weight", (ff, hidden))
        weight(f"blk.{i}.ffn_down.weight", (hidden, ff))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

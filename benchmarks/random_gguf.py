"""A Llama-shaped GGUF file of random ggml blocks in llama.cpp's Q4_K_M mix, written with the `gguf` package
(no download, no converter): for gpu_check.py's resident-bytes and speed steps and for `pagedserve plan`'s
tests. Its tokenizer is an HF tokenizer folder's (default: the embedded SmolLM2's), its vocabulary size the
shape's (the tokenizer's ids are a subset).

Q4_K_M as llama-quantize makes it: Q4_K everywhere, Q6_K for the LM head and for attn_v and ffn_down on
the first and last eighths of the layers and every third layer between; norms F32. Random blocks get
finite, small fp16 scales, so the model computes (degenerate text: serve with ignore_eos). With
`random_data=False` only the header is written and the file is extended to its full size without writing
(a sparse file: instant, for readers of the header such as `pagedserve plan`).

    python benchmarks/random_gguf.py OUT.gguf [--shape llama-8b|tiny] [--tokenizer FOLDER]
"""

import argparse
import json
import os
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import quant_shape_to_byte_shape

Q4_K, Q6_K, F32 = GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K, GGMLQuantizationType.F32
# Byte offsets of each block's fp16 scales (ggml's layouts): Q4_K d and dmin first, Q6_K d last.
_SCALE_OFFSETS = {Q4_K: (0, 2), Q6_K: (208,)}
_ALIGNMENT = 32  # GGUF's default


@dataclass(frozen=True)
class LlamaShape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    context: int


SHAPES = {
    "llama-8b": LlamaShape(4096, 14336, 32, 32, 8, 128256, 131072),  # Llama-3.1-8B
    "tiny": LlamaShape(256, 512, 4, 4, 2, 49152, 2048),  # K-quant rows: multiples of 256
}


def _more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's `use_more_bits`: the layers whose attn_v and ffn_down Q4_K_M stores in Q6_K."""
    eighth = layers // 8
    return layer < eighth or layer >= 7 * eighth or (layer - eighth) % 3 == 2


def q4_k_m_tensors(shape: LlamaShape) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """(name, [rows, cols] (GGUF lists them innermost first), type) of every tensor."""
    head_dim = shape.hidden // shape.heads
    tensors = [("token_embd.weight", (shape.vocab, shape.hidden), Q4_K)]
    for i in range(shape.layers):
        more = Q6_K if _more_bits(i, shape.layers) else Q4_K
        tensors += [
            (f"blk.{i}.attn_norm.weight", (shape.hidden,), F32),
            (f"blk.{i}.attn_q.weight", (shape.hidden, shape.hidden), Q4_K),
            (f"blk.{i}.attn_k.weight", (shape.kv_heads * head_dim, shape.hidden), Q4_K),
            (f"blk.{i}.attn_v.weight", (shape.kv_heads * head_dim, shape.hidden), more),
            (f"blk.{i}.attn_output.weight", (shape.hidden, shape.hidden), Q4_K),
            (f"blk.{i}.ffn_norm.weight", (shape.hidden,), F32),
            (f"blk.{i}.ffn_gate.weight", (shape.intermediate, shape.hidden), Q4_K),
            (f"blk.{i}.ffn_up.weight", (shape.intermediate, shape.hidden), Q4_K),
            (f"blk.{i}.ffn_down.weight", (shape.hidden, shape.intermediate), more),
        ]
    return tensors + [
        ("output_norm.weight", (shape.hidden,), F32),
        ("output.weight", (shape.vocab, shape.hidden), Q6_K),
    ]


def _nbytes(dims: tuple[int, ...], kind: GGMLQuantizationType) -> int:
    block, size = GGML_QUANT_SIZES[kind]
    return int(np.prod(dims)) // block * size


def _padded(n: int) -> int:
    return -(-n // _ALIGNMENT) * _ALIGNMENT


def _add_tokenizer(writer: GGUFWriter, folder: str | None) -> None:
    """An HF BPE tokenizer folder (tokenizer.json) as llama.cpp's gpt2-style tokenizer metadata; None: a
    byte-level vocabulary of one merge (the 256 bytes, " t", two special tokens: quick for transformers to
    read, for files only planned for)."""
    if folder is None:
        space_t = _BYTE_CHARS[ord(" ")] + "t"
        tokens = [_BYTE_CHARS[b] for b in range(256)] + [space_t, "<|im_start|>", "<|im_end|>"]
        vocab, special, merges = list(enumerate(tokens)), set(tokens[257:]), [f"{space_t[0]} t"]
    else:
        with open(os.path.join(folder, "tokenizer.json")) as f:
            tokenizer = json.load(f)
        vocab = sorted(((i, t) for t, i in tokenizer["model"]["vocab"].items()))
        special = {t["content"] for t in tokenizer["added_tokens"] if t["special"]}
        merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    ids = {token: i for i, token in vocab}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list([token for _, token in vocab])
    writer.add_token_types([3 if token in special else 1 for _, token in vocab])  # CONTROL, NORMAL
    writer.add_token_merges(merges)
    writer.add_bos_token_id(ids["<|im_start|>"])
    writer.add_eos_token_id(ids["<|im_end|>"])
    writer.add_add_bos_token(False)


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map (byte-level BPE's alphabet)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b], extra = chr(256 + extra), extra + 1
    return chars


_BYTE_CHARS = _byte_chars()


def _random_blocks(rng: np.random.Generator, dims: tuple[int, ...], kind: GGMLQuantizationType) -> np.ndarray:
    """Random bytes in `kind`'s blocks with every fp16 scale set to a small finite value."""
    if kind == F32:
        return np.ones(dims, dtype=np.float32)  # norms
    block_bytes = GGML_QUANT_SIZES[kind][1]
    blocks = rng.integers(0, 256, size=_nbytes(dims, kind), dtype=np.uint8).reshape(-1, block_bytes)
    scale = np.frombuffer(np.float16(2e-4).tobytes(), dtype=np.uint8)
    for offset in _SCALE_OFFSETS[kind]:
        blocks[:, offset : offset + 2] = scale
    return blocks


def write_random_gguf(
    path: str, shape: LlamaShape, tokenizer: str | None, random_data: bool = True, seed: int = 0
) -> str:
    """The Q4_K_M file of `shape` at `path` (see the module's doc); returns `path`."""
    writer = GGUFWriter(path, "llama")
    writer.add_context_length(shape.context)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_embedding_length(shape.hidden)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(500000.0)
    writer.add_rope_dimension_count(shape.hidden // shape.heads)
    writer.add_vocab_size(shape.vocab)
    writer.add_file_type(15)  # llama.cpp's MOSTLY_Q4_K_M
    _add_tokenizer(writer, tokenizer)
    tensors = q4_k_m_tensors(shape)
    for name, dims, kind in tensors:
        # NOTE: the writer takes a quantized tensor's shape in bytes ([rows, row bytes]).
        stored = dims if kind == F32 else quant_shape_to_byte_shape(dims, kind)
        writer.add_tensor_info(
            name, stored, np.dtype(np.float32 if kind == F32 else np.uint8), _nbytes(dims, kind), kind
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    rng = np.random.default_rng(seed)
    with open(path, "r+b") as f:
        f.seek(0, os.SEEK_END)
        start = _padded(f.tell())
        sizes = [_padded(_nbytes(dims, kind)) for _, dims, kind in tensors]
        if random_data:
            f.seek(start)
            for (_, dims, kind), size in zip(tensors, sizes):
                data = _random_blocks(rng, dims, kind).tobytes()
                f.write(data + bytes(size - len(data)))
        f.truncate(start + sum(sizes))
    return path


def default_tokenizer() -> str:
    """The embedded SmolLM2's tokenizer folder."""
    from pagedserve.utils.default_model import default_model_path
    from pagedserve.utils.gguf_cache import gguf_hf_folder

    return gguf_hf_folder(default_model_path())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-8b")
    parser.add_argument("--tokenizer", default=None, help="HF tokenizer folder (default: SmolLM2's)")
    args = parser.parse_args()
    print(write_random_gguf(args.out, SHAPES[args.shape], args.tokenizer or default_tokenizer()))


if __name__ == "__main__":
    main()

"""DeepSeek's MLA `kv_b_proj` from a GGUF file. llama.cpp's converter splits HF's kv_b_proj [heads * (nope
+ v), kv_lora] per head into `attn_k_b` (the key rows, transposed: [heads, kv_lora, nope]) and `attn_v_b`
([heads, v, kv_lora]) for its absorbed attention; here they are joined back into HF's matrix."""

import re

import numpy as np

_HALVES = re.compile(r"(.*\.self_attn)\.(k_b_proj|v_b_proj)\.weight")


def latent_half(name: str) -> tuple[str, str] | None:
    """(the attention's prefix, k_b_proj or v_b_proj) of a split kv_b half's HF name; None for another."""
    match = _HALVES.fullmatch(name)
    return None if match is None else (match.group(1), match.group(2))


class LatentJoiner:
    """Takes the float halves of a layer's kv_b_proj, gives HF's matrix once both came."""

    def __init__(self) -> None:
        self.waiting: dict[str, dict[str, np.ndarray]] = {}

    def add(self, prefix: str, half: str, weight: np.ndarray) -> tuple[str, np.ndarray] | None:
        halves = self.waiting.setdefault(prefix, {})
        halves[half] = weight
        if len(halves) < 2:
            return None
        del self.waiting[prefix]
        keys = np.swapaxes(halves["k_b_proj"], 1, 2)  # [heads, nope, kv_lora]
        joined = np.concatenate([keys, halves["v_b_proj"]], axis=1)  # per head: its key rows, value rows
        return f"{prefix}.kv_b_proj.weight", joined.reshape(-1, joined.shape[-1])

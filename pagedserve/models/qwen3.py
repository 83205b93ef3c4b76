"""Qwen3: the Llama blocks with an RMSNorm over each head of q and k before rotary (no q/k/v bias)."""

from pagedserve.layers.layernorm import RMSNorm
from pagedserve.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = RMSNorm

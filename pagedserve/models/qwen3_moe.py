"""Qwen3-MoE: the Qwen3 attention (q/k RMSNorm, no bias) and Qwen2-MoE's layers without a shared expert;
`sliding_window`, when set, applies to every layer (as in HF)."""

from pagedserve.models.qwen2_moe import Qwen2MoeForCausalLM


class Qwen3MoeForCausalLM(Qwen2MoeForCausalLM):
    pass

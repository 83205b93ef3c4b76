"""Qwen3: the Llama blocks with an RMSNorm over each head of q and k before rotary (its entry's
`qk_norm`; no q/k/v bias)."""

from pagedserve.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    pass

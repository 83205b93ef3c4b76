"""Qwen2: the Llama blocks with a bias on the q/k/v projections (its entry's `qkv_bias`)."""

from pagedserve.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    pass

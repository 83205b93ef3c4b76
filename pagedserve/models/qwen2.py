"""Qwen2: the Llama blocks with a bias on the q/k/v projections."""

from pagedserve.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True

"""Mistral: the Llama blocks, with `sliding_window` on every layer (HF Mistral ignores layer types)."""

from pagedserve.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    pass

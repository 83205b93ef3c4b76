"""Mistral: the Llama blocks. Sliding-window attention is not implemented: the context is capped at the
window instead (config.py), so attention never silently differs from the model's."""
from pagedserve.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    pass

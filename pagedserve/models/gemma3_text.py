"""Gemma 3 (text): Gemma 2's layers with a (1 + w) RMSNorm over each head of q and k, and local layers
rotated with their own base (rope_parameters per layer type)."""

from pagedserve.models.gemma2 import Gemma2ForCausalLM


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    pass

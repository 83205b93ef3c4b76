"""Constrained decoding with llguidance: StructuredOutputsParams -> grammar -> per-request matchers whose
token bitmask the workers apply to the logits. No torch here (the scheduler layer imports it)."""

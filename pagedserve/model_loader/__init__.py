"""Build a model and fill its weights: from safetensors, a GGUF file, or random (dummy)."""

from pagedserve.model_loader.loader import load_model

__all__ = ["load_model"]

"""`pagedserve plan`'s images (--image-tokens): an image model's prompt images are placeholder tokens in
its KV cache like text, and its workers hold the encoder's output for them (worker/encoder_cache.py):

    request tokens      = input tokens + image tokens + output tokens
    encoder cache bytes = --max-num-batched-tokens x the language model's hidden_size x dtype bytes

per GPU (the encoder cache keeps up to a step's token budget of embeddings, on every tensor-parallel
rank). A GPU's KV budget is what is left after it; an explicit --kv-cache-memory is the KV cache's alone."""

from pagedserve.config import ModelConfig
from pagedserve.errors import ConfigError

MAX_IMAGE_TOKENS = 2**31  # far beyond any context, and within the JSON report's integers


def encoder_cache_bytes(model_config: ModelConfig, max_num_batched_tokens: int, dtype_bytes: int) -> int:
    """The encoder cache at its budget on one GPU; 0 for a text-only model."""
    if model_config.multimodal is None:
        return 0
    hidden: int = model_config.hf_config.hidden_size
    return max_num_batched_tokens * hidden * dtype_bytes


def checked_image_tokens(image_tokens: int, model_config: ModelConfig) -> int:
    """--image-tokens, refused on a text-only model and outside [0, 2**31)."""
    if not 0 <= image_tokens < MAX_IMAGE_TOKENS:
        raise ConfigError(f"--image-tokens {image_tokens} must be in [0, 2**31).")
    if image_tokens and model_config.multimodal is None:
        raise ConfigError(
            f"--image-tokens {image_tokens}: {model_config.architecture} takes no images; leave it out."
        )
    return image_tokens

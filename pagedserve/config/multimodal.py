"""Image input: which architectures take images, and the bounds every image request is held to
(--limit-mm-per-prompt, --allowed-media-domains, --allowed-local-media-path, --media-fetch-timeout,
--max-media-bytes). The language model's own config is ModelConfig.hf_config; the whole multimodal config
(vision tower, projector, image token) is kept here."""

import json
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedserve.errors import ConfigError
from pagedserve.families import IMAGE_ARCHITECTURES, family

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# NOTE: a prompt's images each cost an encoder run and hundreds of tokens; vLLM's default is 999, but an
# unbounded list is a cheap way to make a server decode (and fetch) without end.
DEFAULT_IMAGES_PER_PROMPT = 8


@dataclass(frozen=True)
class MultiModalConfig:
    """`hf_config`: the checkpoint's whole config (LlavaConfig); `image_token_id`: the placeholder token
    each image's embeddings replace; `bidirectional_image_tokens`: the placeholder tokens of one image when
    they attend each other both ways during prefill (Gemma 3; None: causal, LLaVA). The rest bound what a
    request may send."""

    hf_config: "PretrainedConfig"
    image_token_id: int
    bidirectional_image_tokens: int | None = None
    # The token a prompt marks an image's place with, which the processor expands into the image's tokens
    # (Gemma 3's start-of-image); None: the image token itself (LLaVA).
    placeholder_token_id: int | None = None
    max_images_per_prompt: int = DEFAULT_IMAGES_PER_PROMPT
    allowed_media_domains: tuple[str, ...] | None = None  # None: any host
    allowed_local_media_path: str | None = None  # None: file:// URLs are refused
    fetch_timeout_s: float = 5.0
    max_media_bytes: int = 20 * 2**20

    @property
    def prompt_token_id(self) -> int:
        """The token a prompt holds, one per image, before the processor expands it."""
        return self.image_token_id if self.placeholder_token_id is None else self.placeholder_token_id

    def __post_init__(self) -> None:
        if not 0 <= self.max_images_per_prompt < 2**31:
            raise ConfigError(
                f"--limit-mm-per-prompt image={self.max_images_per_prompt} must be in [0, 2**31)."
            )
        if not math.isfinite(self.fetch_timeout_s) or self.fetch_timeout_s <= 0:
            raise ConfigError(
                f"--media-fetch-timeout={self.fetch_timeout_s} must be a positive, finite number of seconds."
            )
        if self.max_media_bytes < 1:
            raise ConfigError(f"--max-media-bytes={self.max_media_bytes} must be at least 1 byte.")
        if self.allowed_local_media_path is not None and not os.path.isdir(self.allowed_local_media_path):
            raise ConfigError(
                f"--allowed-local-media-path {self.allowed_local_media_path!r} is not a folder."
            )


def text_config(hf_config: "PretrainedConfig") -> "PretrainedConfig":
    """The language model's config of a multimodal checkpoint (itself for a text-only one)."""
    if hf_config.model_type in IMAGE_ARCHITECTURES:
        text: PretrainedConfig = hf_config.text_config
        return text
    return hf_config


def image_token_id(hf_config: "PretrainedConfig") -> int:
    """The placeholder token id of a multimodal checkpoint (LLaVA names it either way)."""
    value = getattr(hf_config, "image_token_id", None)
    if value is None:
        value = hf_config.image_token_index
    return int(value)


def bidirectional_image_tokens(hf_config: "PretrainedConfig") -> int | None:
    """One image's placeholder tokens when its family attends them both ways (families.py), else None."""
    facts = family(IMAGE_ARCHITECTURES[hf_config.model_type])
    if facts is None or not facts.bidirectional_images:
        return None
    return int(hf_config.mm_tokens_per_image)


def placeholder_token_id(hf_config: "PretrainedConfig") -> int | None:
    """The start-of-image token that marks an image in a prompt when the model has one (Gemma 3)."""
    value = getattr(hf_config, "boi_token_index", None)
    return None if value is None else int(value)


def parse_limit_mm_per_prompt(value: str | dict[str, object] | None) -> int:
    """--limit-mm-per-prompt '{"image": N}' -> N (the default when not given)."""
    if value is None:
        return DEFAULT_IMAGES_PER_PROMPT
    try:
        limits = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f'--limit-mm-per-prompt {value!r} is not JSON such as {{"image": 4}}: {exc}'
        ) from exc
    if not isinstance(limits, dict) or set(limits) - {"image"}:
        raise ConfigError(f'--limit-mm-per-prompt {value!r}: give {{"image": N}}; only images are supported.')
    count = limits.get("image", DEFAULT_IMAGES_PER_PROMPT)
    if isinstance(count, bool) or not isinstance(count, int):
        raise ConfigError(f"--limit-mm-per-prompt image={count!r} must be an integer.")
    return count

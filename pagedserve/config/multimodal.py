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
from pagedserve.families import IMAGE_ARCHITECTURES

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# NOTE: a prompt's images each cost an encoder run and hundreds of tokens; vLLM's default is 999, but an
# unbounded list is a cheap way to make a server decode (and fetch) without end.
DEFAULT_IMAGES_PER_PROMPT = 8


@dataclass(frozen=True)
class MultiModalConfig:
    """`hf_config`: the checkpoint's whole config (LlavaConfig); `image_token_id`: the placeholder token
    each image's embeddings replace. The rest bound what a request may send."""

    hf_config: "PretrainedConfig"
    image_token_id: int
    max_images_per_prompt: int = DEFAULT_IMAGES_PER_PROMPT
    allowed_media_domains: tuple[str, ...] | None = None  # None: any host
    allowed_local_media_path: str | None = None  # None: file:// URLs are refused
    fetch_timeout_s: float = 5.0
    max_media_bytes: int = 20 * 2**20

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

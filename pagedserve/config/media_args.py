"""EngineArgs' image flags (how many images a prompt may hold, where image URLs may point, how long and
how large a download may be) and their resolution into an image model's MultiModalConfig."""

import dataclasses
import os
from dataclasses import dataclass

from pagedserve.config.cli import config_field
from pagedserve.config.multimodal import MultiModalConfig, parse_limit_mm_per_prompt
from pagedserve.utils import parse_bytes


# NOTE: keyword-only, so that in EngineArgs' __init__ they come after its own fields: EngineArgs("model")
# still names the model.
@dataclass(kw_only=True)
class MediaArgs:
    """The image half of EngineArgs (its base class, beside ParallelArgs: the flags are one flat set)."""

    limit_mm_per_prompt: str | None = config_field(
        None, 'Image models: the most images in one prompt, JSON {"image": N} (default 8; 0 refuses images).'
    )
    allowed_media_domains: str | list[str] | None = config_field(
        None, "Image models: the only hosts http(s) image URLs may name (default: any host)."
    )
    allowed_local_media_path: str | None = config_field(
        None, "Image models: file:// image URLs are read only under this folder (default: refused)."
    )
    media_fetch_timeout: float = config_field(
        5.0, "Image models: seconds an http(s) image may take to download, all of it."
    )
    max_media_bytes: str = config_field(
        "20MiB", "Image models: the largest image file (download, data: URL or file) accepted."
    )

    def multimodal_config(self, multimodal: MultiModalConfig | None) -> MultiModalConfig | None:
        """The image bounds of an image model (None for a text model, which refuses images)."""
        if multimodal is None:
            return None
        domains = self.allowed_media_domains
        return dataclasses.replace(
            multimodal,
            max_images_per_prompt=parse_limit_mm_per_prompt(self.limit_mm_per_prompt),
            allowed_media_domains=None
            if domains is None
            else tuple([domains] if isinstance(domains, str) else domains),
            allowed_local_media_path=self.allowed_local_media_path
            and os.path.realpath(self.allowed_local_media_path),
            fetch_timeout_s=self.media_fetch_timeout,
            max_media_bytes=parse_bytes(self.max_media_bytes, "--max-media-bytes"),
        )

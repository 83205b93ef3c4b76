"""A prompt's images -> the engine's ImageInputs: each image loaded and decoded (media.py), then run
through the model's own HF processor (its processor_config.json: resize, crop, normalisation, how many
placeholder tokens the image takes), and the prompt's one placeholder token per image expanded to the
processor's tokens."""

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from pagedserve.config.multimodal import MultiModalConfig
from pagedserve.engine.grid_images import GridImageProcessor
from pagedserve.engine.media import MediaLoader
from pagedserve.errors import InvalidRequestError
from pagedserve.families import IMAGE_ARCHITECTURES, family
from pagedserve.protocol import ImageInput

if TYPE_CHECKING:
    from PIL.Image import Image


class ImagePromptProcessor:
    """`model_path`: the checkpoint folder, whose processor files the HF AutoProcessor reads."""

    def __init__(self, model_path: str, config: MultiModalConfig) -> None:
        from transformers import AutoProcessor

        self.config = config
        self.media = MediaLoader(config)
        facts = family(IMAGE_ARCHITECTURES[config.hf_config.model_type])
        if facts is not None and facts.mrope:
            self.processor = GridImageProcessor(model_path, config.image_token_id)
        else:
            self.processor = AutoProcessor.from_pretrained(model_path)  # type: ignore[no-untyped-call]
        self.placeholder: str = self.processor.image_token

    def check_count(self, sources: Sequence[object], param: str) -> None:
        """The number of images against --limit-mm-per-prompt (before any is fetched)."""
        limit = self.config.max_images_per_prompt
        if len(sources) > limit:
            raise InvalidRequestError(
                f"{param}: {len(sources)} images in one prompt; the server takes at most {limit} "
                "(--limit-mm-per-prompt '{\"image\": N}').",
                param=param,
            )

    def process(
        self, token_ids: list[int], sources: Sequence[object], param: str
    ) -> tuple[list[int], list[ImageInput]]:
        """The prompt with each image's placeholder token expanded, and the images in prompt order."""
        self.check_count(sources, param)
        token_id = self.config.image_token_id
        places = [i for i, t in enumerate(token_ids) if t == self.config.prompt_token_id]
        if len(places) != len(sources):
            raise InvalidRequestError(
                f"{param}: the prompt has {len(places)} image placeholders ({self.placeholder!r}) but "
                f"{len(sources)} images were given; put one {self.placeholder!r} where each image goes.",
                param=param,
            )
        images = [self.media.load(source, f"{param}[{i}]") for i, source in enumerate(sources)]
        expanded: list[int] = []
        spans: list[tuple[int, int]] = []  # each image's [start, end) in `expanded`
        pixel_values = []  # each image's pixel values and, for any-res processors, its size before them
        adds_text = False
        previous = 0
        for index, (place, image) in enumerate(zip(places, images)):
            expanded += token_ids[previous:place]
            tokens, pixels, size = self._run_processor(image, f"{param}[{index}]")
            start = len(expanded) + tokens.index(token_id)
            spans.append((start, start + tokens.count(token_id)))
            pixel_values.append((pixels, size))
            adds_text = adds_text or len(tokens) > tokens.count(token_id)
            expanded += tokens
            previous = place + 1
        expanded += token_ids[previous:]
        if adds_text:
            # NOTE: the processor puts text around an image's tokens (Gemma 3's "\n\n"), which HF tokenizes
            # together with the prompt's own text beside it (merging newlines): so the expanded prompt is
            # tokenized again as text. Its image tokens are special tokens and stay, each image's run apart.
            assert not isinstance(self.processor, GridImageProcessor), "a grid processor adds no text"
            tokenizer = self.processor.tokenizer
            text = tokenizer.decode(expanded, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            expanded = tokenizer(text, add_special_tokens=False)["input_ids"]
            spans = _runs(expanded, token_id)
            assert len(spans) == len(images), "text between images keeps their runs apart"
        inputs = [
            ImageInput(
                content_hash=_content_hash(pixels, size),
                offset=start,
                length=end - start,
                shape=list(pixels.shape),
                pixel_values=pixels.tobytes(),
                image_size=size,
            )
            for (start, end), (pixels, size) in zip(spans, pixel_values)
        ]
        return expanded, inputs

    def _run_processor(self, image: "Image", param: str) -> tuple[list[int], np.ndarray, list[int] | None]:
        """The processor's tokens for one placeholder, the image's pixel values ([1, C, H, W]; any-res
        tiles: [1, tiles, C, H, W]; a grid family's [1, t, h, w, patch values]) and, for any-res
        processors, its size [height, width] before them."""
        try:
            out = self.processor(
                text=self.placeholder, images=[image], add_special_tokens=False, return_tensors="np"
            )
        except (ValueError, TypeError, OSError) as exc:
            raise InvalidRequestError(
                f"{param}: the model's image processor refused it: {exc}", param=param
            ) from exc
        pixels = np.ascontiguousarray(out["pixel_values"], dtype=np.float32)
        sizes = out.get("image_sizes")
        size = None if sizes is None else [int(side) for side in sizes[0]]
        return [int(t) for t in out["input_ids"][0]], pixels, size


def _runs(token_ids: list[int], token_id: int) -> list[tuple[int, int]]:
    """The [start, end) runs of `token_id` in `token_ids`: one per image."""
    runs: list[tuple[int, int]] = []
    for i, token in enumerate(token_ids):
        if token != token_id:
            continue
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def _content_hash(pixels: np.ndarray, size: list[int] | None) -> str:
    # NOTE: two sizes may give the same tiles yet other tokens (unpadding): the size is part of the key.
    digest = hashlib.sha256(np.asarray(pixels.shape + tuple(size or ()), dtype=np.int64).tobytes())
    digest.update(pixels.tobytes())
    return digest.hexdigest()

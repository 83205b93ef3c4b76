"""The image encoder's outputs, by image content hash, and the step's input embeddings built from them.

An image's embeddings are computed once, when a step first schedules one of its placeholder tokens, and
kept while any request the worker holds has that image: later chunks of a chunked prompt, the other samples
of an n > 1 request and a request sharing the image read them from here. Beyond `budget_tokens` (the
scheduler's token budget: at least one step's worth of image tokens) the least recently used images that no
held request has are dropped; a request resumed after preemption then encodes its image again, which
gives the same embeddings."""

import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from pagedserve.models.interface import MultiModalLM
from pagedserve.protocol import ImageInput
from pagedserve.worker.input_batch import BatchInputs
from pagedserve.worker.request_state import CachedRequestState


@dataclass
class EncoderStats:
    """Cumulative: images the encoder ran on, and the seconds it took."""

    num_images: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class ScheduledImage:
    """The positions [first, end) of `image`'s tokens that the step computes for the batch's request
    `index`, whose scheduled tokens start at position `start`, in row `start_row` of the step's tokens."""

    index: int
    image: ImageInput
    first: int
    end: int
    start: int
    start_row: int

    def row_of(self, position: int) -> int:
        return self.start_row + position - self.start


def scheduled_images(batch: BatchInputs, states: dict[str, CachedRequestState]) -> Iterator[ScheduledImage]:
    """Every image some of whose tokens the step computes, request by request in batch order."""
    metadata = batch.attention[0]
    for index, request_id in enumerate(batch.request_ids):
        start_row = metadata.query_start_loc[index]
        num = metadata.query_start_loc[index + 1] - start_row
        start = metadata.seq_lens[index] - num  # the first scheduled position
        for image in states[request_id].images or ():
            first = max(start, image.offset)
            end = min(start + num, image.offset + image.length)
            if first < end:
                yield ScheduledImage(index, image, first, end, start, start_row)


def bidirectional_spans(
    batch: BatchInputs, states: dict[str, CachedRequestState]
) -> dict[int, list[tuple[int, int]]]:
    """The whole position runs of the images the step computes, per request index: the tokens that attend
    each other both ways in a family that says so (CommonAttentionMetadata.bidirectional_spans)."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for scheduled in scheduled_images(batch, states):
        image = scheduled.image
        spans.setdefault(scheduled.index, []).append((image.offset, image.offset + image.length))
    return spans


class EncoderCache:
    def __init__(self, model: MultiModalLM, budget_tokens: int, device: torch.device) -> None:
        self.model = model
        self.budget_tokens = budget_tokens
        self.device = device
        self.entries: OrderedDict[str, torch.Tensor] = OrderedDict()  # hash -> [tokens, hidden]
        self.stats = EncoderStats()

    def inputs_embeds(self, batch: BatchInputs, states: dict[str, CachedRequestState]) -> torch.Tensor | None:
        """The step's input embeddings with each scheduled placeholder token's row taken from its image;
        None when the step schedules no placeholder token (the model embeds the tokens itself)."""
        rows: list[int] = []
        parts: list[tuple[ImageInput, int, int]] = []  # (image, first, end) rows of its embeddings
        for scheduled in scheduled_images(batch, states):
            image, first, end = scheduled.image, scheduled.first, scheduled.end
            rows.extend(range(scheduled.row_of(first), scheduled.row_of(end)))
            parts.append((image, first - image.offset, end - image.offset))
        if not parts:
            return None
        self._encode_missing([image for image, _, _ in parts])
        embeds = self.model.embed_input_ids(batch.input_ids)
        image_rows = torch.cat([self.entries[image.content_hash][a:b] for image, a, b in parts])
        embeds[torch.tensor(rows, device=embeds.device)] = image_rows.to(embeds.dtype)
        self._evict(states)
        return embeds

    def _encode_missing(self, images: list[ImageInput]) -> None:
        """Run the encoder once on every image of the step not in the cache (images of one shape
        together)."""
        missing: dict[str, ImageInput] = {}
        for image in images:
            if image.content_hash in self.entries:
                self.entries.move_to_end(image.content_hash)
            else:
                missing[image.content_hash] = image
        # NOTE: images of one shape and one original size give the same number of tokens: one batch.
        by_shape: dict[tuple[tuple[int, ...], tuple[int, ...] | None], list[ImageInput]] = {}
        for image in missing.values():
            size = None if image.image_size is None else tuple(image.image_size)
            by_shape.setdefault((tuple(image.shape), size), []).append(image)
        for (shape, size), group in by_shape.items():
            start = time.perf_counter()
            pixels = torch.from_numpy(
                np.concatenate(
                    [np.frombuffer(image.pixel_values, dtype=np.float32).reshape(shape) for image in group]
                )
            ).to(self.device)
            embeddings = encode(self.model, pixels, None if size is None else (size[0], size[1]))
            for image, embedding in zip(group, embeddings):
                if embedding.shape[0] != image.length:
                    raise ValueError(
                        f"the encoder gave {embedding.shape[0]} embeddings for an image the processor "
                        f"gave {image.length} placeholder tokens: the model's config and its "
                        "processor_config.json disagree (image size, patch size or feature strategy)."
                    )
                self.entries[image.content_hash] = embedding
            self.stats.num_images += len(group)
            self.stats.seconds += time.perf_counter() - start

    def _evict(self, states: dict[str, CachedRequestState]) -> None:
        """Drop the least recently used images that no held request has, while over the budget."""
        size = sum(entry.shape[0] for entry in self.entries.values())
        if size <= self.budget_tokens:
            return
        held = {image.content_hash for state in states.values() for image in state.images or ()}
        for content_hash in [h for h in self.entries if h not in held]:
            if size <= self.budget_tokens:
                break
            size -= self.entries.pop(content_hash).shape[0]


def encode(model: MultiModalLM, pixels: torch.Tensor, image_size: tuple[int, int] | None) -> torch.Tensor:
    """The embeddings of images of one shape and, when the model reads it, one size before the processor."""
    if image_size is None:
        return model.embed_images(pixels)
    return model.embed_sized_images(pixels, image_size)

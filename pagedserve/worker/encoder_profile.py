"""The image encoder's share of the memory profile (Worker._profile_run, measured on CUDA before the KV
pool is sized): through the profile's steps the encoder cache is held full (--max-num-batched-tokens
embeddings, its budget) after one encoder pass at the model's largest image, so the measured peak, and
with it the KV pool, leaves room for the cache and for the pass's activations."""

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from pagedserve.models.interface import CausalLM, MultiModalLM
from pagedserve.worker.encoder_cache import encode


@contextmanager
def encoder_in_profile(model: CausalLM, budget_tokens: int, device: torch.device) -> Iterator[None]:
    """Hold a full encoder cache while the block runs (nothing for a text model)."""
    if not isinstance(model, MultiModalLM) or (largest := model.largest_image()) is None:
        yield
        return
    shape, image_size = largest
    # NOTE: one token's embedding gives the cache's row width and dtype, whatever the language model.
    row = model.embed_input_ids(torch.zeros(1, dtype=torch.long, device=device))
    cache = torch.empty(budget_tokens, row.shape[-1], dtype=row.dtype, device=device)
    with torch.inference_mode():
        encode(model, torch.zeros(shape, device=device), image_size)
    yield
    del cache

"""What the worker keeps of each request it holds: how to sample it. Its tokens live in its row of the
input batch's arrays (`InputBatch.known_tokens`): a decode step writes them there for the whole batch at
once, not into a list per request."""

from dataclasses import dataclass

from pagedserve.protocol import ImageInput, LoRARequest
from pagedserve.sampling_params import SamplingParams


@dataclass(slots=True)
class CachedRequestState:
    request_id: str
    num_prompt_tokens: int
    sampling_params: SamplingParams
    eos_token_id: int | None
    lora_request: LoRARequest | None = None
    beam: bool = False  # a beam search's beam: its logprobs are HF's beam scores (layers/sampler.py)
    images: list[ImageInput] | None = None  # an image model's prompt images (worker/encoder_cache.py)

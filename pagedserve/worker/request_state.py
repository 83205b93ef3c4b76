"""What the worker keeps of each request it holds: its tokens and how to sample it (input_batch.py holds
these in rows; the sampling and prompt-logprob stages read them)."""

from dataclasses import dataclass

from pagedserve.protocol import ImageInput, LoRARequest
from pagedserve.sampling_params import SamplingParams


@dataclass(slots=True)
class CachedRequestState:
    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: SamplingParams
    eos_token_id: int | None
    lora_request: LoRARequest | None = None
    beam: bool = False  # a beam search's beam: its logprobs are HF's beam scores (layers/sampler.py)
    images: list[ImageInput] | None = None  # an image model's prompt images (worker/encoder_cache.py)

"""RequestOptions: everything a caller asks of one generation request besides its id and prompt, carried as
one object from the APIs (LLM, LLMEngine.add_request, AsyncLLM, the OpenAI servers) through Frontend and
InputProcessor to the EngineCoreRequest. A new per-request option is a field here, read where it is used."""

from dataclasses import dataclass

from pagedserve.protocol import LoRARequest
from pagedserve.sampling_params import BeamSearchParams, SamplingParams


@dataclass(frozen=True)
class RequestOptions:
    """`beam_search`: a beam search whose `sampling_params.n` best beams come back (its max_tokens wins);
    `priority`: under --scheduling-policy priority, lower first (0 elsewhere); `lora_request`: the adapter
    (None: the base model); `arrival_time`: time.time() when it arrived (None: when it is processed). A
    prompt's `cache_salt` travels with the prompt, as in vLLM."""

    sampling_params: SamplingParams
    beam_search: BeamSearchParams | None = None
    priority: int = 0
    lora_request: LoRARequest | None = None
    arrival_time: float | None = None


def request_options(
    params: SamplingParams | RequestOptions,
    *,
    beam_search: BeamSearchParams | None = None,
    priority: int = 0,
    lora_request: LoRARequest | None = None,
    arrival_time: float | None = None,
) -> RequestOptions:
    """vLLM's per-request keyword arguments beside a SamplingParams, as one RequestOptions; a RequestOptions
    is taken as it is (it carries its own: naming them again would leave one of the two unread)."""
    if not isinstance(params, RequestOptions):
        return RequestOptions(params, beam_search, priority, lora_request, arrival_time)
    if (beam_search, priority, lora_request, arrival_time) != (None, 0, None, None):
        raise TypeError(
            "Got a RequestOptions and per-request keyword arguments (beam_search, priority, lora_request, "
            "arrival_time): set them in the RequestOptions, or pass a SamplingParams with them."
        )
    return params

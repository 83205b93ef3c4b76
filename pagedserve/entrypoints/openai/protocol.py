"""The OpenAI API's bodies that completions and chat completions share (pydantic), with vLLM's extra
sampling fields: the sampling request both extend, its stream options, usage and prompt logprobs. Each
endpoint's own bodies are in protocol_completion.py, protocol_chat.py, protocol_tokenization.py,
protocol_models.py (and protocol_responses.py, protocol_messages.py, protocol_pooling.py, protocol_ollama.py).

Unknown request fields are handled by the base models (request_fields.py). Ranges are checked once, by
SamplingParams; here only types and what SamplingParams cannot know. Boolean fields are strict (true or
false: pydantic would read "yes", "on" or 1 as true).
"""

from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import Field, StrictBool

from pagedserve.engine.input_processor import PromptType
from pagedserve.entrypoints.openai.request_fields import OpenAIBaseModel, OpenAIRequestModel
from pagedserve.entrypoints.openai.structured_request import structured_outputs_from_request
from pagedserve.errors import InvalidRequestError
from pagedserve.sampling_params import RequestOutputKind, SamplingParams, logit_bias_token_ids

T = TypeVar("T")


def _or(value: T | None, default: T) -> T:
    """OpenAI's default for a field the client left out (or sent as null)."""
    return default if value is None else value


# OpenAI's reasoning efforts (chat's `reasoning_effort`, the Responses API's `reasoning.effort`).
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class StreamOptions(OpenAIRequestModel):
    include_usage: StrictBool | None = False
    continuous_usage_stats: StrictBool | None = False  # with include_usage: usage in every chunk (vLLM's)


class SamplingRequest(OpenAIRequestModel):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM's extra sampling fields.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: StrictBool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: StrictBool = False
    skip_special_tokens: StrictBool = True
    truncate_prompt_tokens: int | None = None
    # Seconds this request may run; then it is aborted and returns what it has (finish_reason "abort").
    timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    cache_salt: str | None = None  # prefix-cache hits only between requests with the same salt
    # vLLM's: --scheduling-policy priority serves lower values first (elsewhere only 0 is accepted).
    priority: int = Field(default=0, ge=-(2**63), lt=2**63, strict=True)
    prompt_logprobs: int | None = None  # vLLM's: per prompt token, the logprobs of this many top tokens
    return_tokens_as_token_ids: StrictBool | None = None  # vLLM's: logprob tokens as "token_id:N"
    # Output constraints (structured_request.py): OpenAI's response_format, vLLM's fields.
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # vLLM's, with --reasoning-parser: the most thinking tokens before </think> is forced.
    thinking_token_budget: int | None = Field(default=None, strict=True)

    def check_stream_options(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError(
                "stream_options can only be set when stream is true.", param="stream_options"
            )
        if self.stream and self.prompt_logprobs is not None:
            raise InvalidRequestError(
                "prompt_logprobs cannot be streamed (as in vLLM): set stream to false, or drop "
                "prompt_logprobs.",
                param="prompt_logprobs",
            )

    def include_usage_in_stream(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def usage_in_every_chunk(self) -> bool:
        """stream_options.continuous_usage_stats (with include_usage, as vLLM): usage so far in each chunk."""
        return self.include_usage_in_stream() and bool(
            self.stream_options and self.stream_options.continuous_usage_stats
        )

    def prompt_with_salt(self, prompt: PromptType) -> PromptType:
        """The prompt as the engine takes it, with this request's cache_salt."""
        if self.cache_salt is None:
            return prompt
        key = "prompt_token_ids" if isinstance(prompt, list) else "prompt"
        return {key: prompt, "cache_salt": self.cache_salt}

    def to_sampling_params(
        self,
        max_tokens: int | None,
        logprobs: int | None,
        prompt_logprobs: int | None = None,
        best_of: int | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> SamplingParams:
        """`defaults`: the model's (--generation-config) for the fields this request leaves unset. Raises
        InvalidRequestError naming the field that is out of range."""
        defaults = defaults or {}
        return SamplingParams(
            n=self.n,
            best_of=best_of,
            temperature=_or(self.temperature, defaults.get("temperature", 1.0)),
            top_p=_or(self.top_p, defaults.get("top_p", 1.0)),
            top_k=_or(self.top_k, defaults.get("top_k", 0)),
            min_p=_or(self.min_p, defaults.get("min_p", 0.0)),
            repetition_penalty=_or(self.repetition_penalty, defaults.get("repetition_penalty", 1.0)),
            presence_penalty=_or(self.presence_penalty, 0.0),
            frequency_penalty=_or(self.frequency_penalty, 0.0),
            seed=self.seed,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            max_tokens=max_tokens,  # unset: the engine caps the rest of the context at the default
            min_tokens=self.min_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logit_bias=logit_bias_token_ids(self.logit_bias),
            truncate_prompt_tokens=self.truncate_prompt_tokens,
            structured_outputs=structured_outputs_from_request(self),
            thinking_token_budget=self.thinking_token_budget,
            output_kind=RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY,
        )


class CompletionTokensDetails(OpenAIBaseModel):
    reasoning_tokens: int = 0  # thinking tokens (--reasoning-parser), the tags excluded


class PromptTokensDetails(OpenAIBaseModel):
    cached_tokens: int = 0  # prompt tokens found in the prefix cache


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None  # once the engine has started the request
    completion_tokens_details: CompletionTokensDetails | None = None  # with --reasoning-parser


class PromptLogprob(OpenAIBaseModel):
    """One entry of vLLM's `prompt_logprobs` (keyed by token id): its rank in the vocabulary (1: the most
    likely)."""

    logprob: float
    rank: int | None
    decoded_token: str


# Per prompt token (the first has none): token id -> its logprob.
PromptLogprobs = list[dict[str, PromptLogprob] | None]

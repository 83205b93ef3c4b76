"""The OpenAI API's request and response bodies (pydantic), with vLLM's extra sampling fields.

Unknown request fields are handled by the base models (request_fields.py). Ranges are checked once, by
SamplingParams; here only types and what SamplingParams cannot know. Boolean fields are strict (true or
false: pydantic would read "yes", "on" or 1 as true).
"""

import time
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import Field, StrictBool

from pagedserve.engine.input_processor import PromptType
from pagedserve.entrypoints.openai.request_fields import OpenAIBaseModel, OpenAIRequestModel
from pagedserve.entrypoints.openai.structured_request import structured_outputs_from_request
from pagedserve.errors import InvalidRequestError
from pagedserve.sampling_params import (
    BeamSearchParams,
    RequestOutputKind,
    SamplingParams,
    logit_bias_token_ids,
)

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


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: StrictBool = False
    best_of: int | None = None
    suffix: str | None = None
    # vLLM's beam search fields: a search of width best_of (default n) returning the n best beams.
    use_beam_search: StrictBool = False
    length_penalty: float = 1.0
    early_stopping: StrictBool | Literal["never"] = False  # HF's values

    def echo_only(self) -> bool:
        """echo with max_tokens 0 (vLLM's prompt scoring): the prompt and its logprobs, nothing generated."""
        return self.echo and self.max_tokens == 0

    def num_prompt_logprobs(self) -> int | None:
        """prompt_logprobs, or (echo with logprobs) the echoed prompt's logprobs: the larger."""
        echoed = self.logprobs if self.echo else None
        asked = [n for n in (self.prompt_logprobs, echoed) if n is not None]
        return max(asked) if asked else None

    def check_supported(self) -> None:
        self.check_stream_options()
        if self.suffix:
            raise InvalidRequestError("suffix is not supported.", param="suffix")
        if self.max_tokens == 0 and not self.echo:
            raise InvalidRequestError(
                "max_tokens must be at least 1, got 0 (0 only with echo: the prompt back, scored with "
                "logprobs, nothing generated).",
                param="max_tokens",
            )
        if self.best_of is not None and self.best_of < self.n:
            raise InvalidRequestError(f"best_of={self.best_of} must be at least n={self.n}.", param="best_of")
        if self.stream and (self.use_beam_search or (self.best_of or self.n) > self.n):
            raise InvalidRequestError(
                "best_of > n and use_beam_search cannot be streamed: their outputs "
                "are known only at the end; set stream to false.",
                param="stream",
            )

    def beam_search_params(self) -> BeamSearchParams | None:
        """The beam search asked for (use_beam_search), else None. Raises InvalidRequestError."""
        if not self.use_beam_search:
            return None
        if self.max_tokens is None:
            raise InvalidRequestError("use_beam_search needs max_tokens.", param="max_tokens")
        return BeamSearchParams(
            beam_width=self.best_of or self.n,
            max_tokens=self.max_tokens,
            ignore_eos=self.ignore_eos,
            length_penalty=self.length_penalty,
            early_stopping=self.early_stopping,
        )


class ChatMessage(OpenAIRequestModel):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    # An assistant's earlier thinking (templates that show it read reasoning_content, vLLM's older name).
    reasoning: str | None = None
    reasoning_content: str | None = None


class ChatTemplateRequest(OpenAIRequestModel):
    """How a conversation goes through the chat template (chat completions, /tokenize), vLLM's fields."""

    messages: list[ChatMessage] | None = None
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False  # the last (assistant) message goes on: no generation prompt
    documents: list[dict[str, str]] | None = None  # for templates of retrieval-augmented models
    chat_template_kwargs: dict[str, Any] | None = None  # extra template variables, e.g. enable_thinking
    # How long a reasoning model thinks: gpt-oss's system message says it (harmony: low, medium or high),
    # other models' chat templates get it as the variable `reasoning_effort` (vLLM's).
    reasoning_effort: ReasoningEffort | None = None

    def template_variables(self) -> dict[str, Any] | None:
        """chat_template_kwargs, with reasoning_effort when it is set."""
        if self.reasoning_effort is None:
            return self.chat_template_kwargs
        return {"reasoning_effort": self.reasoning_effort, **(self.chat_template_kwargs or {})}

    def check_template_flags(self) -> None:
        if self.add_generation_prompt and self.continue_final_message:
            raise InvalidRequestError(
                "continue_final_message and add_generation_prompt cannot both be true (as in vLLM): "
                "set add_generation_prompt to false to continue the last message.",
                param="continue_final_message",
            )


class ChatCompletionRequest(SamplingRequest, ChatTemplateRequest):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: StrictBool = False
    top_logprobs: int | None = Field(default=None, ge=0)  # the upper bound is --max-logprobs
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None  # false: at most one call (the first) per choice
    include_reasoning: StrictBool = True  # with --reasoning-parser; false: the reasoning is left out

    def check_supported(self) -> None:
        self.check_stream_options()
        self.check_template_flags()
        for switch in ("enable_thinking", "thinking"):
            value = (self.chat_template_kwargs or {}).get(switch)
            if value is not None and not isinstance(value, bool):
                raise InvalidRequestError(
                    f"chat_template_kwargs.{switch} must be true or false, got {str(value)[:100]!r}.",
                    param=f"chat_template_kwargs.{switch}",
                )
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs set to true.", param="top_logprobs")

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def named_as_sent(self, error: InvalidRequestError) -> InvalidRequestError:
        """`error` naming the field as this request sent it: SamplingParams and the engine check
        max_tokens and logprobs, which a chat request sends as max_completion_tokens and top_logprobs."""
        sent = {
            "max_tokens": "max_completion_tokens" if self.max_completion_tokens is not None else None,
            "logprobs": "top_logprobs",
        }.get(error.param or "")
        if sent is None or error.param is None:
            return error
        message = str(error)
        if message.startswith(error.param):
            message = sent + message[len(error.param) :]
        return InvalidRequestError(message, param=sent, status_code=error.status_code)


class CompletionTokensDetails(OpenAIBaseModel):
    reasoning_tokens: int = 0  # thinking tokens (--reasoning-parser), the tags excluded


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    completion_tokens_details: CompletionTokensDetails | None = None  # with --reasoning-parser


class CompletionLogProbs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(OpenAIBaseModel):
    """One entry of vLLM's `prompt_logprobs` (keyed by token id; no `rank`: pagedserve keeps none)."""

    logprob: float
    decoded_token: str


# Per prompt token (the first has none): token id -> its logprob.
PromptLogprobs = list[dict[str, PromptLogprob] | None]


class CompletionChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None


class CompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(OpenAIBaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(OpenAIBaseModel):
    content: list[ChatTokenLogprob] | None = None


class ChatResponseMessage(OpenAIBaseModel):
    role: str = "assistant"
    content: str | None = None
    # --reasoning-parser: the thinking (null when the output had none); reasoning_content is vLLM's older
    # name for the same value.
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)


class ChatChoice(OpenAIBaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None = None


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None
    reasoning: str | None = None  # --reasoning-parser: the thinking's next part (and as reasoning_content)
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChatStreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


class ModelCard(OpenAIBaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "pagedserve"
    root: str
    parent: str | None = None  # a LoRA adapter's base model
    max_model_len: int | None  # None: a model of the pool (--models-dir) that is not loaded now


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeRequest(ChatTemplateRequest):
    """Either `prompt` (with or without special tokens) or `messages` (through the chat template)."""

    model: str | None = None
    prompt: str | None = None
    add_special_tokens: StrictBool = True


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(OpenAIRequestModel):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str

"""The OpenAI API's chat completions bodies (/v1/chat/completions, pydantic): the messages, the chat
template's fields (also /tokenize's), the request, and the response and stream chunks with their
logprobs, reasoning and tool calls. Unknown fields, strict booleans and ranges as in protocol.py."""

import time
from typing import Any, Literal

from pydantic import Field, StrictBool

from pagedserve.entrypoints.openai.protocol import PromptLogprobs, ReasoningEffort, SamplingRequest, UsageInfo
from pagedserve.entrypoints.openai.request_fields import OpenAIBaseModel, OpenAIRequestModel
from pagedserve.errors import InvalidRequestError


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

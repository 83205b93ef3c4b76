"""Anthropic's Messages API request bodies (POST /v1/messages, /v1/messages/count_tokens). Content blocks
are typed by their `type` (a wrong one is a 400 naming it); unknown fields, top-level or in a block (the
client's own, such as a tool_use block's `caller`), are ignored with a warning, as on the other routes."""

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictStr

from pagedserve.entrypoints.openai.request_fields import OpenAIRequestModel

MAX_TOOL_NAME_CHARS = 128


class TextBlock(OpenAIRequestModel):
    type: Literal["text"]
    text: StrictStr
    cache_control: dict[str, Any] | None = None
    citations: list[dict[str, Any]] | None = None


class ToolUseBlock(OpenAIRequestModel):
    type: Literal["tool_use"]
    id: StrictStr = Field(min_length=1)
    name: StrictStr = Field(min_length=1, max_length=MAX_TOOL_NAME_CHARS)
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(OpenAIRequestModel):
    type: Literal["tool_result"]
    tool_use_id: StrictStr = Field(min_length=1)
    content: StrictStr | list[TextBlock] | None = None
    is_error: StrictBool | None = None
    cache_control: dict[str, Any] | None = None


class ThinkingBlock(OpenAIRequestModel):
    type: Literal["thinking"]
    thinking: StrictStr
    signature: StrictStr | None = None


class RedactedThinkingBlock(OpenAIRequestModel):
    type: Literal["redacted_thinking"]
    data: StrictStr


ContentBlock = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class AnthropicMessage(OpenAIRequestModel):
    role: Literal["user", "assistant"]
    content: StrictStr | list[ContentBlock]


class AnthropicTool(OpenAIRequestModel):
    name: StrictStr = Field(min_length=1, max_length=MAX_TOOL_NAME_CHARS)
    description: StrictStr | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None


class AnthropicToolChoice(OpenAIRequestModel):
    type: Literal["auto", "any", "tool", "none"]
    name: StrictStr | None = None  # with type tool
    disable_parallel_tool_use: StrictBool | None = None


class ThinkingConfig(OpenAIRequestModel):
    type: Literal["enabled", "disabled"]
    # NOTE: Anthropic's floor is 1024; a small model's context may hold less, so any positive budget
    # under max_tokens is taken.
    budget_tokens: int | None = Field(default=None, ge=1, lt=2**63, strict=True)


class AnthropicMetadata(OpenAIRequestModel):
    user_id: StrictStr | None = Field(default=None, max_length=256)


class CountTokensRequest(OpenAIRequestModel):
    model: StrictStr
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: StrictStr | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: ThinkingConfig | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1, lt=2**63, strict=True)
    stop_sequences: list[StrictStr] | None = None
    stream: StrictBool = False
    temperature: float | None = Field(default=None, allow_inf_nan=False)
    top_p: float | None = Field(default=None, allow_inf_nan=False)
    top_k: int | None = Field(default=None, ge=0, lt=2**63, strict=True)
    metadata: AnthropicMetadata | None = None

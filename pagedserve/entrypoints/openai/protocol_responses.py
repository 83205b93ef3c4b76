"""The Responses API's request body (POST /v1/responses). Types and bounds here; what the input items
say is read by responses_input.py, the ranges of the sampling fields by SamplingParams."""

from typing import Any, Literal

from pydantic import Field, StrictBool, StrictStr, field_validator

from pagedserve.entrypoints.openai.protocol import ReasoningEffort
from pagedserve.entrypoints.openai.request_fields import OpenAIBaseModel, OpenAIRequestModel

# OpenAI's bounds on `metadata`.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MAX_RESPONSE_ID_CHARS = 256


class Reasoning(OpenAIRequestModel):
    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None  # no summarizer: the text is given whole
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # the older name of summary


class TextFormat(OpenAIBaseModel):
    """Unknown keys are refused (`schema` is an alias, which the dropping of unknown fields would miss)."""

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: StrictStr | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: StrictStr | None = None
    strict: StrictBool | None = None


class TextConfig(OpenAIRequestModel):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(OpenAIRequestModel):
    model: StrictStr | None = None
    input: StrictStr | list[dict[str, Any]] | None = None
    instructions: StrictStr | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, lt=2**63, strict=True)
    temperature: float | None = Field(default=None, allow_inf_nan=False)
    top_p: float | None = Field(default=None, allow_inf_nan=False)
    stream: StrictBool = False
    store: StrictBool = True
    background: StrictBool | None = None
    previous_response_id: StrictStr | None = Field(
        default=None, min_length=1, max_length=MAX_RESPONSE_ID_CHARS
    )
    metadata: dict[StrictStr, StrictStr] | None = None
    user: StrictStr | None = None
    truncation: Literal["disabled"] | None = None  # "auto" would drop input: not implemented

    @field_validator("metadata")
    @classmethod
    def _metadata_bounds(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        if metadata is None:
            return None
        if len(metadata) > MAX_METADATA_PAIRS:
            raise ValueError(f"at most {MAX_METADATA_PAIRS} pairs, got {len(metadata)}")
        for key, value in metadata.items():
            if len(key) > MAX_METADATA_KEY_CHARS or len(value) > MAX_METADATA_VALUE_CHARS:
                raise ValueError(
                    f"keys are at most {MAX_METADATA_KEY_CHARS} characters and values at most "
                    f"{MAX_METADATA_VALUE_CHARS}; {key[:80]!r} is over"
                )
        return metadata

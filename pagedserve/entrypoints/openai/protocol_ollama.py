"""Ollama's API request bodies (/api/chat, /api/generate, /api/embed, /api/embeddings, /api/show), each
field typed and bounded; unknown fields are ignored with a warning, as on the other routes. `keep_alive`
is parsed here (entrypoints/durations.py, shared with the model pool): a value that does not parse is a
400 naming it."""

from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator

from pagedserve.entrypoints.durations import parse_duration
from pagedserve.entrypoints.openai.protocol_messages import MAX_TOOL_NAME_CHARS
from pagedserve.entrypoints.openai.request_fields import OpenAIRequestModel

Int64 = Annotated[int, Field(ge=-(2**63), lt=2**63, strict=True)]


class OllamaOptions(OpenAIRequestModel):
    """Ollama's `options`. The sampler's are mapped onto SamplingParams (which checks their ranges, as on
    /v1); the runner's have no meaning here (the server's flags decide) and are named in a warning; the
    sampling methods pagedserve lacks are refused when a value turns them on (ollama_options.py)."""

    num_predict: int | None = Field(default=None, ge=-2, lt=2**63, strict=True)  # -1, -2: to the end
    num_ctx: int | None = Field(default=None, ge=1, lt=2**63, strict=True)
    temperature: float | None = Field(default=None, allow_inf_nan=False)
    top_k: Int64 | None = None
    top_p: float | None = Field(default=None, allow_inf_nan=False)
    min_p: float | None = Field(default=None, allow_inf_nan=False)
    seed: Int64 | None = None  # negative: a random seed, as Ollama's -1
    stop: list[StrictStr] | None = None
    repeat_penalty: float | None = Field(default=None, allow_inf_nan=False)
    presence_penalty: float | None = Field(default=None, allow_inf_nan=False)
    frequency_penalty: float | None = Field(default=None, allow_inf_nan=False)
    # Sampling methods pagedserve lacks.
    mirostat: Int64 | None = None
    tfs_z: float | None = Field(default=None, allow_inf_nan=False)
    typical_p: float | None = Field(default=None, allow_inf_nan=False)
    repeat_last_n: Int64 | None = None
    # No meaning here: mirostat's settings (mirostat is off) and the runner's.
    mirostat_tau: float | None = Field(default=None, allow_inf_nan=False)
    mirostat_eta: float | None = Field(default=None, allow_inf_nan=False)
    penalize_newline: StrictBool | None = None
    num_keep: Int64 | None = None
    num_batch: Int64 | None = None
    num_gpu: Int64 | None = None
    main_gpu: Int64 | None = None
    num_thread: Int64 | None = None
    numa: StrictBool | None = None
    low_vram: StrictBool | None = None
    f16_kv: StrictBool | None = None
    logits_all: StrictBool | None = None
    vocab_only: StrictBool | None = None
    use_mmap: StrictBool | None = None
    use_mlock: StrictBool | None = None
    embedding_only: StrictBool | None = None


class OllamaRequest(OpenAIRequestModel):
    model: StrictStr
    keep_alive: StrictFloat | StrictInt | StrictStr | None = None  # its effect: the model manager's
    options: OllamaOptions | None = None

    @field_validator("keep_alive")
    @classmethod
    def _parses(cls, value: float | str | None) -> float | str | None:
        if value is not None:
            parse_duration(value)
        return value


class OllamaToolCallFunction(OpenAIRequestModel):
    name: StrictStr = Field(min_length=1, max_length=MAX_TOOL_NAME_CHARS)
    arguments: dict[str, object]


class OllamaToolCall(OpenAIRequestModel):
    function: OllamaToolCallFunction


class OllamaMessage(OpenAIRequestModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: StrictStr = ""
    thinking: StrictStr | None = None
    images: list[StrictStr] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: StrictStr | None = None  # a tool message: the tool that answered


class OllamaGenerationRequest(OllamaRequest):
    """What /api/chat and /api/generate share."""

    stream: StrictBool = True  # Ollama's default
    format: Literal["", "json"] | dict[str, object] | None = None  # "json", or a JSON schema
    think: StrictBool | Literal["low", "medium", "high"] | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Int64 | None = None


class OllamaChatRequest(OllamaGenerationRequest):
    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[dict[str, object]] | None = None


class OllamaGenerateRequest(OllamaGenerationRequest):
    prompt: StrictStr = ""
    system: StrictStr | None = None
    suffix: StrictStr | None = None
    template: StrictStr | None = None
    context: list[StrictInt] | None = None
    raw: StrictBool = False
    images: list[StrictStr] | None = None


class OllamaEmbedRequest(OllamaRequest):
    input: StrictStr | list[StrictStr]
    truncate: StrictBool = True
    dimensions: Int64 | None = None


class OllamaEmbeddingsRequest(OllamaRequest):
    """The older /api/embeddings: one prompt, its vector as the model pools it."""

    prompt: StrictStr


class OllamaPullRequest(OpenAIRequestModel):
    model: StrictStr | None = None
    name: StrictStr | None = None  # the older clients' name for `model`
    insecure: StrictBool = False
    stream: StrictBool = True


class OllamaShowRequest(OpenAIRequestModel):
    model: StrictStr | None = None
    name: StrictStr | None = None  # the older clients' name for `model`
    verbose: StrictBool = False

"""Bodies of the pooling endpoints (--runner pooling): /v1/embeddings (OpenAI's), /pooling and /classify
(vLLM's), /score and /rerank (vLLM's, the rerank one in Cohere's and Jina's shape). Integer fields are
strict (no booleans, strings or floats), boolean ones too (true or false, never "yes" or 1); their ranges
are checked against the model when the request is processed (engine/pooling_input.py) and the list
lengths by RequestBounds."""

from typing import Annotated, Literal

from pydantic import Field, StrictBool

from pagedserve.entrypoints.openai.protocol import UsageInfo
from pagedserve.entrypoints.openai.request_fields import OpenAIBaseModel, OpenAIRequestModel

StrictInt = Annotated[int, Field(strict=True)]
# A text, texts, one prompt's token ids, or several prompts' token ids (OpenAI's `input`).
PoolingInput = str | list[str] | list[StrictInt] | list[list[StrictInt]]


class PoolingRequestBase(OpenAIRequestModel):
    model: str | None = None
    # Keep the first k tokens of each input (-1: the model's context length); else over it is a 400.
    truncate_prompt_tokens: StrictInt | None = None
    user: str | None = None


# The longest prompt_name accepted (sentence-transformers' names are words: "query", "document").
MAX_PROMPT_NAME_LENGTH = 256


class EmbeddingRequest(PoolingRequestBase):
    input: PoolingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    normalize: StrictBool | None = None  # vLLM's: None keeps the model's pooler setting
    # One of the model's sentence-transformers prompts (config_sentence_transformers.json), put before
    # each text input; None: the model's default_prompt_name, if any.
    prompt_name: Annotated[str, Field(strict=True, max_length=MAX_PROMPT_NAME_LENGTH)] | None = None


class ClassificationRequest(PoolingRequestBase):
    input: PoolingInput


class ScoreRequest(PoolingRequestBase):
    """One query against documents (text_1 a string) or pairs (equal lists), vLLM's names."""

    text_1: str | list[str]
    text_2: str | list[str]


class RerankRequest(PoolingRequestBase):
    query: str
    documents: list[str]
    top_n: StrictInt | None = None
    return_documents: StrictBool = True


class EmbeddingData(OpenAIBaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # str: base64 of little-endian float32 (encoding_format=base64)


class EmbeddingResponse(OpenAIBaseModel):
    object: Literal["list"] = "list"
    id: str
    created: int
    model: str
    data: list[EmbeddingData]
    usage: UsageInfo


class PoolingData(OpenAIBaseModel):
    object: Literal["pooling"] = "pooling"
    index: int
    data: list[float] | str


class PoolingResponse(OpenAIBaseModel):
    object: Literal["list"] = "list"
    id: str
    created: int
    model: str
    data: list[PoolingData]
    usage: UsageInfo


class ClassificationData(OpenAIBaseModel):
    object: Literal["classification"] = "classification"
    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class ClassificationResponse(OpenAIBaseModel):
    object: Literal["list"] = "list"
    id: str
    created: int
    model: str
    data: list[ClassificationData]
    usage: UsageInfo


class ScoreData(OpenAIBaseModel):
    object: Literal["score"] = "score"
    index: int
    score: float


class ScoreResponse(OpenAIBaseModel):
    object: Literal["list"] = "list"
    id: str
    created: int
    model: str
    data: list[ScoreData]
    usage: UsageInfo


class RerankDocument(OpenAIBaseModel):
    text: str


class RerankResult(OpenAIBaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankUsage(OpenAIBaseModel):
    total_tokens: int


class RerankResponse(OpenAIBaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: RerankUsage

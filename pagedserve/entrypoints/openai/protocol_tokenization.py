"""The bodies of /tokenize and /detokenize (vLLM's, pydantic): a prompt or a conversation (through the
chat template) to token ids, and back."""

from pydantic import StrictBool

from pagedserve.entrypoints.openai.protocol_chat import ChatTemplateRequest
from pagedserve.entrypoints.openai.request_fields import OpenAIBaseModel, OpenAIRequestModel


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

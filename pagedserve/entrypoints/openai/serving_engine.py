"""What the OpenAI endpoints share: the engine, the model-name check, token strings for logprobs, SSE."""

import uuid
from typing import Any

from pydantic import BaseModel

from pagedserve.engine.async_llm import AsyncLLM
from pagedserve.entrypoints.openai.protocol import UsageInfo
from pagedserve.errors import InvalidRequestError


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def sse(chunk: BaseModel) -> str:
    """One server-sent event."""
    return f"data: {chunk.model_dump_json()}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def usage_info(num_prompt_tokens: int, num_generated: int) -> UsageInfo:
    return UsageInfo(
        prompt_tokens=num_prompt_tokens,
        completion_tokens=num_generated,
        total_tokens=num_prompt_tokens + num_generated,
    )


class OpenAIServing:
    """Base of the endpoint handlers: owns nothing but references to the engine and its tokenizer."""

    def __init__(self, engine: AsyncLLM, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name
        self.tokenizer: Any = engine.get_tokenizer()
        self.max_model_len = engine.config.model.max_model_len
        self._token_strings: dict[int, str] = {}

    def check_model(self, model: str | None) -> None:
        """Raises InvalidRequestError (404) for a model this server does not serve."""
        if model is not None and model != self.model_name:
            raise InvalidRequestError(
                f"The model `{model}` does not exist: this server serves "
                f"`{self.model_name}` (see GET /v1/models).",
                param="model",
                status_code=404,
            )

    def token_string(self, token_id: int) -> str:
        """The text of one token on its own, as logprobs show it."""
        text = self._token_strings.get(token_id)
        if text is None:
            text = self._token_strings[token_id] = self.tokenizer.decode([token_id])
        return text

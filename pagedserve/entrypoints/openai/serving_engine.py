"""What the OpenAI endpoints share: the engine, the model-name check, token strings for logprobs, SSE."""

import uuid
from collections.abc import AsyncGenerator, Sequence
from typing import Any, TypeVar

from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from pagedserve.engine.async_llm import AsyncLLM
from pagedserve.entrypoints.openai.errors import stream_error_event
from pagedserve.entrypoints.openai.protocol import (
    PromptLogprob,
    PromptLogprobs,
    PromptTokensDetails,
    UsageInfo,
)
from pagedserve.entrypoints.openai.served_models import ServedModels
from pagedserve.outputs import Logprob
from pagedserve.protocol import EngineCoreRequest, LoRARequest


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def sse(chunk: BaseModel) -> str:
    """One server-sent event."""
    return f"data: {chunk.model_dump_json()}\n\n"


SSE_DONE = "data: [DONE]\n\n"


ResponseT = TypeVar("ResponseT", bound=BaseModel)


def as_http(result: ResponseT | AsyncGenerator[BaseModel, None]) -> ResponseT | StreamingResponse:
    """A generate() result as the route answers it: the whole response, or its chunks as server-sent
    events."""
    if isinstance(result, AsyncGenerator):
        return StreamingResponse(sse_stream(result), media_type="text/event-stream")
    return result


async def sse_stream(chunks: AsyncGenerator[BaseModel, None]) -> AsyncGenerator[str, None]:
    """The chunks as server-sent events; an error midway (e.g. the engine died) as an event too."""
    try:
        async for chunk in chunks:
            yield sse(chunk)
    except Exception as exc:
        yield stream_error_event(exc)
    finally:
        await chunks.aclose()
    yield SSE_DONE


# JSON has no -inf: vLLM's floor for the logprob of an impossible token.
MIN_LOGPROB = -9999.0


def usage_info(num_prompt_tokens: int, num_generated: int, num_cached_tokens: int | None = None) -> UsageInfo:
    """`num_cached_tokens`: the prompt tokens found in the prefix cache (None: not known yet)."""
    return UsageInfo(
        prompt_tokens=num_prompt_tokens,
        completion_tokens=num_generated,
        total_tokens=num_prompt_tokens + num_generated,
        prompt_tokens_details=None
        if num_cached_tokens is None
        else PromptTokensDetails(cached_tokens=num_cached_tokens),
    )


class OpenAIServing:
    """Base of the endpoint handlers: owns nothing but references to the engine and its tokenizer."""

    def __init__(self, engine: AsyncLLM, models: ServedModels) -> None:
        self.engine = engine
        self.models = models
        self.model_name = models.base_name  # the name responses report (an adapter's requests: its own)
        self.tokenizer: Any = engine.get_tokenizer()
        self.max_model_len = engine.config.model.max_model_len
        self.sampling_defaults = engine.config.model.generation_defaults  # --generation-config
        self._token_texts = engine.frontend.output_processor.logprob_dicts  # one cache of token texts

    def check_model(self, model: str | None) -> LoRARequest | None:
        """The LoRA adapter `model` names (None: the base model). Raises InvalidRequestError (404) for a
        model this server does not serve."""
        return self.models.resolve(model)

    def response_model(self, core: EngineCoreRequest) -> str:
        """The `model` a response reports: its adapter's name (as it was when the request came: an adapter
        unloaded meanwhile still serves its requests in flight), else the base model's first name."""
        return self.model_name if core.lora_request is None else core.lora_request.lora_name

    def token_string(self, token_id: int) -> str:
        """The text of one token on its own, as logprobs show it."""
        return self._token_texts.text(token_id)

    def shown_token(self, token_id: int, as_ids: bool | None) -> str:
        """A token as logprobs show it: its text, or "token_id:N" (return_tokens_as_token_ids, as vLLM)."""
        return f"token_id:{token_id}" if as_ids else self.token_string(token_id)

    def prompt_logprobs(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[dict[int, Logprob] | None] | None,
        as_ids: bool | None,
    ) -> PromptLogprobs | None:
        """vLLM's `prompt_logprobs`: per prompt token None (the first) or token id -> logprob, rank, text."""
        if logprobs is None:
            return None
        return [
            None
            if entry is None
            else {
                str(t): PromptLogprob(
                    logprob=max(v.logprob, MIN_LOGPROB),
                    rank=v.rank,
                    decoded_token=self.shown_token(t, as_ids),
                )
                for t, v in entry.items()
            }
            for entry in logprobs[: len(token_ids)]
        ]

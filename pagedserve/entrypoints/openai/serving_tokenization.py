"""POST /tokenize and /detokenize (vLLM's extensions): what the model sees, without generating."""

import asyncio
from collections.abc import Callable

from pagedserve.engine.async_llm import AsyncLLM
from pagedserve.entrypoints.openai.protocol_chat import ChatTemplateRequest
from pagedserve.entrypoints.openai.protocol_tokenization import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from pagedserve.entrypoints.openai.served_models import ServedModels
from pagedserve.entrypoints.openai.serving_engine import OpenAIServing
from pagedserve.errors import InvalidRequestError

# a conversation and its template fields -> prompt token ids (OpenAIServingChat.render)
ChatRenderer = Callable[[ChatTemplateRequest], list[int]]


class OpenAIServingTokenization(OpenAIServing):
    def __init__(self, engine: AsyncLLM, models: ServedModels, render_chat: ChatRenderer) -> None:
        super().__init__(engine, models)
        self.render_chat = render_chat

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        """Raises InvalidRequestError unless exactly one of prompt and messages is given."""
        self.check_model(request.model)
        if (request.prompt is None) == (request.messages is None):
            raise InvalidRequestError("Give exactly one of prompt and messages.", param="prompt")
        request.check_template_flags()
        # NOTE: in a thread: a huge prompt never holds up the event loop (/health, other requests).
        return await asyncio.to_thread(self._tokenize, request)

    def _tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        if request.messages is not None:
            tokens = self.render_chat(request)
        else:
            tokens = self.tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens)
        return TokenizeResponse(count=len(tokens), max_model_len=self.max_model_len, tokens=list(tokens))

    def detokenize(self, request: DetokenizeRequest) -> DetokenizeResponse:
        """Raises InvalidRequestError for ids outside the vocabulary."""
        self.check_model(request.model)
        vocab = self.engine.config.model.vocab_size
        bad = [t for t in request.tokens if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(
                f"Token id {bad[0]} is out of vocabulary (valid ids: 0 to {vocab - 1}).", param="tokens"
            )
        return DetokenizeResponse(prompt=self.tokenizer.decode(request.tokens))

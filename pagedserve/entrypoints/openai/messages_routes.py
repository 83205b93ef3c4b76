"""Anthropic's Messages API routes: POST /v1/messages and /v1/messages/count_tokens (errors in Anthropic's
shape: errors.py picks it by the path; the key may come as `x-api-key`: auth.py)."""

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from pagedserve.entrypoints.openai.errors import ANTHROPIC_ERROR_RESPONSES
from pagedserve.entrypoints.openai.protocol_messages import CountTokensRequest, MessagesRequest
from pagedserve.entrypoints.openai.serving_messages import AnthropicServingMessages
from pagedserve.entrypoints.utils import with_cancellation


def add_messages_routes(app: FastAPI, serving: AnthropicServingMessages) -> None:
    @app.post("/v1/messages", response_model=None, responses=ANTHROPIC_ERROR_RESPONSES)
    @with_cancellation
    async def create_message(
        request: MessagesRequest, raw_request: Request
    ) -> dict[str, Any] | StreamingResponse:
        return await serving.create(request)

    @app.post("/v1/messages/count_tokens", responses=ANTHROPIC_ERROR_RESPONSES)
    async def count_tokens(request: CountTokensRequest) -> dict[str, int]:
        return await serving.count_tokens(request)

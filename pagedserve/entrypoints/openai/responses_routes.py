"""The Responses API's routes: POST /v1/responses, GET and DELETE /v1/responses/{id}, POST
/v1/responses/{id}/cancel. Stored responses belong to the API key the request sent (auth.key_scope)."""

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from pagedserve.entrypoints.openai.auth import key_scope
from pagedserve.entrypoints.openai.errors import ERROR_RESPONSES
from pagedserve.entrypoints.openai.protocol_responses import ResponsesRequest
from pagedserve.entrypoints.openai.serving_responses import OpenAIServingResponses
from pagedserve.entrypoints.utils import with_cancellation


def add_responses_routes(app: FastAPI, serving: OpenAIServingResponses) -> None:
    @app.post("/v1/responses", response_model=None, responses=ERROR_RESPONSES)
    @with_cancellation
    async def create_response(
        request: ResponsesRequest, raw_request: Request
    ) -> dict[str, Any] | StreamingResponse:
        return await serving.create(request, key_scope(raw_request.headers))

    @app.get("/v1/responses/{response_id}", responses=ERROR_RESPONSES)
    async def retrieve_response(response_id: str, raw_request: Request) -> dict[str, Any]:
        return serving.retrieve(key_scope(raw_request.headers), response_id)

    @app.delete("/v1/responses/{response_id}", responses=ERROR_RESPONSES)
    async def delete_response(response_id: str, raw_request: Request) -> dict[str, Any]:
        return serving.delete(key_scope(raw_request.headers), response_id)

    @app.post("/v1/responses/{response_id}/cancel", responses=ERROR_RESPONSES)
    async def cancel_response(response_id: str, raw_request: Request) -> dict[str, Any]:
        return serving.cancel(key_scope(raw_request.headers), response_id)

"""The Responses API's routes: POST /v1/responses, GET and DELETE /v1/responses/{id}, POST
/v1/responses/{id}/cancel. Stored responses belong to the API key the request sent (auth.key_scope)."""

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from pagedserve.entrypoints.openai.auth import key_scope
from pagedserve.entrypoints.openai.errors import ERROR_RESPONSES
from pagedserve.entrypoints.openai.protocol_responses import ResponsesRequest
from pagedserve.entrypoints.openai.serving_responses import OpenAIServingResponses
from pagedserve.entrypoints.utils import with_cancellation
from pagedserve.utils.user_json import JsonObject, JsonValue


def add_responses_routes(app: FastAPI, serving: OpenAIServingResponses) -> None:
    # response_model=dict: FastAPI builds its model from the return annotation otherwise, and pydantic
    # cannot build one of JsonObject (a recursive alias for mypy).
    @app.post("/v1/responses", response_model=dict, responses=ERROR_RESPONSES)
    @with_cancellation
    async def create_response(  # JsonObject spelled out: FastAPI evaluates the annotation
        request: ResponsesRequest, raw_request: Request
    ) -> dict[str, JsonValue] | StreamingResponse:
        return await serving.create(request, key_scope(raw_request.headers))

    @app.get("/v1/responses/{response_id}", response_model=dict, responses=ERROR_RESPONSES)
    async def retrieve_response(response_id: str, raw_request: Request) -> JsonObject:
        return serving.retrieve(key_scope(raw_request.headers), response_id)

    @app.delete("/v1/responses/{response_id}", response_model=dict, responses=ERROR_RESPONSES)
    async def delete_response(response_id: str, raw_request: Request) -> JsonObject:
        return serving.delete(key_scope(raw_request.headers), response_id)

    @app.post("/v1/responses/{response_id}/cancel", response_model=dict, responses=ERROR_RESPONSES)
    async def cancel_response(response_id: str, raw_request: Request) -> JsonObject:
        return serving.cancel(key_scope(raw_request.headers), response_id)

"""Ollama's API routes beside /v1: /api/chat, /api/generate, /api/embed, /api/embeddings, /api/tags,
/api/show, /api/ps, /api/pull (a served model is there already), /api/version, and `GET /` / `HEAD /`
("Ollama is running"); /api/create, /api/copy, /api/delete and /api/push say why they do nothing here.
Errors come in Ollama's shape ({"error": "..."}: errors.py picks it by the path); the probes (/,
/api/version) need no key."""

import json
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from pagedserve import __version__
from pagedserve.entrypoints.openai.errors import OLLAMA_ERROR_RESPONSES, OLLAMA_PREFIX
from pagedserve.entrypoints.openai.ollama_replies import NDJSON
from pagedserve.entrypoints.openai.protocol_ollama import (
    OllamaChatRequest,
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaPullRequest,
    OllamaShowRequest,
)
from pagedserve.entrypoints.openai.request_bounds import declaring_json
from pagedserve.entrypoints.openai.serving_ollama import OllamaServing
from pagedserve.entrypoints.utils import with_cancellation
from pagedserve.errors import InvalidRequestError

RUNNING = "Ollama is running"
# /api/chat and /api/generate: one JSON object, or (stream, the default) NDJSON lines.
STREAMED_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {
        "content": {NDJSON: {"schema": {"type": "string"}}},
        "description": "The answer (JSON), or by default its lines as NDJSON, the last with `done`",
    },
    **OLLAMA_ERROR_RESPONSES,
}


class OllamaJsonBodyMiddleware:
    """Ollama reads every /api/ body as JSON whatever its Content-Type, and its documented curl examples
    send none (curl's -d says form data): the body is declared JSON here so FastAPI parses it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(OLLAMA_PREFIX):
            scope = declaring_json(scope)
        await self.app(scope, receive, send)


def add_ollama_routes(app: FastAPI, serving: OllamaServing) -> None:
    models = serving.models
    app.add_middleware(OllamaJsonBodyMiddleware)

    @app.api_route("/", methods=["GET", "HEAD"], response_class=PlainTextResponse)
    async def running() -> str:
        return RUNNING

    @app.api_route("/api/version", methods=["GET", "HEAD"])
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.post("/api/chat", response_model=None, responses=STREAMED_RESPONSES)
    @with_cancellation
    async def chat(request: OllamaChatRequest, raw_request: Request) -> dict[str, object] | StreamingResponse:
        return await serving.chat_reply(request)

    @app.post("/api/generate", response_model=None, responses=STREAMED_RESPONSES)
    @with_cancellation
    async def generate(
        request: OllamaGenerateRequest, raw_request: Request
    ) -> dict[str, object] | StreamingResponse:
        return await serving.generate(request)

    @app.post("/api/embed", responses=OLLAMA_ERROR_RESPONSES)
    @with_cancellation
    async def embed(request: OllamaEmbedRequest, raw_request: Request) -> dict[str, object]:
        return await serving.embed(request)

    @app.post("/api/embeddings", responses=OLLAMA_ERROR_RESPONSES)
    @with_cancellation
    async def embeddings(request: OllamaEmbeddingsRequest, raw_request: Request) -> dict[str, object]:
        return await serving.embeddings(request)

    @app.get("/api/tags")
    async def tags() -> dict[str, object]:
        return models.tags()

    @app.post("/api/show", responses=OLLAMA_ERROR_RESPONSES)
    async def show(request: OllamaShowRequest) -> dict[str, object]:
        return models.show(_named(request.model or request.name, "show"))

    @app.get("/api/ps")
    async def ps() -> dict[str, object]:
        return models.ps()

    add_model_management_routes(app, models.name)


def add_model_management_routes(app: FastAPI, find: Callable[[str], object]) -> None:
    """/api/pull: a served model (`find` raises a 404 for any other name) is pulled already, success at
    once (one NDJSON line when streamed), nothing downloaded. /api/create, /api/copy, /api/delete and
    /api/push: 400, saying how pagedserve gets its models."""

    @app.post("/api/pull", response_model=None, responses=OLLAMA_ERROR_RESPONSES)
    async def pull(request: OllamaPullRequest) -> dict[str, str] | StreamingResponse:
        find(_named(request.model or request.name, "pull"))
        done = {"status": "success"}
        return (
            StreamingResponse(iter([json.dumps(done) + "\n"]), media_type=NDJSON) if request.stream else done
        )

    for operation, method in (("create", "POST"), ("copy", "POST"), ("delete", "DELETE"), ("push", "POST")):
        app.add_api_route(
            f"/api/{operation}", _not_managed(operation), methods=[method], responses=OLLAMA_ERROR_RESPONSES
        )


def _named(model: str | None, action: str) -> str:
    """The model a request names (`model`, or older clients' `name`); 400 without one."""
    if not model:
        raise InvalidRequestError(f"model: the name of the model to {action} is required.", param="model")
    return model


def _not_managed(operation: str) -> Callable[[], Awaitable[None]]:
    """A route of Ollama's model management: 400, saying how pagedserve gets its models."""

    async def refuse() -> None:
        raise InvalidRequestError(
            f"/api/{operation}: pagedserve serves the models it was started with and does not {operation} "
            "models. Start it with the model's file or folder (pagedserve serve PATH), or give it a folder "
            "of models (--models-dir).",
            param="model",
        )

    return refuse

"""The one place errors become HTTP responses: OpenAI-style bodies
{"error": {"message", "type", "param", "code"}}, where `type` names the OpenAI client's exception class
and `code` is the HTTP status (as vLLM does); under /v1/messages (Anthropic's Messages API) Anthropic's
{"type": "error", "error": {"type", "message"}}, the message naming the field; under /api/ (Ollama's API)
Ollama's {"error": "message"}."""

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from pagedserve.errors import (
    CapacityError,
    EngineAsleepError,
    EngineDeadError,
    InvalidRequestError,
    PagedServeError,
)
from pagedserve.logger import init_logger
from pagedserve.utils.user_json import JsonObject

logger = init_logger(__name__)

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


# Anthropic's error types by HTTP status (its client picks the exception class by the status).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
ANTHROPIC_PATH = "/v1/messages"
OLLAMA_PREFIX = "/api/"


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    """The body of every error (declared in the OpenAPI schema)."""

    error: ErrorInfo


class AnthropicErrorInfo(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """The body of an error on Anthropic's routes (/v1/messages...)."""

    type: str
    error: AnthropicErrorInfo


class OllamaErrorResponse(BaseModel):
    """The body of an error on Ollama's routes (/api/...): the message, naming the field."""

    error: str


_ERROR_STATUSES = (
    (400, "Invalid request (what was wrong, the limit, the field to change)"),
    (401, "Missing or wrong API key"),
    (404, "Unknown model"),
    (503, "At capacity (Retry-After), loading, shutting down, or the engine is dead"),
)
# The error statuses of the API routes, for their OpenAPI `responses` (Anthropic's routes: their own shape).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description} for status, description in _ERROR_STATUSES
}
ANTHROPIC_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": AnthropicErrorResponse, "description": description}
    for status, description in _ERROR_STATUSES
}
OLLAMA_ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    status: {"model": OllamaErrorResponse, "description": description}
    for status, description in _ERROR_STATUSES
}


def error_body(message: str, status: int, param: str | None = None, path: str = "") -> JsonObject:
    """The error's body in the shape of the API that `path` belongs to."""
    if path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/"):
        return anthropic_error_body(message, status)
    if path.startswith(OLLAMA_PREFIX):
        return {"error": message}
    return {
        "error": {"message": message, "type": _TYPES.get(status, "APIError"), "param": param, "code": status}
    }


def anthropic_error_body(message: str, status: int) -> JsonObject:
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}


def error_response(
    message: str,
    status: int,
    param: str | None = None,
    headers: dict[str, str] | None = None,
    path: str = "",
) -> JSONResponse:
    """`path`: the request's, which picks the body's shape (error_body)."""
    return JSONResponse(error_body(message, status, param, path), status_code=status, headers=headers)


def exception_status(exc: BaseException) -> tuple[int, str | None, dict[str, str] | None]:
    """(HTTP status, param, extra headers) of an exception."""
    if isinstance(exc, InvalidRequestError):
        return exc.status_code, exc.param, None
    if isinstance(exc, CapacityError):
        return 503, None, {"Retry-After": str(max(1, round(exc.retry_after_s)))}
    if isinstance(exc, (EngineDeadError, EngineAsleepError)):
        return 503, None, None
    return 500, None, None


def exception_message(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, PagedServeError) else f"Internal server error: {exc!r}"


def exception_response(exc: BaseException, path: str = "") -> JSONResponse:
    status, param, headers = exception_status(exc)
    return error_response(exception_message(exc), status, param, headers, path)


def stream_error_event(exc: BaseException) -> str:
    """An SSE event carrying the error; the OpenAI client raises it as an APIError."""
    status, param, _ = exception_status(exc)
    return f"data: {json.dumps(error_body(exception_message(exc), status, param))}\n\n"


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """pydantic's errors -> one message naming each bad field, and the first field as `param`."""
    parts, params = [], []
    for error in exc.errors():
        loc = [str(part) for part in error.get("loc", ()) if part != "body"]
        field = ".".join(loc) or "body"
        params.append(field)
        if error.get("type") == "extra_forbidden":
            parts.append(f"{field}: not supported by this server (a vLLM field pagedserve lacks); remove it")
        elif error.get("type") == "json_invalid":
            params[-1] = "body"
            parts.append(f"the request body is not valid JSON ({error.get('ctx', {}).get('error', '')})")
        else:
            parts.append(f"{field}: {error.get('msg')}")
    return "Invalid request: " + "; ".join(parts) + ".", params[0] if params else None


def register_error_handlers(app: FastAPI) -> None:
    """400 (not FastAPI's 422) for bad bodies; OpenAI-style bodies for every error, 500 included."""

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(message, 400, param, path=request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(
            str(exc.detail), exc.status_code, headers=dict(exc.headers or {}), path=request.url.path
        )

    @app.exception_handler(PagedServeError)
    async def on_pagedserve_error(request: Request, exc: PagedServeError) -> JSONResponse:
        return exception_response(exc, request.url.path)

    @app.exception_handler(Exception)
    async def on_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("Unexpected error while serving a request.")
        return exception_response(exc, request.url.path)

"""vLLM's `POST /invocations` (SageMaker's one inference route): the body's fields name the API it is for,
and the request runs as if sent to that route, with its checks, errors, streaming and cancellation."""

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pagedserve.entrypoints.openai.errors import error_response
from pagedserve.entrypoints.openai.request_bounds import declaring_json

INVOCATIONS_PATH = "/invocations"
# The field that tells each API's body apart, in the order vLLM tries them: the first one the body has
# decides.
_ROUTES = (
    ("messages", "/v1/chat/completions"),
    ("prompt", "/v1/completions"),
    ("input", "/v1/embeddings"),
    ("text_1", "/score"),
    ("documents", "/rerank"),
)


class InvocationsMiddleware:
    """Sends POST /invocations on to the route its body is for. Runs behind the body-size limit (the body
    arrives whole and bounded) and the API key."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != INVOCATIONS_PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        message = await receive()
        target = _route_of(message.get("body", b""))
        if target is None:
            fields = ", ".join(f"'{field}' ({path})" for field, path in _ROUTES)
            response = error_response(
                f"The /invocations body must be a JSON object with one of: {fields}.", 400, param="body"
            )
            await response(scope, receive, send)
            return
        body: list[Message] = [message]

        async def replay() -> Message:
            return body.pop() if body else await receive()

        # NOTE: the body is a JSON object, whatever its declared type (vLLM reads it so too).
        routed = {**declaring_json(scope), "path": target, "raw_path": target.encode()}
        await self.app(routed, replay, send)


def _route_of(body: bytes) -> str | None:
    """The route whose API's field the JSON object `body` has; None for anything else."""
    try:
        fields = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
        return None
    if not isinstance(fields, dict):
        return None
    return next((path for field, path in _ROUTES if field in fields), None)

"""Bounds on what one request can make the server hold or loop over: the body's size (413, checked before
the body is parsed) and the lengths of its lists (400), each naming the limit and its flag. Checked once
per route, before anything is tokenized."""

from collections.abc import Sized
from dataclasses import dataclass, fields

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pagedserve.config import config_field
from pagedserve.entrypoints.openai.errors import error_response
from pagedserve.entrypoints.openai.protocol import SamplingRequest
from pagedserve.entrypoints.openai.protocol_chat import ChatCompletionRequest, ChatTemplateRequest
from pagedserve.entrypoints.openai.protocol_completion import CompletionRequest
from pagedserve.errors import ConfigError, InvalidRequestError


@dataclass(frozen=True)
class RequestBounds:
    """The server's input bounds (flags generated from the fields). Raises ConfigError for a bound that is
    not positive."""

    max_request_body_bytes: int = config_field(
        32 * 2**20, "Largest request body in bytes; larger bodies get 413 before they are parsed."
    )
    max_prompts_per_request: int = config_field(
        1024, "Most prompts in one /v1/completions request (a list of prompts); more get 400."
    )
    max_samples_per_request: int = config_field(
        1024,
        "Most sequences one request may make the engine generate: prompts x best_of (or n); more get 400.",
    )
    max_chat_messages: int = config_field(
        1024, "Most messages in one chat conversation (/v1/chat/completions, /tokenize); more get 400."
    )
    max_stop_strings: int = config_field(64, "Most stop strings per request; more get 400.")
    max_stop_string_length: int = config_field(
        1024, "Longest stop string, in characters; longer ones get 400."
    )
    max_stop_token_ids: int = config_field(1024, "Most stop_token_ids per request; more get 400.")
    max_logit_bias_entries: int = config_field(1024, "Most logit_bias entries per request; more get 400.")
    max_chat_documents: int = config_field(
        1024, "Most documents (vLLM's chat `documents`) in one chat request; more get 400."
    )
    max_chat_template_kwargs: int = config_field(
        64, "Most entries in one request's chat_template_kwargs; more get 400."
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) < 1:
                raise ConfigError(
                    f"{f.name}={getattr(self, f.name)} must be at least 1 (--{f.name.replace('_', '-')})."
                )

    def check_completion(self, request: CompletionRequest) -> None:
        """Raises InvalidRequestError (400) naming the first bound `request` exceeds."""
        prompt = request.prompt
        num_prompts = 1 if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else len(prompt)
        _bound("prompt", "prompts", num_prompts, self.max_prompts_per_request, "max_prompts_per_request")
        self._check_sampling(request, num_prompts * max(request.best_of or 0, request.n))

    def check_pooling(self, num_inputs: int, param: str) -> None:
        """A pooling request's inputs (/v1/embeddings, /classify, /pooling) or documents (/score, /rerank):
        at most --max-prompts-per-request. Raises InvalidRequestError (400)."""
        _bound(param, "inputs", num_inputs, self.max_prompts_per_request, "max_prompts_per_request")

    def check_chat(self, request: ChatCompletionRequest) -> None:
        """Raises InvalidRequestError (400) naming the first bound `request` exceeds."""
        self.check_chat_template(request)
        self._check_sampling(request, request.n)

    def check_chat_template(self, request: ChatTemplateRequest) -> None:
        """Raises InvalidRequestError (400) naming the first bound the conversation's fields exceed."""
        _bound("messages", "messages", _length(request.messages), self.max_chat_messages, "max_chat_messages")
        _bound(
            "documents",
            "documents",
            _length(request.documents),
            self.max_chat_documents,
            "max_chat_documents",
        )
        _bound(
            "chat_template_kwargs",
            "chat_template_kwargs entries",
            _length(request.chat_template_kwargs),
            self.max_chat_template_kwargs,
            "max_chat_template_kwargs",
        )

    def _check_sampling(self, request: SamplingRequest, num_samples: int) -> None:
        _bound(
            "n",
            "sequences to generate (prompts x best_of or n)",
            num_samples,
            self.max_samples_per_request,
            "max_samples_per_request",
        )
        stop = [request.stop] if isinstance(request.stop, str) else request.stop or []
        _bound("stop", "stop strings", len(stop), self.max_stop_strings, "max_stop_strings")
        longest = max(map(len, stop), default=0)
        _bound(
            "stop",
            "characters in a stop string",
            longest,
            self.max_stop_string_length,
            "max_stop_string_length",
        )
        _bound(
            "stop_token_ids",
            "stop_token_ids",
            _length(request.stop_token_ids),
            self.max_stop_token_ids,
            "max_stop_token_ids",
        )
        _bound(
            "logit_bias",
            "logit_bias entries",
            _length(request.logit_bias),
            self.max_logit_bias_entries,
            "max_logit_bias_entries",
        )


def _length(items: Sized | None) -> int:
    return 0 if items is None else len(items)


def _bound(param: str, what: str, count: int, limit: int, name: str) -> None:
    if count > limit:
        raise InvalidRequestError(
            f"The request has {count} {what}, more than this server's limit of {limit} "
            f"(--{name.replace('_', '-')}).",
            param=param,
        )


def declaring_json(scope: Scope) -> Scope:
    """`scope` with its body declared JSON (Content-Type), whatever the client sent: for the routes whose
    API reads any body as JSON (Ollama's, SageMaker's /invocations)."""
    headers = [(name, value) for name, value in scope["headers"] if name != b"content-type"]
    return {**scope, "headers": [*headers, (b"content-type", b"application/json")]}


class BodySizeLimitMiddleware:
    """413 for a request body over `max_bytes`, declared (Content-Length) or streamed (chunked), before
    any of it is parsed. The body is read here and handed on whole; later receive() calls (a disconnect)
    pass through."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(scope, receive, send)
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending its body: nobody to answer
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
        body: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay() -> Message:
            return body.pop() if body else await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            f"The request body is larger than this server's limit of {self.max_bytes} "
            "bytes (--max-request-body-bytes).",
            413,
            param="body",
            path=scope["path"],
        )
        await response(scope, receive, send)

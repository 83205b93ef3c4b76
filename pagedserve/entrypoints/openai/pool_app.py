"""The API of a model pool (--models-dir, --model NAME=PATH): each request goes to the app of the model it
names (its JSON body's `model`, else the `model` query parameter, as for GET /is_sleeping?model=NAME), loading it first
if need be; its `keep_alive` (Ollama's durations) sets how long the model stays loaded afterwards. The
routes about the pool itself (GET /v1/models, Ollama's GET /api/ps, /api/pull and its model management,
/version) are answered without loading anything."""

import json
from datetime import UTC, datetime
from urllib.parse import parse_qs

from fastapi import FastAPI
from starlette.types import Message, Receive, Scope, Send

from pagedserve import __version__
from pagedserve.entrypoints.durations import parse_duration
from pagedserve.entrypoints.openai.auth import METRICS_PATH, PROBE_PATHS
from pagedserve.entrypoints.openai.errors import ERROR_RESPONSES, exception_response, register_error_handlers
from pagedserve.entrypoints.openai.model_pool import LoadedModel, ModelPool, ResidentModel
from pagedserve.entrypoints.openai.models_dir import ModelFile
from pagedserve.entrypoints.openai.ollama_models import tag_entry
from pagedserve.entrypoints.openai.ollama_routes import add_model_management_routes
from pagedserve.entrypoints.openai.protocol_models import ModelCard, ModelList
from pagedserve.errors import InvalidRequestError, PagedServeError


def build_pool_info_app(pool: ModelPool) -> FastAPI:
    """The routes about the pool: every model it serves, loaded or not."""
    app = FastAPI(title="pagedserve", version=__version__)
    register_error_handlers(app)

    def card(name: str) -> ModelCard:
        model = pool.model_file(name)
        loaded = pool.loaded(name)
        max_model_len = None if loaded is None else loaded.engine.config.model.max_model_len
        return ModelCard(id=name, root=model.path, created=int(model.modified), max_model_len=max_model_len)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get("/v1/models")
    async def list_models() -> ModelList:
        return ModelList(data=[card(name) for name in pool.models])

    @app.get("/v1/models/{model:path}", responses=ERROR_RESPONSES)
    async def retrieve_model(model: str) -> ModelCard:
        return card(model)

    @app.get("/api/tags")
    async def tags() -> dict[str, list[dict[str, object]]]:
        """Ollama's /api/tags: every model of the pool, loaded or not."""
        return {"models": [_tag(pool.model_file(name)) for name in pool.models]}

    add_model_management_routes(app, pool.model_file)  # NOTE: answered without loading anything

    @app.get("/api/ps")
    async def running_models() -> dict[str, list[dict[str, object]]]:
        """Ollama's /api/ps: the models loaded (or loading) and when each unloads (null: not while it
        serves, nor with keep_alive -1)."""
        return {"models": [_ps_entry(model) for model in pool.resident()]}

    return app


def _tag(model: ModelFile) -> dict[str, object]:
    gguf = model.path.endswith(".gguf")
    return tag_entry(model.name, model.path, {"format": "gguf" if gguf else "safetensors"})


def _ps_entry(model: ResidentModel) -> dict[str, object]:
    expires = None if model.expires_at is None else datetime.fromtimestamp(model.expires_at, UTC).isoformat()
    return {"name": model.name, "model": model.name, "size": model.size_bytes, "expires_at": expires}


class PoolApp:
    """The ASGI app in front of the models' apps, mounted under the pool's routes. Runs behind the
    body-size limit, which hands the body on whole (request_bounds.BodySizeLimitMiddleware), and behind
    the API key: nothing loads for a request without it."""

    def __init__(self, pool: ModelPool) -> None:
        self.pool = pool

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        message = await receive()
        try:
            name, keep_alive_s = _model_of(scope, message.get("body", b""))
            if path in PROBE_PATHS | {METRICS_PATH}:  # NOTE: open without the key: they never load a model
                await self._loaded(name).app(scope, _replay(message, receive), send)
                return
            async with self.pool.use(name, keep_alive_s) as model:
                await model.app(scope, _replay(message, receive), send)
        except PagedServeError as exc:
            await exception_response(exc, path)(scope, receive, send)

    def _loaded(self, name: str) -> LoadedModel:
        loaded = self.pool.loaded(self.pool.model_file(name).name)
        if loaded is None:
            raise InvalidRequestError(
                f"The model `{name}` is not loaded now: its metrics come with it (GET /v1/models lists them).",
                param="model",
                status_code=404,
            )
        return loaded


def _model_of(scope: Scope, body: bytes) -> tuple[str, float | None]:
    """The model a request names, and its keep_alive in seconds (None: not given). Raises
    InvalidRequestError naming the field."""
    fields = _json_object(body)
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    name = fields.get("model", query.get("model", [None])[0])
    if name is None:
        raise InvalidRequestError(
            "`model` is required: this server serves several models; name one in the "
            "body's `model` (or the `model` query parameter). GET /v1/models lists them.",
            param="model",
        )
    if not isinstance(name, str):
        raise InvalidRequestError(f"`model` must be a string, not {type(name).__name__}.", param="model")
    keep_alive = fields.get("keep_alive")
    return name, None if keep_alive is None else parse_duration(keep_alive, "keep_alive")


def _json_object(body: bytes) -> dict[str, object]:
    """The body's fields when it is a JSON object (the model's own app reports any other body)."""
    try:
        fields = json.loads(body) if body else {}
    except (ValueError, RecursionError):
        return {}
    return fields if isinstance(fields, dict) else {}


def _replay(message: Message, receive: Receive) -> Receive:
    """`receive` with the body message already read put back first."""
    pending = [message]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed

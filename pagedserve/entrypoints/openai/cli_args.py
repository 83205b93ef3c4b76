"""The server's flags: EngineArgs' (one source of truth for the engine) plus ServerArgs', both generated
from their dataclasses, with vLLM's names, so `pagedserve serve` and
`python -m pagedserve.entrypoints.openai.api_server` accept the same command lines."""

import argparse
import json
from dataclasses import dataclass, replace
from typing import Literal

from pagedserve import envs
from pagedserve.config import EngineArgs, add_dataclass_cli_args, config_field, dataclass_from_cli_args
from pagedserve.engine.admission import ServingLimits
from pagedserve.entrypoints.chat_utils import ContentFormat
from pagedserve.entrypoints.durations import parse_duration
from pagedserve.entrypoints.openai.request_bounds import RequestBounds
from pagedserve.entrypoints.openai.residency import ResidencyLimits
from pagedserve.entrypoints.openai.tool_parsers import TOOL_PARSERS, ToolCallParserName
from pagedserve.errors import ConfigError, InvalidRequestError
from pagedserve.utils import parse_bytes

UvicornLogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]


@dataclass(frozen=True)
class ServerArgs:
    """HTTP-side settings (the engine's are EngineArgs)."""

    host: str = config_field("0.0.0.0", "Address to listen on.")
    port: int = config_field(8000, "Port to listen on.")
    api_key: str | None = config_field(
        None,
        "Require this key (`Authorization: Bearer KEY`) on every route but /health, /ready, /version "
        "and /metrics. Precedence: this flag, then the PAGEDSERVE_API_KEY environment variable, then "
        "vLLM's VLLM_API_KEY; none set: no key.",
    )
    metrics_require_api_key: bool = config_field(
        False, "With an API key, require it on /metrics too (open by default, as in vLLM, for scrapers)."
    )
    chat_template: str | None = config_field(
        None,
        "Chat template for /v1/chat/completions: a file, or the Jinja template itself. Default: the "
        "tokenizer's.",
    )
    chat_template_content_format: ContentFormat = config_field(
        "auto",
        "How a message's content reaches the chat template: string (text parts joined), openai (a list "
        "of {'type': 'text', 'text': ...} parts), auto (openai when the template loops over a message's "
        "content, else string).",
    )
    disable_log_stats: bool = config_field(
        False, "Do not log the periodic stats line (throughput, queue, KV-cache usage)."
    )
    disable_log_requests: bool = config_field(False, "Do not log each request as it is added or aborted.")
    enable_log_requests: bool = config_field(
        False,
        "vLLM's flag: log each request (id, prompt length, sampling params) at INFO as it is added or "
        "aborted. That is the default here; --disable-log-requests turns it off.",
    )
    enable_prompt_tokens_details: bool = config_field(
        False,
        "vLLM's flag: report usage.prompt_tokens_details.cached_tokens (the prompt tokens found in the "
        "prefix cache). Always reported here, as OpenAI does.",
    )
    allowed_origins: str | None = config_field(
        None,
        "CORS: the browser origins allowed to call the API, a JSON list as in vLLM ('[\"*\"]' for any, "
        "'[\"https://app.example\"]'). Default: no CORS headers (browsers on other origins are refused).",
    )
    uvicorn_log_level: UvicornLogLevel = config_field(
        "info", "Log level of uvicorn (HTTP access log included)."
    )
    shutdown_timeout: float = config_field(
        30.0,
        "Seconds the requests in flight get to finish after SIGTERM (new ones get 503 meanwhile); the "
        "rest are then aborted with an error and the server exits 0.",
    )

    enable_auto_tool_choice: bool = config_field(
        False, 'Let requests use tool_choice "auto": --tool-call-parser then reads the calls in the text.'
    )
    tool_call_parser: ToolCallParserName | None = config_field(
        None, "How tool calls are written in this model's output (with --enable-auto-tool-choice)."
    )

    max_stored_responses: int = config_field(
        1000,
        "Most responses the Responses API keeps (store, for previous_response_id and GET "
        "/v1/responses/{id}); the least recently used are dropped first.",
    )
    max_stored_response_bytes: int = config_field(
        256 * 2**20,
        "Most bytes (their JSON) the stored responses may take together; the least recently used are "
        "dropped first.",
    )

    lora_modules: str | list[str] | None = config_field(
        None,
        "LoRA adapters to serve (with --enable-lora), each name=path or vLLM's JSON form "
        '\'{"name": "a", "path": "/adapters/a", "base_model_name": "base"}\'; a request picks one by its '
        "`model`.",
    )

    enable_sleep_mode: bool = config_field(
        False,
        "Serve POST /sleep, POST /wake_up and GET /is_sleeping (vLLM's flag): a client with the API key "
        "may then free the model's memory for everyone, so they are off unless asked for.",
    )
    wake_on_request: bool = config_field(
        False,
        "A request that arrives while the model sleeps (POST /sleep) wakes it; without this flag it gets "
        "503 naming POST /wake_up.",
    )
    models_dir: str | None = config_field(
        None,
        "Serve every GGUF file (name.gguf) and HF folder in this directory under its name, each loaded "
        "in its own engine process when first asked for and unloaded when idle (--keep-alive, "
        "--max-loaded-models, --max-loaded-memory). The engine flags apply to each. --model NAME=PATH "
        "(repeatable) adds models by name, with or without this flag.",
    )
    max_loaded_models: int = config_field(
        3, "With --models-dir: most models loaded at once (0: no limit); the least recently used idle goes."
    )
    max_loaded_memory: str | None = config_field(
        None,
        "With --models-dir: most bytes the loaded models hold at once, e.g. '8GiB' (default: no limit): "
        "each its weights (their files' size), its KV cache (--kv-cache-memory; on CPU by default 4 GiB) "
        "and its --swap-space; the least recently used idle models go first.",
    )
    # --model NAME=PATH, repeated (parsed by --model's flag: config.cli.NamedValues); () when none.
    named_models: tuple[str, ...] = ()
    keep_alive: str = config_field(
        "5m",
        "With --models-dir: how long a model stays loaded after its last request, in Ollama's durations "
        "('5m', '1h30m', '300' seconds, 0: unload at once, -1: forever); a request's `keep_alive` "
        "overrides it for its model.",
    )

    def __post_init__(self) -> None:
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ConfigError(
                f"--enable-auto-tool-choice needs --tool-call-parser (one of {', '.join(TOOL_PARSERS)})."
            )
        if self.enable_log_requests and self.disable_log_requests:
            raise ConfigError("--enable-log-requests and --disable-log-requests contradict: give one.")
        self.cors_origins()  # NOTE: a bad value fails at startup, not on the first request
        self.residency_limits()
        self.keep_alive_s()
        for name in ("max_stored_responses", "max_stored_response_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}."
                )

    @property
    def log_requests(self) -> bool:
        return not self.disable_log_requests

    def cors_origins(self) -> list[str]:
        """--allowed-origins as a list (empty: no CORS). Raises ConfigError for anything but a JSON list
        of strings."""
        if self.allowed_origins is None:
            return []
        try:
            origins = json.loads(self.allowed_origins)
        except json.JSONDecodeError:
            origins = None
        if not isinstance(origins, list) or not all(isinstance(o, str) for o in origins):
            raise ConfigError(
                f"--allowed-origins {self.allowed_origins!r} must be a JSON list of origins, e.g. "
                "'[\"https://app.example\"]' or '[\"*\"]'."
            )
        return origins

    @property
    def auto_tool_parser(self) -> str | None:
        """The parser for tool_choice "auto", None when it is not enabled."""
        return self.tool_call_parser if self.enable_auto_tool_choice else None

    def residency_limits(self) -> ResidencyLimits:
        """--max-loaded-models and --max-loaded-memory. Raises ConfigError naming the flag."""
        if self.max_loaded_models < 0:
            raise ConfigError(
                f"--max-loaded-models must be 0 (no limit) or more, got {self.max_loaded_models}."
            )
        budget = (
            0
            if self.max_loaded_memory is None
            else parse_bytes(self.max_loaded_memory, "--max-loaded-memory")
        )
        if self.max_loaded_memory is not None and budget <= 0:
            raise ConfigError(f"--max-loaded-memory must be positive, got {self.max_loaded_memory!r}.")
        return ResidencyLimits(self.max_loaded_models, budget)

    def keep_alive_s(self) -> float:
        """--keep-alive in seconds (math.inf: forever). Raises ConfigError."""
        try:
            return parse_duration(self.keep_alive, "--keep-alive")
        except InvalidRequestError as exc:
            raise ConfigError(str(exc)) from None

    def resolved_api_key(self) -> str | None:
        return self.api_key or envs.api_key()


def make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add every engine, server, serving-limit and request-bound flag to `parser`."""
    EngineArgs.add_cli_args(parser)
    for settings in (ServerArgs, ServingLimits, RequestBounds):
        add_dataclass_cli_args(settings, parser)
    return parser


def args_from_namespace(
    args: argparse.Namespace,
) -> tuple[EngineArgs, ServerArgs, ServingLimits, RequestBounds]:
    """The parsed flags as settings. Raises ConfigError for an out-of-range limit."""
    server_args = dataclass_from_cli_args(ServerArgs, args)
    return (
        EngineArgs.from_cli_args(args),
        replace(server_args, named_models=tuple(getattr(args, "model_by_name", None) or ())),
        dataclass_from_cli_args(ServingLimits, args),
        dataclass_from_cli_args(RequestBounds, args),
    )

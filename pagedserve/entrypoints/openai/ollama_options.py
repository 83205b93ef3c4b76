"""Ollama's `options`, `format` and `think` as the OpenAI request's fields: the sampler's options mapped
onto their names, the runner's named in one warning, sampling methods pagedserve lacks refused (400
naming the option). NAMES turns the OpenAI fields back into Ollama's in error messages."""

from pagedserve.entrypoints.openai.chat_translation import defined
from pagedserve.entrypoints.openai.protocol_ollama import OllamaGenerationRequest, OllamaOptions
from pagedserve.errors import InvalidRequestError
from pagedserve.logger import init_logger

logger = init_logger(__name__)

# OpenAI request field -> Ollama's (errors from the chat / completion path name what the client sent).
NAMES = {
    "max_tokens": "options.num_predict",
    "max_completion_tokens": "options.num_predict",
    "temperature": "options.temperature",
    "top_k": "options.top_k",
    "top_p": "options.top_p",
    "min_p": "options.min_p",
    "seed": "options.seed",
    "stop": "options.stop",
    "repetition_penalty": "options.repeat_penalty",
    "presence_penalty": "options.presence_penalty",
    "frequency_penalty": "options.frequency_penalty",
    "response_format": "format",
    "chat_template_kwargs": "think",
}
# Options pagedserve does not have: the one value that leaves each off, and why others are refused.
_REFUSED = {
    "mirostat": (0, "pagedserve has no Mirostat sampling"),
    "tfs_z": (1.0, "pagedserve has no tail-free sampling"),
    "typical_p": (1.0, "pagedserve has no typical sampling"),
    "repeat_last_n": (-1, "pagedserve's penalties count the whole context"),
}
_MAPPED = {
    "num_predict",
    "num_ctx",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "seed",
    "stop",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
}
# Distinct sets of ignored options warned about; a client sending ever new sets cannot flood the log.
MAX_WARNINGS = 64
_warned: set[frozenset[str]] = set()


def sampling_fields(options: OllamaOptions | None) -> dict[str, object]:
    """The OpenAI request fields of `options` (None values left out). Raises InvalidRequestError naming
    an option that turns on a sampling method pagedserve lacks."""
    if options is None:
        return {}
    given = options.model_fields_set
    for name, (off, reason) in _REFUSED.items():
        value = getattr(options, name)
        if value is not None and value != off:
            raise InvalidRequestError(
                f"options.{name}={value} is not supported: {reason}; send {off} or leave it out.",
                param=f"options.{name}",
            )
    ignored = sorted(name for name in given - _MAPPED - _REFUSED.keys() if getattr(options, name) is not None)
    if ignored and len(_warned) < MAX_WARNINGS and frozenset(ignored) not in _warned:
        _warned.add(frozenset(ignored))
        logger.warning(
            "Ignoring the Ollama options %s: they have no meaning here (the server's flags decide).",
            ", ".join(ignored),
        )
    num_predict = options.num_predict
    return defined(
        {
            "max_tokens": num_predict if num_predict is not None and num_predict > 0 else None,
            "temperature": options.temperature,
            "top_k": options.top_k,
            "top_p": options.top_p,
            "min_p": options.min_p,
            "seed": options.seed if options.seed is not None and options.seed >= 0 else None,
            "stop": options.stop,
            "repetition_penalty": options.repeat_penalty,
            "presence_penalty": options.presence_penalty,
            "frequency_penalty": options.frequency_penalty,
        }
    )


def output_fields(request: OllamaGenerationRequest) -> dict[str, object]:
    """`format` as response_format. Raises InvalidRequestError naming a field the API leaves out."""
    if request.logprobs or request.top_logprobs is not None:
        raise InvalidRequestError(
            "logprobs are not supported on the Ollama API: use /v1/chat/completions.", param="logprobs"
        )
    if request.format == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(request.format, dict):
        return {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "format", "schema": request.format},
            }
        }
    return {}


def thinking_switch(request: OllamaGenerationRequest, thinks: bool) -> dict[str, object]:
    """`think` as the template's enable_thinking. `thinks`: the server runs a reasoning parser. Raises
    InvalidRequestError naming the field."""
    if isinstance(request.think, str):
        raise InvalidRequestError(
            f'think="{request.think}": thinking levels are not supported; send true or false.', param="think"
        )
    if request.think and not thinks:
        raise InvalidRequestError(
            "think: this server does not split the model's thinking; start it with --reasoning-parser "
            "(for a model that thinks), or leave think out.",
            param="think",
        )
    return {} if request.think is None else {"enable_thinking": request.think}


def context_bound(num_ctx: int | None, num_prompt_tokens: int, max_tokens: int | None) -> int | None:
    """max_tokens under options.num_ctx (the prompt and the answer within it). Raises InvalidRequestError
    when the prompt alone fills it."""
    if num_ctx is None:
        return max_tokens
    if num_prompt_tokens >= num_ctx:
        raise InvalidRequestError(
            f"The prompt has {num_prompt_tokens} tokens, options.num_ctx={num_ctx} leaves no room for an "
            "answer: raise options.num_ctx or shorten the prompt.",
            param="options.num_ctx",
        )
    rest = num_ctx - num_prompt_tokens
    return rest if max_tokens is None else min(max_tokens, rest)

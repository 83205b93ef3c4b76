"""The base of the API's bodies, and what happens to a field they do not declare: a response or nested
model forbids it; a request ignores it with a warning, once per field name, as vLLM does, except the fields
vLLM has but pagedserve does not implement (UNSUPPORTED_FIELDS), which are errors (400 naming the field),
never silently dropped."""

from pydantic import BaseModel, ConfigDict, model_validator

from pagedserve.logger import init_logger

logger = init_logger(__name__)

# vLLM's request fields that pagedserve does not implement: ignoring them would change the result
# silently, so they are refused (400 naming the field).
UNSUPPORTED_FIELDS = frozenset(
    {
        "bad_words",
        "allowed_token_ids",
        "logits_processors",
        "prompt_embeds",
        "mm_processor_kwargs",
        "kv_transfer_params",
        "vllm_xargs",
        "functions",
        "function_call",
    }
)
# How many distinct ignored field names get their warning; a client sending ever new names cannot
# grow the set (or the log) without bound.
MAX_WARNED_FIELDS = 256
_warned_fields: set[str] = set()


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OpenAIRequestModel(OpenAIBaseModel):
    """A request body (or a part of one): unknown fields are dropped before validation, with a warning
    once per name; UNSUPPORTED_FIELDS stay and fail as extra fields (400 naming the field)."""

    @model_validator(mode="before")
    @classmethod
    def _drop_unknown_fields(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        unknown = [k for k in data if k not in cls.model_fields and k not in UNSUPPORTED_FIELDS]
        if not unknown:
            return data
        for name in unknown:
            _warn_ignored(cls.__name__, str(name))
        return {k: v for k, v in data.items() if k not in unknown}


def _warn_ignored(model: str, name: str) -> None:
    key = f"{model}.{name[:100]}"
    if key in _warned_fields or len(_warned_fields) >= MAX_WARNED_FIELDS:
        return
    _warned_fields.add(key)
    logger.warning(
        "Ignoring the request field %r of %s: pagedserve does not use it (logged once per field%s).",
        name[:100],
        model,
        "; no further ignored fields are logged" if len(_warned_fields) == MAX_WARNED_FIELDS else "",
    )

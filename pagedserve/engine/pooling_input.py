"""Prompt + PoolingOptions -> a validated EngineCoreRequest for the pooling runner (--runner pooling):
the task the model serves, Matryoshka `dimensions`, truncation, the model's prompt prefixes, the
context length; and a cross-encoder's (query, document) pair tokenized as its tokenizer pairs them."""

import time
from dataclasses import dataclass

from pagedserve.config.pooling import PoolingModelConfig
from pagedserve.engine.input_processor import InputProcessor, PromptType
from pagedserve.engine.tokenizer import AnyTokenizer
from pagedserve.errors import InvalidRequestError
from pagedserve.protocol import EngineCoreRequest, PoolingParams
from pagedserve.sampling_params import RequestOutputKind, SamplingParams

# A pooling request's sampling parameters: a placeholder (nothing is sampled), final output only.
POOLING_SAMPLING_PARAMS = SamplingParams(max_tokens=1, output_kind=RequestOutputKind.FINAL_ONLY)
_TASK_ENDPOINTS = {"embed": "/v1/embeddings (LLM.embed)", "classify": "/classify (LLM.classify)"}


@dataclass(frozen=True)
class PoolingOptions:
    """What a caller asks of one pooling request (vLLM's names). `task`: embed, classify, or encode (the
    model's own task); `normalize` / `activation`: None keeps the model's pooler settings;
    `truncate_prompt_tokens`: keep the first k tokens (-1: --max-model-len), so the CLS token stays;
    `prompt_name`: one of the model's sentence-transformers prompts, put before a text prompt;
    `token_type_start`: where a pair's second segment starts (set by `tokenize_pair`)."""

    task: str = "encode"
    dimensions: int | None = None
    normalize: bool | None = None
    activation: bool | None = None
    truncate_prompt_tokens: int | None = None
    prompt_name: str | None = None
    token_type_start: int | None = None


def _switch(name: str, value: object, default: bool) -> bool:
    """An on/off option: a bool, or None for the model's pooler setting (`default`); anything else (a
    string "yes", a 1) is refused, naming the option, rather than read as true."""
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequestError(f"{name} must be true or false, got {value!r}.", param=name)
    return value


def tokenize_pair(tokenizer: AnyTokenizer, query: str, document: str) -> tuple[list[int], int | None]:
    """A cross-encoder's input: the tokenizer's own pair encoding, and where the second segment's token
    types start (None when the tokenizer has no token types, e.g. RoBERTa)."""
    encoded = tokenizer(query, document)
    types = encoded.get("token_type_ids")
    start = next((i for i, t in enumerate(types) if t == 1), None) if types else None
    return list(encoded["input_ids"]), start


class PoolingInputProcessor:
    """Validates pooling requests against the model (`pooling`) and the context length, reusing the
    generation processor's tokenization."""

    def __init__(self, inputs: InputProcessor, pooling: PoolingModelConfig) -> None:
        self.inputs = inputs
        self.pooling = pooling

    def process(
        self, request_id: str, prompt: PromptType, options: PoolingOptions, arrival_time: float | None = None
    ) -> tuple[str | None, EngineCoreRequest]:
        """Raises InvalidRequestError saying what was wrong, the limit and the field to change."""
        task = self._task(options.task)
        text, token_ids = self.inputs.tokenize(self._with_prompt_prefix(prompt, options.prompt_name))
        keep = self._keep(options.truncate_prompt_tokens)
        if keep is not None and len(token_ids) > keep:
            # NOTE: a text is cut by its tokenizer (BERT's [SEP] stays, as sentence-transformers cuts);
            # token ids are kept as given, the first `keep`.
            token_ids = (
                self.inputs.tokenizer.encode(text, truncation=True, max_length=keep)
                if text is not None and (isinstance(prompt, str) or "prompt_token_ids" not in prompt)
                else token_ids[:keep]
            )
        self._check_tokens(token_ids)
        pooler = self.pooling.pooler
        params = PoolingParams(
            task,
            self._dimensions(options.dimensions) if task == "embed" else None,
            _switch("normalize", options.normalize, pooler.normalize),
            _switch("activation", options.activation, pooler.activation),
            options.token_type_start,
        )
        return text, EngineCoreRequest(
            request_id,
            token_ids,
            POOLING_SAMPLING_PARAMS,
            None,
            arrival_time or time.time(),
            pooling_params=params,
        )

    def _task(self, task: str) -> str:
        served = self.pooling.task
        if task not in ("encode", "embed", "classify"):
            raise InvalidRequestError(
                f"Unknown pooling task {task!r}: use embed, classify or encode.", param="task"
            )
        if task not in ("encode", served):
            raise InvalidRequestError(
                f"This model serves the {served} task, not {task}: use {_TASK_ENDPOINTS[served]}, or serve a "
                f"{'cross-encoder (a *ForSequenceClassification model)' if task == 'classify' else 'embedding model'}"
                " for it.",
                param="model",
            )
        return served

    def _with_prompt_prefix(self, prompt: PromptType, prompt_name: str | None) -> PromptType:
        """A text with the named prompt's text before it, as sentence-transformers puts it (the model's
        default_prompt_name when none is asked for); token ids as given."""
        name = self.pooling.default_prompt_name if prompt_name is None else prompt_name
        if name is None:
            return prompt
        if not isinstance(name, str) or name not in self.pooling.prompts:
            known = ", ".join(map(repr, sorted(self.pooling.prompts))) or "none"
            raise InvalidRequestError(
                f"prompt_name {name!r} is not one of the model's prompts ({known}; "
                "config_sentence_transformers.json): use one of them, or drop prompt_name.",
                param="prompt_name",
            )
        prefix = self.pooling.prompts[name]
        if isinstance(prompt, str):
            return prefix + prompt
        if (
            isinstance(prompt, dict)
            and isinstance(prompt.get("prompt"), str)
            and "prompt_token_ids" not in prompt
        ):
            return {**prompt, "prompt": prefix + prompt["prompt"]}
        if prompt_name is not None:
            raise InvalidRequestError(
                "prompt_name puts a text before a text input, and this input is token ids: send text, or "
                "put the prompt's tokens in yourself and drop prompt_name.",
                param="prompt_name",
            )
        return prompt

    def _keep(self, keep: int | None) -> int | None:
        """truncate_prompt_tokens as a token count (-1: the context length), validated."""
        max_len = self.inputs.model_config.max_model_len
        if keep is None:
            return None
        if isinstance(keep, bool) or not isinstance(keep, int) or not (keep == -1 or 1 <= keep <= max_len):
            raise InvalidRequestError(
                f"truncate_prompt_tokens must be -1 (the model's {max_len} tokens) or an integer from 1 to "
                f"{max_len} (--max-model-len), got {keep!r}.",
                param="truncate_prompt_tokens",
            )
        return max_len if keep == -1 else keep

    def _check_tokens(self, token_ids: list[int]) -> None:
        max_len, vocab = self.inputs.model_config.max_model_len, self.inputs.model_config.vocab_size
        if not token_ids:
            raise InvalidRequestError("The input is empty: it must have at least one token.", param="input")
        if len(token_ids) > max_len:
            raise InvalidRequestError(
                f"This model's maximum context length is {max_len} tokens, but the input has {len(token_ids)} "
                "tokens. Shorten it, or set truncate_prompt_tokens (at most the context length) to keep its "
                "first tokens; the server's limit is --max-model-len.",
                param="input",
            )
        bad = next((t for t in token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequestError(
                f"Token id {bad} is out of vocabulary (valid ids: 0 to {vocab - 1}).", param="input"
            )

    def _dimensions(self, dimensions: int | None) -> int | None:
        if dimensions is None:
            return None
        hidden, allowed = self.pooling.hidden_size, self.pooling.matryoshka_dimensions
        if isinstance(dimensions, bool) or not isinstance(dimensions, int):
            raise InvalidRequestError(
                f"dimensions must be an integer, got {dimensions!r}.", param="dimensions"
            )
        if allowed is None:
            raise InvalidRequestError(
                "This model does not support dimensions: it declares no Matryoshka training "
                "(matryoshka_dimensions or is_matryoshka in config.json), and a truncated embedding of it "
                "would lose quality. Drop dimensions.",
                param="dimensions",
            )
        if not 1 <= dimensions <= hidden or (allowed and dimensions not in allowed):
            choices = ", ".join(map(str, allowed)) if allowed else f"1 to {hidden}"
            raise InvalidRequestError(
                f"dimensions={dimensions} is not supported by this model: use one of {choices}.",
                param="dimensions",
            )
        return dimensions

"""Prompt + SamplingParams -> a validated EngineCoreRequest. Nothing invalid reaches the engine."""
import time
from dataclasses import replace
from typing import Any

import msgspec

from pagedserve.config import ModelConfig
from pagedserve.errors import InvalidRequestError
from pagedserve.protocol import EngineCoreRequest
from pagedserve.sampling_params import SamplingParams

# A prompt: text, token ids, or {"prompt": text} / {"prompt_token_ids": ids}.
PromptType = str | list[int] | dict[str, Any]


class InputProcessor:
    def __init__(self, model_config: ModelConfig, tokenizer: Any) -> None:
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id

    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """Returns (prompt text or None, prompt token ids)."""
        if isinstance(prompt, dict):
            unknown = set(prompt) - {"prompt", "prompt_token_ids"}
            if unknown:
                raise InvalidRequestError(f"Unknown prompt field(s) {sorted(unknown)}; use 'prompt' or "
                                          "'prompt_token_ids'.", param="prompt")
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            prompt = prompt.get("prompt", "")
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return None, list(prompt)
        raise InvalidRequestError("prompt must be a string, a list of token ids, or a dict with 'prompt' "
                                  "or 'prompt_token_ids'.", param="prompt")

    def process(self, request_id: str, prompt: PromptType, params: SamplingParams,
                arrival_time: float | None = None) -> tuple[str | None, EngineCoreRequest]:
        """Validate and resolve: truncation, max_tokens (None = the rest of the context), limits."""
        text, token_ids = self.tokenize(prompt)
        if params.truncate_prompt_tokens is not None:
            token_ids = token_ids[-params.truncate_prompt_tokens:]
        self._validate(token_ids, params)
        max_model_len = self.model_config.max_model_len
        max_tokens = params.max_tokens if params.max_tokens is not None else max_model_len - len(token_ids)
        if len(token_ids) + max_tokens > max_model_len:
            raise InvalidRequestError(
                f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"{len(token_ids) + max_tokens} tokens ({len(token_ids)} in the messages, {max_tokens} in "
                "the completion). Please reduce the length of the messages or completion.",
                param="max_tokens")
        return text, EngineCoreRequest(request_id, token_ids, replace(params, max_tokens=max_tokens),
                                       self.eos_token_id, arrival_time or time.time())

    def _validate(self, token_ids: list[int], params: SamplingParams) -> None:
        max_model_len, vocab = self.model_config.max_model_len, self.model_config.vocab_size
        if not token_ids:
            raise InvalidRequestError("The prompt is empty: it must have at least one token.", param="prompt")
        if len(token_ids) >= max_model_len:
            raise InvalidRequestError(
                f"This model's maximum context length is {max_model_len} tokens. However, your prompt has "
                f"{len(token_ids)} tokens, which leaves no room for output. Shorten the prompt or set "
                "truncate_prompt_tokens.", param="prompt")
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(f"Token id {bad[0]} is out of vocabulary (valid ids: 0 to {vocab - 1}).",
                                      param="prompt")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > self.model_config.max_logprobs:
                raise InvalidRequestError(f"{name}={value} exceeds the server's limit of "
                                          f"{self.model_config.max_logprobs} (--max-logprobs).", param=name)
        for token in list(params.logit_bias or {}) + list(params.stop_token_ids):
            if not 0 <= token < vocab:
                raise InvalidRequestError(f"Token id {token} in logit_bias or stop_token_ids is out of "
                                          f"vocabulary (valid ids: 0 to {vocab - 1}).", param="logit_bias")


def split_samples(request: EngineCoreRequest, child_ids: list[str]) -> list[EngineCoreRequest]:
    """One engine-core request per sample (`child_ids` from OutputProcessor.add_request). Sample i of a
    seeded request samples with seed + i: the samples differ, and the request stays reproducible."""
    params = request.sampling_params
    children = []
    for index, child_id in enumerate(child_ids):
        child_params = params
        if params.seed is not None and len(child_ids) > 1:
            child_params = replace(params, seed=params.seed + index)
        children.append(msgspec.structs.replace(request, request_id=child_id, sampling_params=child_params))
    return children

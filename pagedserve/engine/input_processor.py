"""Prompt + RequestOptions -> a validated EngineCoreRequest. Nothing invalid reaches the engine."""

import time
from dataclasses import dataclass, replace
from typing import Any, Required, TypedDict

import msgspec

from pagedserve.config import ModelConfig
from pagedserve.config.kv_layout import KVCacheLayout
from pagedserve.config.lora import LoRAConfig
from pagedserve.config.reasoning import ReasoningConfig
from pagedserve.engine.image_inputs import ImagePromptProcessor
from pagedserve.engine.lora_validation import LoRAValidator
from pagedserve.engine.request_options import RequestOptions
from pagedserve.engine.structured_validation import StructuredOutputValidator
from pagedserve.engine.tokenizer import AnyTokenizer
from pagedserve.errors import InvalidRequestError
from pagedserve.protocol import EngineCoreRequest, ImageInput
from pagedserve.sampling_params import (
    BeamSearchParams,
    SamplingParams,
    check_beam_search_fields,
    wrap_int64,
)


class TextPrompt(TypedDict, total=False):
    """vLLM's text prompt. `multi_modal_data`, for an image model: {"image": one image or a list} (PIL
    images, or data:, http(s):// or file:// URLs); `cache_salt`: prefix-cache hits only within its salt."""

    prompt: Required[str]
    multi_modal_data: dict[str, object]
    cache_salt: str


class TokensPrompt(TypedDict, total=False):
    """vLLM's prompt of token ids (`prompt`: their text, if the caller has it)."""

    prompt_token_ids: Required[list[int]]
    prompt: str
    multi_modal_data: dict[str, object]
    cache_salt: str


# A prompt: text, token ids, or a dict of TextPrompt's or TokensPrompt's keys.
PromptType = str | list[int] | dict[str, Any]


@dataclass(frozen=True)
class EngineLimits:
    """What the started engine can hold, for the checks that depend on it (beam search)."""

    max_num_seqs: int
    num_kv_blocks: int  # usable
    layout: KVCacheLayout


class InputProcessor:
    """`limits`: set once the engine is started (None skips the capacity checks); `scheduling_policy`:
    --scheduling-policy (a request's `priority` means something under "priority" only)."""

    def __init__(
        self,
        model_config: ModelConfig,
        tokenizer: AnyTokenizer,
        limits: EngineLimits | None = None,
        scheduling_policy: str = "fcfs",
        lora: LoRAConfig | None = None,
        reasoning: ReasoningConfig | None = None,
    ) -> None:
        self.model_config = model_config
        self.reasoning = reasoning
        self.scheduling_policy = scheduling_policy
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.limits = limits
        self.structured_outputs = StructuredOutputValidator(tokenizer, model_config.vocab_size)
        self.lora = LoRAValidator(lora, model_config.hf_config)
        multimodal = model_config.multimodal
        self.images = (
            None if multimodal is None else ImagePromptProcessor(model_config.processor_folder, multimodal)
        )

    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """Returns (prompt text or None, prompt token ids). A dict prompt may also carry `cache_salt`."""
        if isinstance(prompt, dict):
            unknown = set(prompt) - {"prompt", "prompt_token_ids", "cache_salt", "multi_modal_data"}
            if unknown:
                raise InvalidRequestError(
                    f"Unknown prompt field(s) {sorted(unknown)}; use 'prompt' or "
                    "'prompt_token_ids' (and optionally 'cache_salt', 'multi_modal_data').",
                    param="prompt",
                )
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            prompt = prompt.get("prompt", "")
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return None, list(prompt)
        raise InvalidRequestError(
            "prompt must be a string, a list of token ids, or a dict with 'prompt' or 'prompt_token_ids'.",
            param="prompt",
        )

    def process(
        self,
        request_id: str,
        prompt: PromptType,
        options: RequestOptions,
    ) -> tuple[str | None, EngineCoreRequest]:
        """Validate and resolve: truncation, max_tokens (None = the rest of the context, at most the
        model's default), limits, the LoRA adapter. With a beam search, its max_tokens wins and
        `sampling_params.n` best beams come back."""
        params, beam_search = options.sampling_params, options.beam_search
        self._validate_priority(options.priority)
        lora_request = self.lora.check(options.lora_request)
        text, token_ids = self.tokenize(prompt)
        if beam_search is not None:
            params = replace(params, max_tokens=beam_search.max_tokens, ignore_eos=beam_search.ignore_eos)
        # NOTE: every check that needs no image comes first: a refused request fetches nothing.
        self.structured_outputs.validate(params, beam_search)
        self._validate_thinking_budget(params, beam_search)
        self._validate_params(params)
        if params.truncate_prompt_tokens is None:
            self._validate_prompt(token_ids)  # its images only lengthen it
        token_ids, images = self._images(prompt, token_ids)
        if params.truncate_prompt_tokens is not None:
            if images and params.truncate_prompt_tokens < len(token_ids):
                raise InvalidRequestError(
                    "truncate_prompt_tokens cannot cut a prompt with images (it could cut through one); "
                    "drop truncate_prompt_tokens or shorten the prompt.",
                    param="truncate_prompt_tokens",
                )
            token_ids = token_ids[-params.truncate_prompt_tokens :]
        self._validate_prompt(token_ids)
        max_model_len = self.model_config.max_model_len
        max_tokens = params.max_tokens
        if max_tokens is None:
            # NOTE: the model's default (generation_config.json's max_new_tokens) caps the rest of the
            # context, as in vLLM: a default the client never set never makes a request too long.
            rest = max_model_len - len(token_ids)
            max_tokens = min(rest, self.model_config.generation_defaults.get("max_tokens", rest))
        if len(token_ids) + max_tokens > max_model_len:
            raise InvalidRequestError(
                f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"{len(token_ids) + max_tokens} tokens ({len(token_ids)} in the messages, {max_tokens} in "
                "the completion). Please reduce the length of the messages or completion.",
                param="max_tokens",
            )
        if beam_search is not None:
            self._validate_beam_search(beam_search, params, len(token_ids) + max_tokens)
        return text, EngineCoreRequest(
            request_id,
            token_ids,
            replace(params, max_tokens=max_tokens),
            self.eos_token_id,
            options.arrival_time or time.time(),
            cache_salt=_cache_salt(prompt),
            beam_search=beam_search,
            priority=options.priority,
            lora_request=lora_request,
            images=images or None,
        )

    def _images(self, prompt: PromptType, token_ids: list[int]) -> tuple[list[int], list[ImageInput]]:
        """An image prompt's tokens with each placeholder expanded, and its images (none: unchanged)."""
        data = prompt.get("multi_modal_data") if isinstance(prompt, dict) else None
        if data is None:
            if self.images is None:
                return token_ids, []
            data = {}  # NOTE: an image model checks that no placeholder token stands without its image
        if not isinstance(data, dict) or set(data) - {"image"}:
            raise InvalidRequestError(
                'multi_modal_data must be {"image": an image or a list of images}; only images are supported.',
                param="multi_modal_data",
            )
        sources = data.get("image", [])
        sources = sources if isinstance(sources, (list, tuple)) else [sources]
        if self.images is None:
            if not sources:
                return token_ids, []
            raise InvalidRequestError(
                f"The model {self.model_config.served_model_name} takes no images (its architecture "
                f"{self.model_config.architecture} is text-only); send text only.",
                param="multi_modal_data",
            )
        return self.images.process(token_ids, sources, "multi_modal_data.image")

    def _validate_priority(self, priority: int) -> None:
        """A 64-bit integer; not 0 only under --scheduling-policy priority (as vLLM refuses it)."""
        if isinstance(priority, bool) or not isinstance(priority, int) or not -(2**63) <= priority < 2**63:
            raise InvalidRequestError(
                f"priority must be an integer in [-2**63, 2**63), got {priority!r}.", param="priority"
            )
        if priority != 0 and self.scheduling_policy != "priority":
            raise InvalidRequestError(
                f"Got priority {priority} but priority scheduling is not enabled: start the server with "
                "--scheduling-policy priority (scheduling_policy='priority' offline), or drop priority.",
                param="priority",
            )

    def _validate_thinking_budget(self, params: SamplingParams, beam_search: BeamSearchParams | None) -> None:
        """A budget needs the engine to see where thinking ends: a parser whose tags are tokens, and
        sampled tokens (a beam search's continuations are picked by the search)."""
        if params.thinking_token_budget is None:
            return
        if self.reasoning is None or not self.reasoning.tracks_thinking:
            why = (
                "no --reasoning-parser"
                if self.reasoning is None
                else f"{self.reasoning.parser}'s tags are text"
            )
            raise InvalidRequestError(
                f"thinking_token_budget needs a reasoning parser whose think tags are tokens ({why}): "
                "start the server with --reasoning-parser, or drop thinking_token_budget.",
                param="thinking_token_budget",
            )
        if beam_search is not None:
            raise InvalidRequestError(
                "thinking_token_budget cannot be combined with beam search: drop one of them.",
                param="thinking_token_budget",
            )

    def _validate_beam_search(self, beam: BeamSearchParams, params: SamplingParams, max_len: int) -> None:
        """Its beams run in lockstep, all at once: they must fit in a step and, at worst unshared, in
        the KV cache. Its outputs are the best beams, with their cumulative logprob but no per-token
        logprobs (stop_token_ids, min_tokens, the penalties and logit_bias it honours, core/beam_search.py),
        nor sampling knobs."""
        check_beam_search_fields(params)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(params, name) is not None:
                raise InvalidRequestError(
                    f"{name} cannot be combined with beam search: a beam keeps no per-token logprobs "
                    f"(each output carries its cumulative logprob). Drop {name} (with echo, logprobs also "
                    "asks for the prompt's) or use_beam_search.",
                    param=name,
                )
        if params.n > beam.beam_width:
            raise InvalidRequestError(
                f"n={params.n} beams were asked for, more than the beam width "
                f"{beam.beam_width}; raise best_of / beam_width or lower n.",
                param="n",
            )
        if self.limits is None:
            return
        if beam.beam_width > self.limits.max_num_seqs:
            raise InvalidRequestError(
                f"beam_width={beam.beam_width} is more than the engine runs at once "
                f"(--max-num-seqs {self.limits.max_num_seqs}).",
                param="beam_width",
            )
        need = beam.beam_width * self.limits.layout.max_blocks(max_len)
        if need > self.limits.num_kv_blocks:
            raise InvalidRequestError(
                f"A beam search of width {beam.beam_width} over {max_len} tokens may need {need} KV blocks; "
                f"the KV cache has {self.limits.num_kv_blocks}. Lower beam_width or max_tokens, or raise "
                "--kv-cache-memory (--gpu-memory-utilization on a GPU).",
                param="beam_width",
            )

    def _validate_prompt(self, token_ids: list[int]) -> None:
        max_model_len, vocab = self.model_config.max_model_len, self.model_config.vocab_size
        if not token_ids:
            raise InvalidRequestError("The prompt is empty: it must have at least one token.", param="prompt")
        if len(token_ids) >= max_model_len:
            raise InvalidRequestError(
                f"This model's maximum context length is {max_model_len} tokens. However, your prompt has "
                f"{len(token_ids)} tokens, which leaves no room for output. Shorten the prompt or set "
                "truncate_prompt_tokens.",
                param="prompt",
            )
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(
                f"Token id {bad[0]} is out of vocabulary (valid ids: 0 to {vocab - 1}).", param="prompt"
            )

    def _validate_params(self, params: SamplingParams) -> None:
        vocab = self.model_config.vocab_size
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > self.model_config.max_logprobs:
                raise InvalidRequestError(
                    f"{name}={value} exceeds the server's limit of "
                    f"{self.model_config.max_logprobs} (--max-logprobs).",
                    param=name,
                )
        for token in list(params.logit_bias or {}) + list(params.stop_token_ids or []):
            if not 0 <= token < vocab:
                raise InvalidRequestError(
                    f"Token id {token} in logit_bias or stop_token_ids is out of "
                    f"vocabulary (valid ids: 0 to {vocab - 1}).",
                    param="logit_bias",
                )


def _cache_salt(prompt: PromptType) -> str | None:
    salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise InvalidRequestError("cache_salt must be a non-empty string.", param="cache_salt")
    return salt


def split_samples(request: EngineCoreRequest, child_ids: list[str]) -> list[EngineCoreRequest]:
    """One engine-core request per sample (`child_ids` from OutputProcessor.add_request), all in one
    group (they share the prompt's KV blocks). Sample i of a seeded request samples with seed + i: the
    samples differ, and the request stays reproducible. A beam search stays one request."""
    if request.beam_search is not None:
        return [request]  # the core forks the beams; its n best come back under `child_ids`
    if len(child_ids) == 1:
        return [msgspec.structs.replace(request, request_id=child_ids[0])]
    params = request.sampling_params
    if params.best_of is not None and params.best_of > params.n and params.logprobs is None:
        params = replace(params, logprobs=0)  # NOTE: the n best are picked by cumulative logprob
    children = []
    for index, child_id in enumerate(child_ids):
        child_params = (
            params if params.seed is None else replace(params, seed=wrap_int64(params.seed + index))
        )
        children.append(
            msgspec.structs.replace(
                request, request_id=child_id, sampling_params=child_params, group_id=request.request_id
            )
        )
    return children

"""The offline API: `LLM(model).generate(prompts, sampling_params)`."""

import itertools
import time
from collections.abc import Mapping, Sequence, Sized
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from tqdm.auto import tqdm

from pagedserve.config import EngineArgs
from pagedserve.engine.input_processor import PromptType
from pagedserve.engine.llm_engine import LLMEngine
from pagedserve.engine.pooling_input import PoolingOptions, tokenize_pair
from pagedserve.engine.request_options import RequestOptions
from pagedserve.engine.sleep_control import check_sleep_level
from pagedserve.entrypoints.chat_utils import (
    ContentFormat,
    apply_chat_template,
    image_placeholder,
    normalize_messages,
    resolve_content_format,
    with_images,
)
from pagedserve.entrypoints.scoring import cosine, score_pairs
from pagedserve.errors import ConfigError, InvalidRequestError, RequestFailedError
from pagedserve.lora.request import LoRARequest
from pagedserve.outputs import (
    BeamSearchOutput,
    BeamSearchSequence,
    PoolingOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from pagedserve.sampling_params import (
    BeamSearchParams,
    RequestOutputKind,
    SamplingParams,
    beam_search_defaults,
)
from pagedserve.utils.user_json import JsonValue

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# One conversation: OpenAI's chat messages.
ChatMessages = Sequence[Mapping[str, JsonValue]]


class LLM:
    """An engine in this process. `model=None` loads the embedded default (SmolLM2-135M-Instruct);
    every other keyword is an engine argument with vLLM's name; unknown ones raise. `enable_sleep_mode`
    (vLLM's): allow sleep() and wake_up()."""

    def __init__(
        self, model: str | None = None, *, enable_sleep_mode: bool = False, **engine_args: Any
    ) -> None:
        self.llm_engine = LLMEngine(EngineArgs.from_kwargs(model=model, **engine_args))
        self.enable_sleep_mode = enable_sleep_mode
        self._request_counter = itertools.count()

    def get_tokenizer(self) -> "PreTrainedTokenizerBase":
        return self.llm_engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's defaults (generation_config.json, --generation-config), what
        generate() uses when given none (its max_tokens capped at the rest of the context)."""
        return SamplingParams(**self.llm_engine.config.model.generation_defaults)

    def _unset_sampling_params(self) -> SamplingParams:
        """get_default_sampling_params() with the model's max_tokens left to the engine, which caps the rest
        of the context at it: a long prompt still fits, as in vLLM."""
        params = self.get_default_sampling_params()
        if "max_tokens" in self.llm_engine.config.model.generation_defaults:
            return replace(params, max_tokens=None)
        return params

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in input order. A dict prompt may carry a
        `cache_salt`: prefix-cache hits only between prompts with the same salt. `priority`: one per
        prompt, with scheduling_policy="priority" (lower first). `lora_request`: the adapter of every
        prompt, or one per prompt (None: the base model), with enable_lora=True."""
        prompts = _as_prompt_list(prompts)
        params = sampling_params or self._unset_sampling_params()
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        _check_one_per_prompt(len(prompts), "sampling_params", params)
        _check_one_per_prompt(len(prompts), "priority", priority)
        adapters = _adapters_per_prompt(len(prompts), lora_request)
        priorities = priority or [0] * len(prompts)
        # NOTE: only the final outputs are returned: no RequestOutput is built per request per step (vLLM's
        # LLM asks the same).
        options = [
            RequestOptions(
                replace(p, output_kind=RequestOutputKind.FINAL_ONLY), priority=rank, lora_request=adapter
            )
            for p, rank, adapter in zip(params, priorities, adapters)
        ]
        return self._run(prompts, options, use_tqdm)

    def beam_search(
        self,
        prompts: PromptType | Sequence[PromptType],
        params: BeamSearchParams,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        use_tqdm: bool = False,
    ) -> list[BeamSearchOutput]:
        """Beam search for every prompt (HF transformers' rules, see BeamSearchParams), with the model's
        default repetition_penalty (--generation-config) as HF applies it; each output holds `beam_width`
        sequences, best first. The beams share KV blocks, copying on write. `lora_request`: as generate()'s
        (vLLM's argument order)."""
        prompts = _as_prompt_list(prompts)
        defaults = beam_search_defaults(self.llm_engine.config.model.generation_defaults)
        sampling = SamplingParams(
            **{
                **defaults,
                "n": params.beam_width,
                "temperature": 0.0,
                "max_tokens": params.max_tokens,
                "ignore_eos": params.ignore_eos,
            }
        )
        adapters = _adapters_per_prompt(len(prompts), lora_request)
        options = [RequestOptions(sampling, params, lora_request=adapter) for adapter in adapters]
        outputs = self._run(prompts, options, use_tqdm)
        tokenizer = self.get_tokenizer()
        return [
            BeamSearchOutput(
                [
                    BeamSearchSequence(
                        output.prompt_token_ids + beam.token_ids,
                        str(
                            tokenizer.decode(
                                output.prompt_token_ids + beam.token_ids, skip_special_tokens=True
                            )
                        ),
                        beam.cumulative_logprob or 0.0,
                        beam.finish_reason,
                    )
                    for beam in output.outputs
                ]
            )
            for output in outputs
        ]

    def encode(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingOptions | Sequence[PoolingOptions] | None = None,
        use_tqdm: bool = False,
    ) -> list[PoolingRequestOutput]:
        """Pool every prompt (--runner pooling): the model's own task, embeddings or class probabilities;
        one PoolingOptions for all prompts, or one each."""
        prompt_list = _as_prompt_list(prompts)
        options = pooling_params or PoolingOptions()
        option_list = [options] * len(prompt_list) if isinstance(options, PoolingOptions) else list(options)
        if len(option_list) != len(prompt_list):
            raise InvalidRequestError(
                f"Got {len(prompt_list)} prompts but {len(option_list)} pooling_params.",
                param="pooling_params",
            )
        request_ids = [str(next(self._request_counter)) for _ in prompt_list]
        self.llm_engine.add_pooling_requests(list(zip(request_ids, prompt_list, option_list)))
        return [
            PoolingRequestOutput(o.request_id, o.prompt_token_ids, PoolingOutput(o.pooled or []))
            for o in self._run_engine(request_ids, use_tqdm)
        ]

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingOptions | None = None,
        **kw: Any,
    ) -> list[PoolingRequestOutput]:
        """Embeddings (`outputs.embedding`), normalized as the model's pooler says unless asked otherwise."""
        return self.encode(prompts, replace(pooling_params or PoolingOptions(), task="embed"), **kw)

    def classify(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingOptions | None = None,
        **kw: Any,
    ) -> list[PoolingRequestOutput]:
        """A cross-encoder's class probabilities per prompt (`outputs.probs`)."""
        return self.encode(prompts, replace(pooling_params or PoolingOptions(), task="classify"), **kw)

    def score(
        self, query: str | Sequence[str], documents: str | Sequence[str], use_tqdm: bool = False
    ) -> list[ScoringRequestOutput]:
        """One score per (query, document) pair (one query against many, or pairwise): the cosine of their
        embeddings for an embedding model, the head's score of the pair for a cross-encoder."""
        queries, docs = score_pairs(query, documents)
        pooling = self.llm_engine.config.model.pooling
        if pooling is not None and pooling.task == "classify":
            pairs = [tokenize_pair(self.get_tokenizer(), q, d) for q, d in zip(queries, docs)]
            outputs = self.encode(
                [{"prompt_token_ids": ids} for ids, _ in pairs],
                [PoolingOptions(task="classify", token_type_start=start) for _, start in pairs],
                use_tqdm,
            )
            return [
                ScoringRequestOutput(o.request_id, o.prompt_token_ids, ScoringOutput(o.outputs.data[0]))
                for o in outputs
            ]
        texts = list(dict.fromkeys([*queries, *docs]))  # each text embedded once
        embedded = dict(zip(texts, self.embed(texts, use_tqdm=use_tqdm)))
        return [
            ScoringRequestOutput(
                str(i),
                embedded[q].prompt_token_ids + embedded[d].prompt_token_ids,
                ScoringOutput(cosine(embedded[q].outputs.data, embedded[d].outputs.data)),
            )
            for i, (q, d) in enumerate(zip(queries, docs))
        ]

    def reset_prefix_cache(self) -> bool:
        """Forget every cached KV block: later requests compute their prompts from scratch."""
        return self.llm_engine.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """Free the weights and the KV cache (vLLM's levels: 1 keeps the checkpoint mapped to reload from,
        2 does not); the prefix cache is forgotten. wake_up(), or the next generate(), loads them again.
        Raises RequestFailedError when the engine could not (it stays awake; the log says why)."""
        if not self.enable_sleep_mode:
            raise ConfigError("LLM.sleep() needs sleep mode: create the LLM with enable_sleep_mode=True.")
        check_sleep_level(level)
        core = self.llm_engine.engine_core
        core.sleep(level)
        if core.sleep_level != level:
            raise RequestFailedError(
                f"The engine could not sleep (level {level}) and stays awake: see the log."
            )

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Load the weights and allocate the KV cache again: both at once, whichever of vLLM's `tags`
        ("weights", "kv_cache") are given. A no-op when awake."""
        unknown = sorted(set(tags or ()) - {"weights", "kv_cache"})
        if unknown:
            raise InvalidRequestError(
                f"Unknown wake_up tags {unknown}: use 'weights' and 'kv_cache'.", param="tags"
            )
        self.llm_engine.engine_core.wake_up()

    def _run(
        self, prompts: list[PromptType], options: Sequence[RequestOptions], use_tqdm: bool
    ) -> list[RequestOutput]:
        request_ids = [str(next(self._request_counter)) for _ in prompts]
        added = []
        try:
            for request_id, prompt, each in zip(request_ids, prompts, options):
                self.llm_engine.add_request(request_id, prompt, each)
                added.append(request_id)
        except Exception:
            self.llm_engine.abort_request(added)  # nothing half-submitted stays in the engine
            raise
        return self._run_engine(request_ids, use_tqdm)

    def chat(
        self,
        messages: ChatMessages | Sequence[ChatMessages],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, JsonValue]] | None = None,
        *,
        chat_template_content_format: ContentFormat = "auto",
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, JsonValue] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Apply the tokenizer's chat template to each conversation (with `tools`, OpenAI's function list,
        as the template's `tools`; `chat_template_kwargs` as further template variables, e.g.
        enable_thinking; vLLM's arguments), then generate. Constrain the output with
        `SamplingParams(structured_outputs=...)`."""
        conversations = (
            cast(list[ChatMessages], [messages])
            if messages and isinstance(messages[0], dict)
            else cast(Sequence[ChatMessages], messages)
        )
        tokenizer = self.get_tokenizer()
        template = chat_template or getattr(tokenizer, "chat_template", None)
        content_format = resolve_content_format(
            chat_template_content_format, template if isinstance(template, str) else None
        )
        placeholder = image_placeholder(tokenizer, self.llm_engine.config.model.multimodal)
        prompts = [
            with_images(
                apply_chat_template(
                    tokenizer,
                    normalize_messages(conversation, content_format, placeholder),
                    chat_template,
                    add_generation_prompt,
                    tools,
                    continue_final_message=continue_final_message,
                    template_kwargs=chat_template_kwargs,
                ),
                conversation,
            )
            for conversation in conversations
        ]
        return self.generate(prompts, sampling_params, use_tqdm, lora_request=lora_request)

    def _run_engine(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(request_ids), desc="Processed prompts", disable=not use_tqdm, unit="req")
        start, num_tokens = time.perf_counter(), 0
        # NOTE: the model runner enters inference mode at each step unless it is on already: entered once for
        # all the steps here (torch is imported here: `import pagedserve` does not load it).
        import torch

        with torch.inference_mode():
            while self.llm_engine.has_unfinished_requests():
                for output in self.llm_engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        num_tokens += sum(len(o.token_ids) for o in output.outputs)
                        bar.update(1)
                        bar.set_postfix_str(f"output {num_tokens / (time.perf_counter() - start):.1f} tok/s")
        bar.close()
        return [finished[request_id] for request_id in request_ids]


def _as_prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
    if isinstance(prompts, (str, dict)) or (
        isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
    ):
        return [prompts]
    return list(prompts)


def _check_one_per_prompt(num_prompts: int, name: str, values: Sized | None) -> None:
    """A per-prompt argument (None: not given) has one value per prompt, or InvalidRequestError."""
    if values is not None and len(values) != num_prompts:
        raise InvalidRequestError(
            f"Got {num_prompts} prompts but {len(values)} {name}: pass one per prompt"
            + ("." if name == "priority" else f", or one {name}."),
            param=name,
        )


def _adapters_per_prompt(
    num_prompts: int, lora_request: LoRARequest | Sequence[LoRARequest | None] | None
) -> list[LoRARequest | None]:
    """`lora_request` (one for every prompt, or one each) as one per prompt."""
    adapters = list(lora_request) if isinstance(lora_request, Sequence) else [lora_request] * num_prompts
    _check_one_per_prompt(num_prompts, "lora_request", adapters)
    return adapters

"""Features that meet keep their promises: the combinatorial property test.

Hypothesis draws a batch of requests from the whole feature space (greedy and seeded sampling, n and
best_of, beam search, stop strings and stop token ids, min_tokens, logprobs and prompt_logprobs, guided
regex / choice / JSON, logit_bias, penalties, shared prefixes for prefix-cache hits, cache_salt, priority,
a LoRA adapter) and two token budgets, one for the batch and one for each request run alone, so prompts are
cut into chunks at other places; it runs them under one of several engine settings (n-gram and draft-model
speculation, forced recompute and swap preemption in a tiny pool, priority scheduling, chunked prefill, an
fp8 KV cache, a sliding-window model, DeepSeek V3's latent attention, a K-quant and a Q4_0 GGUF, three
adapters over two slots, adapters in one slot under priority and a draft model, wide batches whose decode
steps run above 8 and 16 rows, two data-parallel replicas, two pipeline stages with adapters, sleep and wake
between runs, images (LLaVA's, and Gemma 3's, attended both ways), gpt-oss, the API server's tokenizer).
For every request:

- its output in the batch equals its output run alone: tokens, text, finish and stop reasons, and the
  logprobs and prompt logprobs **bit for bit**: a token's logits do not depend on what shares its step, on
  where its prompt was cut, nor on its neighbours' adapters (docs/design.md); greedy and seeded sampling are
  reproducible per position;
- on the settings of a HF model in float32, a greedy request without logits processors also gives HF
  transformers' greedy tokens, so an engine that is consistently wrong fails too;
- a constrained output that finished matches its constraint;
- prompt logprobs: one entry per prompt token, the first None;
- nothing raises, and every KV block (and swap block) is back in its pool at the end.

A stop string or stop token id is taken from the request's own unstopped output, so that it is hit.
CI runs a fixed (derandomized) set of examples per setting; `-m nightly` runs many more, randomized.
"""

import contextlib
import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedserve import LLM, SamplingParams
from pagedserve.errors import InvalidRequestError
from pagedserve.lora.request import LoRARequest
from pagedserve.outputs import RequestOutput
from pagedserve.sampling_params import BeamSearchParams, RequestOutputKind
from pagedserve.structured_outputs_params import StructuredOutputsParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
DRAFT = {"model": "{model}", "num_speculative_tokens": 3}  # "{model}": the setting's model itself
# n-gram speculation, swap preemption and three adapters (ranks 8, 4, 8) over two slots and two host slots.
LORA_NGRAM_SWAP: dict[str, object] = dict(
    speculative_config=NGRAM,
    preemption_mode="swap",
    swap_space=0.01,
    enable_lora=True,
    max_loras=2,
    max_cpu_loras=2,
    max_lora_rank=8,
)
TIGHT = dict(block_size=8, num_gpu_blocks_override=24, max_model_len=96, max_num_seqs=6)
# Decode steps of up to 32 rows (the GGUF kernels change instruction paths at 8, 16 and 32 rows; the LoRA
# expand at runs of 8 tokens of one adapter) in a pool that still runs short under 20 requests.
WIDE = dict(block_size=8, num_gpu_blocks_override=120, max_model_len=96, max_num_seqs=32)

# Token budgets a run may take instead of its setting's (None), so a prompt is cut at other places alone
# than in its batch. Only smaller ones: the workers' buffers and the window's block bound follow the setting.
BUDGETS: tuple[int | None, ...] = (None, 5, 8, 13)


@dataclass(frozen=True)
class Setting:
    model: str  # a tiny model of tests/conftest.py's TINY_MODELS (GGUF_MODELS: written as a GGUF)
    args: dict[str, Any]  # the engine's arguments
    max_batch: int = 5  # requests drawn per batch
    min_batch: int = 2
    # The token budgets the batch may run under (see BUDGETS); a wide setting keeps its own, so its prompts
    # prefill in a few steps and their decodes then share steps of many rows.
    batch_budgets: tuple[int | None, ...] = BUDGETS
    hf_reference: bool = False  # greedy requests also equal HF transformers' greedy tokens
    # the engine may sleep (POST /sleep, level 1 or 2) between the runs alone and the batch
    sleeps: bool = False
    images: bool = False  # prompts carry 0 to 2 images (an image model: LLaVA, Qwen2.5-VL or Gemma 3)
    # The token budgets a request run alone may take (see BUDGETS).
    alone_budgets: tuple[int | None, ...] = BUDGETS
    # the API server's tokenizer (utils/light_tokenizer.py, no transformers) reads and writes the text:
    # prompts, detokenization, stop strings, the constraints' token masks
    light_tokenizer: bool = False


SETTINGS: dict[str, Setting] = {
    "ngram_recompute_chunked": Setting(
        "llama",
        dict(TIGHT, speculative_config=NGRAM, preemption_mode="recompute", max_num_batched_tokens=32),
        hf_reference=True,
    ),
    "draft_swap": Setting(
        "llama",
        dict(
            TIGHT,
            speculative_config=DRAFT,
            preemption_mode="swap",
            swap_space=0.01,
            scheduling_policy="priority",  # the drawn priorities order admission, preemption, swap-in
        ),
    ),
    "fp8_chunked_prefix_cache": Setting(
        "llama", dict(TIGHT, kv_cache_dtype="fp8", max_num_batched_tokens=16)
    ),
    "window_recompute": Setting(
        "mistral-swa", dict(TIGHT, preemption_mode="recompute", max_num_batched_tokens=24), hf_reference=True
    ),
    # A Q4_K GGUF: the packed K-quant kernels on integer activations, prefill chunks and decode alike; its LM
    # head folds the greedy argmax into the matmul (gguf_packed_matmul_greedy), drafts verified on it.
    "kquant_gguf_ngram_swap": Setting(
        "llama-kquant",
        dict(
            TIGHT,
            speculative_config=NGRAM,
            preemption_mode="swap",
            swap_space=0.01,
            max_num_batched_tokens=32,
        ),
    ),
    # A Q4_0 GGUF: integer activation blocks at every batch, steps of 16 tokens and more on AMX tiles where
    # the CPU has them (the same bits as the smaller steps' kernel); the LM head's argmax folded into its
    # matmul off the AMX tiles, read from the logits on them.
    "q4_0_gguf_recompute_priority": Setting(
        "llama-q4_0",
        dict(TIGHT, preemption_mode="recompute", scheduling_policy="priority", max_num_batched_tokens=64),
    ),
    # Wide decode batches of a Q4_0 GGUF: the decode kernel (8 rows or fewer), the packed kernel and AMX
    # tiles (16 rows and more) meet within one request's life.
    "q4_0_gguf_wide": Setting(
        "llama-q4_0",
        dict(WIDE, max_num_batched_tokens=256),
        max_batch=18,
        min_batch=12,
        batch_budgets=(None,),
    ),
    # int4 linear layers (Q4_1 blocks) on the Triton kernels beside Triton attention (--linear-backend triton,
    # --attention-backend triton; on CPU both in Triton's interpreter).
    "triton_int4_linear_attention": Setting(
        "llama", dict(TIGHT, quantization="int4", linear_backend="triton", attention_backend="triton")
    ),
    # Three adapters (ranks 8, 4, 8; attention, q/v, MLP) over two slots: requests wait for a slot, adapters
    # leave host memory and are read again, beams and samples fork with their adapter.
    "lora_ngram_swap": Setting("llama", dict(TIGHT, **LORA_NGRAM_SWAP), sleeps=True),
    # Three adapters in three slots beside base-model requests in wide batches: a token's update must not
    # depend on how many neighbours share its adapter (the expand's runs), nor on which adapters they use.
    "lora_wide": Setting(
        "llama",
        dict(WIDE, enable_lora=True, max_loras=3, max_lora_rank=8, max_num_batched_tokens=256),
        max_batch=18,
        min_batch=12,
        batch_budgets=(None,),
    ),
    # One adapter slot under priority scheduling and a draft model: urgent requests of another adapter must
    # wait for the slot rather than preempt requests whose leaving would not free it.
    "lora_one_slot_draft_priority": Setting(
        "llama",
        dict(
            TIGHT,
            speculative_config=DRAFT,
            scheduling_policy="priority",
            preemption_mode="recompute",
            enable_lora=True,
            max_loras=1,
            max_lora_rank=8,
            max_num_batched_tokens=24,
        ),
    ),
    # Two data-parallel replicas (engine processes, one thread each): a request and its samples or beams
    # go to one replica; its output must not depend on which, nor on what else that replica runs.
    "dp2_ngram_recompute": Setting(
        "llama",
        dict(
            TIGHT,
            data_parallel_size=2,
            cpu_threads=1,
            speculative_config=NGRAM,
            preemption_mode="recompute",
            max_num_batched_tokens=32,
        ),
    ),
    # Two pipeline stages (worker processes, one layer each): hidden states cross between them every step,
    # two micro-batches in flight (a request sits out while its step is in flight); each stage holds its own
    # layer's part of the three adapters in two slots.
    "pp2_lora_ngram_swap": Setting("llama", dict(TIGHT, pipeline_parallel_size=2, **LORA_NGRAM_SWAP)),
    # A thinking model (<think> </think> tokens, --reasoning-parser qwen3) under n-gram speculation: drawn
    # thinking budgets force </think> (drafts at a forced position must equal it), constraints start after
    # it (drafts inside thinking unconstrained, after it masked), prompts that open or close thinking.
    "thinking_light_tokenizer_ngram_recompute": Setting(
        "qwen3-think",
        dict(TIGHT, reasoning_parser="qwen3", speculative_config=NGRAM, preemption_mode="recompute"),
        max_batch=3,
        light_tokenizer=True,  # the thinking model's added tags, as `pagedserve serve` reads them
    ),
    # Images (tiny LLaVA, 16 tokens an image) from a pool of three, so requests share images: prompts cut
    # through their images, the encoder cache and image-keyed prefix hits, under speculation and preemption.
    "llava_images_ngram_recompute": Setting(
        "llava",
        dict(TIGHT, speculative_config=NGRAM, preemption_mode="recompute", max_num_batched_tokens=32),
        images=True,
        max_batch=3,
    ),
    # Qwen2.5-VL's images (4 tokens each from the same pool): M-RoPE's 3-D positions through prompts cut
    # through their images, image-keyed prefix hits, recompute preemption and n-gram drafts.
    "qwen2_5_vl_images_ngram_recompute": Setting(
        "qwen2_5_vl",
        dict(TIGHT, speculative_config=NGRAM, preemption_mode="recompute", max_num_batched_tokens=32),
        images=True,
        max_batch=3,
    ),
    # LLaVA-NeXT's any-res images (44 or 88 tokens each) under n-gram speculation and recompute preemption,
    # with three adapters on its language model over two slots: image rows and text rows of one request
    # take its adapter's deltas in the decoder alone.
    "llava_next_images_lora_ngram_recompute": Setting(
        "llava_next",
        dict(
            block_size=8,
            num_gpu_blocks_override=64,
            max_model_len=256,
            max_num_seqs=6,
            max_num_batched_tokens=48,
            speculative_config=NGRAM,
            preemption_mode="recompute",
            enable_lora=True,
            max_loras=2,
            max_cpu_loras=2,
            max_lora_rank=8,
        ),
        images=True,
        max_batch=3,
    ),
    # Images on Gemma 3 (tiny, 16 tokens an image, attending each other both ways in prefill, on the cpu
    # backend's kernel): chunks never cut through an image, so every budget holds an image, its start and end.
    "gemma3_images_ngram_recompute": Setting(
        "gemma3v",
        dict(TIGHT, speculative_config=NGRAM, preemption_mode="recompute", max_num_batched_tokens=32),
        images=True,
        max_batch=3,
        batch_budgets=(None, 18, 23),
        alone_budgets=(None, 18, 23),
    ),
    # gpt-oss: attention sinks in alternating windowed (24) and full layers (two KV cache groups), YaRN,
    # biased experts, under n-gram speculation and recompute preemption. Batches of up to 3 and no HF
    # reference (tests/models/test_gpt_oss.py has it): the full setting took 265 s on the shared machine.
    "gpt_oss_ngram_recompute": Setting(
        "gpt_oss",
        dict(TIGHT, speculative_config=NGRAM, preemption_mode="recompute", max_num_batched_tokens=24),
        max_batch=3,
    ),
    # gpt-oss with MXFP4 experts (an `mxfp4` checkpoint of the same tiny model) on the native block kernels'
    # MXFP4 type, batches of up to 3 as above.
    "gpt_oss_mxfp4_ngram_recompute": Setting(
        "gpt_oss",
        dict(TIGHT, speculative_config=NGRAM, preemption_mode="recompute", max_num_batched_tokens=24),
        max_batch=3,
    ),
    # DeepSeek V3 (MLA: one latent per token and layer in the cache, every token absorbed on the native
    # kernel; grouped expert routing) under n-gram speculation, recompute preemption and chunked prefill.
    "mla_ngram_recompute_chunked": Setting(
        "deepseek_v3",
        dict(TIGHT, speculative_config=NGRAM, preemption_mode="recompute", max_num_batched_tokens=32),
        hf_reference=True,
    ),
}
# Settings whose Triton kernels run on CUDA only here: under Triton's interpreter on CPU this setting's batches
# take over 10 minutes (measured), so CPU runs check the same kernels end to end on fewer tokens in
# tests/quantization/test_linear_backend.py and tests/kernels/test_triton_llm.py.
GPU_SETTINGS = {"triton_int4_linear_attention"}
SETTING_PARAMS = [
    pytest.param(name, marks=pytest.mark.gpu) if name in GPU_SETTINGS else name for name in SETTINGS
]
GGUF_MODELS = {"llama-kquant": "Q4_K", "llama-q4_0": "Q4_0"}  # tiny models loaded as a GGUF of that type
MXFP4_SETTINGS = {"gpt_oss_mxfp4_ngram_recompute"}  # their model's experts written as an MXFP4 checkpoint

# Two block-aligned shared prefixes (prefix-cache hits), one a repeating pattern (n-gram proposals).
PREFIXES = [[11, 12, 13, 14, 15, 16, 17, 18] * 3, list(range(3000, 3024))]
CONSTRAINTS: list[tuple[dict[str, Any], Any]] = [
    (dict(regex=r"[a-z]{1,6}( [a-z]{1,6}){0,2}"), lambda t: re.fullmatch(r"[a-z]{1,6}( [a-z]{1,6}){0,2}", t)),
    (dict(choice=["alpha", "beta gamma", "delta"]), lambda t: t in ("alpha", "beta gamma", "delta")),
    (
        dict(json={"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}),
        lambda t: isinstance(json.loads(t).get("ok"), bool),
    ),
]


@dataclass
class Case:
    """One drawn request: its prompt, parameters, and what to derive from its unstopped output."""

    prompt: dict[str, Any]
    params: SamplingParams
    beam: BeamSearchParams | None = None
    stop_at: tuple[str, int] | None = None  # ("string" | "token", output index) to stop at
    check: Any = None  # the constraint's check on the output text
    stopped: dict[str, Any] = field(default_factory=dict)  # the stop fields derived at run time
    priority: int = 0  # honoured by the settings with scheduling_policy="priority"
    lora: int | None = None  # the adapter (an index into the setting's), with enable_lora


THINK, END = 49152, 49153  # the qwen3-think model's tags (conftest.add_think_tokens)
IMAGE = 49152  # the tiny LLaVA's <image>, Qwen2.5-VL's <|image_pad|>, Gemma 3's <start_of_image> (conftest)


def _image_pool() -> list[Any]:
    import numpy as np
    from PIL import Image

    return [
        Image.fromarray(np.random.RandomState(seed).randint(0, 256, (24 + 8 * seed, 40, 3), dtype=np.uint8))
        for seed in range(3)
    ]


IMAGES = _image_pool()


@st.composite
def cases(draw: st.DrawFn, thinking: bool = False, images: bool = False) -> Case:
    """`thinking`: a thinking model's case (think tags in the prompt, a budget, a bias toward <think>).
    `images`: 0 to 2 images of the pool, their placeholders after the shared prefix."""
    case = draw(_cases())
    if images:
        chosen = draw(st.lists(st.integers(0, len(IMAGES) - 1), max_size=2))
        tokens = case.prompt["prompt_token_ids"]
        case.prompt["prompt_token_ids"] = tokens[:24] + [IMAGE] * len(chosen) + tokens[24:]
        case.prompt["multi_modal_data"] = {"image": [IMAGES[i] for i in chosen]}
    if not thinking:
        return case
    # The prompt's last tag opens thinking, closes it, or there is none (a leading <think> may open it).
    tags = draw(st.sampled_from([[THINK, THINK, 7, THINK], [THINK, 7, END], []]))
    case.prompt["prompt_token_ids"] += tags
    changes: dict[str, Any] = dict(thinking_token_budget=draw(st.none() | st.integers(0, 4)))
    if draw(st.booleans()):
        changes["logit_bias"] = {THINK: draw(st.sampled_from([3.0, 100.0]))}
    if case.check is not None:
        check = case.check
        case.check = lambda text: check(text.split("</think>", 1)[-1])  # the answer after thinking
    case.params = replace(case.params, **changes)
    return case


@st.composite
def _cases(draw: st.DrawFn) -> Case:
    prefix = PREFIXES[draw(st.integers(0, len(PREFIXES) - 1))]
    suffix = draw(st.lists(st.integers(100, 40000), min_size=1, max_size=10))
    prompt: dict[str, Any] = {"prompt_token_ids": prefix + suffix}
    if draw(st.booleans()):
        prompt["cache_salt"] = draw(st.sampled_from(["tenant-a", "tenant-b"]))
    max_tokens = draw(st.integers(1, 14))
    priority = draw(st.integers(-2, 2))
    lora = draw(st.none() | st.integers(0, 2))
    kwargs: dict[str, Any] = dict(max_tokens=max_tokens)
    if draw(st.booleans()):
        kwargs["logit_bias"] = {draw(st.integers(100, 40000)): draw(st.sampled_from([-100.0, 3.0, 100.0]))}
    penalty = draw(st.sampled_from(["none", "none", "repetition", "frequency"]))
    if penalty == "repetition":
        kwargs["repetition_penalty"] = 1.3
    elif penalty == "frequency":
        kwargs.update(frequency_penalty=0.5, presence_penalty=0.3)
    if draw(st.integers(0, 9)) == 0:  # beam search (the processors above apply to every beam's logits)
        width = draw(st.integers(2, 3))
        params = SamplingParams(n=width, temperature=0.0, ignore_eos=True, **kwargs)
        beam = BeamSearchParams(width, max_tokens, ignore_eos=True)
        return Case(prompt, params, beam, priority=priority, lora=lora)
    sampled = draw(st.booleans())
    n = draw(st.integers(1, 2))
    kwargs.update(
        temperature=draw(st.sampled_from([0.5, 1.0])) if sampled else 0.0,
        seed=draw(st.integers(0, 2**63 - 1)) if sampled else None,
        n=n,
        ignore_eos=draw(st.booleans()),
        min_tokens=draw(st.integers(0, max_tokens)) if draw(st.booleans()) else 0,
        logprobs=draw(st.none() | st.integers(0, 3)),
        prompt_logprobs=draw(st.none() | st.integers(0, 2)),
        # NOTE: final-only requests without stop strings or logprobs hear from the engine core only at their
        # first token and their end (EngineCoreRequest.final_only).
        output_kind=draw(st.sampled_from([RequestOutputKind.CUMULATIVE, RequestOutputKind.FINAL_ONLY])),
    )
    if sampled and draw(st.booleans()):
        kwargs["best_of"] = n + 1
    check = None
    if draw(st.integers(0, 3)) == 0:
        constraint, check = draw(st.sampled_from(CONSTRAINTS))
        kwargs["structured_outputs"] = StructuredOutputsParams(**constraint)
    stop_at = None
    if max_tokens > 1 and draw(st.booleans()):
        stop_at = (draw(st.sampled_from(["string", "token"])), draw(st.integers(0, max_tokens - 1)))
    return Case(prompt, SamplingParams(**kwargs), stop_at=stop_at, check=check, priority=priority, lora=lora)


_ENGINES: dict[str, LLM] = {}
_ADAPTERS: dict[str, list[LoRARequest]] = {}  # per setting with enable_lora
_MODELS: dict[str, str] = {}  # per setting: the HF folder its model was built from


def engine(name: str, tiny_model_factory: Any) -> LLM:
    """One engine per setting for the whole module (building one costs seconds)."""
    if name not in _ENGINES:
        setting = SETTINGS[name]
        model = _MODELS[name] = tiny_model_factory(setting.model)
        args = setting.args
        if setting.model in GGUF_MODELS:
            from gguf_writer import write_gguf

            gguf = os.path.join(model, "model.gguf")
            model = write_gguf(model, "llama", gguf, GGUF_MODELS[setting.model])
        if name in MXFP4_SETTINGS:
            from mxfp4_checkpoint import write_mxfp4_checkpoint

            # NOTE: beside the shared tiny model's folder, not in it (other tests copy that folder's files)
            model = write_mxfp4_checkpoint(model, f"{model}-mxfp4")
        if "triton" in (args.get("linear_backend"), args.get("attention_backend")):
            _import_triton_kernels()
        spec = args.get("speculative_config")
        if spec and spec.get("model") == "{model}":
            args = dict(args, speculative_config=dict(spec, model=model))
        if args.get("enable_lora"):
            _ADAPTERS[name] = _write_adapters(model)
        _ENGINES[name] = LLM(model, **args)
        if setting.light_tokenizer:
            _use_light_tokenizer(_ENGINES[name])
    return _ENGINES[name]


def _use_light_tokenizer(llm: LLM) -> None:
    """The frontend reads and writes text with the API server's tokenizer (a snapshot of this one), as
    under `pagedserve serve`."""
    from pagedserve.utils.hf_tokenizer import snapshot_tokenizer
    from pagedserve.utils.light_tokenizer import LightTokenizer

    engine = llm.llm_engine
    light = LightTokenizer(snapshot_tokenizer(engine.tokenizer))
    inputs = engine.frontend.input_processor
    engine.tokenizer = inputs.tokenizer = inputs.structured_outputs.tokenizer = light
    engine.frontend.output_processor.tokenizer = light


def _import_triton_kernels() -> None:
    """The Triton kernels as this machine runs them: compiled on CUDA, interpreted on CPU."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "kernels"))
    from interpreted_triton import import_triton_kernels

    import_triton_kernels()


def _write_adapters(model: str) -> list[LoRARequest]:
    from lora_adapters import ATTENTION, MLP, write_adapter
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    # NOTE: an image model's adapters target its language model, named as PEFT names transformers' LLaVA.
    decoder = "model.language_model." if hasattr(config, "text_config") else "model."
    config = getattr(config, "text_config", config)
    shapes = [(8, 16, ATTENTION + MLP), (4, 8, ("q_proj", "v_proj")), (8, 4, MLP)]
    return [
        LoRARequest(
            f"a{i}",
            i + 1,
            write_adapter(os.path.join(model, f"lora-{i}"), config, r, alpha, targets, i, decoder=decoder),
        )
        for i, (r, alpha, targets) in enumerate(shapes)
    ]


@contextlib.contextmanager
def token_budget(llm: LLM, budget: int | None) -> Iterator[None]:
    """The scheduler's --max-num-batched-tokens set to `budget` for the runs inside (None: the setting's).
    NOTE: reaches into the in-process scheduler; data-parallel replicas keep their setting's budget."""
    if budget is None or llm.llm_engine.config.parallel.data_parallel_size > 1:
        yield
        return
    scheduler = llm.llm_engine.engine_core.scheduler
    config = scheduler.config
    scheduler.config = replace(config, max_num_batched_tokens=min(budget, config.max_num_batched_tokens))
    try:
        yield
    finally:
        scheduler.config = config


def run(llm: LLM, cases: list[Case], budget: int | None = None) -> list[RequestOutput]:
    """Submit every case in one batch (beams and samples mixed) and step the engine to the end."""
    engine_ = llm.llm_engine
    by_priority = engine_.config.scheduler.policy == "priority"
    adapters = next((a for name, a in _ADAPTERS.items() if _ENGINES.get(name) is llm), None)
    ids = [f"{id(case)}-{i}" for i, case in enumerate(cases)]
    for request_id, case in zip(ids, cases):
        params = replace(case.params, **case.stopped)
        priority = case.priority if by_priority else 0
        lora = None if adapters is None or case.lora is None else adapters[case.lora]
        engine_.add_request(
            request_id, case.prompt, params, beam_search=case.beam, priority=priority, lora_request=lora
        )
    finished: dict[str, RequestOutput] = {}
    with token_budget(llm, budget):
        while engine_.has_unfinished_requests():
            finished.update((o.request_id, o) for o in engine_.step() if o.finished)
    return [finished[request_id] for request_id in ids]


def derive_stop(llm: LLM, case: Case) -> None:
    """A stop string (the text of one output token) or stop token id taken from the unstopped output."""
    if case.stop_at is None:
        return
    kind, index = case.stop_at
    sample = run(llm, [case])[0].outputs[0]
    if index >= len(sample.token_ids):
        return
    token = sample.token_ids[index]
    if kind == "token":
        case.stopped = {"stop_token_ids": [token]}
        return
    text = llm.get_tokenizer().decode([token]).strip()
    if text and "\ufffd" not in text:
        case.stopped = {"stop": [text]}


def assert_same(batched: RequestOutput, alone: RequestOutput, case: Case) -> None:
    """Equal outputs, logprobs and prompt logprobs to the bit."""
    assert len(batched.outputs) == len(alone.outputs)
    for a, b in zip(batched.outputs, alone.outputs):
        fields = ("token_ids", "text", "finish_reason", "stop_reason", "logprobs")
        assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields], case
    assert batched.prompt_logprobs == alone.prompt_logprobs, case
    if case.params.prompt_logprobs is not None:
        prompt_len = len(alone.prompt_token_ids)  # NOTE: an image's placeholder expanded
        assert alone.prompt_logprobs is not None and len(alone.prompt_logprobs) == prompt_len
        assert alone.prompt_logprobs[0] is None and None not in alone.prompt_logprobs[1:]


def assert_logprobs_well_formed(output: RequestOutput, tokenizer: Any) -> None:
    """Every position's vLLM `Logprob`s: the chosen token (sampled, or the prompt's) first; ranks distinct,
    from 1 when any top token is listed, and falling values as they rise; the chosen token's rank past
    every listed token more likely than it; each token's text its own."""
    positions = [(p, t) for p, t in zip(output.prompt_logprobs or [], output.prompt_token_ids) if p]
    for sample in output.outputs:
        positions += zip(sample.logprobs or [], sample.token_ids)
    for entry, token in positions:
        (chosen_id, chosen), *others = entry.items()
        assert chosen_id == token and chosen.rank > sum(v.logprob > chosen.logprob for _, v in others)
        ranked = sorted(entry.values(), key=lambda v: v.rank)
        assert not others or ranked[0].rank == 1
        assert all(a.rank < b.rank and a.logprob >= b.logprob for a, b in zip(ranked, ranked[1:]))
        assert all(v.decoded_token == tokenizer.decode([t]) for t, v in entry.items())


def assert_cached_whole_blocks(output: RequestOutput, block_size: int) -> None:
    """The prefix-cache hit reported (vLLM's num_cached_tokens): whole blocks, short of the last prompt
    token (always computed)."""
    cached = output.num_cached_tokens
    assert cached is not None and cached % block_size == 0 and 0 <= cached < len(output.prompt_token_ids)


def compares_with_hf(case: Case, lora: bool) -> bool:
    """A greedy request that HF's plain greedy search defines: no processor, constraint, stop or adapter."""
    params = case.params
    return (
        case.beam is None
        and not lora
        and params.temperature == 0.0
        and params.n == 1
        and params.min_tokens == 0
        and params.logit_bias is None
        and params.repetition_penalty == 1.0
        and params.frequency_penalty == params.presence_penalty == 0.0
        and params.structured_outputs is None
        and not case.stopped
    )


_HF_MODELS: dict[str, Any] = {}


def assert_hf_greedy(folder: str, case: Case, output: RequestOutput) -> None:
    """The engine's greedy tokens are HF transformers' (eager attention, float32) for the same prompt: up to
    the engine's own end (EOS included, when it stopped there)."""
    import torch
    from transformers import AutoModelForCausalLM

    if folder not in _HF_MODELS:
        _HF_MODELS[folder] = AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager"
        )
    tokens = output.outputs[0].token_ids
    prompt = torch.tensor([case.prompt["prompt_token_ids"]])
    generated = _HF_MODELS[folder].generate(
        prompt, max_new_tokens=len(tokens), do_sample=False, eos_token_id=None, pad_token_id=0
    )
    assert generated[0, prompt.shape[1] :].tolist() == tokens, case


def check_batch(llm: LLM, drawn: list[Case], budgets: tuple[int | None, int | None], setting: str) -> None:
    alone_budget, batch_budget = budgets
    accepted = []
    for case in drawn:
        try:
            derive_stop(llm, case)
            alone = run(llm, [case], alone_budget)[0]
        except InvalidRequestError:
            continue  # a combination the engine refuses (with its message) stays out of the batch
        accepted.append((case, alone))
    level = len(drawn) % 3 if SETTINGS[setting].sleeps else 0  # 0: awake (a third of the batches)
    if level:  # the batch's first request wakes it: the weights reloaded, the KV cache empty
        llm.llm_engine.engine_core.sleep(level)
    batched = run(llm, [case for case, _ in accepted], batch_budget)
    adapters = setting in _ADAPTERS
    for (case, alone), output in zip(accepted, batched):
        assert output.error is None and alone.error is None, output.error
        assert_same(output, alone, case)
        assert_logprobs_well_formed(output, llm.get_tokenizer())
        assert_cached_whole_blocks(output, llm.llm_engine.config.cache.block_size)
        if SETTINGS[setting].hf_reference and compares_with_hf(case, adapters and case.lora is not None):
            assert_hf_greedy(_MODELS[setting], case, output)
        if case.check is not None:
            for sample in output.outputs:
                if sample.finish_reason == "stop" and sample.stop_reason is None:
                    assert case.check(sample.text), (case, sample.text)
    assert_all_blocks_back(llm)


def assert_all_blocks_back(llm: LLM) -> None:
    if llm.llm_engine.config.parallel.data_parallel_size > 1:
        return  # NOTE: the replicas' block pools live in their own processes, out of reach here
    scheduler = llm.llm_engine.engine_core.scheduler
    kv, swap = scheduler.kv_cache_manager, scheduler.kv_cache_manager.swap_space
    assert kv.num_free_blocks() == kv.num_usable_blocks and not kv.req_to_blocks
    if swap is not None:
        assert swap.num_free_blocks() == swap.num_blocks and not swap.tables


@st.composite
def batches(draw: st.DrawFn, setting: str, longest: int = 0) -> tuple[list[Case], tuple[Any, Any]]:
    """Requests for one batch of `setting` (up to its max_batch, or `longest`), and the two token budgets."""
    chosen = SETTINGS[setting]
    thinking = "reasoning_parser" in chosen.args
    drawn = draw(
        st.lists(
            cases(thinking, chosen.images), min_size=chosen.min_batch, max_size=longest or chosen.max_batch
        )
    )
    return drawn, (draw(st.sampled_from(chosen.alone_budgets)), draw(st.sampled_from(chosen.batch_budgets)))


EXAMPLES = int(os.environ.get("PAGEDSERVE_FEATURES_EXAMPLES", "8"))


@pytest.mark.sampled
@pytest.mark.parametrize("setting", SETTING_PARAMS)
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_features_meet(setting: str, data: st.DataObject, tiny_model_factory: Any) -> None:
    drawn, budgets = data.draw(batches(setting))
    check_batch(engine(setting, tiny_model_factory), drawn, budgets, setting)


@pytest.mark.nightly
@pytest.mark.parametrize("setting", SETTING_PARAMS)
@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_features_meet_long(setting: str, data: st.DataObject, tiny_model_factory: Any) -> None:
    drawn, budgets = data.draw(batches(setting, longest=max(8, SETTINGS[setting].max_batch)))
    check_batch(engine(setting, tiny_model_factory), drawn, budgets, setting)

"""Features that meet keep their promises: the combinatorial property test.

Hypothesis draws a batch of requests from the whole feature space (greedy and seeded sampling, n and
best_of, beam search, stop strings and stop token ids, min_tokens, logprobs and prompt_logprobs, guided
regex / choice / JSON, logit_bias, penalties, shared prefixes for prefix-cache hits, cache_salt, priority,
a LoRA adapter) and runs it under one of several engine settings (n-gram and draft-model speculation,
forced recompute and swap preemption in a tiny pool, priority scheduling, chunked prefill, an fp8 KV cache,
a sliding-window model, a K-quant and a Q4_0 GGUF, three adapters over two slots, two data-parallel
replicas, two pipeline stages with adapters). For every request:

- its output in the batch equals its output run alone: tokens, text, finish and stop reasons exactly,
  logprobs and prompt logprobs within 1e-4 (greedy and seeded sampling are reproducible per position);
- a constrained output that finished matches its constraint;
- prompt logprobs: one entry per prompt token, the first None;
- nothing raises, and every KV block (and swap block) is back in its pool at the end.

A stop string or stop token id is taken from the request's own unstopped output, so that it is hit.
CI runs a fixed (derandomized) set of examples per setting; `-m nightly` runs many more, randomized.
"""

import json
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedserve import LLM, SamplingParams
from pagedserve.errors import InvalidRequestError
from pagedserve.lora.request import LoRARequest
from pagedserve.outputs import RequestOutput
from pagedserve.sampling_params import BeamSearchParams
from pagedserve.structured_outputs_params import StructuredOutputsParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
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

# name -> (tiny model, engine arguments); "{model}" in a speculative config is the model itself.
SETTINGS: dict[str, tuple[str, dict[str, Any]]] = {
    "ngram_recompute_chunked": (
        "llama",
        dict(TIGHT, speculative_config=NGRAM, preemption_mode="recompute", max_num_batched_tokens=32),
    ),
    "draft_swap": (
        "llama",
        dict(
            TIGHT,
            speculative_config={"model": "{model}", "num_speculative_tokens": 3},
            preemption_mode="swap",
            swap_space=0.01,
            scheduling_policy="priority",  # the drawn priorities order admission, preemption, swap-in
        ),
    ),
    "fp8_chunked_prefix_cache": ("llama", dict(TIGHT, kv_cache_dtype="fp8", max_num_batched_tokens=16)),
    "window_recompute": ("mistral-swa", dict(TIGHT, preemption_mode="recompute", max_num_batched_tokens=24)),
    # A Q4_K GGUF: the packed K-quant kernels on integer activations, prefill chunks and decode alike.
    "kquant_gguf_ngram_swap": (
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
    # the CPU has them (the same bits as the smaller steps' kernel).
    "q4_0_gguf_recompute_priority": (
        "llama-q4_0",
        dict(TIGHT, preemption_mode="recompute", scheduling_policy="priority", max_num_batched_tokens=64),
    ),
    # Three adapters (ranks 8, 4, 8; attention, q/v, MLP) over two slots: requests wait for a slot, adapters
    # leave host memory and are read again, beams and samples fork with their adapter.
    "lora_ngram_swap": ("llama", dict(TIGHT, **LORA_NGRAM_SWAP)),
    # Two data-parallel replicas (engine processes, one thread each): a request and its samples or beams
    # go to one replica; its output must not depend on which, nor on what else that replica runs.
    "dp2_ngram_recompute": (
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
    "pp2_lora_ngram_swap": ("llama", dict(TIGHT, pipeline_parallel_size=2, **LORA_NGRAM_SWAP)),
}
GGUF_MODELS = {"llama-kquant": "Q4_K", "llama-q4_0": "Q4_0"}  # tiny models loaded as a GGUF of that type

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


@st.composite
def cases(draw: st.DrawFn) -> Case:
    prefix = PREFIXES[draw(st.integers(0, len(PREFIXES) - 1))]
    suffix = draw(st.lists(st.integers(100, 40000), min_size=1, max_size=10))
    prompt: dict[str, Any] = {"prompt_token_ids": prefix + suffix}
    if draw(st.booleans()):
        prompt["cache_salt"] = draw(st.sampled_from(["tenant-a", "tenant-b"]))
    max_tokens = draw(st.integers(1, 14))
    if draw(st.integers(0, 9)) == 0:  # beam search
        width = draw(st.integers(2, 3))
        params = SamplingParams(n=width, temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        return Case(prompt, params, BeamSearchParams(width, max_tokens, ignore_eos=True))
    sampled = draw(st.booleans())
    n = draw(st.integers(1, 2))
    kwargs: dict[str, Any] = dict(
        max_tokens=max_tokens,
        temperature=draw(st.sampled_from([0.5, 1.0])) if sampled else 0.0,
        seed=draw(st.integers(0, 2**63 - 1)) if sampled else None,
        n=n,
        ignore_eos=draw(st.booleans()),
        min_tokens=draw(st.integers(0, max_tokens)) if draw(st.booleans()) else 0,
        logprobs=draw(st.none() | st.integers(0, 3)),
        prompt_logprobs=draw(st.none() | st.integers(0, 2)),
    )
    if sampled and draw(st.booleans()):
        kwargs["best_of"] = n + 1
    if draw(st.booleans()):
        kwargs["logit_bias"] = {draw(st.integers(100, 40000)): draw(st.sampled_from([-100.0, 3.0, 100.0]))}
    penalty = draw(st.sampled_from(["none", "none", "repetition", "frequency"]))
    if penalty == "repetition":
        kwargs["repetition_penalty"] = 1.3
    elif penalty == "frequency":
        kwargs.update(frequency_penalty=0.5, presence_penalty=0.3)
    check = None
    if draw(st.integers(0, 3)) == 0:
        constraint, check = draw(st.sampled_from(CONSTRAINTS))
        kwargs["structured_outputs"] = StructuredOutputsParams(**constraint)
    stop_at = None
    if max_tokens > 1 and draw(st.booleans()):
        stop_at = (draw(st.sampled_from(["string", "token"])), draw(st.integers(0, max_tokens - 1)))
    priority = draw(st.integers(-2, 2))
    lora = draw(st.none() | st.integers(0, 2))
    return Case(prompt, SamplingParams(**kwargs), stop_at=stop_at, check=check, priority=priority, lora=lora)


_ENGINES: dict[str, LLM] = {}
_ADAPTERS: dict[str, list[LoRARequest]] = {}  # per setting with enable_lora


def engine(name: str, tiny_model_factory: Any) -> LLM:
    """One engine per setting for the whole module (building one costs seconds)."""
    if name not in _ENGINES:
        model_name, args = SETTINGS[name]
        model = tiny_model_factory(model_name)
        if model_name in GGUF_MODELS:
            from gguf_writer import write_gguf

            model = write_gguf(model, "llama", os.path.join(model, "model.gguf"), GGUF_MODELS[model_name])
        spec = args.get("speculative_config")
        if spec and spec.get("model") == "{model}":
            args = dict(args, speculative_config=dict(spec, model=model))
        if args.get("enable_lora"):
            _ADAPTERS[name] = _write_adapters(model)
        _ENGINES[name] = LLM(model, **args)
    return _ENGINES[name]


def _write_adapters(model: str) -> list[LoRARequest]:
    from lora_adapters import ATTENTION, MLP, write_adapter
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    shapes = [(8, 16, ATTENTION + MLP), (4, 8, ("q_proj", "v_proj")), (8, 4, MLP)]
    return [
        LoRARequest(
            f"a{i}", i + 1, write_adapter(os.path.join(model, f"lora-{i}"), config, r, alpha, targets, i)
        )
        for i, (r, alpha, targets) in enumerate(shapes)
    ]


def run(llm: LLM, cases: list[Case]) -> list[RequestOutput]:
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
    assert len(batched.outputs) == len(alone.outputs)
    for a, b in zip(batched.outputs, alone.outputs):
        fields = ("token_ids", "text", "finish_reason", "stop_reason")
        assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields], case
        if b.logprobs is not None:
            assert a.logprobs is not None and len(a.logprobs) == len(b.logprobs) == len(b.token_ids)
            for x, y in zip(a.logprobs, b.logprobs):
                assert x.keys() == y.keys() and all(x[k] == pytest.approx(y[k], abs=1e-4) for k in x), (
                    case,
                    x,
                    y,
                )
    if case.params.prompt_logprobs is not None:
        prompt_len = len(case.prompt["prompt_token_ids"])
        for output in (batched, alone):
            assert output.prompt_logprobs is not None and len(output.prompt_logprobs) == prompt_len
            assert output.prompt_logprobs[0] is None and None not in output.prompt_logprobs[1:]
        for x, y in zip(batched.prompt_logprobs[1:], alone.prompt_logprobs[1:]):  # type: ignore[index]
            assert x.keys() == y.keys() and all(x[k] == pytest.approx(y[k], abs=1e-4) for k in x)


def assert_all_blocks_back(llm: LLM) -> None:
    if llm.llm_engine.config.parallel.data_parallel_size > 1:
        return  # NOTE: the replicas' block pools live in their own processes, out of reach here
    scheduler = llm.llm_engine.engine_core.scheduler
    kv, swap = scheduler.kv_cache_manager, scheduler.kv_cache_manager.swap_space
    assert kv.num_free_blocks() == kv.num_usable_blocks and not kv.req_to_blocks
    if swap is not None:
        assert swap.num_free_blocks() == swap.num_blocks and not swap.tables


def check_batch(llm: LLM, drawn: list[Case]) -> None:
    accepted = []
    for case in drawn:
        try:
            derive_stop(llm, case)
            alone = run(llm, [case])[0]
        except InvalidRequestError:
            continue  # a combination the engine refuses (with its message) stays out of the batch
        accepted.append((case, alone))
    batched = run(llm, [case for case, _ in accepted])
    for (case, alone), output in zip(accepted, batched):
        assert output.error is None and alone.error is None, output.error
        assert_same(output, alone, case)
        if case.check is not None:
            for sample in output.outputs:
                if sample.finish_reason == "stop" and sample.stop_reason is None:
                    assert case.check(sample.text), (case, sample.text)
    assert_all_blocks_back(llm)


EXAMPLES = int(os.environ.get("PAGEDSERVE_FEATURES_EXAMPLES", "8"))


@pytest.mark.sampled
@pytest.mark.parametrize("setting", list(SETTINGS))
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=st.lists(cases(), min_size=2, max_size=5))
def test_features_meet(setting: str, batch: list[Case], tiny_model_factory: Any) -> None:
    check_batch(engine(setting, tiny_model_factory), batch)


@pytest.mark.nightly
@pytest.mark.parametrize("setting", list(SETTINGS))
@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=st.lists(cases(), min_size=2, max_size=8))
def test_features_meet_long(setting: str, batch: list[Case], tiny_model_factory: Any) -> None:
    check_batch(engine(setting, tiny_model_factory), batch)

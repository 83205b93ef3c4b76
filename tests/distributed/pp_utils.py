"""Helpers of the pipeline-parallel tests (any executor): a workload with a shared prefix run twice
(prefix caching) over a KV pool too small for it (preemption), then a third time with a request aborted
mid-flight (pp batches in flight), and the check that each rank holds only its stage's parameters."""

import math
import random
from collections.abc import Callable, Iterable

from tp_utils import shutdown

from pagedserve import LLM, SamplingParams
from pagedserve.config.parallel import PipelineStage
from pagedserve.lora.request import LoRARequest
from pagedserve.model_shape import ModelShape
from pagedserve.protocol import SchedulerStats

PP_ENGINE_ARGS = dict(max_model_len=64, block_size=8, max_num_batched_tokens=16)
# KV blocks of 8 tokens: fewer than the 4 requests need at once, so some are preempted (recompute). With
# KV cache groups (qwen3-4l: four, gemma2: two) a request holds a block per group and token.
NUM_BLOCKS = {
    "llama-5l-tied": 10,
    "qwen3-4l": 28,
    "gemma2": 16,
    "qwen2_moe": 10,
    "phi3": 10,
    "falcon-7b": 10,
    "deepseek_v3": 10,
    "gpt_oss": 16,
}
PREFIX = [random.Random(1).randrange(3, 49152) for _ in range(16)]  # two blocks shared by every prompt


def prompts() -> list[dict[str, list[int]]]:
    rng = random.Random(0)
    return [
        {"prompt_token_ids": PREFIX + [rng.randrange(3, 49152) for _ in range(n)]} for n in (1, 9, 20, 30)
    ]


def greedy_twice(llm: LLM, lora: list[LoRARequest | None] | None = None) -> list[list[int]]:
    """Greedy tokens of the prompts (with adapters `lora`, one per prompt), run twice: the second round
    starts from cached prefix blocks."""
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    return [
        list(out.outputs[0].token_ids)
        for _ in range(2)
        for out in llm.generate(prompts(), params, use_tqdm=False, lora_request=lora)
    ]


def abort_mid_flight(llm: LLM, lora: list[LoRARequest | None] | None = None) -> list[list[int]]:
    """The prompts again, stepped by hand; the longest is aborted once it has a step in flight (in one
    process: once it started). Its blocks stay held until that step returns; every block is free at the
    end; at pp > 1, pp batches were in flight (pp - 1 still out after a step). Returns the greedy tokens
    of the other three."""
    engine, target = llm.llm_engine, "abort-3"
    core, params = engine.engine_core, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    kv = core.scheduler.kv_cache_manager
    for i, prompt in enumerate(prompts()):
        engine.add_request(f"abort-{i}", prompt, params, lora_request=lora[i] if lora else None)
    finished: dict[str, list[int]] = {}
    depth, aborted = 0, False
    while engine.has_unfinished_requests():
        finished.update((o.request_id, list(o.outputs[0].token_ids)) for o in engine.step() if o.finished)
        depth = max(depth, len(core.batch_queue or ()))
        request = core.scheduler.requests.get(target)
        in_flight = target in core.scheduler.in_flight
        if request is not None and (in_flight or (core.batch_queue is None and request.num_computed_tokens)):
            num_free = kv.num_free_blocks()
            engine.abort_request(target)
            assert kv.num_free_blocks() == num_free or not in_flight, "freed while its step may write them"
            aborted = True
    assert aborted
    assert depth == engine.config.parallel.pipeline_parallel_size - 1
    assert kv.num_free_blocks() == kv.num_usable_blocks
    return [finished[f"abort-{i}"] for i in range(3)]


def start_engine(model: str, num_blocks: int, tp: int = 1, pp: int = 1, **settings: object) -> LLM:
    return LLM(
        model,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        num_gpu_blocks_override=num_blocks,
        **PP_ENGINE_ARGS,
        **settings,
    )


def generate_checked(
    llm: LLM, lora: list[LoRARequest | None] | None = None
) -> tuple[list[list[int]], SchedulerStats]:
    """(greedy tokens of greedy_twice, then abort_mid_flight's; the scheduler's stats before the abort) of
    `llm`; checks that each rank holds only its stage's part, and as many parameters as the planner counts
    for it."""
    engine = llm.llm_engine
    tp = engine.config.parallel.tensor_parallel_size
    per_rank = engine.engine_core.executor.collective_rpc("parameter_shapes")
    model_config = engine.config.model
    shape = ModelShape.from_hf_config(model_config.hf_config, model_config.architecture)
    for rank, shapes in enumerate(per_rank):
        stage = engine.config.kv_layout.stages[rank // tp]
        check_stage_parameters(shapes.keys(), stage)
        assert sum(math.prod(size) for size in shapes.values()) == shape.stage(stage).num_parameters(tp)
    tokens, stats = greedy_twice(llm, lora), engine.engine_core.get_stats()
    return tokens + abort_mid_flight(llm, lora), stats


def run_engine(
    model: str,
    num_blocks: int,
    tp: int = 1,
    pp: int = 1,
    lora: list[LoRARequest | None] | None = None,
    **settings: object,
) -> tuple[list[list[int]], SchedulerStats]:
    """generate_checked() of an engine started for it (and shut down)."""
    llm = start_engine(model, num_blocks, tp, pp, **settings)
    try:
        return generate_checked(llm, lora)
    finally:
        shutdown(llm)


def check_stage_parameters(names: Iterable[str], stage: PipelineStage) -> None:
    """The stage's layers, the embedding on the first stage only, the norm and head on the last only (a
    head tied to the embedding at pp=1 is no parameter of its own)."""
    layers = {int(name.split(".")[2]) for name in names if name.startswith("model.layers.")}
    assert layers == set(range(stage.start, stage.end))
    assert any(name.startswith("model.embed_tokens.") for name in names) == stage.is_first
    assert any(name.startswith("model.norm.") for name in names) == stage.is_last
    assert stage.is_last or not any(name.startswith("lm_head.") for name in names)


def one_process_tokens(tiny_model_factory: Callable[[str], str]) -> Callable[[str], list[list[int]]]:
    """The body of a test module's `one_process` fixture (module-scoped: `one_process =
    pytest.fixture(scope="module", name="one_process")(one_process_tokens)`): one_process(name) gives the
    greedy tokens of this workload in one process (uni executor), computed once per model. (Not a
    tests/distributed/conftest.py: that would shadow tests/conftest.py for `from conftest import`.)"""
    cache: dict[str, list[list[int]]] = {}

    def get(name: str) -> list[list[int]]:
        if name not in cache:
            cache[name], _ = run_engine(tiny_model_factory(name), NUM_BLOCKS[name])
        return cache[name]

    return get

"""Pipeline parallelism on gloo through `LLM`: greedy tokens of pp=2, pp=3 (uneven stages) and tp=2 x pp=2
equal one process's, with preemption (a tiny KV pool) and prefix caching (repeated prefixes); the layer
partition and the settings pp > 1 refuses."""

import json
import random
from collections.abc import Callable, Iterable

import pytest
from tp_utils import shutdown

from pagedserve import LLM, SamplingParams
from pagedserve.config import EngineArgs
from pagedserve.config.parallel import PP_LAYER_PARTITION_ENV, PipelineStage, pipeline_stages
from pagedserve.entrypoints.cli import main as cli_main
from pagedserve.errors import ConfigError

ENGINE_ARGS = dict(max_model_len=64, block_size=8, max_num_batched_tokens=16)
# KV blocks of 8 tokens: fewer than the 4 requests need at once, so some are preempted (recompute). With
# four KV cache groups (qwen3-4l) a request holds a block per group and token.
NUM_BLOCKS = {"llama-5l-tied": 10, "qwen3-4l": 28}
PREFIX = [random.Random(1).randrange(3, 49152) for _ in range(16)]  # two blocks shared by every prompt


def _prompts() -> list[dict[str, list[int]]]:
    rng = random.Random(0)
    return [
        {"prompt_token_ids": PREFIX + [rng.randrange(3, 49152) for _ in range(n)]} for n in (1, 9, 20, 30)
    ]


def _greedy_twice(llm: LLM) -> list[list[int]]:
    """Greedy tokens of the prompts, run twice: the second round starts from cached prefix blocks."""
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    return [
        list(out.outputs[0].token_ids)
        for _ in range(2)
        for out in llm.generate(_prompts(), params, use_tqdm=False)
    ]


def _run(
    model: str, num_blocks: int, tp: int = 1, pp: int = 1, **settings: object
) -> tuple[list[list[int]], int]:
    """(greedy tokens, preemptions) of one engine; checks that each rank holds only its stage's part."""
    llm = LLM(
        model,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        num_gpu_blocks_override=num_blocks,
        **ENGINE_ARGS,
        **settings,
    )
    try:
        engine = llm.llm_engine
        per_rank = engine.engine_core.executor.collective_rpc("parameter_shapes")
        for rank, shapes in enumerate(per_rank):
            _check_stage_parameters(shapes.keys(), engine.config.kv_layout.stages[rank // tp])
        return _greedy_twice(llm), engine.engine_core.get_stats().num_preemptions_total
    finally:
        shutdown(llm)


def _check_stage_parameters(names: Iterable[str], stage: PipelineStage) -> None:
    """The stage's layers, the embedding on the first stage only, the norm and head on the last only (a
    head tied to the embedding at pp=1 is no parameter of its own)."""
    layers = {int(name.split(".")[2]) for name in names if name.startswith("model.layers.")}
    assert layers == set(range(stage.start, stage.end))
    assert any(name.startswith("model.embed_tokens.") for name in names) == stage.is_first
    assert any(name.startswith("model.norm.") for name in names) == stage.is_last
    assert stage.is_last or not any(name.startswith("lm_head.") for name in names)


@pytest.fixture(scope="module")
def one_process(tiny_model_factory) -> Callable[[str], list[list[int]]]:
    """one_process(name): the greedy tokens of one process (uni executor), computed once per model."""
    cache: dict[str, list[list[int]]] = {}

    def get(name: str) -> list[list[int]]:
        if name not in cache:
            cache[name], _ = _run(tiny_model_factory(name), NUM_BLOCKS[name])
        return cache[name]

    return get


@pytest.mark.parametrize(
    ("name", "tp", "pp", "partition"),
    [
        ("llama-5l-tied", 1, 2, None),  # layers 0-2 | 3-4
        ("llama-5l-tied", 1, 3, "1,1,3"),
        ("qwen3-4l", 1, 2, None),  # KV cache groups (full + windowed) split over the stages
        ("llama-5l-tied", 2, 2, None),
    ],
)
def test_pp_greedy_equals_one_process(
    tiny_model_factory,
    one_process,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    tp: int,
    pp: int,
    partition: str | None,
) -> None:
    expected = one_process(name)
    if partition is not None:
        monkeypatch.setenv(PP_LAYER_PARTITION_ENV, partition)
    tokens, preemptions = _run(tiny_model_factory(name), NUM_BLOCKS[name], tp, pp)
    assert tokens == expected
    assert preemptions > 0


def test_swap_preemption_and_ngram_speculation_at_pp2(tiny_model_factory) -> None:
    """Each stage swaps its own layers' blocks; n-gram drafts are verified by the last stage's sampler."""
    settings = dict(
        preemption_mode="swap",
        swap_space=0.01,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3},
    )
    model, num_blocks = tiny_model_factory("llama-5l-tied"), NUM_BLOCKS["llama-5l-tied"]
    expected, _ = _run(model, num_blocks, **settings)
    tokens, preemptions = _run(model, num_blocks, 1, 2, **settings)
    assert tokens == expected
    assert preemptions > 0


def test_default_partition_gives_extra_layers_before_the_last_stage() -> None:
    spans = [(s.start, s.end) for s in pipeline_stages(5, 3)]
    assert spans == [(0, 2), (2, 4), (4, 5)]
    assert [(s.start, s.end) for s in pipeline_stages(8, 4)] == [(0, 2), (2, 4), (4, 6), (6, 8)]


@pytest.mark.parametrize("partition", ["2,2", "1,x,1", "0,2,3", "2,2,2"])
def test_bad_partition_names_the_variable(monkeypatch: pytest.MonkeyPatch, partition: str) -> None:
    monkeypatch.setenv(PP_LAYER_PARTITION_ENV, partition)
    with pytest.raises(ConfigError, match=PP_LAYER_PARTITION_ENV):
        pipeline_stages(5, 3)


@pytest.mark.parametrize(
    ("name", "settings", "match"),
    [
        ("falcon-7b", {}, "supports LlamaForCausalLM"),
        ("llama", {"pipeline_parallel_size": 3}, "exceeds the model's 2 layers"),
        ("llama", {"enable_lora": True}, "--enable-lora"),
        ("llama", {"distributed_executor_backend": "uni"}, "uni runs one rank"),
        ("llama", {"speculative_config": {"model": "{self}", "num_speculative_tokens": 2}}, "a draft model"),
    ],
)
def test_unsupported_settings_are_refused(tiny_model_factory, name: str, settings: dict, match: str) -> None:
    model = tiny_model_factory(name)
    if "speculative_config" in settings:  # the model drafts for itself
        settings = {"speculative_config": {**settings["speculative_config"], "model": model}}
    args = EngineArgs(model=model, **{"pipeline_parallel_size": 2, **settings})
    with pytest.raises(ConfigError, match=match):
        args.create_engine_config()


def test_gguf_pp2_greedy_equals_one_process() -> None:
    """The embedded SmolLM2 GGUF (30 layers, quantized blocks, a tied head): each stage decodes only its
    tensors, holds about half the layers, and the tokens are one process's."""
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    prompts = ["The capital of France is", "def fibonacci(n):"]
    tokens, weights = [], []
    for pp in (1, 2):
        llm = LLM(pipeline_parallel_size=pp, kv_cache_memory="16MiB", max_model_len=64)
        try:
            tokens.append([o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)])
            weights.append(
                [r.weights_bytes for r in llm.llm_engine.engine_core.executor.determine_kv_memory()]
            )
        finally:
            shutdown(llm)
    assert tokens[1] == tokens[0]
    assert len(weights[1]) == 2 and max(weights[1]) < 0.7 * weights[0][0]


def test_plan_numbers_are_the_engines_at_pp2(tiny_model_factory, capsys: pytest.CaptureFixture[str]) -> None:
    """`pagedserve plan -pp 2`: the largest stage's weights and block, the engine's block count."""
    model = tiny_model_factory("llama-5l-tied")
    settings = ["--kv-cache-memory", "1MiB", "--max-model-len", "64", "--dtype", "float32"]
    llm = LLM(model, pipeline_parallel_size=2, kv_cache_memory="1MiB", max_model_len=64, dtype="float32")
    try:
        core = llm.llm_engine.engine_core
        kv, reports = core.kv_cache_config, core.executor.determine_kv_memory()
    finally:
        shutdown(llm)
    assert cli_main(["plan", model, *settings, "-pp", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["pipeline_parallel_size"] == 2
    assert result["weights_bytes"] == max(report.weights_bytes for report in reports)
    assert (result["bytes_per_block"], result["num_blocks"]) == (kv.bytes_per_block, kv.num_blocks - 1)

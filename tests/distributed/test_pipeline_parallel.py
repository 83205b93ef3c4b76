"""Pipeline parallelism on gloo through `LLM`: greedy tokens of pp=2, pp=3 (uneven stages) and tp=2 x pp=2
equal one process's, with pp batches in flight, preemption (a tiny KV pool), prefix caching (repeated
prefixes) and an abort mid-flight, for every family's layers (MoE, fused checkpoints, Falcon's, windowed
KV groups) and with LoRA adapters or a draft model; the layer partition and the settings pp > 1 refuses."""

import json

import pytest
from lora_adapters import write_adapter
from pp_utils import NUM_BLOCKS, one_process_tokens, run_engine
from tp_utils import shutdown
from transformers import AutoConfig

from pagedserve import LLM, SamplingParams
from pagedserve.config import EngineArgs
from pagedserve.config.parallel import PP_LAYER_PARTITION_ENV, pipeline_stages
from pagedserve.entrypoints.cli import main as cli_main
from pagedserve.errors import ConfigError
from pagedserve.lora.request import LoRARequest

one_process = pytest.fixture(scope="module", name="one_process")(one_process_tokens)


@pytest.mark.parametrize(
    ("name", "tp", "pp", "partition"),
    [
        # (llama-5l-tied at pp=2, layers 0-2 | 3-4, is compared with one process by the swap, LoRA, draft
        # and GGUF tests below, with their features on)
        ("llama-5l-tied", 1, 3, "1,1,3"),
        ("qwen3-4l", 1, 2, None),  # KV cache groups (full + windowed) split over the stages
        ("llama-5l-tied", 2, 2, None),
        # The other families share the trunk and the stage rule: a seeded half of them per run.
        *(
            pytest.param(*case, marks=pytest.mark.sampled)
            for case in [
                # experts (and the shared expert) on stage 0 only: layer 1 is dense
                ("qwen2_moe", 1, 2, None),
                ("phi3", 1, 2, None),  # fused qkv_proj / gate_up_proj checkpoint tensors
                ("falcon-7b", 1, 2, None),  # its own names, parallel attention/MLP, LayerNorms, a tied head
                ("gemma2", 1, 2, None),  # a windowed layer, then a global one: one KV cache group per stage
                ("deepseek_v3", 1, 2, None),  # MLA (one latent tensor per layer), experts on stage 1
                ("gpt_oss", 1, 2, None),  # sinks, biases, a window layer then a full one, YaRN, experts
            ]
        ),
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
    tokens, stats = run_engine(tiny_model_factory(name), NUM_BLOCKS[name], tp, pp)
    assert tokens == expected
    assert stats.num_preemptions_total > 0


def _feature(
    feature: str, model: str, folder: str
) -> tuple[dict[str, object], list[LoRARequest | None] | None]:
    """(engine settings, adapter per prompt) of a feature: three adapters over two slots (each stage swaps
    its layers' part in and out), or the model drafting 3 tokens for itself, built whole beside the last
    stage's layers (its drafts are accepted: the draft model ran)."""
    if feature == "draft":
        return {"speculative_config": {"model": model, "num_speculative_tokens": 3}}, None
    config = AutoConfig.from_pretrained(model)
    a, b, c = (
        LoRARequest(f"a{seed}", seed, write_adapter(f"{folder}/a{seed}", config, 8, 16, seed=seed))
        for seed in (1, 2, 3)
    )
    return dict(enable_lora=True, max_loras=2, max_lora_rank=8), [a, None, b, c]


@pytest.mark.parametrize("feature", ["lora", "draft"])
def test_feature_at_pp2_equals_one_process(tiny_model_factory, one_process, tmp_path, feature: str) -> None:
    """LoRA: each stage holds its own layers' slots; the adapters change the tokens (not the base model's
    request). A draft model runs whole on the last stage: as in one process, every draft is accepted."""
    name = "llama-5l-tied"
    model = tiny_model_factory(name)
    settings, lora = _feature(feature, model, str(tmp_path))
    expected, one = run_engine(model, NUM_BLOCKS[name], lora=lora, **settings)
    tokens, staged = run_engine(model, NUM_BLOCKS[name], 1, 2, lora=lora, **settings)
    assert tokens == expected
    assert staged.num_preemptions_total > 0
    if lora is not None:
        changed = [t != base for t, base in zip(tokens, one_process(name))]
        assert changed == [adapter is not None for adapter in lora * 2 + lora[:3]]
    else:
        # NOTE: the model drafts for itself: every draft is accepted. The counts differ from one process's
        # with micro-batches in flight (another schedule: other preemptions, which drop drafts).
        for stats in (one, staged):
            assert stats.spec_decode_num_accepted_tokens == stats.spec_decode_num_draft_tokens > 0


def test_swap_preemption_and_ngram_speculation_at_pp2(tiny_model_factory) -> None:
    """Each stage swaps its own layers' blocks; n-gram drafts are verified by the last stage's sampler."""
    settings = dict(
        preemption_mode="swap",
        swap_space=0.01,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3},
    )
    model, num_blocks = tiny_model_factory("llama-5l-tied"), NUM_BLOCKS["llama-5l-tied"]
    expected, _ = run_engine(model, num_blocks, **settings)
    tokens, stats = run_engine(model, num_blocks, 1, 2, **settings)
    assert tokens == expected
    assert stats.num_preemptions_total > 0


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
        ("llama", {"pipeline_parallel_size": 3}, "exceeds the model's 2 layers"),
        ("llama", {"distributed_executor_backend": "uni"}, "uni runs one rank"),
        ("llama", {"runner": "pooling"}, "does not serve pooling models"),
    ],
)
def test_unsupported_settings_are_refused(tiny_model_factory, name: str, settings: dict, match: str) -> None:
    model = tiny_model_factory(name)
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
    """`pagedserve plan -pp 2`: the largest stage's weights (its layers' LoRA slots too) and block, the
    engine's block count."""
    model = tiny_model_factory("llama-5l-tied")
    settings = ["--kv-cache-memory", "1MiB", "--max-model-len", "64", "--dtype", "float32", "--enable-lora"]
    llm = LLM(
        model,
        pipeline_parallel_size=2,
        kv_cache_memory="1MiB",
        max_model_len=64,
        dtype="float32",
        enable_lora=True,
    )
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

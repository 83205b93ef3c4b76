"""DeepSeek V2 and V3 (multi-head latent attention, grouped expert routing, YaRN) against HF transformers
in float32: greedy tokens identical and each token's logprob within 1e-4 (test_greedy_vs_hf's tolerance),
through chunked prefill, recompute preemption and prefix-cache hits, on the torch backend (decodes
absorbed over the latent, prefill chunks expanded) and the native CPU kernel (every token absorbed). And
the config fields outside what is implemented are refused at startup, naming the field and value."""

import json
import os
import shutil

import pytest
from test_greedy_vs_hf import PROMPT_LENS, assert_matches, make_prompts, reference, run

from pagedserve import SamplingParams
from pagedserve.config import EngineArgs
from pagedserve.entrypoints.cli import main as cli_main
from pagedserve.errors import ConfigError

BLOCK_SIZE = 8


@pytest.mark.parametrize("backend", ["cpu", pytest.param("torch", marks=pytest.mark.sampled)])
def test_v3_matches_hf_through_chunks_preemption_and_prefix_hits(tiny_model_factory, backend: str) -> None:
    path = tiny_model_factory("deepseek_v3")
    prompts = make_prompts(0, PROMPT_LENS)
    # One full-length request's blocks and three more; 16-token steps chunk every long prompt.
    num_blocks = 128 // BLOCK_SIZE + 3
    ours, llm = run(
        path,
        prompts,
        block_size=BLOCK_SIZE,
        max_model_len=128,
        num_gpu_blocks_override=num_blocks,
        max_num_batched_tokens=16,
        attention_backend=backend,
    )
    core = llm.llm_engine.engine_core
    assert core.get_stats().num_preemptions_total > 0, "the pool was meant to force preemption"
    assert_matches(ours, reference(path, prompts))
    # The longest prompt again: its blocks are in the prefix cache (the last request to finish).
    hits = core.get_stats().prefix_cache_hits
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    again = llm.generate([{"prompt_token_ids": prompts[-1]}], params, use_tqdm=False)[0]
    assert core.get_stats().prefix_cache_hits - hits >= BLOCK_SIZE
    assert again.outputs[0].token_ids == reference(path, prompts)[-1][0]
    assert core.block_snapshot().num_free_blocks == num_blocks - 1


@pytest.mark.sampled
def test_v2_matches_hf(tiny_model_factory) -> None:
    path = tiny_model_factory("deepseek_v2")
    prompts = make_prompts(1, PROMPT_LENS)
    ours, _ = run(path, prompts, block_size=16, kv_cache_memory="8MiB", max_num_batched_tokens=32)
    assert_matches(ours, reference(path, prompts))


def test_kimi_k2_style_config_matches_hf(tiny_model_factory, tmp_path) -> None:
    """A V3 with Kimi-K2's routing and YaRN whose config.json says model_type kimi_k2 (its config class is
    remote code, never run): read as DeepSeek V3's config, greedy tokens and logprobs as HF's V3."""
    path = tiny_model_factory("deepseek_v3-kimi")
    kimi = tmp_path / "kimi"
    shutil.copytree(path, kimi)
    config = json.loads((kimi / "config.json").read_text())
    config.update(model_type="kimi_k2", auto_map={"AutoConfig": "configuration_deepseek.DeepseekV3Config"})
    (kimi / "config.json").write_text(json.dumps(config))
    prompts = make_prompts(2, PROMPT_LENS)
    ours, _ = run(str(kimi), prompts, block_size=16, kv_cache_memory="8MiB", max_num_batched_tokens=32)
    assert_matches(ours, reference(path, prompts))


@pytest.mark.parametrize(
    "field,value,named",
    [
        ("scoring_func", "softmax", "scoring_func='softmax'"),  # V2's scoring on a V3 model
        ("topk_method", "greedy", "topk_method='greedy'"),
        ("rope_scaling", {"type": "dynamic", "factor": 2.0}, "rope_type='dynamic'"),
    ],
)
def test_unimplemented_config_fields_are_refused(
    tmp_path, capsys: pytest.CaptureFixture[str], field: str, value: object, named: str
) -> None:
    data = os.path.join(os.path.dirname(__file__), os.pardir, "data", "deepseek-v3", "config.json")
    with open(data) as f:
        config = json.load(f)
    config[field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit):
        cli_main(["plan", str(tmp_path), "--json"])
    assert f"config.json asks for {named}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args,named",
    [
        ({"speculative_config": {"method": "deepseek_mtp", "num_speculative_tokens": 1}}, "'deepseek_mtp'"),
        ({"enable_lora": True}, "--enable-lora does not support DeepseekV3ForCausalLM"),
    ],
)
def test_mtp_draft_and_lora_are_refused(tiny_model_factory, args: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        EngineArgs(model=tiny_model_factory("deepseek_v3"), **args).create_engine_config()


@pytest.mark.sampled
def test_fp8_latent_cache_same_on_both_backends_and_close_to_hf(tiny_model_factory) -> None:
    """An fp8 cache stores each latent rounded (one scale per layer, from the first batch): both backends
    read the same values, so their tokens are equal; each first token's logprob (the distribution's peak)
    stays near HF's float32 one."""
    path = tiny_model_factory("deepseek_v3")
    prompts = make_prompts(2, [9, 40])
    outputs = {
        backend: run(
            path,
            prompts,
            kv_cache_memory="8MiB",
            kv_cache_dtype="fp8",
            calculate_kv_scales=True,
            attention_backend=backend,
        )[0]
        for backend in ("cpu", "torch")
    }
    assert [tokens for tokens, _ in outputs["cpu"]] == [tokens for tokens, _ in outputs["torch"]]
    for (_, logprobs), (_, hf_logprobs) in zip(outputs["cpu"], reference(path, prompts)):
        assert abs(logprobs[0] - hf_logprobs[0]) < 0.1

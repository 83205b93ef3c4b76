"""gpt-oss against HF transformers (float32, eager attention with its sinks): greedy tokens and logprobs
for prompts longer than its sliding window, with chunked prefill, recompute preemption and prefix-cache
hits; on the native CPU kernel (the default) and the torch backend. An MXFP4 checkpoint (its experts
quantized from the random float ones: E2M1 values times power-of-two scales) kept packed gives HF's
greedy tokens on its dequantized weights, and `pagedserve plan` counts gpt-oss-20b's real config. Config
fields it does not implement are refused at startup, naming the field and value."""

import json
import os
import re
import shutil
import sys

import pytest
import torch
from mxfp4_checkpoint import write_mxfp4_checkpoint
from test_greedy_vs_hf import MAX_TOKENS, assert_matches, make_prompts, reference, run, run_with_preemption

from pagedserve import LLM, SamplingParams
from pagedserve.entrypoints.cli import main as cli_main
from pagedserve.errors import ConfigError
from pagedserve.quantization.resident import resident_weights

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "kernels"))
from interpreted_triton import import_triton_kernels  # noqa: E402

# NOTE: at import, before any engine: kernels defined once for the GPU cannot be called interpreted later.
import_triton_kernels()

GPT_OSS_20B = os.path.join(os.path.dirname(__file__), os.pardir, "data", "gpt-oss-20b", "config.json")
# The tiny config's window is 24: the two longer prompts outgrow it.
PROMPTS = make_prompts(0, [3, 40, 101])


@pytest.fixture(scope="module")
def gpt_oss(tiny_model_factory) -> str:
    return tiny_model_factory("gpt_oss")


@pytest.mark.sampled  # the other tests run the native kernel (the default) every day
def test_torch_backend_matches_hf(gpt_oss: str) -> None:
    ours, _ = run(gpt_oss, PROMPTS, block_size=16, kv_cache_memory="64MiB", attention_backend="torch")
    assert_matches(ours, reference(gpt_oss, PROMPTS))


def test_preemption_chunked_prefill_and_prefix_hits_match_hf(gpt_oss: str) -> None:
    """A pool of 24 blocks of 8 tokens (a 128-token request holds 16 in the full-attention group and at
    most 4 in the window group) and 16-token steps: prompts are chunked and requests recomputed after
    preemption; the same prompts again then hit the prefix cache (the window group serving only the
    blocks its window reads)."""
    num_blocks = 24
    llm = run_with_preemption(gpt_oss, PROMPTS, 8, num_blocks)
    core = llm.llm_engine.engine_core
    hits_before = core.get_stats().prefix_cache_hits
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    again = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    assert core.get_stats().prefix_cache_hits > hits_before
    assert [o.outputs[0].token_ids for o in again] == [tokens for tokens, _ in reference(gpt_oss, PROMPTS)]
    assert core.block_snapshot().num_free_blocks == num_blocks - 1


@pytest.mark.parametrize(
    "field,value,named",
    [
        ("rope_parameters", {"rope_type": "dynamic", "factor": 2.0}, "rope_type='dynamic'"),
        ("layer_types", ["sliding_attention", "chunked_attention"], "'chunked_attention'"),
        ("num_experts_per_tok", 5, "num_experts_per_tok=5"),
    ],
)
def test_config_fields_outside_the_implementation_are_refused(
    tmp_path, gpt_oss: str, field: str, value: object, named: str
) -> None:
    for name in os.listdir(gpt_oss):
        if name != "model.safetensors":
            shutil.copy(os.path.join(gpt_oss, name), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(ConfigError, match=re.escape(named)):
        LLM(str(tmp_path))


@pytest.fixture(scope="module")
def gpt_oss_mxfp4(tmp_path_factory, gpt_oss: str) -> tuple[str, str]:
    """(an MXFP4 checkpoint of the tiny model, the same model in float32 with the dequantized experts)."""
    packed, dequantized = (str(tmp_path_factory.mktemp(name)) for name in ("mxfp4", "dequantized"))
    return write_mxfp4_checkpoint(gpt_oss, packed, dequantized), dequantized


@pytest.mark.parametrize(
    "backend",
    [
        "native",
        pytest.param("torch", marks=pytest.mark.sampled),
        pytest.param("triton", marks=pytest.mark.sampled),
    ],
)
def test_mxfp4_experts_stay_packed_and_match_hf(
    gpt_oss_mxfp4: tuple[str, str], backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """native and triton (interpreted on CPU) multiply ggml MXFP4 rows on their block kernels, torch widens
    the checkpoint's blocks per step; each gives HF's greedy tokens on the dequantized experts. native on
    float32 activations, for logprobs within 1e-4 (its default 16-bit ones: the GGUF test's greedy tokens)."""
    if backend == "native":
        monkeypatch.setenv("PAGEDSERVE_GGUF_ACTIVATION_BITS", "32")
    packed, dequantized = gpt_oss_mxfp4
    prompts = PROMPTS[:2]  # the experts are what differs: the long prompt's attention is checked above
    ours, llm = run(packed, prompts, block_size=16, kv_cache_memory="64MiB", linear_backend=backend)
    assert_matches(ours, reference(dequantized, prompts))
    model = llm.llm_engine.engine_core.executor.worker.model_runner.model
    experts = model.model.layers[0].mlp.experts
    stored = experts.w13_blocks if backend == "torch" else experts.w13_rows
    assert stored.dtype == torch.uint8 and not hasattr(experts, "w13_weight")
    kernels = "widened per step (torch)" if backend == "torch" else f"packed, {backend} block kernels"
    assert f"mxfp4 {kernels}" in resident_weights(model).describe()


def test_plan_counts_gpt_oss_20b(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """gpt-oss-20b's config.json (tests/data): experts at 4.25 bits a weight, everything else in bfloat16;
    KV bytes per token 2 (K, V) x 24 layers x 8 KV heads x 64 x 2 bytes, a block holding one KV cache
    group's 12 layers."""
    assert (
        cli_main(["plan", GPT_OSS_20B, "--json", "--kv-cache-memory", "8GiB", "--max-model-len", "8192"]) == 0
    )
    plan = json.loads(capsys.readouterr().out)
    layers, experts, hidden, intermediate, vocab = 24, 32, 2880, 2880, 201088
    expert_weights = layers * experts * 3 * hidden * intermediate
    attention = layers * (hidden * (64 + 2 * 8) * 64 + (64 + 2 * 8) * 64 + 64 * 64 * hidden + hidden + 64)
    others = (
        attention
        + layers * (experts * (hidden + 1 + 2 * intermediate + hidden) + 2 * hidden)  # router, biases, norms
        + 2 * vocab * hidden
        + hidden
    )
    assert plan["weights_bytes"] == expert_weights * 17 // 32 + 2 * others
    assert plan["weights_format"] == "mxfp4 experts packed (block kernels); the rest in bfloat16"
    assert plan["kv_bytes_per_token"] == 2 * 24 * 8 * 64 * 2
    assert plan["bytes_per_block"] == 12 * 2 * 8 * 64 * 2 * 16

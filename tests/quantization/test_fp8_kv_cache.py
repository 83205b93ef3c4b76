"""fp8 KV cache: both backends read what they wrote (against a float cache holding the same rounded
values), the same --kv-cache-memory holds 4x the float32 blocks (2x bfloat16), greedy stays close."""

import pytest
import torch

from pagedserve import LLM, SamplingParams
from pagedserve.attention.backends.base import AttentionLayerSpec
from pagedserve.attention.backends.cpu_native import CpuNativeAttentionBackend
from pagedserve.attention.backends.torch_paged import TorchPagedAttentionBackend
from pagedserve.attention.kv_quant import FP8_DTYPES, KVQuantization
from pagedserve.kernels import cpu as cpu_kernels
from tests.kernels.paged_batches import NUM_BLOCKS, make_batch

BACKENDS = [TorchPagedAttentionBackend, CpuNativeAttentionBackend]


@pytest.mark.parametrize("backend_class", BACKENDS, ids=lambda c: c.name)
@pytest.mark.parametrize("cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_cache_reads_back_the_rounded_values(backend_class: type, cache_dtype: str) -> None:
    if backend_class is CpuNativeAttentionBackend and cpu_kernels.load_cpu_kernels().error:
        pytest.skip(f"native CPU kernels unavailable: {cpu_kernels.load_cpu_kernels().error}")
    torch.manual_seed(0)
    block_size, heads, kv_heads, dim = 16, 4, 2, 32
    quant = KVQuantization(FP8_DTYPES[cache_dtype], k_scale=0.05, v_scale=0.02)
    fp8_spec = AttentionLayerSpec(heads, kv_heads, dim, dim**-0.5, kv_quant=quant)
    float_spec = AttentionLayerSpec(heads, kv_heads, dim, dim**-0.5)
    # decodes over cached tokens, then a prefill chunk after a cached prefix, then a fresh prompt
    common = make_batch([(20, 1), (3, 1), (17, 9), (0, 12)], block_size, seed=1)
    shape = (NUM_BLOCKS, block_size, kv_heads, dim)
    fp8_cache = (torch.zeros(shape, dtype=torch.uint8), torch.zeros(shape, dtype=torch.uint8))
    float_cache = (torch.zeros(shape), torch.zeros(shape))
    num_tokens = common.query_start_loc[-1]
    backend = backend_class()
    # the cached tokens: written by a first step through the fp8 path, mirrored rounded in the float cache
    past = torch.randn(2, NUM_BLOCKS * block_size, kv_heads, dim)
    all_slots = torch.arange(NUM_BLOCKS * block_size)
    for cache, scale, values, mirror in zip(fp8_cache, (quant.k_scale, quant.v_scale), past, float_cache):
        cache.view(-1, kv_heads, dim).copy_(quant.quantize(values, scale))
        mirror.view(-1, kv_heads, dim).copy_(
            quant.dequantize(cache.view(-1, kv_heads, dim)[all_slots], scale, torch.float32)
        )
    q = torch.randn(num_tokens, heads * dim)
    k, v = torch.randn(num_tokens, kv_heads * dim), torch.randn(num_tokens, kv_heads * dim)
    rounded_k = quant.dequantize(quant.quantize(k, quant.k_scale), quant.k_scale, torch.float32)
    rounded_v = quant.dequantize(quant.quantize(v, quant.v_scale), quant.v_scale, torch.float32)
    out = backend.forward(fp8_spec, q, k, v, fp8_cache, backend.build_metadata(common))
    expected = backend.forward(
        float_spec, q, rounded_k, rounded_v, float_cache, backend.build_metadata(common)
    )
    fresh = common.query_start_loc[3]  # the fresh prompt attends its own k/v as computed, not as stored
    torch.testing.assert_close(out[:fresh], expected[:fresh], atol=1e-5, rtol=1e-5)
    unrounded = backend.forward(
        float_spec, q, k, v, tuple(c.clone() for c in float_cache), backend.build_metadata(common)
    )
    torch.testing.assert_close(out[fresh:], unrounded[fresh:], atol=1e-5, rtol=1e-5)


def _engine(model: str, **kwargs: object) -> LLM:
    return LLM(model, kv_cache_memory="8MiB", max_model_len=256, **kwargs)


def test_fp8_holds_4x_the_float32_blocks_and_2x_bfloat16(tiny_llama: str) -> None:
    """And a bfloat16 cache of a float32 model twice its blocks (as a bfloat16 model's own)."""

    def blocks(**kwargs: object) -> int:
        return _engine(tiny_llama, **kwargs).llm_engine.engine_core.kv_cache_config.num_blocks

    float32, fp8, bf16_cache = blocks(), blocks(kv_cache_dtype="fp8"), blocks(kv_cache_dtype="bfloat16")
    bf16, bf16_fp8 = blocks(dtype="bfloat16"), blocks(dtype="bfloat16", kv_cache_dtype="fp8_e5m2")
    assert fp8 == 4 * float32 and bf16_fp8 == 2 * bf16, (float32, fp8, bf16, bf16_fp8)
    assert bf16_cache == 2 * float32 == bf16, (float32, bf16_cache, bf16)


def _prompt_logprobs(llm: LLM, sequences: list[list[int]]) -> torch.Tensor:
    """Teacher-forced logprob of every token after the first, all sequences concatenated."""
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": s} for s in sequences], params, use_tqdm=False)
    return torch.tensor(
        [
            entry[token]
            for output, sequence in zip(outputs, sequences)
            for entry, token in zip(output.prompt_logprobs[1:], sequence[1:])
        ]
    )


@pytest.mark.parametrize(
    ("kv_cache_dtype", "calculate_kv_scales", "bound"),
    [("fp8", False, 0.05), ("fp8", True, 0.05), ("bfloat16", False, 0.005)],
)
def test_fp8_logprobs_stay_close_to_the_float_cache(
    tiny_llama: str, kv_cache_dtype: str, calculate_kv_scales: bool, bound: float
) -> None:
    """A random tiny model's logits are nearly tied, so greedy tokens would flip on any rounding: its
    teacher-forced logprobs are compared instead (SmolLM2's greedy and perplexity: benchmarks/accuracy.py).
    A bfloat16 cache (8 mantissa bits to e4m3's 3) stays ten times closer."""
    generator = torch.Generator().manual_seed(0)
    sequences = [torch.randint(10, 40000, (n,), generator=generator).tolist() for n in (8, 40, 90)]
    # NOTE: prompts chunked by 16 tokens, so later chunks attend their prefix through the cache
    chunked = dict(max_num_batched_tokens=16, max_num_seqs=4)
    reference = _prompt_logprobs(_engine(tiny_llama, **chunked), sequences)
    llm = _engine(
        tiny_llama, kv_cache_dtype=kv_cache_dtype, calculate_kv_scales=calculate_kv_scales, **chunked
    )
    error = (_prompt_logprobs(llm, sequences) - reference).abs()
    print(
        f"{kv_cache_dtype} KV, calculate_kv_scales={calculate_kv_scales}: |logprob error| mean "
        f"{error.mean():.2e}, max {error.max():.2e}, reference mean {reference.mean():.2f}"
    )
    assert 0 < error.max() < bound * reference.abs().mean()
    runner = llm.llm_engine.engine_core.executor.worker.model_runner
    assert runner.kv_caches[0][0].dtype == (torch.uint8 if kv_cache_dtype == "fp8" else torch.bfloat16)
    quant = runner.attention_layers[0].spec.kv_quant
    if kv_cache_dtype == "fp8":
        assert not quant.scales_pending and (quant.k_scale != 1.0) == calculate_kv_scales
    else:
        assert quant is None

"""fp8 KV cache: both backends read what they wrote (against a float cache holding the same rounded
values), the key rotation leaves attention unchanged and shrinks the logits' rounding error, the same
--kv-cache-memory holds 4x the float32 blocks (2x bfloat16), greedy stays close."""

import pytest
import torch

from pagedserve import LLM, SamplingParams
from pagedserve.attention.backends.base import AttentionLayerSpec
from pagedserve.attention.backends.cpu_native import CpuNativeAttentionBackend
from pagedserve.attention.backends.torch_paged import TorchPagedAttentionBackend
from pagedserve.attention.kv_quant import FP8_DTYPES, KVQuantization, key_rotation
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
    # Every token, the fresh prompt's included, attends the K/V as stored (rounded).
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
def test_key_rotation_is_orthonormal_and_spreads_every_channel(head_dim: int) -> None:
    rotation = key_rotation(head_dim, torch.float64, torch.device("cpu"))
    torch.testing.assert_close(rotation @ rotation.T, torch.eye(head_dim, dtype=torch.float64))
    block = head_dim & -head_dim  # each channel spread evenly over its block of the largest power of two
    assert ((rotation != 0).sum(dim=0) == block).all()
    assert torch.allclose(rotation[rotation != 0].abs(), torch.tensor(block**-0.5, dtype=torch.float64))


@pytest.mark.parametrize("soft_cap", [None, 30.0])
def test_rotated_and_shifted_keys_leave_attention_unchanged(soft_cap: float | None) -> None:
    """Through the torch backend on float caches: attention over (q R, (k - m) R) equals attention over
    (q, k), prefix and fresh tokens alike; a soft cap (not shift-invariant) gets no offset."""
    torch.manual_seed(0)
    block_size, heads, kv_heads, dim = 16, 4, 2, 64
    spec = AttentionLayerSpec(heads, kv_heads, dim, dim**-0.5, logits_soft_cap=soft_cap)
    common = make_batch([(20, 1), (17, 9), (0, 12)], block_size, seed=1)
    num_tokens = common.query_start_loc[-1]
    prefix = torch.randn(NUM_BLOCKS * block_size, kv_heads * dim) + 3.0  # keys with a common offset
    q, k = torch.randn(num_tokens, heads * dim), torch.randn(num_tokens, kv_heads * dim) + 3.0
    v = torch.randn(num_tokens, kv_heads * dim)
    quant = KVQuantization(FP8_DTYPES["fp8"], rotate_keys=True, scales_pending=True)
    quant.calculate_scales(prefix, v, kv_heads, dim, shift_invariant=soft_cap is None)
    assert (quant.key_offset is None) == (soft_cap is not None)
    backend = TorchPagedAttentionBackend()
    shape = (NUM_BLOCKS, block_size, kv_heads, dim)
    values = torch.randn(shape)
    plain_cache = (prefix.view(shape).clone(), values.clone())
    rotated_cache = (quant.transform(prefix, prefix, kv_heads, dim)[1].view(shape).clone(), values.clone())
    expected = backend.forward(spec, q, k, v, plain_cache, backend.build_metadata(common))
    out = backend.forward(
        spec, *quant.transform(q, k, kv_heads, dim), v, rotated_cache, backend.build_metadata(common)
    )
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


def test_rotation_shrinks_the_rounding_error_of_outlier_dominated_logits() -> None:
    """Keys whose logits are carried by two large channels (as real models' are): the fp8 logits' error
    of rotated keys, mean key subtracted, is a fraction of the unrotated keys'."""
    torch.manual_seed(0)
    dim, num_keys = 64, 512
    q, k = torch.randn(8, dim), torch.randn(num_keys, dim)
    q[:, :2] *= 4.0
    k[:, :2] = k[:, :2] + 12.0
    logits = q @ k.T

    def logit_error(quant: KVQuantization) -> float:
        quant.calculate_scales(k, k, 1, dim, shift_invariant=True)
        rotated_q, stored = quant.transform(q, k, 1, dim)
        rounded = quant.dequantize(quant.quantize(stored, quant.k_scale), quant.k_scale, torch.float32)
        shift = (logits - rotated_q @ stored.T)[:, :1]  # q . m, the same for every key of a query
        return (rotated_q @ rounded.T + shift - logits).abs().mean().item()

    plain = logit_error(KVQuantization(FP8_DTYPES["fp8"]))
    rotated = logit_error(KVQuantization(FP8_DTYPES["fp8"], rotate_keys=True))
    assert rotated < plain / 3, (rotated, plain)


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
            entry[token].logprob
            for output, sequence in zip(outputs, sequences)
            for entry, token in zip(output.prompt_logprobs[1:], sequence[1:])
        ]
    )


@pytest.mark.sampled
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


@pytest.mark.sampled
@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "bfloat16"])
def test_a_rounding_cache_gives_the_same_output_however_the_prompt_was_computed(
    tiny_llama: str, kv_cache_dtype: str
) -> None:
    """Every token attends the K/V as stored: a fresh prompt, the same prompt as a prefix-cache hit, and
    the prompt chunked at 48 tokens give the same tokens and logprobs (a fresh prompt attending its own
    unrounded K/V differed)."""
    prompt = {"prompt_token_ids": list(range(1000, 1054))}
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=1, ignore_eos=True)

    def run(llm: LLM) -> tuple[list[int], list[float]]:
        sample = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
        return sample.token_ids, [lp[t].logprob for lp, t in zip(sample.logprobs, sample.token_ids)]

    cached = _engine(tiny_llama, kv_cache_dtype=kv_cache_dtype, enable_prefix_caching=True)
    fresh_tokens, fresh_logprobs = run(cached)
    hit_tokens, hit_logprobs = run(cached)
    assert cached.llm_engine.engine_core.get_stats().prefix_cache_hits > 0
    chunked_tokens, chunked_logprobs = run(
        _engine(tiny_llama, kv_cache_dtype=kv_cache_dtype, max_num_batched_tokens=48)
    )
    assert fresh_tokens == hit_tokens == chunked_tokens
    assert hit_logprobs == pytest.approx(fresh_logprobs, abs=1e-5)
    assert chunked_logprobs == pytest.approx(fresh_logprobs, abs=1e-5)

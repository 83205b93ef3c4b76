"""The native CPU paged-attention kernel and the cpu backend: against the torch reference backend, and
each token's output the same bits however its step was cut and whatever shares it."""

from dataclasses import replace
from typing import Any

import pytest
import torch
from paged_batches import NUM_BLOCKS, forward_on_both_backends, make_batch, random_cache

from pagedserve import LLM, SamplingParams
from pagedserve.attention.backends import select_attention_backend
from pagedserve.attention.backends.base import AttentionLayerSpec, CommonAttentionMetadata
from pagedserve.attention.backends.cpu_native import CpuNativeAttentionBackend
from pagedserve.attention.backends.torch_paged import TorchPagedAttentionBackend
from pagedserve.attention.kv_quant import FP8_DTYPES, KVQuantization
from pagedserve.config import EngineArgs
from pagedserve.errors import ConfigError
from pagedserve.kernels import cpu as cpu_kernels
from pagedserve.platforms.cpu import CpuPlatform

TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}  # abs for fp32, else rel


@pytest.fixture(scope="module", autouse=True)
def kernels_built() -> None:
    error = cpu_kernels.load_cpu_kernels().error
    if error is not None:
        pytest.skip(f"native CPU kernels unavailable: {error}")


def decode_lens(block_size: int) -> list[int]:
    """Length 1, block ends, and mid-block ends."""
    return [1, block_size, 3 * block_size, block_size + 1, 2 * block_size - 1, 5 * block_size + 3]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 2), (4, 4)], ids=["gqa", "mha"])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_kernel_matches_torch_backend(
    block_size: int, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> None:
    torch.manual_seed(block_size + head_dim + num_heads)
    spec = AttentionLayerSpec(num_heads, num_kv_heads, head_dim, scale=head_dim**-0.5)
    common = make_batch([(n - 1, 1) for n in decode_lens(block_size)], block_size, seed=head_dim)
    key_cache, value_cache = random_cache(block_size, spec, dtype)
    q = torch.randn(common.num_decodes, num_heads, head_dim).to(dtype)

    out = cpu_kernels.paged_attention(
        q, key_cache, value_cache, common.block_tables, torch.tensor(common.seq_lens), spec.scale
    )
    torch_backend = TorchPagedAttentionBackend()  # reference in float32 on the same (rounded) values
    expected = torch_backend.attend_decodes(
        spec,
        q.float(),
        key_cache.float(),
        value_cache.float(),
        torch_backend.build_decode_metadata(common, common.num_decodes),
    )
    assert out.dtype == dtype and out.shape == q.shape
    error = (out.float() - expected).abs().max().item()
    if dtype != torch.float32:
        error /= expected.abs().max().item()
    assert error < TOLERANCE[dtype]


@pytest.mark.parametrize("head_dim", [40, 80, 96])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(9, 3), (14, 2), (5, 1)], ids=["g3", "g7", "g5"])
def test_kernel_matches_torch_backend_on_every_head_grouping(
    num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    """Query heads per kv head below, at and past the four whose V pass is shared (3, 7, 5), and head
    dims that leave a partial 64-column tile or are not a whole number of vectors (the scalar paths)."""
    torch.manual_seed(head_dim + num_heads)
    spec = AttentionLayerSpec(num_heads, num_kv_heads, head_dim, scale=head_dim**-0.5)
    common = make_batch([(n - 1, 1) for n in decode_lens(16)], 16, seed=head_dim)
    key_cache, value_cache = random_cache(16, spec, torch.float32)
    q = torch.randn(common.num_decodes, num_heads, head_dim)
    out = cpu_kernels.paged_attention(
        q, key_cache, value_cache, common.block_tables, torch.tensor(common.seq_lens), spec.scale
    )
    torch_backend = TorchPagedAttentionBackend()
    expected = torch_backend.attend_decodes(
        spec, q, key_cache, value_cache, torch_backend.build_decode_metadata(common, common.num_decodes)
    )
    assert (out - expected).abs().max().item() < TOLERANCE[torch.float32]


def test_kernel_takes_int32_and_strided_inputs() -> None:
    spec = AttentionLayerSpec(6, 2, 64, scale=0.125)
    common = make_batch([(20, 1), (0, 1), (40, 1)], 16, seed=1)
    key_cache, value_cache = random_cache(16, spec, torch.float32)
    q = torch.randn(3, 6, 64)
    lens = torch.tensor(common.seq_lens)
    tables = common.block_tables
    expected = cpu_kernels.paged_attention(q, key_cache, value_cache, tables, lens, 0.125)
    column_major = tables.t().contiguous().t()
    for variant in (tables.int(), column_major, column_major.int()):
        assert torch.equal(
            cpu_kernels.paged_attention(q, key_cache, value_cache, variant, lens, 0.125), expected
        )
    strided_q = torch.randn(6, 3, 64).transpose(0, 1)
    assert torch.equal(
        cpu_kernels.paged_attention(strided_q, key_cache, value_cache, tables, lens, 0.125),
        cpu_kernels.paged_attention(strided_q.contiguous(), key_cache, value_cache, tables, lens, 0.125),
    )


def test_kernel_rejects_block_ids_outside_the_cache() -> None:
    spec = AttentionLayerSpec(4, 4, 64, scale=0.125)
    key_cache, value_cache = random_cache(8, spec, torch.float32)
    tables = torch.tensor([[3, NUM_BLOCKS]])
    with pytest.raises(RuntimeError, match="outside the cache"):
        cpu_kernels.paged_attention(
            torch.randn(1, 4, 64), key_cache, value_cache, tables, torch.tensor([9]), 0.125
        )


def test_kernel_rejects_more_queries_than_tokens() -> None:
    spec = AttentionLayerSpec(4, 4, 64, scale=0.125)
    key_cache, value_cache = random_cache(8, spec, torch.float32)
    with pytest.raises(RuntimeError, match="request 0 has 4 query tokens"):
        cpu_kernels.paged_attention(
            torch.randn(4, 4, 64),
            key_cache,
            value_cache,
            torch.tensor([[3]]),
            torch.tensor([3]),
            0.125,
            query_start_loc=torch.tensor([0, 4]),
        )


# (sliding_window, logits_soft_cap): plain; a window shorter than most requests (it cuts the cached prefix,
# the chunk and the fresh prefill); Gemma 2's soft cap with a window.
SCORING = [(None, None), (11, None), (20, 5.0)]
# Decodes, chunks over a cached prefix (short: a verification; long), fresh prompts.
MIXED_REQUESTS = [(0, 1), (37, 1), (7, 1), (19, 13), (50, 2), (0, 21), (3, 40), (9, 3), (0, 70)]


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window,soft_cap", SCORING)
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_mixed_batch_through_backend_matches_torch(
    block_size: int, window: int | None, soft_cap: float | None, cache_dtype: torch.dtype
) -> None:
    """Decodes, chunks over a cached prefix and fresh prefills in one step, every token through the native
    kernel: the torch backend's outputs and the same K/V written."""
    torch.manual_seed(block_size)
    spec = AttentionLayerSpec(8, 2, 64, scale=0.125, sliding_window=window, logits_soft_cap=soft_cap)
    common = make_batch(MIXED_REQUESTS, block_size, seed=2)
    num_tokens = common.query_start_loc[-1]
    q = torch.randn(num_tokens, spec.num_heads * spec.head_dim)
    k, v = (torch.randn(num_tokens, spec.num_kv_heads * spec.head_dim) for _ in range(2))
    # a float32 model's cache (--kv-cache-dtype auto), or bfloat16 (both backends read the same rounded values)
    caches = random_cache(block_size, spec, cache_dtype)
    outputs, written = forward_on_both_backends(spec, (q, k, v), caches, common)
    assert outputs[1].dtype == torch.float32
    assert (outputs[0] - outputs[1]).abs().max().item() < 1e-5
    assert all(torch.equal(a, b) for a, b in zip(*written))
    assert not torch.equal(written[1][0], caches[0])  # this step's K did land in the cache


@pytest.mark.parametrize("window", [None, 11])
def test_bidirectional_spans_match_torch(window: int | None) -> None:
    """Image tokens that attend each other both ways (Gemma 3): two adjacent images in a fresh prompt, one
    in a chunk over a cached prefix, one within a longer window-cut prompt; the kernel's `attend_ends` give
    the torch backend's widened masks, and they change the output."""
    torch.manual_seed(3)
    spec = AttentionLayerSpec(8, 2, 64, scale=0.125, sliding_window=window)
    common = make_batch(MIXED_REQUESTS, 16, seed=2)
    spans = {3: [(22, 30)], 5: [(4, 12), (12, 20)], 6: [(10, 26)], 8: [(40, 60)]}
    num_tokens = common.query_start_loc[-1]
    q = torch.randn(num_tokens, spec.num_heads * spec.head_dim)
    k, v = (torch.randn(num_tokens, spec.num_kv_heads * spec.head_dim) for _ in range(2))
    caches = random_cache(16, spec, torch.float32)
    causal, _ = forward_on_both_backends(spec, (q, k, v), caches, common)
    outputs, _ = forward_on_both_backends(spec, (q, k, v), caches, replace(common, bidirectional_spans=spans))
    assert (outputs[0] - outputs[1]).abs().max().item() < 1e-5
    assert (outputs[1] - causal[1]).abs().max().item() > 1e-2


Step = tuple[CommonAttentionMetadata, slice]  # a step's batch and its rows of the whole batch's q/k/v


def piece(common: CommonAttentionMetadata, request: int, first: int, end: int) -> Step:
    """Request `request`'s new tokens [first, end) (counted from its first new token) as a step alone."""
    start, stop = common.query_start_loc[request], common.query_start_loc[request + 1]
    cached = common.seq_lens[request] - (stop - start)
    rows = slice(start + first, start + end)
    alone = CommonAttentionMetadata.from_lists(
        [0, end - first],
        [cached + end],
        common.block_tables[request : request + 1],
        common.slot_mapping[rows],
        num_decodes=int(end - first == 1),
        block_size=common.block_size,
    )
    return alone, rows


def run_steps(
    spec: AttentionLayerSpec,
    qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    caches: tuple[torch.Tensor, torch.Tensor],
    steps: list[Step],
    threads: int = 1,
) -> torch.Tensor:
    """`steps` in order through the cpu backend on a copy of `caches`, with `threads` threads: each row's
    output where the whole batch would have it."""
    backend = CpuNativeAttentionBackend()
    cache = (caches[0].clone(), caches[1].clone())
    q, k, v = qkv
    out = torch.full_like(q, float("nan"))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for common, rows in steps:
            out[rows] = backend.forward(
                spec, q[rows], k[rows], v[rows], cache, backend.build_metadata(common)
            )
    finally:
        torch.set_num_threads(before)
    return out


# Every block size and scoring on a float32 model's cache; the other caches at block size 16.
INVARIANCE_CASES = [(b, *scoring, "float32") for b in (8, 16, 32) for scoring in SCORING] + [
    (16, *scoring, cache) for cache in ("bfloat16", "fp8_e4m3", "float16") for scoring in SCORING
]


@pytest.mark.parametrize("block_size,window,soft_cap,cache", INVARIANCE_CASES)
def test_a_tokens_output_bits_do_not_depend_on_its_step(
    block_size: int, window: int | None, soft_cap: float | None, cache: str
) -> None:
    """Each token's attention output, in the same bits, from the whole mixed step, from its request alone,
    from its request cut into chunks at other places (the token at another position of its chunk), from
    itself alone over the cached prefix (1 thread), and with 2 or 3 threads. `cache`: a float32 model's cache, its
    bfloat16 cache (--kv-cache-dtype bfloat16), an fp8 cache, a float16 model's."""
    torch.manual_seed(block_size)
    quant = KVQuantization(FP8_DTYPES[cache], k_scale=0.03, v_scale=0.07) if cache.startswith("fp8") else None
    spec = AttentionLayerSpec(9, 3, 64, 0.125, window, soft_cap, kv_quant=quant)
    dtype = torch.float16 if cache == "float16" else torch.float32
    common = make_batch(MIXED_REQUESTS, block_size, seed=5)
    num_tokens = common.query_start_loc[-1]
    qkv = (
        torch.randn(num_tokens, 9 * 64).to(dtype),
        torch.randn(num_tokens, 3 * 64).to(dtype),
        torch.randn(num_tokens, 3 * 64).to(dtype),
    )
    if quant is None:
        caches = random_cache(block_size, spec, torch.bfloat16 if cache == "bfloat16" else dtype)
    else:
        shape = (NUM_BLOCKS, block_size, 3, 64)
        caches = (quant.quantize(torch.randn(shape), 0.03), quant.quantize(torch.randn(shape), 0.07))
    whole = run_steps(spec, qkv, caches, [(common, slice(0, num_tokens))])
    assert not whole.isnan().any()
    new_tokens = [n for _, n in MIXED_REQUESTS]
    requests_alone = [piece(common, r, 0, n) for r, n in enumerate(new_tokens)]
    thirds = [piece(common, r, a, b) for r, n in enumerate(new_tokens) for a, b in _thirds(n) if a < b]
    one_by_one = [piece(common, r, t, t + 1) for r, n in enumerate(new_tokens) for t in range(n)]
    for how, steps in (("alone", requests_alone), ("in thirds", thirds), ("one by one", one_by_one)):
        _assert_same_bits(run_steps(spec, qkv, caches, steps), whole, how)
    for threads in (2, 3):
        out = run_steps(spec, qkv, caches, [(common, slice(0, num_tokens))], threads)
        _assert_same_bits(out, whole, f"{threads} threads")


def _assert_same_bits(out: torch.Tensor, expected: torch.Tensor, how: str) -> None:
    differ = (out != expected).any(dim=-1)
    assert not differ.any(), (
        f"{how}: tokens {differ.nonzero().flatten().tolist()} differ from the whole step, by up to "
        f"{(out - expected).abs().max().item():.3g}"
    )


def _thirds(n: int) -> list[tuple[int, int]]:
    """[0, n) cut in three at n / 3 and 2 n / 3 (the cuts fall mid-block and mid-tile)."""
    return [(0, n // 3), (n // 3, 2 * n // 3), (2 * n // 3, n)]


def dense_attention(
    spec: AttentionLayerSpec, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: range
) -> torch.Tensor:
    """The definition, one query at a time: q [Tq, H, D] at `positions` over keys/values [Tk, Hkv, D]."""
    group = spec.num_heads // spec.num_kv_heads
    out = torch.empty_like(q)
    for row, position in enumerate(positions):
        first = 0 if spec.sliding_window is None else max(0, position + 1 - spec.sliding_window)
        for head in range(spec.num_heads):
            k, v = keys[first : position + 1, head // group], values[first : position + 1, head // group]
            scores = k @ q[row, head] * spec.scale
            if spec.logits_soft_cap is not None:
                scores = spec.logits_soft_cap * torch.tanh(scores / spec.logits_soft_cap)
            if spec.sinks is None:
                out[row, head] = torch.softmax(scores, dim=0) @ v
            else:  # the sink: one more logit in the softmax, with no value
                out[row, head] = torch.softmax(torch.cat([scores, spec.sinks[head, None]]), dim=0)[:-1] @ v
    return out


@pytest.mark.parametrize("window,soft_cap", SCORING)
def test_torch_backend_matches_the_definition(window: int | None, soft_cap: float | None) -> None:
    """The reference backend itself, windowed and soft-capped, against attention computed token by token."""
    torch.manual_seed(3)
    spec = AttentionLayerSpec(4, 2, 16, scale=0.25, sliding_window=window, logits_soft_cap=soft_cap)
    requests = [(0, 1), (37, 1), (19, 13), (0, 21)]
    common = make_batch(requests, 8, seed=4)
    num_tokens = common.query_start_loc[-1]
    q = torch.randn(num_tokens, spec.num_heads * spec.head_dim)
    k, v = (torch.randn(num_tokens, spec.num_kv_heads * spec.head_dim) for _ in range(2))
    key_cache, value_cache = random_cache(8, spec, torch.float32)
    backend = TorchPagedAttentionBackend()
    out = backend.forward(spec, q, k, v, (key_cache, value_cache), backend.build_metadata(common))
    for i, (cached, new) in enumerate(requests):
        rows = slice(common.query_start_loc[i], common.query_start_loc[i + 1])
        keys = key_cache[common.block_tables[i]].flatten(0, 1)[: cached + new]
        values = value_cache[common.block_tables[i]].flatten(0, 1)[: cached + new]
        expected = dense_attention(
            spec, q[rows].view(new, spec.num_heads, -1), keys, values, range(cached, cached + new)
        )
        assert (out[rows].view_as(expected) - expected).abs().max().item() < 1e-5


def test_llm_greedy_tokens_equal_torch_backend(tiny_llama: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    kernel = cpu_kernels.paged_attention

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(args)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(cpu_kernels, "paged_attention", counted)
    prompts = [{"prompt_token_ids": [(7 * i + 3) % 49000 + 3 for i in range(n)]} for n in (3, 17, 40, 64)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    tokens = {}
    for backend in ("torch", "cpu"):
        llm = LLM(tiny_llama, attention_backend=backend, block_size=8, kv_cache_memory="16MiB")
        tokens[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert calls, "the cpu backend never ran the native kernel"
    assert tokens["cpu"] == tokens["torch"]


def test_speculative_verifications_run_through_the_kernel(
    tiny_llama: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n-gram speculation on a repetitive prompt: the cpu backend attends each verification (1 + k tokens
    over the cached prefix) in the native kernel, and the greedy tokens equal the torch backend's and those
    without speculation."""
    verifications = []
    kernel = cpu_kernels.paged_attention

    def counted(*args: Any, query_start_loc: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        query_len, seq_len = int(query_start_loc[1] - query_start_loc[0]), int(args[4][0])
        verifications.append(1 < query_len < seq_len)
        return kernel(*args, query_start_loc=query_start_loc, **kwargs)

    monkeypatch.setattr(cpu_kernels, "paged_attention", counted)
    prompt = {"prompt_token_ids": [11, 12, 13, 14, 15, 16] * 6}
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    tokens = {}
    for name, backend, spec in (("plain", "torch", None), ("torch", "torch", ngram), ("cpu", "cpu", ngram)):
        llm = LLM(
            tiny_llama,
            attention_backend=backend,
            block_size=8,
            kv_cache_memory="16MiB",
            speculative_config=spec,
        )
        tokens[name] = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    assert any(verifications), "no verification reached the kernel"
    assert tokens["cpu"] == tokens["torch"] == tokens["plain"]


def test_auto_picks_cpu_unless_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    assert select_attention_backend("auto", CpuPlatform()).name == "cpu"
    monkeypatch.setenv("PAGEDSERVE_CPU_KERNELS", "0")
    monkeypatch.setattr(cpu_kernels, "load_cpu_kernels", cpu_kernels.load_cpu_kernels.__wrapped__)
    assert select_attention_backend("auto", CpuPlatform()).name == "torch"
    assert select_attention_backend("cpu", CpuPlatform()).name == "torch"  # falls back, warns


def test_unknown_attention_backend_names_the_flag(tiny_llama: str) -> None:
    with pytest.raises(ConfigError, match="--attention-backend must be one of auto, torch, cpu, triton"):
        EngineArgs(model=tiny_llama, attention_backend="flash").create_engine_config()


# Sinks from below to well above the scores' range: some heads give the sink most of their weight.
SINKS = torch.linspace(-4.0, 6.0, 8)


@pytest.mark.parametrize("cache", ["float32", "fp8_e4m3"])
def test_attention_sinks_match_torch_and_the_definition(cache: str) -> None:
    """gpt-oss's sinks with its sliding window, on a float32 model's cache and an fp8 one: the kernel
    equals the torch backend, and the torch backend the definition (token by token)."""
    torch.manual_seed(7)
    quant = KVQuantization(FP8_DTYPES[cache], k_scale=0.03, v_scale=0.07) if cache != "float32" else None
    spec = AttentionLayerSpec(8, 2, 16, 0.25, sliding_window=11, sinks=SINKS, kv_quant=quant)
    requests = [(0, 1), (37, 1), (19, 13), (0, 21)]
    common = make_batch(requests, 8, seed=4)
    num_tokens = common.query_start_loc[-1]
    q = torch.randn(num_tokens, 8 * 16)
    k, v = (torch.randn(num_tokens, 2 * 16) for _ in range(2))
    shape = (NUM_BLOCKS, 8, 2, 16)
    if quant is None:
        caches = (torch.randn(shape), torch.randn(shape))
    else:
        caches = (quant.quantize(torch.randn(shape), 0.03), quant.quantize(torch.randn(shape), 0.07))
    outputs, written = forward_on_both_backends(spec, (q, k, v), caches, common)
    assert (outputs[0] - outputs[1]).abs().max().item() < 1e-5
    no_sinks = forward_on_both_backends(replace(spec, sinks=None), (q, k, v), caches, common)[0]
    assert (outputs[1] - no_sinks[1]).abs().max().item() > 0.1  # the sinks do take weight
    key_cache, value_cache = written[0]
    if quant is not None:
        key_cache = quant.dequantize(key_cache, 0.03, torch.float32)
        value_cache = quant.dequantize(value_cache, 0.07, torch.float32)
    for i, (cached, new) in enumerate(requests):
        rows = slice(common.query_start_loc[i], common.query_start_loc[i + 1])
        keys = key_cache[common.block_tables[i]].flatten(0, 1)[: cached + new]
        values = value_cache[common.block_tables[i]].flatten(0, 1)[: cached + new]
        expected = dense_attention(spec, q[rows].view(new, 8, 16), keys, values, range(cached, cached + new))
        assert (outputs[0][rows].view_as(expected) - expected).abs().max().item() < 1e-5

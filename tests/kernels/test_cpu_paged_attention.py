"""The native CPU paged-attention decode kernel and the cpu backend, against the torch reference backend."""

from typing import Any

import pytest
import torch
from paged_batches import NUM_BLOCKS, forward_on_both_backends, make_batch, random_cache

from pagedserve import LLM, SamplingParams
from pagedserve.attention.backends import select_attention_backend
from pagedserve.attention.backends.base import AttentionLayerSpec
from pagedserve.attention.backends.cpu_native import MAX_KERNEL_CHUNK, CpuNativeAttentionBackend
from pagedserve.attention.backends.torch_paged import TorchPagedAttentionBackend
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

    out = cpu_kernels.paged_attention_decode(
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
    out = cpu_kernels.paged_attention_decode(
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
    expected = cpu_kernels.paged_attention_decode(q, key_cache, value_cache, tables, lens, 0.125)
    column_major = tables.t().contiguous().t()
    for variant in (tables.int(), column_major, column_major.int()):
        assert torch.equal(
            cpu_kernels.paged_attention_decode(q, key_cache, value_cache, variant, lens, 0.125), expected
        )
    strided_q = torch.randn(6, 3, 64).transpose(0, 1)
    assert torch.equal(
        cpu_kernels.paged_attention_decode(strided_q, key_cache, value_cache, tables, lens, 0.125),
        cpu_kernels.paged_attention_decode(
            strided_q.contiguous(), key_cache, value_cache, tables, lens, 0.125
        ),
    )


def test_kernel_rejects_block_ids_outside_the_cache() -> None:
    spec = AttentionLayerSpec(4, 4, 64, scale=0.125)
    key_cache, value_cache = random_cache(8, spec, torch.float32)
    tables = torch.tensor([[3, NUM_BLOCKS]])
    with pytest.raises(RuntimeError, match="outside the cache"):
        cpu_kernels.paged_attention_decode(
            torch.randn(1, 4, 64), key_cache, value_cache, tables, torch.tensor([9]), 0.125
        )


# (sliding_window, logits_soft_cap): plain; a window shorter than most requests (it cuts the cached prefix,
# the chunk and the fresh prefill); Gemma 2's soft cap with a window.
SCORING = [(None, None), (11, None), (20, 5.0)]


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window,soft_cap", SCORING)
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_mixed_batch_through_backend_matches_torch(
    block_size: int, window: int | None, soft_cap: float | None, cache_dtype: torch.dtype
) -> None:
    """Decodes, short chunks over a cached prefix (the native backend's decode kernel takes them, one query
    per token), then a fresh prefill, a chunk too long for the kernel and a short one (SDPA), in one step:
    same outputs and the same K/V written."""
    torch.manual_seed(block_size)
    spec = AttentionLayerSpec(8, 2, 64, scale=0.125, sliding_window=window, logits_soft_cap=soft_cap)
    requests = [
        (0, 1),
        (37, 1),
        (block_size - 1, 1),
        (19, 13),
        (50, 2),
        (0, 21),
        (3, MAX_KERNEL_CHUNK + 1),
        (9, 3),
    ]
    common = make_batch(requests, block_size, seed=2)
    assert CpuNativeAttentionBackend().num_decode_requests(common) == 5
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
            out[row, head] = torch.softmax(scores, dim=0) @ v
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
    kernel = cpu_kernels.paged_attention_decode

    def counted(*args: Any) -> torch.Tensor:
        calls.append(args)
        return kernel(*args)

    monkeypatch.setattr(cpu_kernels, "paged_attention_decode", counted)
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
    over the cached prefix) in the native kernel, one query per token, and the greedy tokens equal the
    torch backend's and those without speculation."""
    query_rows = []
    kernel = cpu_kernels.paged_attention_decode

    def counted(q: torch.Tensor, *args: Any) -> torch.Tensor:
        query_rows.append(q.shape[0])
        return kernel(q, *args)

    monkeypatch.setattr(cpu_kernels, "paged_attention_decode", counted)
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
    assert max(query_rows) > 1, "no verification reached the kernel"
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

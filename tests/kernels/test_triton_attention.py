"""The Triton kernels (reshape_and_cache, paged attention with split-K and sliding window) and the
triton backend against the torch reference backend on random inputs. On CPU they run in Triton's
interpreter, in float32 (its bf16 arithmetic is broken); on a GPU the fp16/bf16 cases run too."""

import pytest
import torch
from interpreted_triton import DEVICE, import_triton_kernels
from paged_batches import make_batch, random_cache

from pagedserve.attention.backends.base import AttentionLayerSpec, CommonAttentionMetadata
from pagedserve.attention.backends.torch_paged import TorchPagedAttentionBackend, write_kv
from pagedserve.utils import cdiv

kernels = import_triton_kernels()
from pagedserve.attention.backends.triton import TritonAttentionBackend  # noqa: E402

TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-2, torch.bfloat16: 3e-2}  # relative to max |out|
DTYPES = [torch.float32] + [pytest.param(d, marks=pytest.mark.gpu) for d in (torch.float16, torch.bfloat16)]
GROUPS = {"gqa4": (8, 2), "mqa": (4, 1), "mha": (4, 4), "gqa3": (6, 2)}


def on_device(common: CommonAttentionMetadata) -> CommonAttentionMetadata:
    common.block_tables = common.block_tables.to(DEVICE)
    common.slot_mapping = common.slot_mapping.to(DEVICE)
    return common


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    error = (actual.float() - expected.float()).abs().max().item() / expected.float().abs().max().item()
    assert error < TOLERANCE[dtype], f"max relative error {error:.2e}"


def run_both(
    spec: AttentionLayerSpec, common: CommonAttentionMetadata, dtype: torch.dtype, num_blocks: int = 64
) -> None:
    """The same step through the triton and the torch backend: equal outputs and equal caches."""
    num_tokens = common.query_start_loc[-1]
    q = torch.randn(num_tokens, spec.num_heads * spec.head_dim).to(dtype).to(DEVICE)
    k, v = (torch.randn(num_tokens, spec.num_kv_heads * spec.head_dim).to(dtype).to(DEVICE) for _ in range(2))
    caches = tuple(c.to(DEVICE) for c in random_cache(common.block_size, spec, dtype, num_blocks))
    outputs, written = [], []
    for backend in (TritonAttentionBackend(), TorchPagedAttentionBackend()):
        cache = (caches[0].clone(), caches[1].clone())
        outputs.append(backend.forward(spec, q, k, v, cache, backend.build_metadata(common)))
        written.append(cache)
    assert outputs[0].dtype == dtype and outputs[0].shape == q.shape
    assert_close(outputs[0], outputs[1], dtype)
    assert all(torch.equal(a, b) for a, b in zip(*written))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", list(GROUPS))
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_mixed_batch_matches_torch(block_size: int, group: str, dtype: torch.dtype) -> None:
    """Decodes (one at a block's end), a prefill chunk over a cached prefix, a fresh prefill: one step."""
    torch.manual_seed(block_size)
    num_heads, num_kv_heads = GROUPS[group]
    spec = AttentionLayerSpec(num_heads, num_kv_heads, 32, scale=32**-0.5)
    common = make_batch([(0, 1), (block_size - 1, 1), (45, 1), (19, 13), (0, 21)], block_size, seed=2)
    run_both(spec, on_device(common), dtype)


@pytest.mark.parametrize("window,soft_cap", [(11, None), (20, 5.0)])
@pytest.mark.parametrize("block_size", [8, 16])
def test_window_and_soft_cap_through_the_backend_match_torch(
    block_size: int, window: int, soft_cap: float | None
) -> None:
    """The layer's sliding window (cutting the cached prefix, the chunk and the fresh prefill) and Gemma
    2's soft cap, from AttentionLayerSpec, as the torch backend applies them."""
    torch.manual_seed(block_size)
    spec = AttentionLayerSpec(8, 2, 32, scale=0.125, sliding_window=window, logits_soft_cap=soft_cap)
    common = make_batch([(0, 1), (37, 1), (block_size - 1, 1), (19, 13), (0, 21)], block_size, seed=2)
    run_both(spec, on_device(common), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_head_dim_not_a_power_of_two(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    spec = AttentionLayerSpec(4, 2, 40, scale=40**-0.5)
    run_both(spec, on_device(make_batch([(6, 1), (9, 7), (0, 18)], 16, seed=3)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [8, 32])
def test_decode_split_k_matches_torch(block_size: int, dtype: torch.dtype) -> None:
    """Long decodes in few requests: split-K (several splits, some empty for the short request)."""
    torch.manual_seed(3)
    spec = AttentionLayerSpec(4, 2, 32, scale=32**-0.5)
    common = on_device(make_batch([(1100, 1), (700, 1), (3, 1)], block_size, seed=4, num_blocks=320))
    metadata = TritonAttentionBackend().build_metadata(common)
    assert metadata.batch.decode_only and metadata.batch.num_splits == 3  # ceil(1101 / 512)
    run_both(spec, common, dtype, num_blocks=320)


@pytest.mark.parametrize("requests", [[(0, 1), (37, 1), (19, 13), (0, 21)], [(1100, 1), (3, 1)]])
def test_attention_sinks_match_torch(requests: list[tuple[int, int]]) -> None:
    """gpt-oss's sinks (some heads giving them most of their weight) with a sliding window, in a mixed
    step and in split-K decodes (the sink counts once over the splits)."""
    torch.manual_seed(5)
    spec = AttentionLayerSpec(
        4, 2, 32, 32**-0.5, sliding_window=600, sinks=torch.linspace(-3.0, 5.0, 4).to(DEVICE)
    )
    common = on_device(make_batch(requests, 16, seed=4, num_blocks=80))
    assert TritonAttentionBackend().build_metadata(common).batch.num_splits == (3 if requests[0][0] else 1)
    run_both(spec, common, torch.float32, num_blocks=80)


def test_split_k_equals_one_split() -> None:
    """Forcing many splits over short contexts (empty splits included) gives one split's result."""
    torch.manual_seed(4)
    common = on_device(make_batch([(40, 1), (2, 1), (70, 1)], 16, seed=5))
    q = torch.randn(3, 8, 32, device=DEVICE)
    key_cache, value_cache = (
        c.to(DEVICE) for c in random_cache(16, AttentionLayerSpec(8, 2, 32, 1.0), torch.float32)
    )
    results = []
    for splits in (1, 6):
        batch = TritonAttentionBackend().build_metadata(common).batch
        batch.num_splits = splits
        out = torch.empty_like(q)
        kernels.paged_attention(out, q, key_cache, value_cache, batch, scale=0.2)
        results.append(out)
    assert (results[0] - results[1]).abs().max().item() < 1e-5


def reference_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    window: int | None,
    soft_cap: float | None,
    scale: float,
) -> torch.Tensor:
    """Plain attention of the last len(q) positions over all keys, each query seeing itself and (with a
    window) the window - 1 keys before it; scores soft-capped (Gemma 2). q [L, H, D]; keys/values
    [S, H_kv, D]."""
    group = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, keys) * scale
    if soft_cap is not None:
        scores = soft_cap * torch.tanh(scores / soft_cap)
    query_pos = torch.arange(keys.shape[0] - q.shape[0], keys.shape[0])[:, None]
    key_pos = torch.arange(keys.shape[0])[None, :]
    allowed = (key_pos <= query_pos) & (key_pos > query_pos - (window or keys.shape[0]))
    weights = scores.masked_fill(~allowed.to(q.device), float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", weights, values)


def attention_over_cache(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    common: CommonAttentionMetadata,
    scale: float,
    window: int | None = None,
    soft_cap: float | None = None,
) -> torch.Tensor:
    """`reference_attention` of every request of the batch over its keys in the (float) cache."""
    out = torch.empty_like(q)
    for i, seq_len in enumerate(common.seq_lens):
        rows = slice(common.query_start_loc[i], common.query_start_loc[i + 1])
        blocks = common.block_tables[i, : cdiv(seq_len, common.block_size)]
        keys = key_cache[blocks].flatten(0, 1)[:seq_len]
        values = value_cache[blocks].flatten(0, 1)[:seq_len]
        out[rows] = reference_attention(q[rows], keys, values, window, soft_cap, scale)
    return out


@pytest.mark.parametrize("window,soft_cap", [(5, None), (16, None), (40, None), (None, 2.0), (12, 1.5)])
def test_sliding_window_and_soft_cap_match_reference(window: int | None, soft_cap: float | None) -> None:
    torch.manual_seed(window or 0)
    block_size = 8
    spec = AttentionLayerSpec(4, 2, 32, scale=0.15)
    requests = [(30, 1), (0, 1), (25, 20)]
    common = on_device(make_batch(requests, block_size, seed=6))
    key_cache, value_cache = (c.to(DEVICE) for c in random_cache(block_size, spec, torch.float32))
    q = torch.randn(common.query_start_loc[-1], 4, 32, device=DEVICE)
    out = torch.empty_like(q)
    kernels.paged_attention(
        out,
        q,
        key_cache,
        value_cache,
        TritonAttentionBackend().build_metadata(common).batch,
        0.15,
        sliding_window=window,
        logits_soft_cap=soft_cap,
    )
    expected = attention_over_cache(q, key_cache, value_cache, common, 0.15, window, soft_cap)
    assert (out - expected).abs().max().item() < 1e-5


def test_reshape_and_cache_skips_padding_slots() -> None:
    """Tokens go to their slots like the torch backend's write; slot -1 (CUDA-graph padding) writes nothing."""
    torch.manual_seed(5)
    spec = AttentionLayerSpec(4, 2, 40, scale=1.0)
    key_cache, value_cache = (c.to(DEVICE) for c in random_cache(16, spec, torch.float32))
    slots = torch.tensor([5, 17, -1, 130, 16 * 63 + 15, -1], device=DEVICE)
    k, v = (torch.randn(6, 2, 40, device=DEVICE) for _ in range(2))
    expected = (key_cache.clone(), value_cache.clone())
    real = slots >= 0
    write_kv(*expected, k[real], v[real], slots[real], spec)
    kernels.reshape_and_cache(k, v, key_cache, value_cache, slots)
    assert torch.equal(key_cache, expected[0]) and torch.equal(value_cache, expected[1])


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_cache_is_read_through_its_scales(fp8: torch.dtype) -> None:
    """A float8 cache holding K / k_scale and V / v_scale: attention equals the torch backend's over the
    dequantized cache (reading fp8 is exact, so float32 tolerance)."""
    torch.manual_seed(6)
    spec = AttentionLayerSpec(4, 2, 32, scale=0.2)
    common = on_device(make_batch([(20, 1), (5, 9), (0, 7)], 8, seed=1))
    key_cache, value_cache = (c.to(DEVICE) for c in random_cache(8, spec, torch.float32))
    quantized = ((key_cache / 0.5).to(fp8), (value_cache / 0.25).to(fp8))
    q = torch.randn(common.query_start_loc[-1], 4, 32, device=DEVICE)
    out = torch.empty_like(q)
    kernels.paged_attention(
        out,
        q,
        *quantized,
        TritonAttentionBackend().build_metadata(common).batch,
        0.2,
        k_scale=0.5,
        v_scale=0.25,
    )
    expected = attention_over_cache(q, quantized[0].float() * 0.5, quantized[1].float() * 0.25, common, 0.2)
    assert (out - expected).abs().max().item() < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_writes_equal_torch_conversion(fp8: torch.dtype) -> None:
    """K / k_scale rounded as torch rounds, saturated at the format's largest value (GPU: the
    interpreter's float8 rounding differs from torch's)."""
    torch.manual_seed(7)
    key_cache, value_cache = (torch.zeros(64, 16, 2, 40, device=DEVICE, dtype=fp8) for _ in range(2))
    slots = torch.tensor([5, 17, 130, 16 * 63 + 15], device=DEVICE)
    k, v = (torch.randn(4, 2, 40, device=DEVICE) * 300 for _ in range(2))  # some beyond e4m3's 448
    kernels.reshape_and_cache(k, v, key_cache, value_cache, slots, k_scale=0.5, v_scale=2.0)
    limit = torch.finfo(fp8).max
    for cache, values, scale in ((key_cache, k, 0.5), (value_cache, v, 2.0)):
        expected = (values / scale).clamp(-limit, limit).to(fp8)
        assert torch.equal(cache.view(-1, 2, 40)[slots].float(), expected.float())

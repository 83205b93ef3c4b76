"""The native kernels on an fp8 KV cache: writes equal torch's saturating cast bit for bit, and decodes
read the fp8 bits in place equal the torch backend reading the same bits (e4m3fn and e5m2)."""

import pytest
import torch
from paged_batches import NUM_BLOCKS, forward_on_both_backends, make_batch

from pagedserve.attention.backends.base import AttentionLayerSpec
from pagedserve.attention.backends.torch_paged import TorchPagedAttentionBackend
from pagedserve.attention.kv_quant import FP8_DTYPES, KVQuantization
from pagedserve.kernels import cpu as cpu_kernels

FORMATS = ["fp8_e4m3", "fp8_e5m2"]


@pytest.fixture(scope="module", autouse=True)
def kernels_built() -> None:
    error = cpu_kernels.load_cpu_kernels().error
    if error is not None:
        pytest.skip(f"native CPU kernels unavailable: {error}")


def awkward_values(quant: KVQuantization, scale: float, shape: tuple[int, ...]) -> torch.Tensor:
    """Random values spanning the format's whole range at `scale`, plus its edges: every finite value
    exactly, every midpoint between neighbours (ties), past the largest value, zeros of both signs."""
    table = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(quant.fp8_dtype).float() * scale
    finite = table[torch.isfinite(table)].unique()
    midpoints = (finite[1:] + finite[:-1]) / 2
    largest = finite.abs().max().item()
    edges = torch.cat([finite, midpoints, torch.tensor([largest * 1.01, -largest * 4, 1e30, 0.0, -0.0])])
    randoms = torch.randn(shape).flatten() * torch.exp2(torch.randint(-20, 12, shape).flatten().float())
    values = torch.cat([edges, randoms * scale])[: randoms.numel()]
    return values[torch.randperm(values.numel())].view(shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cache_dtype", FORMATS)
def test_native_write_equals_torch_cast(cache_dtype: str, dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    quant = KVQuantization(FP8_DTYPES[cache_dtype], k_scale=0.037, v_scale=3.5)
    heads, dim, block_size = 2, 64, 16
    shape = (NUM_BLOCKS, block_size, heads, dim)
    slots = torch.randperm(NUM_BLOCKS * block_size)[:40]
    k = awkward_values(quant, quant.k_scale, (40, heads, dim)).to(dtype)
    v = awkward_values(quant, quant.v_scale, (40, heads, dim)).to(dtype)
    k[0, 0, :2] = torch.tensor([float("nan"), float("-inf")])
    caches = [torch.zeros(shape, dtype=torch.uint8) for _ in range(2)]
    cpu_kernels.reshape_and_cache_fp8(k, v, *caches, slots, quant.fp8_dtype, quant.k_scale, quant.v_scale)
    for cache, x, scale in zip(caches, (k, v), (quant.k_scale, quant.v_scale)):
        written = cache.view(-1, heads, dim)[slots]
        expected = quant.quantize(x, scale)
        nan = torch.isnan(x)
        assert torch.equal(written[~nan], expected[~nan])
        assert torch.isnan(written[nan].view(quant.fp8_dtype).float()).all()
        untouched = torch.ones(NUM_BLOCKS * block_size, dtype=torch.bool)
        untouched[slots] = False
        assert not cache.view(-1, heads, dim)[untouched].any()


def test_native_write_rejects_bad_slots_and_scales() -> None:
    quant = KVQuantization(torch.float8_e4m3fn)
    caches = [torch.zeros(4, 8, 1, 16, dtype=torch.uint8) for _ in range(2)]
    k = torch.randn(2, 1, 16)
    with pytest.raises(RuntimeError, match="outside the cache's 32 slots"):
        cpu_kernels.reshape_and_cache_fp8(k, k, *caches, torch.tensor([3, 32]), quant.fp8_dtype, 1.0, 1.0)
    for scale in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(RuntimeError, match="must be finite and > 0"):
            cpu_kernels.reshape_and_cache_fp8(
                k, k, *caches, torch.tensor([0, 1]), quant.fp8_dtype, scale, 1.0
            )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cache_dtype", FORMATS)
@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 2), (4, 4)], ids=["gqa", "mha"])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_decode_reads_fp8_in_place(
    block_size: int, num_heads: int, num_kv_heads: int, cache_dtype: str, dtype: torch.dtype
) -> None:
    """The kernel on the fp8 bits against the torch backend on the same bits (dequantized in float32)."""
    torch.manual_seed(block_size + num_heads)
    head_dim = 64
    quant = KVQuantization(FP8_DTYPES[cache_dtype], k_scale=0.02, v_scale=0.5)
    spec = AttentionLayerSpec(num_heads, num_kv_heads, head_dim, head_dim**-0.5, kv_quant=quant)
    lens = [1, block_size, 3 * block_size, block_size + 1, 5 * block_size + 3]
    common = make_batch([(n - 1, 1) for n in lens], block_size, seed=head_dim)
    shape = (NUM_BLOCKS, block_size, num_kv_heads, head_dim)
    key_cache = quant.quantize(torch.randn(shape) * 0.1, quant.k_scale)
    value_cache = quant.quantize(torch.randn(shape), quant.v_scale)
    q = torch.randn(len(lens), num_heads, head_dim).to(dtype)
    out = cpu_kernels.paged_attention(
        q,
        key_cache,
        value_cache,
        common.block_tables,
        torch.tensor(common.seq_lens),
        spec.scale,
        fp8=(quant.fp8_dtype, quant.k_scale, quant.v_scale),
    )
    reference = TorchPagedAttentionBackend()
    expected = reference.attend_decodes(
        spec, q.float(), key_cache, value_cache, reference.build_decode_metadata(common, common.num_decodes)
    )
    assert out.dtype == dtype and out.shape == q.shape
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2 * expected.abs().max().item()
    assert (out.float() - expected).abs().max().item() < tolerance


# (sliding_window, logits_soft_cap): plain; a window that cuts the cached prefix and the chunk; a soft cap.
@pytest.mark.parametrize("window,soft_cap", [(None, None), (11, None), (20, 5.0)])
@pytest.mark.parametrize("cache_dtype", FORMATS)
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_mixed_fp8_batch_through_backend_matches_torch(
    block_size: int, cache_dtype: str, window: int | None, soft_cap: float | None
) -> None:
    """Decodes, a prefill chunk over a cached prefix and a fresh prefill in one step, GQA: the same
    fp8 bytes written and the same outputs as the torch backend."""
    torch.manual_seed(block_size)
    quant = KVQuantization(FP8_DTYPES[cache_dtype], k_scale=0.03, v_scale=0.07)
    spec = AttentionLayerSpec(8, 2, 64, 0.125, window, soft_cap, kv_quant=quant)
    common = make_batch([(0, 1), (37, 1), (block_size - 1, 1), (19, 13), (0, 21)], block_size, seed=2)
    num_tokens = common.query_start_loc[-1]
    q = torch.randn(num_tokens, 8 * 64)
    k, v = (torch.randn(num_tokens, 2 * 64) for _ in range(2))
    shape = (NUM_BLOCKS, block_size, 2, 64)
    caches = (quant.quantize(torch.randn(shape), 0.03), quant.quantize(torch.randn(shape), 0.07))
    outputs, written = forward_on_both_backends(spec, (q, k, v), caches, common)
    assert all(torch.equal(a, b) for a, b in zip(*written))
    assert not torch.equal(written[0][0], caches[0])  # this step's K did land in the cache
    assert (outputs[0] - outputs[1]).abs().max().item() < 1e-5


def test_kernel_refuses_an_fp8_cache_without_a_format() -> None:
    q = torch.randn(1, 4, 16)
    cache = torch.zeros(4, 8, 4, 16, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="needs fp8_format"):
        cpu_kernels.paged_attention(q, cache, cache, torch.tensor([[1]]), torch.tensor([3]), 0.25)

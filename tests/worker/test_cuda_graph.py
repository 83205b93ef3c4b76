"""CUDA-graph bucketing and padding, checked on CPU: the sizes --cuda-graph-sizes resolves to, the
bucket of a batch, the padded static buffers, and that attention over a padded bucket (the triton
backend, in Triton's interpreter here) gives the unpadded batch's result and leaves the cache alone
outside the real tokens' slots."""

import logging
import os
import sys

import pytest
import torch

from pagedserve import LLM
from pagedserve.attention.backends.base import AttentionLayerSpec
from pagedserve.attention.backends.torch_paged import TorchPagedAttentionBackend
from pagedserve.config import EngineArgs
from pagedserve.config.engine_config import cuda_graph_capture_sizes
from pagedserve.errors import ConfigError
from pagedserve.worker.cuda_graph import PAD_SLOT, DecodeBuffers, graph_bucket
from pagedserve.worker.input_batch import BatchInputs

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "kernels"))
from interpreted_triton import DEVICE, import_triton_kernels  # noqa: E402
from paged_batches import make_batch, random_cache  # noqa: E402

import_triton_kernels()
from pagedserve.attention.backends.triton import TritonAttentionBackend  # noqa: E402


def test_capture_sizes_follow_vllm() -> None:
    assert cuda_graph_capture_sizes("512", 512) == (1, 2, 4, *range(8, 513, 8))
    assert cuda_graph_capture_sizes("512", 100) == (1, 2, 4, *range(8, 97, 8), 100)  # capped, cap captured
    assert cuda_graph_capture_sizes("1,3,16", 8) == (1, 3, 8)
    assert cuda_graph_capture_sizes([2], 64) == (1, 2)
    for bad in ("0", "a,b", ""):
        with pytest.raises(ConfigError, match="--cuda-graph-sizes"):
            cuda_graph_capture_sizes(bad, 64)


def test_engine_config_resolves_sizes(tiny_llama: str) -> None:
    config = EngineArgs(model=tiny_llama, max_num_seqs=20, cuda_graph_sizes="16").create_engine_config()
    assert config.cuda_graph_sizes == (1, 2, 4, 8, 16)


def test_bucket_is_the_smallest_size_that_fits() -> None:
    sizes = (1, 2, 4, 8, 16)
    assert [graph_bucket(n, sizes) for n in (1, 2, 3, 5, 8, 9, 16, 17)] == [1, 2, 4, 8, 8, 16, 16, None]


def decode_batch(cached_lens: list[int], block_size: int) -> BatchInputs:
    common = make_batch([(c, 1) for c in cached_lens], block_size, seed=len(cached_lens))
    n = len(cached_lens)
    return BatchInputs(
        input_ids=torch.arange(100, 100 + n),
        positions=torch.tensor(cached_lens),
        attention=[common],
        request_ids=[f"r{i}" for i in range(n)],
        sample_rows=list(range(n)),
        logits_indices=torch.arange(n),
        draft_token_ids=[[] for _ in range(n)],
    )


def test_fill_copies_the_batch_and_pads_the_bucket() -> None:
    buffers = DecodeBuffers.allocate(8, max_blocks_per_request=10, device=torch.device("cpu"))
    buffers.fill(decode_batch([30, 4, 17, 50, 9], 8), 8)  # leaves stale rows behind
    batch = decode_batch([12, 40, 3], 8)
    buffers.fill(batch, 4)
    common = batch.attention[0]
    assert buffers.input_ids[:4].tolist() == [100, 101, 102, 0]
    assert buffers.positions[:4].tolist() == [12, 40, 3, 0]
    assert buffers.slot_mapping[:4].tolist() == common.slot_mapping.tolist() + [PAD_SLOT]
    assert buffers.seq_lens[:4].tolist() == [13, 41, 4, 1]
    width = common.block_tables.shape[1]
    assert torch.equal(buffers.block_tables[:3, :width], common.block_tables)
    assert not buffers.block_tables[3].any()  # the padding row reads the null block 0
    assert buffers.query_start_loc[:5].tolist() == [0, 1, 2, 3, 4]


def test_attention_over_a_padded_bucket_equals_the_batch() -> None:
    torch.manual_seed(0)
    block_size, size = 8, 8
    spec = AttentionLayerSpec(4, 2, 32, scale=0.2)
    batch = decode_batch([12, 40, 3, 25, 7], block_size)
    n = len(batch.request_ids)
    buffers = DecodeBuffers.allocate(size, max_blocks_per_request=8, device=DEVICE)
    batch.attention[0].block_tables = batch.attention[0].block_tables.to(DEVICE)
    batch.attention[0].slot_mapping = batch.attention[0].slot_mapping.to(DEVICE)
    buffers.fill(batch, size)
    q, k, v = (torch.randn(size, 4 * 32 if i == 0 else 2 * 32, device=DEVICE) for i in range(3))
    caches = tuple(c.to(DEVICE) for c in random_cache(block_size, spec, torch.float32))
    triton_backend = TritonAttentionBackend()
    metadata = triton_backend.build_graph_metadata(
        buffers.query_start_loc[: size + 1],
        buffers.seq_lens[:size],
        buffers.block_tables[:size],
        buffers.slot_mapping[:size],
        block_size,
        max_seq_len=512,
    )
    padded_cache = (caches[0].clone(), caches[1].clone())
    padded = triton_backend.forward(spec, q, k, v, padded_cache, metadata)
    reference = TorchPagedAttentionBackend()
    expected_cache = (caches[0].clone(), caches[1].clone())
    expected = reference.forward(
        spec, q[:n], k[:n], v[:n], expected_cache, reference.build_metadata(batch.attention[0])
    )
    assert (padded[:n] - expected).abs().max().item() < 1e-5
    assert torch.isfinite(padded).all()
    assert all(torch.equal(a, b) for a, b in zip(padded_cache, expected_cache))


def test_graphs_are_off_on_cpu_and_say_so(tiny_llama: str, caplog: pytest.LogCaptureFixture) -> None:
    package_logger = logging.getLogger("pagedserve")  # NOTE: it does not propagate to the root logger
    package_logger.addHandler(caplog.handler)
    try:
        LLM(tiny_llama, kv_cache_memory="4MiB", device="cpu")
    finally:
        package_logger.removeHandler(caplog.handler)
    assert "CUDA graphs: off (the device is cpu); decode steps run eagerly." in caplog.text

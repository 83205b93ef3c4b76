"""The peak-memory profile's steps (run on CUDA before sizing the KV cache), checked on CPU: the token
budget split over the requests, and both steps through the real step path, leaving nothing behind."""

from collections.abc import Callable

import pytest
from torch.profiler import ProfilerActivity, profile

from pagedserve.config import EngineArgs
from pagedserve.worker.worker import Worker, profile_request_lengths


@pytest.mark.parametrize(
    "num_tokens,max_requests,max_model_len,expected",
    [
        (2048, 1, 4096, [2048]),
        (2048, 1, 512, [512]),  # one request is capped at max_model_len
        (10, 4, 512, [3, 3, 2, 2]),
        (3, 8, 512, [1, 1, 1]),  # never an empty request
        (8192, 4, 1000, [1000] * 4),
    ],
)
def test_token_budget_is_split_evenly(
    num_tokens: int, max_requests: int, max_model_len: int, expected: list[int]
) -> None:
    assert profile_request_lengths(num_tokens, max_requests, max_model_len) == expected


def test_profile_steps_sample_every_request_and_leave_nothing(tiny_llama: str) -> None:
    config = EngineArgs(
        model=tiny_llama, device="cpu", max_num_seqs=5, max_num_batched_tokens=70, block_size=8
    ).create_engine_config()
    worker = Worker(config)
    runner = worker.model_runner
    sampled_rows = []
    sampler = runner.sampler

    def counting_sampler(logits, metadata, greedy_tokens=None):
        sampled_rows.append(logits.shape[0])
        return sampler(logits, metadata, greedy_tokens)

    runner.sampler = counting_sampler
    worker._profile_run()
    assert sampled_rows == [1, 5]  # one 70-token request, then 5 requests of 14 tokens
    assert runner.input_batch.states == {} and runner.input_batch.block_tables.row_of == {}
    assert runner.kv_caches == []
    assert all(layer.kv_cache is None for layer in runner.attention_layers)


def test_calculated_kv_scales_wait_for_the_first_real_batch(tiny_llama: str) -> None:
    """The profile's dummy tokens (all token 0) must not set --calculate-kv-scales' scales or key offset."""
    config = EngineArgs(
        model=tiny_llama, device="cpu", kv_cache_dtype="fp8", calculate_kv_scales=True
    ).create_engine_config()
    worker = Worker(config)
    worker._profile_run()
    quants = [layer.spec.kv_quant for layer in worker.model_runner.attention_layers]
    assert all(q.scales_pending and q.k_scale == 1.0 and q.key_offset is None for q in quants)


def peak_cpu_bytes(run: Callable[[], None]) -> tuple[int, set[str]]:
    """The most bytes torch held on the CPU at once while `run` ran, above what it held before (torch's
    profiler records every allocation and free with its op), and the ops that ran."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak, {event.name for event in prof.events()}


def test_image_models_profile_holds_the_encoder_cache_and_a_pass(tiny_llava_next: str) -> None:
    """The profile's peak (from which a GPU sizes its KV pool) of LLaVA-NeXT is its text steps' plus at
    least the full encoder cache (--max-num-batched-tokens rows of hidden_size float32), and it runs the
    vision tower (its patch convolution) once, at the largest image (2 x 2 tiles + the base tile)."""
    budget = 256
    config = EngineArgs(
        model=tiny_llava_next, device="cpu", dtype="float32", max_num_batched_tokens=budget, max_model_len=256
    ).create_engine_config()
    worker = Worker(config)
    text_steps, text_ops = peak_cpu_bytes(worker._profile_steps)
    whole, ops = peak_cpu_bytes(worker._profile_run)
    assert whole - text_steps >= budget * config.model.hf_config.hidden_size * 4
    assert "aten::convolution" in ops and "aten::convolution" not in text_ops
    assert worker.model_runner.model.largest_image() == ([1, 5, 3, 32, 32], (64, 64))

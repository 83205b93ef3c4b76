"""Prefix caching on a model with two KV cache groups (tiny Gemma 2: a global layer and a local one with a
window of 24), in a pool small enough that blocks are evicted: a request sharing a long prefix with an
earlier one reuses it (the engine's stats count the hit) although the window group's oldest blocks were
evicted, and its greedy tokens equal those with caching off and HF transformers'; once everything is
evicted, no hit and the same tokens again."""

import random

import torch
from models.test_greedy_vs_hf import assert_matches, hf_greedy

from pagedserve import LLM, SamplingParams
from pagedserve.core.hashing import extend_block_hashes

BLOCK_SIZE, MAX_TOKENS = 8, 12


def run(llm: LLM, prompt: list[int]) -> tuple[list[int], list[float]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    completion = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0]
    return completion.token_ids, [
        step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids)
    ]


def prefix_cache_hits(llm: LLM) -> int:
    return llm.llm_engine.engine_core.get_stats().prefix_cache_hits


def test_second_request_reuses_the_shared_prefix_and_matches_hf(tiny_model_factory) -> None:
    from transformers import AutoModelForCausalLM

    path = tiny_model_factory("gemma2")
    rng = random.Random(12)
    shared = [rng.randrange(3, 49152) for _ in range(70)]
    first = shared + [rng.randrange(3, 49152) for _ in range(5)]
    second = shared + [rng.randrange(3, 49152) for _ in range(7)]
    filler = [rng.randrange(3, 49152) for _ in range(20)]  # evicts the oldest free blocks
    flood = [rng.randrange(3, 49152) for _ in range(110)]  # evicts everything
    third = shared + [rng.randrange(3, 49152) for _ in range(3)]
    prompts = [first, filler, second, flood, third]
    # 23 usable blocks: a request of max_model_len (16 global blocks + the window's 6) just fits.
    engine_args = dict(
        block_size=BLOCK_SIZE, max_model_len=128, num_gpu_blocks_override=24, max_num_batched_tokens=16
    )
    cached = LLM(path, enable_prefix_caching=True, **engine_args)
    pool = cached.llm_engine.engine_core.scheduler.kv_cache_manager.block_pool
    hashes: list[bytes] = []
    extend_block_hashes(hashes, shared, BLOCK_SIZE, len(shared) // BLOCK_SIZE, None)
    ours, hits = [], []
    for prompt in prompts:
        before = prefix_cache_hits(cached)
        if prompt is second:
            # The window group's (group 1) oldest blocks of the prefix were evicted, its last ones and
            # the global group's are still cached.
            assert (hashes[0], 1) not in pool.cached and (hashes[7], 1) in pool.cached
            assert all((block_hash, 0) in pool.cached for block_hash in hashes)
        ours.append(run(cached, prompt))
        hits.append(prefix_cache_hits(cached) - before)
    # The 8 full blocks of the shared 70 tokens, then nothing after the flood.
    assert hits == [0, 0, 64, 0, 0]
    uncached = LLM(path, enable_prefix_caching=False, **engine_args)
    assert_matches(ours, [run(uncached, prompt) for prompt in prompts])
    assert prefix_cache_hits(uncached) == 0
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    assert_matches(ours, hf_greedy(hf, prompts, MAX_TOKENS))

"""Greedy tokens identical to HF transformers' generate, across architectures, block sizes, forced
preemption and forced chunked prefill."""
import random

import pytest
import torch

from pagedserve import LLM, SamplingParams

MAX_TOKENS = 12
PROMPT_LENS = [3, 17, 40, 64, 101]


def make_prompts(seed: int, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 49152) for _ in range(n)] for n in lengths]


def hf_greedy(model, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """One prompt at a time (no padding), EOS never stops it."""
    results = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
        results.append(out[0, len(prompt):].tolist())
    return results


_HF_CACHE: dict[str, list[list[int]]] = {}


def reference(path: str, prompts: list[list[int]]) -> list[list[int]]:
    if path not in _HF_CACHE:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        _HF_CACHE[path] = hf_greedy(model, prompts, MAX_TOKENS)
    return _HF_CACHE[path]


def run(path: str, prompts: list[list[int]], **engine_args) -> tuple[list[list[int]], LLM]:
    llm = LLM(path, **engine_args)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs], llm


@pytest.mark.parametrize("name", ["llama", "llama-tied-mha", "mistral", "qwen2"])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_greedy_matches_hf(tiny_model_factory, name: str, block_size: int) -> None:
    path = tiny_model_factory(name)
    prompts = make_prompts(0, PROMPT_LENS)
    ours, _ = run(path, prompts, block_size=block_size, kv_cache_memory="64MiB")
    assert ours == reference(path, prompts)


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_greedy_matches_hf_with_preemption_and_chunked_prefill(tiny_model_factory, block_size: int) -> None:
    path = tiny_model_factory("llama")
    prompts = make_prompts(0, PROMPT_LENS)
    # Room for one full-length request and a little more; 16-token steps chunk every long prompt.
    num_blocks = 128 // block_size + 3
    ours, llm = run(path, prompts, block_size=block_size, max_model_len=128,
                    num_gpu_blocks_override=num_blocks, max_num_batched_tokens=16)
    scheduler = llm.llm_engine.engine_core.scheduler
    assert scheduler.num_preemptions_total > 0, "the pool was meant to force preemption"
    assert ours == reference(path, prompts)
    assert scheduler.kv_cache_manager.num_free_blocks() == num_blocks - 1


@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_low_precision_runs_close_to_hf(tiny_llama: str, dtype: str) -> None:
    """bfloat16 cannot be token-exact against a different kernel order; its first token must be."""
    prompts = make_prompts(1, [9, 33])
    ours, _ = run(tiny_llama, prompts, dtype=dtype, kv_cache_memory="64MiB")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=getattr(torch, dtype))
    theirs = hf_greedy(model, prompts, MAX_TOKENS)
    assert [o[0] for o in ours] == [t[0] for t in theirs]

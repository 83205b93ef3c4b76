"""`LLM(attention_backend="triton")` end to end: the same greedy tokens as the torch backend, through
chunked prefill, prefix-cache hits and mixed prefill+decode steps (on CPU in Triton's interpreter)."""

import os
import subprocess
import sys
from typing import Any

import pytest
from interpreted_triton import DEVICE, import_triton_kernels

from pagedserve import LLM, SamplingParams

kernels = import_triton_kernels()


def test_greedy_tokens_equal_torch_backend(tiny_llama: str, monkeypatch: pytest.MonkeyPatch) -> None:
    launches = []
    attention = kernels.attention.paged_attention

    def counted(*args: Any, **kwargs: Any) -> None:
        launches.append(args[4].decode_only)  # the PagedBatch
        attention(*args, **kwargs)

    monkeypatch.setattr("pagedserve.attention.backends.triton.paged_attention", counted)
    shared = [(11 * i + 5) % 49000 + 3 for i in range(24)]  # a prefix the second round finds cached
    first = [
        {"prompt_token_ids": shared + [7, 8, 9]},
        {"prompt_token_ids": [4, 5, 6]},
        {"prompt_token_ids": [(7 * i + 3) % 49000 + 3 for i in range(45)]},
    ]
    second = [{"prompt_token_ids": shared + [10, 11]}]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    tokens = {}
    for backend in ("torch", "triton"):
        # 32 tokens per step: the 45-token prompt is chunked and shares steps with decodes.
        llm = LLM(
            tiny_llama,
            attention_backend=backend,
            block_size=8,
            kv_cache_memory="8MiB",
            max_num_batched_tokens=32,
            max_num_seqs=4,
            device=DEVICE.type,
            dtype="float32",
        )
        outputs = llm.generate(first, params, use_tqdm=False)
        hits = llm.llm_engine.engine_core.get_stats().prefix_cache_hits
        outputs += llm.generate(second, params, use_tqdm=False)
        assert llm.llm_engine.engine_core.get_stats().prefix_cache_hits - hits == 24
        tokens[backend] = [o.outputs[0].token_ids for o in outputs]
    assert True in launches and False in launches  # decode-only and mixed steps both ran the kernel
    assert tokens["triton"] == tokens["torch"]


@pytest.mark.sampled
def test_mla_greedy_tokens_equal_torch_backend(tiny_model_factory) -> None:
    """DeepSeek V3's latent attention through the Triton kernel (every token absorbed: one KV head, the
    latent cache as both K and V) gives the torch backend's tokens (absorbed decodes, expanded prefill),
    a prompt chunked by 8-token steps beside another's decodes."""
    prompts = [{"prompt_token_ids": [(7 * i + 3) % 49000 + 3 for i in range(n)]} for n in (3, 20)]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    tokens = {}
    for backend in ("torch", "triton"):
        llm = LLM(
            tiny_model_factory("deepseek_v3"),
            attention_backend=backend,
            block_size=8,
            kv_cache_memory="8MiB",
            max_num_batched_tokens=8,
            device=DEVICE.type,
            dtype="float32",
        )
        tokens[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert tokens["triton"] == tokens["torch"]


def test_triton_on_cpu_without_the_interpreter_is_refused_clearly() -> None:
    """A fresh process (no TRITON_INTERPRET): asking for triton on CPU names the problem and the flag."""
    code = (
        "from pagedserve.attention.backends import select_attention_backend\n"
        "from pagedserve.platforms import get_platform\n"
        "select_attention_backend('triton', get_platform('cpu'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode != 0
    assert "--attention-backend triton cannot run here" in result.stderr
    assert "TRITON_INTERPRET=1" in result.stderr and "--attention-backend auto or torch" in result.stderr

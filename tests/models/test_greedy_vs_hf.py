"""Greedy tokens identical to HF transformers' generate, across architectures, block sizes, forced
preemption and forced chunked prefill."""

import random

import pytest
import torch

from pagedserve import LLM, SamplingParams
from pagedserve.config.kv_layout import KVCacheGroups

MAX_TOKENS = 12
PROMPT_LENS = [3, 17, 40, 64, 101]


def make_prompts(seed: int, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 49152) for _ in range(n)] for n in lengths]


def hf_greedy(model, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[float]]]:
    """One prompt at a time (no padding), EOS never stops it: the tokens and each one's logprob."""
    results = []
    for prompt in prompts:
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
        tokens = out.sequences[0, len(prompt) :].tolist()
        logprobs = [
            torch.log_softmax(step[0].float(), dim=-1)[token].item()
            for step, token in zip(out.logits, tokens)
        ]
        results.append((tokens, logprobs))
    return results


_HF_CACHE: dict[str, list[tuple[list[int], list[float]]]] = {}


def reference(path: str, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    """HF transformers' eager attention (the definition: soft caps and windows included)."""
    if path not in _HF_CACHE:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
        _HF_CACHE[path] = hf_greedy(model, prompts, MAX_TOKENS)
    return _HF_CACHE[path]


def run(
    path: str, prompts: list[list[int]], **engine_args
) -> tuple[list[tuple[list[int], list[float]]], LLM]:
    llm = LLM(path, **engine_args)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    results = []
    for output in outputs:
        completion = output.outputs[0]
        results.append(
            (
                completion.token_ids,
                [step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids)],
            )
        )
    return results, llm


def assert_matches(
    ours: list[tuple[list[int], list[float]]], theirs: list[tuple[list[int], list[float]]]
) -> None:
    """Greedy tokens identical, each token's logprob within 1e-4."""
    assert [tokens for tokens, _ in ours] == [tokens for tokens, _ in theirs]
    for (_, our_logprobs), (_, their_logprobs) in zip(ours, theirs):
        assert max(abs(a - b) for a, b in zip(our_logprobs, their_logprobs)) < 1e-4


# Every block size for the Llama blocks and the sliding-window families (CI runs one of them per family,
# rotating: the sampled marker); one each (all three sizes covered) for the other families.
FAMILY_BLOCK_SIZES = [
    (name, block_size)
    for name in ("llama", "llama-tied-mha", "mistral", "qwen2", "mistral-swa", "gemma2")
    for block_size in (8, 16, 32)
] + [
    ("qwen2-swa", 16),
    ("qwen2-mwl", 16),
    ("qwen3", 8),
    ("gemma3_text", 32),
    ("phi3", 16),
    ("falcon-7b", 8),
    ("falcon-40b", 32),
    ("mixtral", 16),
    ("qwen2_moe", 8),
    ("qwen3_moe", 32),
]


@pytest.mark.sampled(by="name")
@pytest.mark.parametrize("name,block_size", FAMILY_BLOCK_SIZES)
def test_greedy_matches_hf(tiny_model_factory, name: str, block_size: int) -> None:
    path = tiny_model_factory(name)
    prompts = make_prompts(0, PROMPT_LENS)
    ours, _ = run(path, prompts, block_size=block_size, kv_cache_memory="64MiB")
    assert_matches(ours, reference(path, prompts))


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_greedy_matches_hf_on_the_torch_layers(
    tiny_model_factory, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The layers' torch path (RMSNorm, rotary, activations), which every device but the CPU runs, over
    steady decode steps: their inputs are the same tensors every step, rewritten, so nothing may cache
    on a tensor's identity across steps (the rotary angles once did)."""
    from pagedserve.kernels.cpu import fused_ops

    monkeypatch.setenv("PAGEDSERVE_FUSED_CPU_OPS", "0")
    fused_ops._ops.cache_clear()
    try:
        path = tiny_model_factory(name)
        prompts = make_prompts(0, PROMPT_LENS)
        ours, _ = run(path, prompts, block_size=8, kv_cache_memory="64MiB")
        assert_matches(ours, reference(path, prompts))
    finally:
        monkeypatch.undo()
        fused_ops._ops.cache_clear()


@pytest.mark.sampled(by="name")
@pytest.mark.parametrize(
    "name,block_size",
    [
        ("llama", 8),
        ("llama", 16),
        ("llama", 32),
        ("mistral-swa", 8),
        # Mixed windowed and full layers: one block table per KV cache group.
        ("gemma2", 8),
        ("gemma2", 16),
        ("gemma2", 32),
        ("gemma3_text", 16),
        ("qwen2-mwl", 32),
        ("mixtral", 32),
        ("falcon-40b", 8),
    ],
)
def test_greedy_matches_hf_with_preemption_and_chunked_prefill(
    tiny_model_factory, name: str, block_size: int
) -> None:
    from transformers import AutoConfig

    path = tiny_model_factory(name)
    prompts = make_prompts(0, PROMPT_LENS)
    config = AutoConfig.from_pretrained(path)
    groups = KVCacheGroups.for_model(config, config.architectures[0], block_size)
    # Room for one full-length request (a block per group per block of tokens) and a little more; 16-token
    # steps chunk every long prompt.
    run_with_preemption(path, prompts, block_size, 128 // block_size * groups.num_groups + 3)


def run_with_preemption(path: str, prompts: list[list[int]], block_size: int, num_blocks: int) -> LLM:
    """HF's greedy tokens from a pool of `num_blocks` too small for all `prompts` at once (preemption
    forced, and checked) in 16-token steps (long prompts chunked); every block back in the pool after."""
    ours, llm = run(
        path,
        prompts,
        block_size=block_size,
        max_model_len=128,
        num_gpu_blocks_override=num_blocks,
        max_num_batched_tokens=16,
    )
    core = llm.llm_engine.engine_core
    assert core.get_stats().num_preemptions_total > 0, "the pool was meant to force preemption"
    assert_matches(ours, reference(path, prompts))
    assert core.block_snapshot().num_free_blocks == num_blocks - 1
    return llm


@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_low_precision_runs_close_to_hf(tiny_llama: str, dtype: str) -> None:
    """bfloat16 cannot be token-exact against a different kernel order; its first token must be."""
    prompts = make_prompts(1, [9, 33])
    ours, _ = run(tiny_llama, prompts, dtype=dtype, kv_cache_memory="64MiB")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=getattr(torch, dtype))
    theirs = hf_greedy(model, prompts, MAX_TOKENS)
    assert [tokens[0] for tokens, _ in ours] == [tokens[0] for tokens, _ in theirs]


@pytest.mark.parametrize(
    "name,overrides",
    [
        # Gemma's norms stored as 1 + w, its extra norms' names, the window read from the file. (Each GGUF
        # costs a tokenizer conversion: one family here; Phi-3's fused tensors take the safetensors path's
        # split, checked above.)
        (
            "gemma2",
            dict(
                head_dim=16,
                query_pre_attn_scalar=256,
                sliding_window=24,
                tie_word_embeddings=True,
                layer_types=["sliding_attention", "full_attention"],
            ),
        ),
    ],
)
def test_gguf_matches_hf(tmp_path, name: str, overrides: dict) -> None:
    """A GGUF file laid out as llama.cpp's converter writes it, read by pagedserve and by transformers'
    own GGUF support: the same greedy tokens and logprobs."""
    from conftest import build_tiny_model
    from gguf_writer import write_gguf
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model(str(tmp_path / "hf"), name, **overrides)
    path = write_gguf(folder, name, str(tmp_path / f"{name}.gguf"))
    prompts = make_prompts(2, [5, 40])
    ours, _ = run(path, prompts, block_size=16, kv_cache_memory="16MiB")
    model = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=f"{name}.gguf", dtype=torch.float32, attn_implementation="eager"
    )
    assert_matches(ours, hf_greedy(model, prompts, MAX_TOKENS))


# Mixtral (arch llama with `llama.expert_count`, q/k permuted); Qwen2-MoE (gated shared expert, top-k not
# renormalized) and Qwen3-MoE (q/k norms, renormalized), whose expert sizes transformers does not read.
@pytest.mark.sampled
@pytest.mark.parametrize(
    "name,arch,quant_type",
    [
        ("mixtral", "llama", "F32"),
        ("mixtral", "llama", "Q8_0"),
        ("qwen2_moe", "qwen2moe", "F32"),
        ("qwen2_moe", "qwen2moe", "Q8_0"),
        ("qwen3_moe", "qwen3moe", "Q8_0"),
    ],
)
def test_moe_gguf_matches_hf(tmp_path, monkeypatch, name: str, arch: str, quant_type: str) -> None:
    """A MoE GGUF as llama.cpp's converter writes it (experts stacked per projection, its metadata keys;
    Q8_0: every matrix but the routers quantized) against HF on the float folder holding the same values:
    the config read back, the same greedy tokens and logprobs (1e-4)."""
    from conftest import TINY_MODELS, build_tiny_model
    from gguf_writer import write_gguf
    from transformers import AutoConfig

    # Exact float32 activations, so both sides multiply the same values: the default 16-bit activation
    # blocks of the decode kernels keep their own 1e-3 promise, tested in tests/quantization.
    monkeypatch.setenv("PAGEDSERVE_GGUF_ACTIVATION_BITS", "32")

    # llama.cpp builds every Qwen-MoE layer sparse: no dense layer here.
    overrides = {**TINY_MODELS[name], "mlp_only_layers": []} if name == "qwen2_moe" else TINY_MODELS[name]
    folder = build_tiny_model(str(tmp_path / "hf"), name, **overrides)
    path = write_gguf(folder, arch, str(tmp_path / f"{name}.gguf"), quant_type=quant_type)
    prompts = make_prompts(3, [5, 40])
    ours, llm = run(path, prompts, block_size=16, kv_cache_memory="16MiB")
    model_config = llm.llm_engine.config.model
    expected = AutoConfig.from_pretrained(folder)
    assert model_config.architecture == expected.architectures[0]
    for key in _MOE_CONFIG_KEYS[name]:
        assert getattr(model_config.hf_config, key) == getattr(expected, key), key
    assert model_config.quantization == "gguf"  # dense matrices stay in their blocks
    assert_matches(ours, reference(folder, prompts))


_MOE_CONFIG_KEYS = {
    "mixtral": ("num_local_experts", "num_experts_per_tok"),
    "qwen2_moe": (
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "norm_topk_prob",
        "mlp_only_layers",
    ),
    "qwen3_moe": (
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "norm_topk_prob",
        "head_dim",
    ),
}


def hf_greedy_on_rounded_activations(
    folder: str, prompts: list[list[int]], bits: int, block: int = 32
) -> list[tuple[list[int], list[float]]]:
    """HF transformers with every linear layer's input rounded to `bits`-bit integers per block of `block`
    values (one scale each; the K-quant kernels: 256), as the GGUF kernels take them: the plain-PyTorch
    definition of the integer paths."""
    from gguf_reference import rounded_activations
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(
                lambda _, args: (rounded_activations(args[0], bits, block).float(),)
            )
    return hf_greedy(model, prompts, MAX_TOKENS)


@pytest.mark.sampled
@pytest.mark.parametrize(
    ("quant_type", "bits"), [("Q4_K", "16"), ("Q4_K", "8"), ("Q5_K", "16"), ("Q6_K", "16")]
)
def test_k_quant_gguf_matches_hf(tmp_path, monkeypatch, quant_type: str, bits: str) -> None:
    """A K-quant GGUF (every matrix, the embedding and LM head included, in `quant_type` blocks) against HF
    on the float folder holding the same values. Float activations (the file's rows, the exact path): the
    same greedy tokens and logprobs (1e-4). Integer activation blocks (`bits` 16: 15-bit blocks, the
    default; 8) through the 16-row packed kernel, prefill and decode: against HF with each linear layer's
    input rounded as the kernel rounds it, the prefill's token equal and its logprob within 5e-2; the
    kernel's own exactness on rounded inputs is tested per type, shape and batch in
    tests/kernels/test_gguf_matmul.py."""
    from conftest import TINY_MODELS, build_tiny_model
    from gguf_writer import write_gguf

    folder = build_tiny_model(str(tmp_path / "hf"), "llama", **TINY_MODELS["llama-kquant"])
    path = write_gguf(folder, "llama", str(tmp_path / "llama.gguf"), quant_type=quant_type)
    prompts = make_prompts(5, [5, 9, 12, 40, 70])
    monkeypatch.setenv("PAGEDSERVE_GGUF_ACTIVATION_BITS", "32")
    exact, _ = run(path, prompts, block_size=16, kv_cache_memory="16MiB")
    assert_matches(exact, reference(folder, prompts))
    monkeypatch.setenv("PAGEDSERVE_GGUF_ACTIVATION_BITS", bits)
    rounded, _ = run(path, prompts, block_size=16, kv_cache_memory="16MiB", max_num_batched_tokens=64)
    # NOTE: only the first token: an activation on a rounding tie goes either way under float32 summation
    # order, and this random model turns one such flip into later tokens' logprobs moving by up to ~0.8.
    for (tokens, logprobs), (hf_tokens, hf_logprobs) in zip(
        rounded, hf_greedy_on_rounded_activations(folder, prompts, 15 if bits == "16" else 8, 256)
    ):
        assert tokens[0] == hf_tokens[0] and abs(logprobs[0] - hf_logprobs[0]) < 5e-2
    assert rounded != exact  # the integer kernels ran

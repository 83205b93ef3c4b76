"""`pagedserve plan` against hand-computed figures for Llama-2-7B, Llama-3-8B and Llama-3-70B (their
config.json files ship in tests/data), and against the engine's own sizing of a tiny model."""

import json
import os

import pytest
import torch

from pagedserve import LLM
from pagedserve.entrypoints.cli import main as cli_main
from pagedserve.model_shape import ModelShape

DATA = os.path.join(os.path.dirname(__file__), os.pardir, "data")
GiB = 2**30


def plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    status = cli_main(["plan", *args, "--json"])
    return status, json.loads(capsys.readouterr().out)


def test_llama_2_7b_fp16_explicit_budget(capsys: pytest.CaptureFixture[str]) -> None:
    status, result = plan(
        capsys, os.path.join(DATA, "llama-2-7b", "config.json"), "--kv-cache-memory", "64GiB"
    )
    # Embeddings and LM head 2 x 32000 x 4096; per layer 4 x 4096^2 (q, k, v, o) + 3 x 4096 x 11008 (MLP)
    # + 2 x 4096 (norms), 32 layers; the final norm 4096.
    params = 2 * 32000 * 4096 + 32 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096) + 4096
    assert params == 6_738_415_616 == result["num_parameters"]
    assert result["dtype"] == "float16" and result["weights_bytes"] == 2 * params
    assert (
        result["kv_bytes_per_token"] == 2 * 32 * 32 * 128 * 2 == 524_288
    )  # K+V, layers, heads, head_dim, fp16
    assert result["bytes_per_block"] == 16 * 524_288
    assert result["num_blocks"] == 64 * GiB // (16 * 524_288) - 1 == 8191  # one block is reserved
    assert result["capacity_tokens"] == 8191 * 16 == 131_056
    assert result["max_model_len"] == 4096 and result["max_requests_at_request_tokens"] == 8191 // 256 == 31
    assert result["max_concurrency_at_max_model_len"] == pytest.approx(131_056 / 4096)
    assert status == 0 and result["recommended_flags"]["--max-model-len"] == 4096


def test_kv_cache_memory_bytes_is_vllms_name_for_the_budget(capsys: pytest.CaptureFixture[str]) -> None:
    config = os.path.join(DATA, "llama-2-7b", "config.json")
    _, named = plan(capsys, config, "--kv-cache-memory", "64GiB")
    _, in_bytes = plan(capsys, config, "--kv-cache-memory-bytes", str(64 * GiB))
    assert in_bytes["num_blocks"] == named["num_blocks"] == 8191
    _, smaller = plan(capsys, config, "--kv-cache-memory-bytes", str(32 * GiB))
    assert smaller["num_blocks"] == 32 * GiB // (16 * 524_288) - 1


def test_llama_3_8b_on_an_80gib_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    status, result = plan(
        capsys,
        os.path.join(DATA, "llama-3-8b"),
        "--gpu-memory",
        "80GiB",
        "--concurrency",
        "32",
        "--input-tokens",
        "2048",
        "--output-tokens",
        "512",
    )
    params = 2 * 128256 * 4096 + 32 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) + 4096
    assert params == 8_030_261_248 == result["num_parameters"]
    weights = 2 * params  # bfloat16, the checkpoint's dtype
    assert result["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2 == 131_072  # GQA: 8 KV heads
    # Estimated activations of the 2048-token profiling forward: per token 3 x hidden + qkv + attention
    # output + 3 x intermediate, in bf16, plus one float32 row of logits.
    activations = 2048 * (3 * 4096 + 48 * 128 + 32 * 128 + 3 * 14336) * 2 + 4 * 128256
    budget = int(80 * GiB * 0.9) - weights - activations - 512 * 2**20
    assert (
        (result["activation_bytes"], result["kv_budget_bytes"])
        == (activations, budget)
        == (268_948_480, 60_443_069_440)
    )
    assert result["num_blocks"] == budget // (16 * 131_072) - 1 == 28_820
    assert result["capacity_tokens"] == 28_820 * 16 == 461_120
    assert result["max_requests_at_request_tokens"] == 28_820 // 160 == 180  # 2560 tokens = 160 blocks
    flags = result["recommended_flags"]
    assert status == 0 and flags["--max-model-len"] == 2560 and flags["--max-num-seqs"] == 32
    assert flags["--gpu-memory-utilization"] == 0.9  # it fits: the asked-for share stays


def test_llama_3_70b_does_not_fit_one_gpu_but_four(capsys: pytest.CaptureFixture[str]) -> None:
    config = os.path.join(DATA, "llama-3-70b", "config.json")
    workload = [
        "--gpu-memory",
        "80GiB",
        "--concurrency",
        "64",
        "--input-tokens",
        "4096",
        "--output-tokens",
        "1024",
    ]
    status, result = plan(capsys, config, *workload)
    assert result["num_parameters"] == 70_553_706_496 and result["kv_bytes_per_token"] == 2 * 80 * 8 * 128 * 2
    assert status == 1 and not result["fits"] and result["recommended_flags"] is None
    assert result["would_fit"][0] == "--tensor-parallel-size 4 (4 GPUs)"
    status, result = plan(capsys, config, *workload, "--tensor-parallel-size", "4")
    # Per GPU: a quarter of the heads (2 of the 8 KV heads), of the MLP and of the vocabulary.
    per_layer = 8192 * (16 + 2 * 2) * 128 + 16 * 128 * 8192 + 3 * 8192 * (28672 // 4) + 2 * 8192
    assert result["num_parameters_per_gpu"] == 2 * (128256 // 4) * 8192 + 80 * per_layer + 8192
    assert result["kv_bytes_per_token"] == 2 * 80 * 2 * 128 * 2 == 81_920
    assert status == 0 and result["max_requests_at_request_tokens"] >= 64
    capsys.readouterr()
    assert cli_main(["plan", config, *workload]) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_plan_numbers_are_the_engines(tiny_llama: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Same model and settings: the plan's figures equal what the engine sized (and logs)."""
    llm = LLM(tiny_llama, kv_cache_memory="1MiB", max_model_len=256, dtype="float32")
    core = llm.llm_engine.engine_core
    kv = core.kv_cache_config
    _, result = plan(
        capsys, tiny_llama, "--kv-cache-memory", "1MiB", "--max-model-len", "256", "--dtype", "float32"
    )
    assert result["weights_bytes"] == core.executor.worker.weights_bytes
    assert result["bytes_per_block"] == kv.bytes_per_block
    assert (result["num_blocks"], result["capacity_tokens"]) == (kv.num_blocks - 1, kv.capacity_tokens)


@pytest.mark.parametrize(
    "name",
    [
        "qwen2",
        "llama-tied-mha",
        "qwen3",
        "gemma2",
        "gemma3_text",
        "phi3",
        "falcon-7b",
        "falcon-40b",
        "mixtral",
        "qwen2_moe",
        "qwen3_moe",
        "gpt_oss",
    ],
)
def test_parameter_count_formula_matches_the_model(name: str) -> None:
    """Every family's parameters (biases, q/k norms, Gemma's four norms, Falcon's LayerNorms, every
    expert, routers and shared experts, a tied head) count as HF's model of it, and as ours at tp=1."""
    from conftest import TINY_MODELS, tiny_hf_config
    from transformers import AutoModelForCausalLM

    from pagedserve.models.registry import get_model_class

    config = tiny_hf_config(name.split("-")[0], **TINY_MODELS[name])
    model = AutoModelForCausalLM.from_config(config)
    architecture = config.architectures[0] if config.architectures else type(model).__name__
    shape = ModelShape.from_hf_config(config, architecture)
    assert shape.num_parameters() == sum(p.numel() for p in model.parameters())
    with torch.device("meta"):
        ours = get_model_class(architecture)(config)
    assert shape.num_parameters() == sum(p.numel() for p in ours.parameters())


MISTRAL_7B_V01 = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "sliding_window": 4096,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
}


def test_sliding_window_model_counts_the_freed_blocks(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    """Mistral 7B v0.1 runs at its full 32k context; a request holds at most its 4096-token window, one
    step's chunk (2048 tokens) and a partly filled block at each end: ceil((4096 - 1 + 2048) / 16) + 1 =
    385 blocks instead of 32768 / 16 = 2048."""
    (tmp_path / "config.json").write_text(json.dumps(MISTRAL_7B_V01))
    status, result = plan(
        capsys,
        str(tmp_path),
        "--kv-cache-memory",
        "8GiB",
        "--max-model-len",
        "32768",
        "--max-num-batched-tokens",
        "2048",
        "--concurrency",
        "8",
        "--input-tokens",
        "30000",
        "--output-tokens",
        "2768",
    )
    assert result["sliding_window"] == 4096 and result["max_model_len"] == 32768
    assert result["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2
    assert result["num_blocks"] == 8 * GiB // (16 * 131_072) - 1 == 4095
    assert result["max_concurrency_at_max_model_len"] == pytest.approx(4095 / 385)
    assert result["max_requests_at_request_tokens"] == 4095 // 385 == 10  # without freeing: 4095 // 2048 = 1
    assert status == 0


GEMMA2_9B_LIKE = {
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "hidden_size": 3584,
    "intermediate_size": 14336,
    "num_hidden_layers": 42,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "vocab_size": 256000,
    "max_position_embeddings": 8192,
    "sliding_window": 4096,
    "layer_types": ["sliding_attention", "full_attention"] * 21,
    "torch_dtype": "bfloat16",
}


def test_hybrid_model_counts_blocks_per_kv_cache_group(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    """Gemma 2 alternates windowed and full layers: two KV cache groups of 21 layers, so a block holds 21
    layers' K/V; a request of 8192 tokens holds every block of the full group (512) and, in the window
    group, its window plus one 2048-token chunk: ceil((4096 - 1 + 2048) / 16) + 1 = 385."""
    (tmp_path / "config.json").write_text(json.dumps(GEMMA2_9B_LIKE))
    status, result = plan(
        capsys,
        str(tmp_path),
        "--kv-cache-memory",
        "32GiB",
        "--max-num-batched-tokens",
        "2048",
        "--concurrency",
        "4",
        "--input-tokens",
        "8000",
        "--output-tokens",
        "192",
    )
    per_token = 2 * 42 * 8 * 256 * 2
    assert result["kv_cache_groups"] == 2 and result["sliding_window"] is None
    assert result["kv_bytes_per_token"] == per_token
    assert result["bytes_per_block"] == per_token * 16 * 21 // 42
    usable = 32 * GiB // result["bytes_per_block"] - 1
    assert result["num_blocks"] == usable
    per_request = 8192 // 16 + (-(-(4096 - 1 + 2048) // 16) + 1)
    assert result["max_requests_at_request_tokens"] == usable // per_request
    assert result["max_concurrency_at_max_model_len"] == pytest.approx(usable / per_request)
    assert status == 0


def test_model_as_flag_like_serve(capsys: pytest.CaptureFixture[str]) -> None:
    """`plan --model M` is `plan M` (as `serve` takes both); two different models are refused."""
    config = os.path.join(DATA, "llama-2-7b", "config.json")
    workload = ["--gpu-memory", "80GiB", "--concurrency", "4", "--input-tokens", "1000"]
    positional = plan(capsys, config, *workload)
    flag = plan(capsys, "--model", config, *workload)
    assert flag == positional and flag[1]["num_blocks"] > 0
    with pytest.raises(SystemExit) as exc:
        cli_main(["plan", config, "--model", os.path.join(DATA, "llama-3-8b", "config.json")])
    assert exc.value.code == 2 and "Two models given" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["plan", *workload])
    assert "No model given" in capsys.readouterr().err


def test_lora_slots_count_as_weights(capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3-8B, 4 slots of rank 16, tp 2: per layer q/k/v (4096 in; 4096 + 2 x 1024 out, split), o (4096
    split in, 4096 out), gate/up (4096 in; 2 x 14336 out, split), down (14336 split in, 4096 out), each
    slot rank wide per fused projection; fp16."""
    config = os.path.join(DATA, "llama-3-8b", "config.json")
    flags = ["--kv-cache-memory", "16GiB", "--tensor-parallel-size", "2"]
    _, plain = plan(capsys, config, *flags)
    _, lora = plan(capsys, config, *flags, "--enable-lora", "--max-loras", "4", "--max-lora-rank", "16")
    r = 16
    per_layer = (
        3 * r * (4096 + 6144 // 2)
        + r * (4096 // 2 + 4096)
        + 2 * r * (4096 + 28672 // 2)
        + r * (14336 // 2 + 4096)
    )
    assert lora["lora_bytes"] == 4 * 32 * per_layer * 2 and plain["lora_bytes"] == 0
    assert lora["weights_bytes"] == plain["weights_bytes"] + lora["lora_bytes"]


def test_plan_lora_bytes_are_what_the_worker_allocates(
    tiny_llama: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, result = plan(
        capsys,
        tiny_llama,
        "--kv-cache-memory",
        "8MiB",
        "--enable-lora",
        "--max-loras",
        "3",
        "--max-lora-rank",
        "8",
        "--dtype",
        "float32",
    )
    llm = LLM(tiny_llama, kv_cache_memory="8MiB", enable_lora=True, max_loras=3, max_lora_rank=8)
    runner = llm.llm_engine.engine_core.executor.worker.model_runner
    assert runner.lora is not None and result["lora_bytes"] == runner.lora.num_bytes > 0


def _q4_k(n: int) -> int:
    return n // 256 * 144


def _q6_k(n: int) -> int:
    return n // 256 * 210


LLAMA_8B_WORKLOAD = [
    "--gpu-memory",
    "12GiB",
    "--concurrency",
    "8",
    "--input-tokens",
    "2048",
    "--output-tokens",
    "512",
]


def test_llama_8b_q4_k_m_fits_12gib_with_its_packed_bytes(
    capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    """Issue 43: a Llama-3.1-8B-shaped Q4_K_M file (its header only: plan reads no tensor data) on a 12 GiB
    GPU. On CUDA its Q4_K and Q6_K rows stay packed: weights are the rows' bytes, norms in bf16."""
    from benchmarks.random_gguf import SHAPES, write_random_gguf

    path = write_random_gguf(
        str(tmp_path / "llama8b-Q4_K_M.gguf"), SHAPES["llama-8b"], None, random_data=False
    )
    status, result = plan(capsys, path, *LLAMA_8B_WORKLOAD)
    # llama.cpp's Q4_K_M: Q6_K for the LM head, and for attn_v and ffn_down on 16 of the 32 layers
    more_bits = [i for i in range(32) if i < 4 or i >= 28 or (i - 4) % 3 == 2]
    assert len(more_bits) == 16
    vocab, hidden, kv, inter = 128256, 4096, 1024, 14336
    per_layer = _q4_k(2 * hidden * hidden + kv * hidden + 2 * inter * hidden)  # q, o, k, gate, up
    weights = (
        _q4_k(vocab * hidden)
        + _q6_k(vocab * hidden)
        + 32 * per_layer
        + 16 * _q6_k(kv * hidden + hidden * inter)  # attn_v, ffn_down with more bits
        + 16 * _q4_k(kv * hidden + hidden * inter)
        + (2 * 32 + 1) * hidden * 2  # norms in bfloat16
    )
    assert result["weights_bytes"] == weights == 4_912_365_568  # 4.57 GiB, not 14.96 GiB dequantized
    assert result["weights_format"] == "GGUF Q4_K, Q6_K packed; F32 tensors in bfloat16"
    assert status == 0 and result["fits"] and result["max_requests_at_request_tokens"] >= 8
    assert result["request_tokens"] == 2560 and result["recommended_flags"]["--max-num-seqs"] == 8


def test_bf16_8b_on_12gib_lists_4_bit_weights_and_cpu_offload(capsys: pytest.CaptureFixture[str]) -> None:
    model = os.path.join(DATA, "llama-3-8b")
    status, result = plan(capsys, model, *LLAMA_8B_WORKLOAD)
    assert status == 1 and result["weights_bytes"] == 2 * 8_030_261_248
    would_fit = result["would_fit"]
    # Online int4 (Q4_1 rows: 20 bytes per 32 weights) of the linear layers, embeddings and head in bf16
    linear = 32 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    int4 = 2 * (8_030_261_248 - linear) + linear // 32 * 20
    assert f"4-bit weights ({int4 / 2**30:.2f} GiB per GPU)" in "\n".join(would_fit)
    (offload,) = [option for option in would_fit if option.startswith("--cpu-offload-gb")]
    gib = int(offload.split()[1])
    status, offloaded = plan(capsys, model, *LLAMA_8B_WORKLOAD, "--cpu-offload-gb", str(gib))
    layer = 2 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096)
    layers = -(-gib * 2**30 // layer)  # whole layers from the last, at least gib GiB
    assert offloaded["cpu_offload_bytes"] == layers * layer
    # the device keeps the rest and two layers' buffers, filled one layer ahead
    assert offloaded["weights_bytes"] == 2 * 8_030_261_248 - layers * layer + 2 * layer
    assert status == 0 and offloaded["fits"]


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "14"])
def test_cpu_offload_gb_out_of_range_names_the_flag(capsys: pytest.CaptureFixture[str], value: str) -> None:
    model = os.path.join(DATA, "llama-3-8b")
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["plan", model, *LLAMA_8B_WORKLOAD, "--cpu-offload-gb", value])
    assert exit_info.value.code == 2 and "--cpu-offload-gb" in capsys.readouterr().err


def test_deepseek_v3_kv_is_one_latent_per_layer(capsys: pytest.CaptureFixture[str]) -> None:
    """MLA (docs/models.md): a token stores kv_lora_rank + qk_rope_head_dim values per layer, on every
    tensor-parallel rank alike (the latent is replicated), not 2 x heads x head_dim."""
    config = os.path.join(DATA, "deepseek-v3", "config.json")
    _, result = plan(capsys, config, "--kv-cache-memory", "64GiB")
    assert result["kv_bytes_per_token"] == 61 * (512 + 64) * 2 == 70_272  # layers, latent + rope, bf16
    assert result["bytes_per_block"] == 16 * 70_272
    assert result["kv_layout"].startswith("MLA latent: 576 values")
    assert 671e9 < result["num_parameters"] < 672e9  # DeepSeek's published 671B (the MTP module not held)
    _, fp8_tp8 = plan(capsys, config, "--kv-cache-memory", "64GiB", "--kv-cache-dtype", "fp8", "-tp", "8")
    assert fp8_tp8["kv_bytes_per_token"] == 61 * 576 == 35_136

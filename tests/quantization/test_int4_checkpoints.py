"""GPTQ and AWQ checkpoints (written by the test-side packer in int4_reference.py from the published
formats) against their reference dequantization: the loaded weights, the kernel against
dequantize-then-matmul at batch 1..256, and greedy tokens and logprobs against HF transformers running the
reference-dequantized float weights."""

import random

import pytest
import torch
from conftest import build_tiny_model
from int4_reference import LINEAR_NAMES, Scheme, group_index, quantize, write_checkpoints

from pagedserve import LLM, SamplingParams
from pagedserve.config import EngineArgs
from pagedserve.kernels.cpu.gguf_ops import gguf_dequantize
from pagedserve.model_loader.loader import load_model

# Hidden 128 and MLP 256: every projection's input is whole groups of 128.
SIZES = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
SCHEMES = {
    "gptq-g32-asym": Scheme("gptq", 32),
    "gptq-g64-actorder-sym": Scheme("gptq", 64, desc_act=True, sym=True),
    "gptq-g128-actorder-asym-v2": Scheme("gptq", 128, desc_act=True, checkpoint_format="gptq_v2"),
    "gptq-g128-sym": Scheme("gptq", 128, sym=True),
    "awq-g32": Scheme("awq", 32),
    "awq-g64": Scheme("awq", 64),
    "awq-g128": Scheme("awq", 128),
}
CASES = [("llama", name) for name in SCHEMES] + [("qwen2", "gptq-g64-actorder-sym"), ("qwen2", "awq-g128")]
# The other families that load 4-bit checkpoints (weights and kernel only).
OTHER_FAMILIES = [("mistral", "awq-g32"), ("qwen3", "gptq-g32-asym"), ("gemma2", "gptq-g64-actorder-sym")]
# End to end: each format, act-order, asymmetric zeros, both families (the weights of every case are
# checked exactly above, so every case need not run HF too).
GREEDY_CASES = [CASES[0], CASES[2], CASES[5], CASES[7], CASES[8]]
PROMPT_LENS = [3, 17, 40]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """checkpoints(architecture, scheme) -> (quantized folder, reference float folder), built once."""
    built: dict[tuple[str, str], tuple[str, str]] = {}

    def get(architecture: str, scheme: str) -> tuple[str, str]:
        if (architecture, scheme) not in built:
            root = tmp_path_factory.mktemp(f"{architecture}-{scheme}")
            float_folder = build_tiny_model(str(root / "float"), architecture, **SIZES)
            quantized, reference = str(root / "quantized"), str(root / "reference")
            write_checkpoints(float_folder, SCHEMES[scheme], quantized, reference)
            built[architecture, scheme] = quantized, reference
        return built[architecture, scheme]

    return get


def _load(folder: str) -> torch.nn.Module:
    return load_model(
        EngineArgs(model=folder, device="cpu").create_engine_config().model, torch.device("cpu")
    )


def _stored_weight(layer: torch.nn.Module) -> torch.Tensor:
    """A loaded layer's weight as it holds it (Q4_0 blocks, plus each group's offset when asymmetric), in
    the checkpoint's column order."""
    method = layer.quant_method
    weight = gguf_dequantize(layer.qweight, 2, method.cols)  # Q4_0
    offsets = getattr(layer, "group_offsets", None)  # [groups, N]
    if offsets is not None:
        weight += offsets.t().repeat_interleave(method.group_width, dim=1)
    if method.permutation is None:
        return weight
    restored = torch.empty_like(weight)
    restored[:, method.permutation] = weight
    return restored


def _fused_reference(reference: dict[str, torch.Tensor], prefix: str, fused: str) -> torch.Tensor:
    parts = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    names = parts.get(fused, [fused])
    return torch.cat([reference[f"{prefix}.{name}.weight"] for name in names])


@pytest.mark.parametrize(("architecture", "scheme"), CASES + OTHER_FAMILIES)
def test_loaded_weights_and_kernel_match_the_reference(checkpoints, architecture: str, scheme: str) -> None:
    from safetensors.torch import load_file

    quantized, reference_folder = checkpoints(architecture, scheme)
    reference = load_file(f"{reference_folder}/model.safetensors")
    model = _load(quantized)
    layers = {name: m for name, m in model.named_modules() if hasattr(m, "quant_method") and "proj" in name}
    assert len(layers) == 4 * 2  # qkv, o, gate_up, down in each of 2 layers
    generator = torch.Generator().manual_seed(0)
    for name, layer in layers.items():
        prefix, fused = name.rsplit(".", 1)
        expected = _fused_reference(reference, prefix, fused)
        stored = _stored_weight(layer)
        assert torch.equal(stored, expected), name
        # 4 bits per weight (+ the blocks' fp16 scales), and an offset per group only when asymmetric
        assert layer.qweight.dtype == torch.uint8 and layer.qweight.numel() == stored.numel() * 18 // 32
        assert hasattr(layer, "group_offsets") != SCHEMES[scheme].sym and not hasattr(layer, "qzeros")
        for batch in (1, 2, 7, 64, 256):
            x = torch.randn(batch, layer.quant_method.cols, generator=generator)
            ours = layer.quant_method.apply(layer, x)
            torch.testing.assert_close(ours, x @ stored.t(), rtol=1e-4, atol=1e-4)


def _prompts() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, 49152) for _ in range(n)] for n in PROMPT_LENS]


def _hf_greedy(folder: str) -> list[tuple[list[int], list[float]]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    results = []
    for prompt in _prompts():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
        tokens = out.sequences[0, len(prompt) :].tolist()
        logprobs = [torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(out.logits, tokens)]
        results.append((tokens, logprobs))
    return results


def _greedy(llm: LLM) -> list[tuple[list[int], list[float]]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in _prompts()], params, use_tqdm=False)
    return [
        (
            o.outputs[0].token_ids,
            [step[t].logprob for step, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)],
        )
        for o in outputs
    ]


def _assert_greedy_equals_hf(llm: LLM, reference: str) -> None:
    """Greedy tokens identical, each token's logprob within 1e-4 (relative above 1); shuts `llm` down."""
    ours, theirs = _greedy(llm), _hf_greedy(reference)
    llm.llm_engine.engine_core.shutdown()
    assert [tokens for tokens, _ in ours] == [tokens for tokens, _ in theirs]
    for (_, our_logprobs), (_, their_logprobs) in zip(ours, theirs):
        worst = max(abs(a - b) / max(abs(b), 1.0) for a, b in zip(our_logprobs, their_logprobs))
        assert worst < 1e-4, worst


@pytest.mark.parametrize(("architecture", "scheme"), GREEDY_CASES)
def test_greedy_tokens_equal_hf_on_the_reference_weights(checkpoints, architecture: str, scheme: str) -> None:
    quantized, reference = checkpoints(architecture, scheme)
    llm = LLM(quantized, kv_cache_memory="16MiB", max_model_len=128)
    assert llm.llm_engine.config.model.quantization == SCHEMES[scheme].method
    _assert_greedy_equals_hf(llm, reference)


def test_the_reference_packer_round_trips_its_own_grid() -> None:
    """The test-side quantizer: every group's values within half a step of the weight (so the checks
    above compare real 4-bit weights), act-order groups of exactly group_size columns."""
    weight = torch.randn(16, 128, generator=torch.Generator().manual_seed(1))
    g_idx = group_index(128, 32, desc_act=True)
    assert torch.bincount(g_idx).tolist() == [32] * 4 and (g_idx.diff() < 0).any()
    quantized = quantize(weight, g_idx, sym=False)
    step = quantized.scale.float()[:, g_idx]
    assert ((quantized.dequantize() - weight).abs() <= step * 0.51).all()
    assert LINEAR_NAMES[-1] == "down_proj"


@pytest.mark.slow
def test_tensor_parallel_shards_the_groups(checkpoints) -> None:
    """tp=2: q/k/v, gate/up split by output rows, o/down by input columns (whole groups per rank): greedy
    tokens and logprobs as HF's on the reference weights. Act-order cannot split o/down: refused."""
    quantized, reference = checkpoints("llama", "gptq-g128-actorder-asym-v2")
    with pytest.raises(Exception, match="act-order \\(desc_act\\).*--tensor-parallel-size 1"):
        LLM(quantized, tensor_parallel_size=2, kv_cache_memory="16MiB", max_model_len=128)
    quantized, reference = checkpoints("llama", "awq-g64")
    _assert_greedy_equals_hf(
        LLM(quantized, tensor_parallel_size=2, kv_cache_memory="16MiB", max_model_len=128), reference
    )

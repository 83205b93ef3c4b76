"""fp8 weight checkpoints (quant_method "fp8"): a tiny Llama quantized here from the format's description
(per-tensor, per-channel and block-wise scales; static W8A8's input_scale), saved as a HF folder. Loaded,
its weights stay fp8 and dequantize to the reference's values exactly; greedy tokens equal HF transformers
running those reference-dequantized weights in float32, through the native kernel and the torch fallback."""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from pagedserve.errors import ConfigError
from pagedserve.quantization.fp8 import Fp8Config, Fp8LinearMethod
from tests.models.test_greedy_vs_hf import assert_matches, make_prompts, reference, run

pytestmark = pytest.mark.slow  # engines on tiny models

FP8_MAX = 448.0
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BLOCK = 16  # the format's 128 x 128 blocks, scaled down to the tiny model


def quantize(weight: torch.Tensor, scheme: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(fp8 weight, the checkpoint's scale tensor, the dequantized float32 weight), as the format defines
    them: weight ~= fp8 * scale, scale = max|W| / 448 over the tensor, each output row, or each block."""
    n, k = weight.shape
    if scheme == "per-tensor":
        scale = weight.abs().max() / FP8_MAX
        full = scale.expand(n, k)
    elif scheme == "per-channel":
        scale = weight.abs().amax(dim=1, keepdim=True) / FP8_MAX  # [N, 1]
        full = scale.expand(n, k)
    else:  # block-wise: [ceil(N / B), ceil(K / B)]
        padded = torch.zeros(-(-n // BLOCK) * BLOCK, -(-k // BLOCK) * BLOCK)
        padded[:n, :k] = weight.abs()
        blocks = padded.view(padded.shape[0] // BLOCK, BLOCK, padded.shape[1] // BLOCK, BLOCK)
        scale = blocks.amax(dim=(1, 3)) / FP8_MAX
        full = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:n, :k]
    fp8 = (weight / full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return fp8, scale.float().contiguous(), fp8.float() * full


def fp8_checkpoint(
    source: str,
    folder: str,
    scheme: str,
    static: bool = False,
    keep_float: frozenset[str] = frozenset(),
    extra_config: dict | None = None,
) -> tuple[str, str]:
    """(fp8 folder, float folder holding the reference-dequantized weights) of the model in `source`;
    the linear layers named in `keep_float` stay float; `extra_config` joins its quantization_config."""
    fp8_folder, float_folder = os.path.join(folder, "fp8"), os.path.join(folder, "float")
    for target in (fp8_folder, float_folder):
        shutil.copytree(source, target)
    tensors = load_file(os.path.join(source, "model.safetensors"))
    quantized, dequantized = dict(tensors), dict(tensors)
    for name, weight in tensors.items():
        stem = name.removesuffix(".weight")
        if name.endswith(".weight") and name.split(".")[-2] in LINEARS and stem not in keep_float:
            fp8, scale, dequantized[name] = quantize(weight, scheme)
            quantized[name] = fp8
            quantized[f"{stem}.weight_scale_inv" if scheme == "block" else f"{stem}.weight_scale"] = scale
            if static:
                quantized[f"{stem}.input_scale"] = torch.tensor(0.02)
    save_file(quantized, os.path.join(fp8_folder, "model.safetensors"), metadata={"format": "pt"})
    save_file(dequantized, os.path.join(float_folder, "model.safetensors"), metadata={"format": "pt"})
    config_path = os.path.join(fp8_folder, "config.json")
    config = json.load(open(config_path))
    config["quantization_config"] = {
        "quant_method": "fp8",
        "activation_scheme": "static" if static else "dynamic",
        **({"weight_block_size": [BLOCK, BLOCK]} if scheme == "block" else {}),
        **(extra_config or {}),
    }
    json.dump(config, open(config_path, "w"))
    return fp8_folder, float_folder


def linear_layers(llm) -> dict[str, torch.nn.Module]:
    model = llm.llm_engine.engine_core.executor.worker.model_runner.model
    return {
        name: m
        for name, m in model.named_modules()
        if isinstance(getattr(m, "quant_method", None), Fp8LinearMethod)
    }


@pytest.mark.parametrize(
    "scheme,static", [("per-tensor", False), ("per-channel", True), ("block", False)], ids=str
)
def test_fp8_weights_load_exactly_and_match_hf(tmp_path, tiny_llama: str, scheme: str, static: bool) -> None:
    fp8_folder, float_folder = fp8_checkpoint(tiny_llama, str(tmp_path), scheme, static)
    prompts = make_prompts(5, [3, 24])
    ours, llm = run(fp8_folder, prompts, block_size=16, kv_cache_memory="8MiB")
    layers = linear_layers(llm)
    assert len(layers) == 2 * 4  # qkv, o, gate_up, down in each of 2 layers
    reference_weights = load_file(os.path.join(float_folder, "model.safetensors"))
    for name, layer in layers.items():
        assert layer.weight.dtype == torch.float8_e4m3fn  # resident in 1 byte per weight
        parts = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
        short = name.rsplit(".", 1)[-1]
        expected = torch.cat(
            [reference_weights[name.replace(short, part) + ".weight"] for part in parts.get(short, (short,))]
        )
        assert torch.equal(layer.quant_method.dequantized_weight(layer), expected), name
        if static:
            assert layer.input_scale.item() > 0
    assert_matches(ours, reference(float_folder, prompts))


def test_torch_fallback_matches_hf(tmp_path, tiny_llama: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the native kernels: the weight dequantized per matmul (in row chunks) in torch."""
    import pagedserve.quantization.fp8 as fp8_module

    monkeypatch.setattr(fp8_module, "_native_kernels", lambda: False)
    monkeypatch.setattr(fp8_module, "_CHUNK_ELEMENTS", 1000)  # several chunks even on tiny weights
    fp8_folder, float_folder = fp8_checkpoint(tiny_llama, str(tmp_path), "block")
    prompts = make_prompts(6, [5, 30])
    ours, _ = run(fp8_folder, prompts, block_size=16, kv_cache_memory="8MiB")
    assert_matches(ours, reference(float_folder, prompts))


@pytest.mark.parametrize(
    "quant_config,message",
    [
        ({"activation_scheme": "weird"}, "activation_scheme is 'weird'"),
        ({"weight_block_size": [128]}, r"weight_block_size is \[128\]"),
        ({"weight_block_size": [128, -1]}, "two integers"),
        ({"weight_block_size": [True, 128]}, "two integers"),
        ({"weight_block_size": [0, 128]}, r"two integers \[block_n, block_k\] in \[1, 65536\]"),
        ({"weight_block_size": [2**64, 128]}, r"two integers \[block_n, block_k\] in \[1, 65536\]"),
        ({"weight_block_size": [float("nan"), 128]}, r"two integers \[block_n, block_k\] in \[1, 65536\]"),
        ({"weight_block_size": "128x128"}, r"two integers \[block_n, block_k\] in \[1, 65536\]"),
        ({"fmt": "e5m2"}, "fmt is 'e5m2'"),
    ],
)
def test_bad_quantization_configs_are_refused(quant_config: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Fp8Config.from_checkpoint({"quant_method": "fp8", **quant_config})


def test_fp8_is_detected_and_other_flags_are_refused(tmp_path, tiny_llama: str) -> None:
    from pagedserve.config import EngineArgs

    fp8_folder, _ = fp8_checkpoint(tiny_llama, str(tmp_path), "per-channel")
    assert EngineArgs(model=fp8_folder).create_engine_config().model.quantization == "fp8"
    for flag in ("int8", "none"):
        with pytest.raises(ConfigError, match="cannot load an fp8 checkpoint"):
            EngineArgs(model=fp8_folder, quantization=flag).create_engine_config()
    with pytest.raises(ConfigError, match="--quantization fp8 loads checkpoints quantized to fp8"):
        EngineArgs(model=tiny_llama, quantization="fp8").create_engine_config()

"""--quantization: detected from the checkpoint, validated with messages that name the choices."""

import json
import shutil

import pytest
import torch

from pagedserve.config import EngineArgs
from pagedserve.errors import ConfigError
from pagedserve.quantization import QUANTIZATION_CONFIGS
from pagedserve.quantization.gguf import GGUFMethod
from pagedserve.quantization.rtn import GGML_Q8_0, RTNMethod, quantize_q4_1, quantize_q8_0


def _quantization(model: str, **kwargs: object) -> str | None:
    return EngineArgs(model=model, device="cpu", **kwargs).create_engine_config().model.quantization


def test_gguf_files_are_quantized_by_default_and_none_dequantizes(default_model: str) -> None:
    assert _quantization(default_model) == "gguf"
    assert _quantization(default_model, quantization="none") is None
    with pytest.raises(ConfigError, match="already gguf"):
        _quantization(default_model, quantization="int8")


def test_float_checkpoints_take_online_schemes_only(tiny_llama: str) -> None:
    assert _quantization(tiny_llama) is None
    assert _quantization(tiny_llama, quantization="int4") == "int4"
    with pytest.raises(ConfigError, match="needs a GGUF file"):
        _quantization(tiny_llama, quantization="gguf")
    with pytest.raises(ConfigError, match="must be one of gguf, int8, int4, .*gptq, awq, fp8, mxfp4 or none"):
        _quantization(tiny_llama, quantization="squeezellm")


def test_an_unsupported_checkpoint_scheme_is_named(tiny_llama: str, tmp_path) -> None:
    folder = shutil.copytree(tiny_llama, tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ConfigError, match="'bitsandbytes'.*supported: gguf, int8, int4, .*gptq, awq, fp8, mxfp4 or none"
    ):
        _quantization(str(folder))


def test_mxfp4_checkpoints_load_as_stored_and_only_for_gpt_oss(tiny_llama: str, tmp_path) -> None:
    folder = shutil.copytree(tiny_llama, tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(
        json.dumps({**config, "quantization_config": {"quant_method": "mxfp4"}})
    )
    with pytest.raises(ConfigError, match="mxfp4 checkpoint of LlamaForCausalLM .*GptOssForCausalLM only"):
        _quantization(str(folder))
    with pytest.raises(ConfigError, match="--quantization mxfp4 loads checkpoints .* not quantized"):
        _quantization(tiny_llama, quantization="mxfp4")


def test_each_scheme_is_registered_under_its_own_name() -> None:
    assert all(QUANTIZATION_CONFIGS.load(name).name == name for name in QUANTIZATION_CONFIGS.names())


@pytest.mark.parametrize(
    ("quantize", "ggml_type", "levels"), [(quantize_q8_0, 8, 254), (quantize_q4_1, 3, 15)]
)
def test_online_quantizers_round_to_the_nearest_level(quantize, ggml_type: int, levels: int) -> None:
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    weight = torch.randn(64, 256)
    rows = quantize(weight)
    restored = torch.from_numpy(dequantize(rows.numpy(), GGMLQuantizationType(ggml_type)))
    groups = weight.reshape(-1, 32)
    step = (
        groups.amax(dim=1) - groups.amin(dim=1) if levels == 15 else 2 * groups.abs().amax(dim=1)
    ) / levels
    error = (restored.reshape(-1, 32) - groups).abs().amax(dim=1)
    assert (error <= step * 0.5 * 1.01 + 1e-6).all()  # half a step (fp16 rounding of the scale aside)


@pytest.mark.parametrize("raw", ["", "-1", "0", "4", "16.0", "nan", "inf", str(2**63), str(2**64), "sixteen"])
def test_gguf_activation_bits_rejects_other_values(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEDSERVE_GGUF_ACTIVATION_BITS", raw)
    with pytest.raises(ConfigError, match="PAGEDSERVE_GGUF_ACTIVATION_BITS=.* must be 8, 16 or 32"):
        GGUFMethod()


@pytest.mark.parametrize(("raw", "bits"), [(None, 16), ("8", 8), ("16", 16), ("32", 32)])
def test_gguf_layers_take_the_activation_bits_of_the_environment(
    raw: str | None, bits: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if raw is None:
        monkeypatch.delenv("PAGEDSERVE_GGUF_ACTIVATION_BITS", raising=False)
    else:
        monkeypatch.setenv("PAGEDSERVE_GGUF_ACTIVATION_BITS", raw)
    assert GGUFMethod().activation_bits == bits
    assert RTNMethod(GGML_Q8_0).activation_bits == bits  # the int8/int4 schemes share the kernels

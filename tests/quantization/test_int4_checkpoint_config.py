"""gptq / awq checkpoints: detected from config.json's quantization_config, every field validated (its
extremes included) with a message naming what is supported, and the flag combinations that cannot work
refused before any weight is read."""

import json
import math
import os
import shutil

import pytest
import torch

from pagedserve.config import EngineArgs
from pagedserve.config.int4_checkpoint import parse_int4_checkpoint
from pagedserve.entrypoints.cli import main as cli_main
from pagedserve.errors import ConfigError
from pagedserve.model_loader.loader import load_model

GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}
BAD_NUMBERS = [0, -1, 3, 8, 2**63, 2**64, 1.5, math.nan, math.inf, "4", None, True, [4]]


@pytest.fixture
def with_quant_config(tiny_llama: str, tmp_path):
    """with_quant_config(dict) -> a copy of the tiny Llama whose config.json carries that
    quantization_config (the tensors are the float ones: nothing here reads them)."""

    def make(quant_config: dict) -> str:
        folder = shutil.copytree(tiny_llama, tmp_path / f"model{len(list(tmp_path.iterdir()))}")
        config = json.loads((folder / "config.json").read_text())
        config["quantization_config"] = quant_config
        (folder / "config.json").write_text(json.dumps(config))
        return str(folder)

    return make


def _model_config(folder: str, **kwargs: object):
    return EngineArgs(model=folder, device="cpu", **kwargs).create_engine_config().model


def test_checkpoints_are_detected_and_their_layout_read(with_quant_config) -> None:
    assert _model_config(with_quant_config(GPTQ)).quantization == "gptq"
    assert _model_config(with_quant_config(AWQ), quantization="awq").quantization == "awq"
    v1 = parse_int4_checkpoint("gptq", {**GPTQ, "desc_act": True, "group_size": -1})
    assert (v1.group_size, v1.desc_act, v1.zeros_minus_one) == (-1, True, True)
    v2 = parse_int4_checkpoint("gptq", {**GPTQ, "checkpoint_format": "gptq_v2"})
    assert not v2.zeros_minus_one
    # AutoAWQ's own quant_config.json names: w_bit, q_group_size; "GEMM" in capitals
    awq = parse_int4_checkpoint(
        "awq", {"w_bit": 4, "q_group_size": 128, "zero_point": True, "version": "GEMM"}
    )
    assert (awq.group_size, awq.desc_act, awq.zeros_minus_one) == (128, False, False)


def _is_valid(method: str, field: str, value: object) -> bool:
    """Values these checks accept: bits 4; group sizes that are multiples of 32 (2^63 and 2^64 too: the
    layers check them against their columns, below) and GPTQ's -1 (whole rows)."""
    if field == "bits":
        return value == 4 and not isinstance(value, bool)
    return value in (2**63, 2**64) or (value == -1 and method == "gptq")


INVALID = [
    (method, field, value)
    for method in ("gptq", "awq")
    for field in ("bits", "group_size")
    for value in BAD_NUMBERS + [16, 48, 33]
    if not _is_valid(method, field, value)
]


@pytest.mark.parametrize(("method", "field", "value"), INVALID)
def test_unsupported_bits_and_group_sizes_are_refused(method: str, field: str, value: object) -> None:
    base = GPTQ if method == "gptq" else AWQ
    with pytest.raises(ConfigError, match=rf"{field}=.*Supported: gptq: bits 4, group_size a multiple of 32"):
        parse_int4_checkpoint(method, {**base, field: value})


@pytest.mark.parametrize(
    ("method", "field", "value"),
    [
        ("gptq", "desc_act", "yes"),
        ("gptq", "sym", None),
        ("gptq", "checkpoint_format", "marlin"),
        ("gptq", "lm_head", True),
        ("gptq", "dynamic", {"-:.*down": {}}),
        ("awq", "version", "gemv"),
        ("awq", "zero_point", False),
        ("awq", "modules_to_not_convert", ["visual"]),
    ],
)
def test_unsupported_layouts_are_refused(method: str, field: str, value: object) -> None:
    base = GPTQ if method == "gptq" else AWQ
    with pytest.raises(ConfigError, match=f"This {method} checkpoint has .*Supported: gptq: bits 4"):
        parse_int4_checkpoint(method, {**base, field: value})


def test_the_engine_config_refuses_a_bad_checkpoint_before_loading(with_quant_config) -> None:
    with pytest.raises(ConfigError, match="bits=8"):
        _model_config(with_quant_config({**GPTQ, "bits": 8}))


def test_flags_that_cannot_load_the_checkpoint_are_refused(with_quant_config, tiny_llama: str) -> None:
    gptq = with_quant_config(GPTQ)
    with pytest.raises(ConfigError, match="--quantization none cannot load a gptq checkpoint"):
        _model_config(gptq, quantization="none")
    with pytest.raises(ConfigError, match="--quantization awq needs a checkpoint quantized with awq.*gptq"):
        _model_config(gptq, quantization="awq")
    with pytest.raises(ConfigError, match="needs a checkpoint quantized with gptq.*not quantized"):
        _model_config(tiny_llama, quantization="gptq")
    with pytest.raises(ConfigError, match="CPU kernels only.*--device cpu"):
        load_model(_model_config(gptq), torch.device("meta"))  # any device but the CPU
    assert _model_config(gptq, load_format="dummy").quantization is None  # random float weights


@pytest.mark.parametrize("group_size", [2**63, 2**64, 64 * 3])
def test_a_group_size_that_does_not_divide_the_layers_is_refused(with_quant_config, group_size: int) -> None:
    config = _model_config(with_quant_config({**GPTQ, "group_size": group_size}))
    with pytest.raises(ConfigError, match=f"not whole groups of {group_size}"):
        load_model(config, torch.device("cpu"))


@pytest.mark.parametrize(("quant_config", "bits"), [(GPTQ, 4.5), ({**AWQ, "group_size": 128}, 4.75)])
def test_plan_counts_the_linear_layers_in_4_bits(tmp_path, capsys, quant_config: dict, bits: float) -> None:
    """Llama-2-7B in fp16 with 4-bit linear layers: 4 bits + an fp16 scale per 32, + a float32 offset
    per group when asymmetric; embeddings, LM head and norms stay fp16."""
    data = os.path.join(os.path.dirname(__file__), os.pardir, "data", "llama-2-7b", "config.json")
    config = json.load(open(data))
    config["quantization_config"] = quant_config
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert cli_main(["plan", str(tmp_path / "config.json"), "--kv-cache-memory", "8GiB", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    linear = 32 * (4 * 4096**2 + 3 * 4096 * 11008)
    others = 2 * 32000 * 4096 + 32 * 2 * 4096 + 4096  # embeddings, LM head, norms
    assert result["weights_bytes"] == 2 * others + math.ceil(linear * bits / 8)


def test_families_with_fused_checkpoint_tensors_or_experts_are_refused(tiny_model_factory, tmp_path) -> None:
    for name in ("phi3", "mixtral"):
        folder = shutil.copytree(tiny_model_factory(name), tmp_path / name)
        config = json.loads((folder / "config.json").read_text())
        config["quantization_config"] = GPTQ
        (folder / "config.json").write_text(json.dumps(config))
        with pytest.raises(ConfigError, match="gptq checkpoints of .* are not supported.*LlamaForCausalLM"):
            _model_config(str(folder))


def test_g_idx_that_cannot_be_served_is_refused() -> None:
    """One activation permutation serves a fused layer: q/k/v must share act-order's g_idx; g_idx must name
    groups that exist; a shuffled g_idx with desc_act false would be silently wrong."""
    from pagedserve.config.int4_checkpoint import Int4CheckpointFormat
    from pagedserve.layers.linear import QKVParallelLinear
    from pagedserve.quantization.base import set_quantization_config
    from pagedserve.quantization.gptq import GPTQConfig

    def layer(desc_act: bool) -> QKVParallelLinear:
        with set_quantization_config(GPTQConfig(Int4CheckpointFormat("gptq", 32, desc_act, True, False))):
            return QKVParallelLinear(64, 16, 4, 2)

    shuffled = (torch.arange(64) // 32)[torch.randperm(64, generator=torch.Generator().manual_seed(0))]
    act_order = layer(True)
    act_order.g_idx.weight_loader(act_order.g_idx, shuffled.to(torch.int32), "q")
    with pytest.raises(ConfigError, match="different act-order g_idx"):
        act_order.g_idx.weight_loader(act_order.g_idx, shuffled.flip(0).to(torch.int32), "k")
    with pytest.raises(ConfigError, match="groups outside 0..1"):
        act_order.g_idx.weight_loader(act_order.g_idx, shuffled.to(torch.int32) + 1, "v")
    with pytest.raises(ConfigError, match="says desc_act false"):
        layer(False).g_idx.weight_loader(None, shuffled.to(torch.int32), "q")

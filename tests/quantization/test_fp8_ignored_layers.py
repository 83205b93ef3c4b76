"""fp8 checkpoints that leave some layers in float (`quantization_config.ignored_layers`, llm-compressor's
`ignore`, transformers' `modules_to_not_convert`): those layers load as float weights equal to the
checkpoint's, the others stay fp8, and greedy tokens equal HF transformers on the same weights."""

import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from pagedserve.errors import ConfigError
from pagedserve.models.registry import get_model_class
from pagedserve.quantization.base import UnquantizedMethod, set_quantization_config
from pagedserve.quantization.fp8 import Fp8Config, Fp8LinearMethod
from tests.models.test_greedy_vs_hf import assert_matches, make_prompts, reference, run
from tests.quantization.test_fp8_weights import fp8_checkpoint

IGNORED = [
    "lm_head",
    r"re:.*mlp\.down_proj$",
    r"re:model\.layers\.0\.self_attn\.[qkv]_proj",
    "model.layers.1.self_attn.o_proj",
]
FLOAT_LINEARS = {  # the checkpoint's linear layers these entries name
    "model.layers.0.self_attn.q_proj",
    "model.layers.0.self_attn.k_proj",
    "model.layers.0.self_attn.v_proj",
    "model.layers.0.mlp.down_proj",
    "model.layers.1.mlp.down_proj",
    "model.layers.1.self_attn.o_proj",
}


@pytest.mark.slow
def test_ignored_layers_load_in_float_and_match_hf(tmp_path, tiny_llama: str) -> None:
    fp8_folder, float_folder = fp8_checkpoint(
        tiny_llama,
        str(tmp_path),
        "per-channel",
        static=True,  # the float layers have no input_scale either
        keep_float=frozenset(FLOAT_LINEARS),
        extra_config={"ignored_layers": IGNORED},
    )
    prompts = make_prompts(7, [4, 20])
    ours, llm = run(fp8_folder, prompts, block_size=16, kv_cache_memory="8MiB")
    model = llm.llm_engine.engine_core.executor.worker.model_runner.model
    methods = {
        name: type(module.quant_method)
        for name, module in model.named_modules()
        if name.endswith(("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))
    }
    assert methods == {
        "model.layers.0.self_attn.qkv_proj": UnquantizedMethod,
        "model.layers.0.self_attn.o_proj": Fp8LinearMethod,
        "model.layers.0.mlp.gate_up_proj": Fp8LinearMethod,
        "model.layers.0.mlp.down_proj": UnquantizedMethod,
        "model.layers.1.self_attn.qkv_proj": Fp8LinearMethod,
        "model.layers.1.self_attn.o_proj": UnquantizedMethod,
        "model.layers.1.mlp.gate_up_proj": Fp8LinearMethod,
        "model.layers.1.mlp.down_proj": UnquantizedMethod,
    }
    checkpoint = load_file(os.path.join(fp8_folder, "model.safetensors"))
    layers = dict(model.named_modules())
    qkv = layers["model.layers.0.self_attn.qkv_proj"]
    assert qkv.weight.dtype == torch.float32 and not hasattr(qkv, "weight_scale")
    expected = torch.cat([checkpoint[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(qkv.weight, expected)
    for name in ("model.layers.0.mlp.down_proj", "model.layers.1.self_attn.o_proj"):
        assert torch.equal(layers[name].weight, checkpoint[f"{name}.weight"]), name
    assert layers["model.layers.1.self_attn.qkv_proj"].weight.dtype == torch.float8_e4m3fn
    assert_matches(ours, reference(float_folder, prompts))


def build_model(folder: str, config: Fp8Config) -> torch.nn.Module:
    hf_config = AutoConfig.from_pretrained(folder)
    with set_quantization_config(config):
        model = get_model_class("LlamaForCausalLM")(hf_config)
    config.prepare_layers(model)
    return model


def test_a_fused_layer_must_be_named_whole(tiny_llama: str) -> None:
    config = Fp8Config.from_checkpoint(
        {"ignore": ["re:.*layers.1.self_attn.q_proj", "re:.*layers.1.self_attn.k_proj"]}
    )
    with pytest.raises(ConfigError, match=r"name model.layers.1.self_attn.q_proj, .*k_proj but not .*v_proj"):
        build_model(tiny_llama, config)
    # transformers' key, a fused layer named as ours (Phi-3's checkpoints name qkv_proj)
    config = Fp8Config.from_checkpoint({"modules_to_not_convert": ["model.layers.1.mlp.gate_up_proj"]})
    model = build_model(tiny_llama, config)
    assert isinstance(model.get_submodule("model.layers.1.mlp.gate_up_proj").quant_method, UnquantizedMethod)
    assert isinstance(model.get_submodule("model.layers.0.mlp.gate_up_proj").quant_method, Fp8LinearMethod)


@pytest.mark.parametrize(
    "value,message",
    [
        ("lm_head", "ignored_layers is 'lm_head'; it must be a list of module names"),
        ([1], r"ignored_layers is \[1\]; it must be a list"),
        ([""], "must be a list of module names"),
        ([2**64], "must be a list of module names"),
        ([float("nan")], "must be a list of module names"),
        (["re:("], r"holds 're:\(', not a valid regex"),
        ({"lm_head": True}, "must be a list of module names"),
    ],
)
def test_bad_ignored_layers_are_refused(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Fp8Config.from_checkpoint({"quant_method": "fp8", "ignored_layers": value})


def test_empty_or_absent_ignored_layers() -> None:
    assert Fp8Config.from_checkpoint({"ignored_layers": []}).ignored_layers == ()
    assert Fp8Config.from_checkpoint({"ignored_layers": None}).ignored_layers == ()
    assert Fp8Config.from_checkpoint({}).ignored_layers == ()

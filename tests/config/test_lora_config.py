"""--enable-lora's flags at their extremes: each refused with the flag named, or accepted."""

import pytest

from pagedserve.config import EngineArgs
from pagedserve.config.lora import LoRAConfig
from pagedserve.errors import ConfigError


@pytest.mark.parametrize(
    "settings,message",
    [
        (dict(max_loras=0), "--max-loras"),
        (dict(max_loras=-1), "--max-loras"),
        (dict(max_loras=2**63), "--max-loras"),
        (dict(max_lora_rank=0), "--max-lora-rank"),
        (dict(max_lora_rank=2**64), "--max-lora-rank"),
        (dict(max_lora_rank=7), "--max-lora-rank"),
        (dict(max_loras=4, max_cpu_loras=2), "--max-cpu-loras"),
        (dict(max_cpu_loras=2**63), "--max-cpu-loras"),
    ],
)
def test_bad_limits_name_their_flag(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LoRAConfig(**settings)


def test_defaults_and_what_lora_serves(tiny_model_factory) -> None:
    assert LoRAConfig().num_cpu_loras == 1 and LoRAConfig(max_loras=3).num_cpu_loras == 3
    with pytest.raises(ConfigError, match="--enable-lora does not support Phi3ForCausalLM"):
        EngineArgs(model=tiny_model_factory("phi3"), enable_lora=True).create_engine_config()
    # gpt-oss: refused, saying why (adapters target separate dense projections; its MLPs are experts)
    with pytest.raises(ConfigError, match=r"support GptOssForCausalLM \(its MLPs are fused experts\)"):
        EngineArgs(model=tiny_model_factory("gpt_oss"), enable_lora=True).create_engine_config()
    config = EngineArgs(
        model=tiny_model_factory("llama"), enable_lora=True, max_loras=2
    ).create_engine_config()
    assert config.lora == LoRAConfig(max_loras=2) and config.scheduler.max_loras == 2

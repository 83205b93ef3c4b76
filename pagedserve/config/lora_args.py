"""EngineArgs' LoRA flags (--enable-lora and the adapter slots' limits) and their resolution into a
LoRAConfig."""

from dataclasses import dataclass

from pagedserve.config.cli import config_field
from pagedserve.config.lora import LoRAConfig
from pagedserve.config.model import ModelConfig


# NOTE: keyword-only, so that in EngineArgs' __init__ they come after its own fields: EngineArgs("model")
# still names the model.
@dataclass(kw_only=True)
class LoRAArgs:
    """The LoRA part of EngineArgs (one of its base classes: the flags are one flat set)."""

    enable_lora: bool = config_field(
        False, "Serve LoRA adapters over the base model (--lora-modules, lora_request)."
    )
    max_loras: int = config_field(
        1, "--enable-lora: the most adapters in one step (each takes a slot of weights)."
    )
    max_lora_rank: int = config_field(
        16, "--enable-lora: the largest adapter rank (every slot is this wide)."
    )
    max_cpu_loras: int | None = config_field(
        None,
        "--enable-lora: adapters kept read in host memory, least recently used evicted (default --max-loras).",
    )

    def lora_config(self, model: ModelConfig) -> LoRAConfig | None:
        """The adapter slots for `model`; None without --enable-lora."""
        limits = dict(
            max_loras=self.max_loras, max_lora_rank=self.max_lora_rank, max_cpu_loras=self.max_cpu_loras
        )
        return LoRAConfig.for_model(model, **limits) if self.enable_lora else None

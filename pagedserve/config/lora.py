"""--enable-lora and its limits (vLLM's flags)."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedserve.config.model import SEPARATE_PROJECTION_ARCHITECTURES
from pagedserve.errors import ConfigError
from pagedserve.families import FAMILIES, family

if TYPE_CHECKING:
    from pagedserve.config.model import ModelConfig

# The ranks a slot can hold, as vLLM allows them.
SUPPORTED_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# The families made of the projections adapters target (q/k/v/o, gate/up/down: lora/shapes.py).
# LLaVA's: adapters on its Llama language model (models/llava.py), never on the vision tower.
LORA_ARCHITECTURES = (
    *SEPARATE_PROJECTION_ARCHITECTURES,
    *(family.architecture for family in FAMILIES if family.lora_on_language_model),
)


@dataclass(frozen=True)
class LoRAConfig:
    """`max_loras` adapters can be in one step (their weights sit in that many slots beside every linear
    layer); `max_cpu_loras` adapters stay loaded in host memory (least recently used evicted);
    `max_lora_rank` is the largest rank an adapter may have (each slot is that wide)."""

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None  # None: max_loras

    def __post_init__(self) -> None:
        if not 1 <= self.max_loras <= 1024:
            raise ConfigError(f"max_loras={self.max_loras} must be between 1 and 1024 (--max-loras).")
        if self.max_lora_rank not in SUPPORTED_LORA_RANKS:
            raise ConfigError(
                f"max_lora_rank={self.max_lora_rank} is not supported; --max-lora-rank must be one of "
                f"{', '.join(map(str, SUPPORTED_LORA_RANKS))}."
            )
        if self.max_cpu_loras is None:
            object.__setattr__(self, "max_cpu_loras", self.max_loras)
        elif not self.max_loras <= self.max_cpu_loras <= 65536:
            raise ConfigError(
                f"max_cpu_loras={self.max_cpu_loras} must be at least --max-loras ({self.max_loras}) and at "
                "most 65536 (--max-cpu-loras)."
            )

    @classmethod
    def for_model(cls, model: "ModelConfig", **limits: int | None) -> "LoRAConfig":
        """--enable-lora's settings for a model, or ConfigError when its architecture or runner has none."""
        architecture = model.architecture
        if model.pooling is not None:
            raise ConfigError("--enable-lora serves generation models only; drop it with --runner pooling.")
        if architecture not in LORA_ARCHITECTURES:
            facts = family(architecture)
            why = f" ({facts.joined_projections})" if facts is not None and facts.joined_projections else ""
            raise ConfigError(
                f"--enable-lora does not support {architecture}{why}; it serves "
                f"{', '.join(LORA_ARCHITECTURES)}. Drop --enable-lora."
            )
        return cls(**limits)  # type: ignore[arg-type]

    @property
    def num_cpu_loras(self) -> int:
        assert self.max_cpu_loras is not None, "resolved in __post_init__"
        return self.max_cpu_loras

"""The base model's projections an adapter may target, and their sizes (no torch: `pagedserve plan` and the
frontend's checks read them too)."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedserve.utils.hf_config import head_dim

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# The modules an adapter may target: the dense Llama-style projections every LoRA-capable family has.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# The submodule of a decoder layer holding each ("mlp" for the rest).
MODULE_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn"}


@dataclass(frozen=True)
class ModelShapes:
    """(input size, output size) of each target module kind in every layer of the base model."""

    num_layers: int
    sizes: dict[str, tuple[int, int]]

    @classmethod
    def of(cls, config: "PretrainedConfig") -> "ModelShapes":
        hidden, dim = config.hidden_size, head_dim(config)
        q, kv, mlp = (
            config.num_attention_heads * dim,
            config.num_key_value_heads * dim,
            config.intermediate_size,
        )
        sizes = {
            "q_proj": (hidden, q),
            "k_proj": (hidden, kv),
            "v_proj": (hidden, kv),
            "o_proj": (q, hidden),
            "gate_proj": (hidden, mlp),
            "up_proj": (hidden, mlp),
            "down_proj": (mlp, hidden),
        }
        return cls(config.num_hidden_layers, sizes)

    def slot_elements(self, max_rank: int, tp: int) -> int:
        """Values of one adapter slot on one of `tp` ranks (lora/linear.py's A and B beside each fused
        layer: q/k/v and gate/up share an input, so one A of n * max_rank rows, B block-diagonal)."""
        s = self.sizes
        hidden, q, kv, mlp = s["q_proj"][0], s["q_proj"][1], s["k_proj"][1], s["gate_proj"][1]
        per_layer = (
            3 * max_rank * (hidden + (q + 2 * kv) // tp)  # qkv_proj (column parallel)
            + max_rank * (q // tp + hidden)  # o_proj (row parallel)
            + 2 * max_rank * (hidden + 2 * mlp // tp)  # gate_up_proj
            + max_rank * (mlp // tp + hidden)  # down_proj
        )
        return per_layer * self.num_layers

    def max_adapter_bytes(self, max_rank: int) -> int:
        """The largest file an adapter of rank <= max_rank can be (float32, every module), plus slack for
        the file's header: anything larger is refused unread."""
        per_layer = sum(max_rank * (n_in + n_out) for n_in, n_out in self.sizes.values())
        return 4 * per_layer * self.num_layers + (1 << 20)

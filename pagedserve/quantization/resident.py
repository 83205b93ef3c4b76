"""What the model's weights hold in device memory, per layer type and format: the startup log, the
`model_weight_bytes` metric and the KV-cache sizing all count this one measurement."""

import re
from dataclasses import dataclass, field

from torch import nn

from pagedserve.quantization.base import QuantizeMethodBase
from pagedserve.utils import format_bytes

# Layer type -> the module names it covers (the first match wins; anything else is "other": norms, routers).
_LAYER_TYPES = (
    ("experts", re.compile(r"\.experts(\.|$)")),
    ("embedding", re.compile(r"embed_tokens|(^|\.)(word|token)_embeddings?$|wte$")),
    ("lm head", re.compile(r"(^|\.)lm_head$")),
    ("attention qkv/o", re.compile(r"(self_attn|attention|attn)\.")),
    ("mlp", re.compile(r"(mlp|feed_forward|ffn)\.")),
)


@dataclass
class ResidentWeights:
    """Bytes and storage formats of the weights, per layer type; `total`: every parameter, once."""

    bytes: dict[str, int] = field(default_factory=dict)
    formats: dict[str, set[str]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.bytes.values())

    def describe(self) -> str:
        """One line for the startup log: each type's bytes and formats, then the total."""
        parts = [
            f"{kind} {format_bytes(n)} ({', '.join(sorted(self.formats[kind]))})"
            for kind, n in self.bytes.items()
        ]
        return f"{'; '.join(parts)}; total {format_bytes(self.total)}"


def resident_weights(model: nn.Module) -> ResidentWeights:
    """Measures `model`'s parameters (a tied head's shared storage counted once, under the embedding)."""
    resident, seen = ResidentWeights(), set[int]()
    for name, module in model.named_modules():
        params = [p for p in module.parameters(recurse=False) if id(p) not in seen]
        if not params:
            continue
        seen.update(id(p) for p in params)
        kind = next((kind for kind, pattern in _LAYER_TYPES if pattern.search(name)), "other")
        method = getattr(module, "quant_method", None)
        formats = (
            method.storage_formats(module)
            if isinstance(method, QuantizeMethodBase)
            else {str(p.dtype).removeprefix("torch.") for p in params}
        )
        resident.bytes[kind] = resident.bytes.get(kind, 0) + sum(p.numel() * p.element_size() for p in params)
        resident.formats.setdefault(kind, set()).update(formats)
    return resident

"""fp8 KV-cache scales shipped in a checkpoint (as vLLM reads them): per layer, `...self_attn.k_scale` /
`v_scale`, or in older formats `...k_proj.output_scale` / `v_proj.output_scale`, or one `kv_scale` for
both. They are taken out of the weight stream (no parameter holds them) and kept on each layer's
`Attention` as `checkpoint_kv_scales`, which the model runner uses for --kv-cache-dtype fp8 (unless
--calculate-kv-scales)."""

import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from pagedserve.errors import ConfigError
from pagedserve.layers.attention import Attention
from pagedserve.logger import init_logger

logger = init_logger(__name__)

# NOTE: \b keeps `kv_scale` from matching as `v_scale` (no word boundary between its k and v).
_SCALE_NAME = re.compile(
    r"\blayers\.(\d+)\.\S*?\b(k_scale|v_scale|kv_scale|k_proj\.output_scale|v_proj\.output_scale)$"
)
_LAYER_INDEX = re.compile(r"\blayers\.(\d+)\.")


class KVScaleCollector:
    """Filters a checkpoint's (name, tensor) stream: KV scales are kept here, the rest passes on."""

    def __init__(self) -> None:
        self.scales: dict[int, dict[str, float]] = {}  # layer index -> {"k": scale, "v": scale}

    def filter(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            match = _SCALE_NAME.search(name)
            if match is None:
                yield name, tensor
                continue
            value = float(torch.flatten(tensor)[0])  # NOTE: a torch function reads a lazy CheckpointTensor
            if not (value > 0 and value < float("inf")):
                raise ConfigError(f"The checkpoint's KV scale {name} is {value}; it must be finite and > 0.")
            kind = match.group(2)
            layer = self.scales.setdefault(int(match.group(1)), {})
            for which in ("k", "v") if kind == "kv_scale" else (kind[0],):
                layer[which] = value

    def apply(self, model: nn.Module) -> None:
        """Give each attention layer of the model its (k, v) scales, when the checkpoint has both."""
        applied = 0
        for name, module in model.named_modules():
            index = _LAYER_INDEX.search(name)
            if not isinstance(module, Attention) or index is None:
                continue
            scales = self.scales.get(int(index.group(1)), {})
            if "k" in scales and "v" in scales:
                module.checkpoint_kv_scales = (scales["k"], scales["v"])
                applied += 1
        if self.scales:
            logger.info("KV-cache scales from the checkpoint for %d attention layers.", applied)

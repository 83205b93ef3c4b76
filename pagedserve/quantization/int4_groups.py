"""GPTQ/AWQ-style 4-bit group-wise weights, repacked at load as Q4_0 rows for the --linear-backend's
kernels (`ggml_backend.py`).

Such a checkpoint stores, per output row n and group of input columns, w = scale * (q - zero) with q and
zero in 4 bits. We store it as Q4_0 blocks of 32 (d * (q - 8), d = the group's fp16 scale: the checkpoint's
q and scale unchanged), a group of 32, 64 or 128 columns being 1, 2 or 4 blocks with the same d, plus, when
some zero is not 8 (asymmetric checkpoints), one float32 offset per group, scale * (8 - zero):
x . w = Q4_0(x) + sum over each group of (sum of its x) * offset. Both terms are the checkpoint's exact
values (an fp16 scale times a small integer is exact in float32), so the layer computes the reference
dequantization's matmul up to float32 rounding. Memory: 4.5 bits per weight, + 32 / group size for the
offsets (4.75 at groups of 128).
NOTE: why not Q4_1 (d * q + m): its m = -scale * zero is fp16, which rounds it (measured: logprobs 3.5e-4 off
the reference on the test models, one greedy token different), and it is 5 bits per weight. Why not torch's
`_weight_int4pack_mm_for_cpu`, which takes this scale/zero form: measured (benchmarks/quant_kernels.py,
docs/benchmarks.md "Kernels"), with float32 activations it is 7x to several hundred times slower than our
kernels, and with bfloat16 activations it rounds activations and scales to 8 mantissa bits.
Act-order checkpoints (GPTQ desc_act: `g_idx` assigns columns to groups out of order) have their input
columns permuted at load so each group is contiguous, and the activations gathered with the same
permutation at run time (as exllama does).
"""

from abc import abstractmethod
from collections.abc import Callable
from typing import cast

import torch
from torch import nn

from pagedserve.config.int4_checkpoint import BLOCK, Int4CheckpointFormat, parse_int4_checkpoint
from pagedserve.errors import ConfigError
from pagedserve.quantization.base import QuantizationConfig, QuantizeMethodBase
from pagedserve.quantization.ggml_backend import current_linear_backend, ggml_linear
from pagedserve.quantization.gguf import ShardLoader
from pagedserve.quantization.rtn import q4_block_rows

GGML_Q4_0 = 2
SYMMETRIC_ZERO = 8  # a symmetric 4-bit grid centered on 8: Q4_0's own offset
# A checkpoint tensor -> the same values with output rows first (what the layer's shard loaders expect).
ToOutputMajor = Callable[[torch.Tensor], torch.Tensor]


def read_whole(loaded: torch.Tensor) -> torch.Tensor:
    """A checkpoint tensor as a plain tensor: `narrow` over all of it reads a lazy safetensors tensor
    (`model_loader/safetensors.py`) whole, and is a view of a tensor."""
    return loaded.narrow(0, 0, loaded.shape[0])


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] with eight 4-bit values each (value j at bits 4j..4j+3) -> uint8 [R, C * 8]."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    nibbles = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & 0xF
    return nibbles.reshape(packed.shape[0], -1).to(torch.uint8)


def pack_pairs(q: torch.Tensor) -> torch.Tensor:
    """uint8 [R, K] 4-bit values -> uint8 [R, K / 2], columns 2i (low nibble) and 2i + 1 (high): staging
    that keeps the input dimension unpacked enough for the layers' column splits."""
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_pairs(pairs: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_pairs`."""
    return torch.stack([pairs & 0xF, pairs >> 4], dim=-1).reshape(pairs.shape[0], -1)


class GroupedInt4Method(QuantizeMethodBase):
    """Stages a layer's q (two per byte), zeros and scales with output rows first, through the layer's own
    shard loaders (so tensor parallelism splits them as it splits a float weight), then repacks them into
    Q4_0 rows and, for asymmetric zeros, per-group offsets. Subclasses say how their checkpoint's tensors
    map to that staging."""

    def __init__(self, checkpoint_format: Int4CheckpointFormat) -> None:
        self.format = checkpoint_format
        self.backend = current_linear_backend()
        self.cols = self.output_size = self.group_width = 0
        self.permutation: torch.Tensor | None = None  # act-order: the input column behind each repacked one
        self.group_index: torch.Tensor | None = None  # act-order: g_idx, the group of each input column

    @abstractmethod
    def staged_tensors(self) -> dict[str, tuple[torch.dtype, ToOutputMajor, torch.Tensor]]:
        """Checkpoint tensor name (`qweight`, ...) -> (its dtype, conversion to output-major, staging)."""

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int) -> None:
        self.cols, self.output_size = input_size, output_size
        group_size = self.format.group_size
        split_input = hasattr(layer, "input_size_per_partition") and getattr(layer, "tp_size", 1) > 1
        if split_input and (self.format.desc_act or group_size == -1):
            what = "act-order (desc_act)" if self.format.desc_act else "group_size -1"
            raise ConfigError(
                f"A {what} {self.format.method} checkpoint cannot split a row-parallel layer's input columns "
                "over tensor-parallel ranks (each rank's columns would need every group); use "
                "--tensor-parallel-size 1."
            )
        if input_size % BLOCK or (group_size > 0 and input_size % group_size):
            raise ConfigError(
                f"A {self.format.method} layer with {input_size} input columns per rank is not whole groups "
                f"of {group_size} (nor blocks of {BLOCK}); choose a --tensor-parallel-size that keeps them "
                "whole."
            )
        groups = 1 if group_size == -1 else input_size // group_size
        self.pairs = torch.zeros(output_size, input_size // 2, dtype=torch.uint8)
        self.zeros = torch.zeros(output_size, groups, dtype=torch.uint8)
        self.scales = torch.zeros(output_size, groups, dtype=torch.float16)
        shard_loader = cast(ShardLoader, layer.weight_loader)
        for name, (dtype, to_output_major, staging) in self.staged_tensors().items():
            param = nn.Parameter(torch.empty(0, dtype=dtype), requires_grad=False)
            param.weight_loader = (  # type: ignore[attr-defined]  # NOTE: read by load_weights
                lambda _, loaded, shard_id=None, convert=to_output_major, into=staging: shard_loader(
                    nn.Parameter(into, requires_grad=False), convert(read_whole(loaded)), shard_id
                )
            )
            setattr(layer, name, param)

    def _column_groups(self) -> torch.Tensor:
        """The group of each of this rank's input columns."""
        if self.group_index is not None:
            return self.group_index
        if self.format.group_size == -1:
            return torch.zeros(self.cols, dtype=torch.int64)
        return torch.arange(self.cols) // self.format.group_size

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        q = unpack_pairs(self.pairs)
        groups = self._column_groups().long().cpu()
        if bool((groups.diff() < 0).any()):
            order = torch.argsort(groups, stable=True)
            q, groups = q[:, order.to(q.device)], groups[order]
            self.permutation = order.to(q.device)  # NOTE: gathers the activations, on the model's device
        num_groups = self.scales.shape[1]
        self.group_width = self.cols // num_groups
        if self.group_width % BLOCK or not torch.equal(groups, torch.arange(self.cols) // self.group_width):
            raise ConfigError(
                f"The {self.format.method} checkpoint's g_idx gives groups of unequal sizes, or sizes that are "
                f"not a multiple of {BLOCK}; pagedserve's 4-bit kernels need {self.group_width} columns in "
                "each group."
            )
        scale = self.scales.float()
        block_scale = scale.repeat_interleave(self.group_width // BLOCK, dim=1).reshape(-1)
        rows = q4_block_rows(q.reshape(-1, BLOCK), block_scale, None).reshape(self.output_size, -1)
        offsets = scale * (SYMMETRIC_ZERO - self.zeros.float())  # exact: an fp16 scale times a small integer
        for name in self.staged_tensors():
            delattr(layer, name)
        layer.qweight = nn.Parameter(rows, requires_grad=False)
        if bool(offsets.any()):
            layer.group_offsets = nn.Parameter(offsets.t().contiguous(), requires_grad=False)
        del self.pairs, self.zeros, self.scales
        self.group_index = None

    def storage_formats(self, layer: nn.Module) -> set[str]:
        offsets = " + float32 group offsets" if hasattr(layer, "group_offsets") else ""
        return {f"{self.format.method} as Q4_0{offsets}"}

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.cols).float()
        if self.permutation is not None:
            flat = flat.index_select(1, self.permutation)
        y = ggml_linear(self.backend, flat, cast(torch.Tensor, layer.qweight), GGML_Q4_0).float()
        offsets = getattr(layer, "group_offsets", None)
        if offsets is not None:  # + sum over each group of x times scale * (8 - zero)
            y.addmm_(flat.view(flat.shape[0], -1, self.group_width).sum(dim=2), offsets)
        return y.reshape(*x.shape[:-1], self.output_size).to(x.dtype)


class GroupedInt4Config(QuantizationConfig):
    """A checkpoint of 4-bit groups: its linear layers use `method_class`; embeddings and the LM head
    stay float."""

    method_class: type[GroupedInt4Method]

    def __init__(self, checkpoint_format: Int4CheckpointFormat) -> None:
        self.checkpoint_format = checkpoint_format

    @classmethod
    def from_checkpoint(cls, quant_config: dict[str, object]) -> "GroupedInt4Config":
        return cls(parse_int4_checkpoint(cls.name, quant_config))

    def get_linear_method(self) -> QuantizeMethodBase:
        return self.method_class(self.checkpoint_format)

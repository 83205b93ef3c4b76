"""`gguf`: a GGUF file's quantized tensors stay in their ggml blocks in memory and are multiplied by the
--linear-backend's kernels (`ggml_backend.py`; on CPU by default the native `kernels/cpu/gguf_matmul.cpp`).

The loader (`model_loader/gguf.py`) yields, for every 2-D tensor, `<name>.qweight_type` (the ggml type id)
then `<name>.qweight` (the raw rows, uint8 [rows, row_bytes]). A fused layer (q/k/v, gate/up) may get
shards of different types (files often give v a finer type than q and k): each type is staged in its own
buffer through the layer's own sharding loader, and after loading the rows become one or more `parts`, one
matmul each.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import cast

import torch
from torch import nn

from pagedserve import envs
from pagedserve.errors import ConfigError
from pagedserve.kernels.cpu.gguf_ops import (
    GGML_BLOCK_FORMATS,
    NATIVE_GGML_TYPES,
    gguf_pack,
    gguf_packable,
    gguf_packed_matmul,
    gguf_packed_matmul_greedy,
    gguf_packed_rows,
)
from pagedserve.quantization.base import QuantizationConfig, QuantizeMethodBase
from pagedserve.quantization.ggml_backend import current_linear_backend, ggml_dequantize, ggml_linear

GGML_TYPE_NAMES = {id_: name for name, id_ in NATIVE_GGML_TYPES.items()}
# (param, checkpoint tensor, shard id) -> copies this rank's shard into param: the layer's own loader
ShardLoader = Callable[[nn.Parameter, torch.Tensor, object], object]


def row_bytes(ggml_type: int, cols: int) -> int:
    """Bytes of one row of `cols` weights in ggml blocks of `ggml_type`. Raises ConfigError when `cols`
    does not fill whole blocks (e.g. a tensor-parallel split that cuts through a block)."""
    weights, nbytes = GGML_BLOCK_FORMATS[ggml_type]
    if cols % weights:
        raise ConfigError(
            f"A GGUF weight row of {cols} columns does not split into whole blocks of {weights} "
            f"(ggml type {ggml_type}); choose a --tensor-parallel-size that keeps rows whole, "
            "or load dequantized with --quantization none."
        )
    return cols // weights * nbytes


@dataclass(frozen=True)
class GGUFPart:
    """Output rows [start, end) of a layer, stored as one ggml type: the file's rows (uint8 [end - start,
    row_bytes]), or, when `packed` (native backend only), those rows in the decode layout of `gguf_pack`
    (flat uint8). `backend`: the --linear-backend that multiplies them."""

    ggml_type: int
    start: int
    end: int
    rows: torch.Tensor
    packed: bool = False
    backend: str = "native"

    def matmul(self, x: torch.Tensor, activation_bits: int) -> torch.Tensor:
        if self.packed:
            return gguf_packed_matmul(x, self.rows, self.ggml_type, self.end - self.start, activation_bits)
        return ggml_linear(self.backend, x, self.rows, self.ggml_type, activation_bits)

    def dequantize(self, ids: torch.Tensor, cols: int, dtype: torch.dtype) -> torch.Tensor:
        """Rows `ids` (an embedding lookup) in `dtype`."""
        if self.packed:
            return gguf_packed_rows(self.rows, self.ggml_type, self.end - self.start, cols, ids).to(dtype)
        return ggml_dequantize(self.backend, self.rows.index_select(0, ids), self.ggml_type, cols, dtype)

    def packed_for_integers(self, activation_bits: int) -> "GGUFPart":
        """This part in the 16-row packed layout where it has one for `activation_bits` (Q4_0, Q4_1, Q8_0
        with 8 or 16; Q4_K, Q5_K, Q6_K with 8): a few times faster than the row kernels
        (gguf_packed_matmul.cpp, gguf_kquant_matmul.cpp say why). Float activations
        (PAGEDSERVE_GGUF_ACTIVATION_BITS=32) keep the rows and their exact kernel."""
        if self.packed or self.backend != "native" or not gguf_packable(self.ggml_type, activation_bits):
            return self
        return replace(self, rows=gguf_pack(self.rows, self.ggml_type), packed=True)


class GGUFMethod(QuantizeMethodBase):
    """Linear layers, the token embedding and the LM head on ggml blocks (float32 activations on the
    native backend, the model's dtype on the others)."""

    def __init__(self) -> None:
        self.backend = current_linear_backend()
        # NOTE: the build context's: the loaded rows are staged on the device the model is built on.
        self.device, self.dtype = torch.empty(0).device, torch.get_default_dtype()
        self.activation_bits = envs.gguf_activation_bits()
        self.cols = 0
        self.output_size = 0
        self.pending_types: dict[object, int] = {}  # shard id -> ggml type of the qweight that follows
        self.staging: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # type -> (rows, rows loaded mask)
        self.parts: list[GGUFPart] = []

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int) -> None:
        self.cols, self.output_size = input_size, output_size
        shard_loader = cast(ShardLoader, layer.weight_loader)
        qweight = nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
        qweight.weight_loader = lambda param, loaded, shard_id=None: self._load_rows(  # type: ignore[attr-defined]
            shard_loader, loaded, shard_id
        )
        qweight_type = nn.Parameter(torch.empty(0, dtype=torch.int64), requires_grad=False)
        qweight_type.weight_loader = (  # type: ignore[attr-defined]
            lambda param, loaded, shard_id=None: self.pending_types.__setitem__(shard_id, int(loaded))
        )
        layer.qweight, layer.qweight_type = qweight, qweight_type

    def _load_rows(self, shard_loader: ShardLoader, loaded: torch.Tensor, shard_id: object) -> None:
        ggml_type = self.pending_types.pop(shard_id)
        if ggml_type not in self.staging:
            self.staging[ggml_type] = (
                torch.zeros(
                    self.output_size, row_bytes(ggml_type, self.cols), dtype=torch.uint8, device=self.device
                ),
                torch.zeros(self.output_size, 1, dtype=torch.uint8, device=self.device),
            )
        rows, mask = self.staging[ggml_type]
        shard_loader(nn.Parameter(rows, requires_grad=False), loaded, shard_id)
        if shard_id is None:  # the whole weight in one tensor
            mask.fill_(1)
        else:  # NOTE: the layer's own loader says which output rows this shard fills (fused layers).
            shard_loader(
                nn.Parameter(mask, requires_grad=False),
                torch.ones(loaded.shape[0], 1, dtype=torch.uint8),
                shard_id,
            )

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if not self.staging:
            return  # a tied LM head: its embedding already finalized the shared storage
        runs = sorted(
            (start, end, ggml_type)
            for ggml_type, (_, mask) in self.staging.items()
            for start, end in _runs(mask.flatten().bool().cpu())
        )
        pieces = [
            GGUFPart(
                ggml_type, start, end, self.staging[ggml_type][0][start:end], backend=self.backend
            ).packed_for_integers(self.activation_bits)
            for start, end, ggml_type in runs
        ]
        self.staging = {}
        self.parts = self._share_storage(layer, pieces)

    @staticmethod
    def _share_storage(layer: nn.Module, pieces: list[GGUFPart]) -> list[GGUFPart]:
        """One uint8 tensor for the layer's `qweight` (what state dicts and memory counts see), the parts
        views into it."""
        storage = pieces[0].rows if len(pieces) == 1 else torch.cat([p.rows.flatten() for p in pieces])
        layer.qweight.data = storage
        layer.qweight_type.data = torch.tensor([p.ggml_type for p in pieces])
        parts, offset = [], 0
        for piece in pieces:
            view = storage.view(-1)[offset : offset + piece.rows.numel()].view(piece.rows.shape)
            parts.append(replace(piece, rows=view))
            offset += piece.rows.numel()
        return parts

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.dtype == torch.float32 and len(self.parts) == 1:  # the hot path: no reshapes
            return self.parts[0].matmul(x, self.activation_bits)
        flat = x.reshape(-1, self.cols)
        if self.backend == "native":  # NOTE: the C++ kernels take float32 activations
            flat = flat.float()
        outputs = [part.matmul(flat, self.activation_bits) for part in self.parts]
        y = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
        return y.reshape(*x.shape[:-1], self.output_size).to(x.dtype)

    def apply_greedy(self, layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The packed kernel folds the argmax into the matmul (gguf_packed_greedy.cpp's FusedArgmax)."""
        part = self.parts[0]
        if x.dim() != 2 or x.dtype != torch.float32 or len(self.parts) != 1 or not part.packed:
            return self.apply(layer, x), None
        logits, tokens = gguf_packed_matmul_greedy(
            x, part.rows, part.ggml_type, part.end - part.start, self.activation_bits
        )
        return logits, tokens

    def storage_formats(self, layer: nn.Module) -> set[str]:
        if not self.parts:  # float (an int8/int4 layer whose rows fill no group)
            return super().storage_formats(layer)
        return {GGML_TYPE_NAMES[part.ggml_type] for part in self.parts}

    def embedding(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        (part,) = self.parts  # an embedding is one tensor, so one type
        return part.dequantize(ids, self.cols, self.dtype)


def _runs(mask: torch.Tensor) -> list[tuple[int, int]]:
    """Maximal runs [start, end) of True in a 1-D bool tensor."""
    padded = torch.cat([torch.tensor([False]), mask, torch.tensor([False])]).int()
    edges = torch.nonzero(padded.diff()).flatten().tolist()
    return list(zip(edges[0::2], edges[1::2]))


class GGUFConfig(QuantizationConfig):
    """Every matrix of the file stays in its ggml blocks: linear layers, experts, embedding, LM head; or
    the experts in a format the experts layer keeps itself (gpt-oss's MXFP4: the config reader's
    `quantization_config.packed_experts`, the blocks repacked in model_loader/gguf_gate_up.py)."""

    name = "gguf"
    quantizes_experts = True

    def __init__(self, packed_experts: str | None = None) -> None:
        self.packed_experts = packed_experts

    @classmethod
    def from_checkpoint(cls, quant_config: dict[str, object]) -> "GGUFConfig":
        packed = quant_config.get("packed_experts")
        return cls(None if packed is None else str(packed))

    def get_linear_method(self) -> QuantizeMethodBase:
        return GGUFMethod()

    def get_embedding_method(self) -> QuantizeMethodBase:
        return GGUFMethod()

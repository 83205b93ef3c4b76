"""The interface every weight-quantization scheme implements (as vLLM's `quantization/`): a
`QuantizationConfig` (what the checkpoint or the flag says) hands each layer a `QuantizeMethodBase` that
creates its parameters, takes the checkpoint's tensors through the layer's own sharding loaders, and
computes the layer's output."""

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.kernels.cpu.float_ops import float_matmul, float_matmul_available


class QuantizeMethodBase(ABC):
    """How one layer stores and applies its weight. The layer owns the tensor-parallel geometry and a
    `weight_loader(param, loaded, shard_id)` that copies its shard of a checkpoint tensor into `param`;
    the method owns the storage format."""

    @abstractmethod
    def create_weights(self, layer: nn.Module, input_size: int, output_size: int) -> None:
        """Register the layer's weight parameters for an [output_size, input_size] (per rank) weight, each
        with a `weight_loader` attribute that the model's `load_weights` calls."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """x [..., input_size] -> x W^T [..., output_size] (bias excluded: the layer adds it)."""

    def apply_greedy(self, layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`apply`, plus each output row's argmax where the kernel finds it on the way (an LM head's greedy
        tokens, without reading the logits again); None where it does not."""
        return self.apply(layer, x), None

    def embedding(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` [T] of the weight as [T, input_size] (embedding layers only)."""
        raise NotImplementedError(f"{type(self).__name__} does not quantize embeddings")

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Called once every checkpoint tensor is loaded: repack, quantize online, free staging."""

    def storage_formats(self, layer: nn.Module) -> set[str]:
        """How the layer's weight is stored, for the startup log: its parameters' dtypes unless the
        method says better."""
        return {str(p.dtype).removeprefix("torch.") for p in layer.parameters(recurse=False)}


def linear(x: torch.Tensor, weight: torch.Tensor, row_invariant: bool = True) -> torch.Tensor:
    """x [..., K] times weight^T, weight [N, K]. On CPU in float32, with `row_invariant`, by the native
    row-invariant kernel (kernels/cpu/float_matmul.cpp): a token's output has the same bits whatever the
    batch it shares. Elsewhere (`row_invariant` False, another dtype or device, no native kernels) torch's
    F.linear, whose oneDNN GEMM on CPU picks its kernel and summation order by the number of rows."""
    if row_invariant and x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32:
        if float_matmul_available():
            out = float_matmul(x.reshape(-1, x.shape[-1]), weight)
            return out.view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight)


class UnquantizedMethod(QuantizeMethodBase):
    """A plain [output, input] weight in the model's dtype, multiplied by `linear`: row-invariant on CPU in
    float32 unless built with `row_invariant=False` (then oneDNN's F.linear, faster at prefill). None: as
    the model being built asks (`set_quantization_config`; --batch-invariant)."""

    def __init__(self, row_invariant: bool | None = None) -> None:
        self.row_invariant = _row_invariant[0] if row_invariant is None else row_invariant

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int) -> None:
        # NOTE: zeros, not empty: an embedding's padding rows past the vocabulary are never loaded.
        layer.weight = nn.Parameter(torch.zeros(output_size, input_size), requires_grad=False)
        layer.weight.weight_loader = layer.weight_loader  # type: ignore[attr-defined]  # NOTE: read by load_weights

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return linear(x, cast(torch.Tensor, layer.weight), self.row_invariant)

    def embedding(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, cast(torch.Tensor, layer.weight))


class QuantizationConfig(ABC):
    """One scheme's settings. `name` is the scheme's --quantization name (vLLM's where vLLM has one).
    `quantizes_experts`: a fused experts layer keeps each expert as its linear method stores it (else its
    experts are float, or in `packed_experts`' format)."""

    name: str
    quantizes_experts: bool = False
    packed_experts: str | None = None  # a format the fused experts layer stores itself (mxfp4)

    @classmethod
    def from_checkpoint(cls, quant_config: dict[str, object]) -> "QuantizationConfig":
        """The scheme as config.json's `quantization_config` describes it (schemes without settings
        ignore it)."""
        return cls()

    @abstractmethod
    def get_linear_method(self) -> QuantizeMethodBase:
        """The method of a linear (column/row/qkv/merged) layer."""

    def prepare_layers(self, model: nn.Module) -> None:
        """Called once the model is built (in its device and dtype), before any weight loads: layers
        the checkpoint treats apart by name (fp8's `ignored_layers`) change method here."""

    def get_embedding_method(self) -> QuantizeMethodBase:
        """The method of the token embedding and the LM head (unquantized unless the scheme says so)."""
        return UnquantizedMethod()


_current: list[QuantizationConfig | None] = [None]
_row_invariant: list[bool] = [True]
_linear_backend: list[str] = ["native"]


@contextlib.contextmanager
def set_quantization_config(
    config: QuantizationConfig | None, row_invariant: bool = True, linear_backend: str = "native"
) -> Iterator[None]:
    """Layers built inside this context take their methods from `config` (None: unquantized), their float
    matmuls row-invariant or not, their quantized ones on `linear_backend` (--linear-backend, resolved),
    so the model classes need not thread these through every constructor."""
    previous = _current[0], _row_invariant[0], _linear_backend[0]
    _current[0], _row_invariant[0], _linear_backend[0] = config, row_invariant, linear_backend
    try:
        yield
    finally:
        _current[0], _row_invariant[0], _linear_backend[0] = previous


def linear_backend() -> str:
    """The --linear-backend of the model being built (`set_quantization_config`)."""
    return _linear_backend[0]


def linear_method() -> QuantizeMethodBase:
    config = _current[0]
    return UnquantizedMethod() if config is None else config.get_linear_method()


def experts_quantized() -> bool:
    """Whether the experts layer being built stores each expert through `linear_method()`."""
    config = _current[0]
    return config is not None and config.quantizes_experts


def packed_experts() -> str | None:
    """The format the experts layer being built keeps its experts in itself (mxfp4), or None."""
    config = _current[0]
    return None if config is None else config.packed_experts


def embedding_method() -> QuantizeMethodBase:
    config = _current[0]
    return UnquantizedMethod() if config is None else config.get_embedding_method()

"""Tensor-parallel linear layers. Each parameter carries a `weight_loader` that copies its own shard of a
full checkpoint tensor, so no rank ever materializes more than its part of the model. How the weight is
stored and multiplied (float, or a quantization scheme) is the layer's `quant_method`'s business."""

from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn

from pagedserve.distributed import get_tp_rank, get_tp_world_size, tensor_model_parallel_all_reduce
from pagedserve.quantization.base import linear_method

# (param, checkpoint tensor, shard id) -> copies this rank's shard into param
WeightLoader = Callable[[nn.Parameter, torch.Tensor, object], object]


def _divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(
            f"{what}={numerator} is not divisible by tensor_parallel_size={denominator}; "
            "choose a --tensor-parallel-size that divides it."
        )
    return numerator // denominator


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


def _copy_whole(param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
    """The loader of a replicated parameter: every rank holds all of it."""
    param.data.copy_(loaded)


class LinearDelta(Protocol):
    """What a layer adds to its output beside its weight: the LoRA adapters of the step (lora/layers.py)."""

    def add_to(self, y: torch.Tensor, x: torch.Tensor) -> None:
        """y [T, out] += the delta of input x [T, in], in place."""


def set_weight_loader(param: nn.Parameter, loader: WeightLoader) -> None:
    """Attach the function that copies this rank's shard of a checkpoint tensor into `param`."""
    param.weight_loader = loader  # type: ignore[attr-defined]  # NOTE: read by the model's load_weights


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W split by output rows: each rank computes its slice of y. `shard_ids`: the
    checkpoint projections fused in it, in output order (what its weight_loader takes)."""

    shard_ids: tuple[object, ...] = (None,)
    replicated = False  # every rank holds all of W (ReplicatedLinear)

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = (0, 1) if self.replicated else (get_tp_rank(), get_tp_world_size())
        # NOTE: not `input_size_per_partition`: quantization methods tell a row-parallel layer by that name.
        self.input_size = input_size
        self.output_size_per_partition = _divide(output_size, self.tp_size, "output size")
        self.lora: LinearDelta | None = None
        self.quant_method = linear_method()
        self.quant_method.create_weights(self, input_size, self.output_size_per_partition)
        self.bias = _param(self.output_size_per_partition) if bias else None
        if self.bias is not None:
            set_weight_loader(self.bias, self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        size = param.shape[0]
        param.data.copy_(loaded.narrow(0, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.quant_method.apply(self, x)
        if self.lora is not None:
            self.lora.add_to(y, x)
        return y if self.bias is None else y + self.bias


class ReplicatedLinear(ColumnParallelLinear):
    """y = x W^T + b computed whole on every rank (MLA's down projections: its latent is replicated)."""

    replicated = True


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input fused into one matmul (gate and up)."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        self.output_sizes = output_sizes
        self.shard_ids = tuple(range(len(output_sizes)))
        super().__init__(input_size, sum(output_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        assert isinstance(shard_id, int)
        size = self.output_sizes[shard_id] // self.tp_size
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, self.tp_rank * size, size))


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection. Heads are split across ranks; with fewer KV heads than ranks, each KV
    head is replicated on tp_size / num_kv_heads ranks."""

    shard_ids = ("q", "k", "v")

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        total_num_heads: int,
        total_num_kv_heads: int,
        bias: bool = False,
    ) -> None:
        tp_size = get_tp_world_size()
        self.head_dim = head_dim
        self.num_heads = _divide(total_num_heads, tp_size, "num_attention_heads")
        if total_num_kv_heads >= tp_size:
            self.num_kv_heads = _divide(total_num_kv_heads, tp_size, "num_key_value_heads")
            self.num_kv_head_replicas = 1
        else:
            self.num_kv_heads = 1
            self.num_kv_head_replicas = _divide(tp_size, total_num_kv_heads, "tp size over kv heads")
        output_size = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp_size
        super().__init__(hidden_size, output_size, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if shard_id == "q":
            offset, size, index = 0, q_size, self.tp_rank
        elif shard_id == "k":
            offset, size, index = q_size, kv_size, self.tp_rank // self.num_kv_head_replicas
        else:
            assert shard_id == "v"
            offset, size, index = q_size + kv_size, kv_size, self.tp_rank // self.num_kv_head_replicas
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, index * size, size))


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W split by input columns: each rank multiplies its slice of x (the output of
    a column-parallel layer) and the partial sums are all-reduced."""

    shard_ids: tuple[object, ...] = (None,)

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_world_size()
        self.input_size_per_partition = _divide(input_size, self.tp_size, "input size")
        self.output_size = output_size
        self.lora: LinearDelta | None = None
        self.quant_method = linear_method()
        self.quant_method.create_weights(self, self.input_size_per_partition, output_size)
        self.bias = _param(output_size) if bias else None
        if self.bias is not None:
            set_weight_loader(self.bias, _copy_whole)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        size = param.shape[1]
        param.data.copy_(loaded.narrow(1, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.quant_method.apply(self, x)
        if self.lora is not None:  # NOTE: its partial sum too, before the all-reduce adds the ranks'
            self.lora.add_to(y, x)
        y = tensor_model_parallel_all_reduce(y)
        return y if self.bias is None else y + self.bias

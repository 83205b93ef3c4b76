"""Mixture of experts: top-k routing as HF does it, and a fused experts layer that groups the step's tokens
by expert and runs one gate/up and one down matmul per active expert (no loop over tokens).

Under tensor parallelism every rank holds every expert's slice of the intermediate dimension (gate/up rows,
down columns), as the dense MLP is split; the partial outputs are all-reduced once per layer.

A quantized checkpoint (GGUF) keeps each expert's blocks: its gate/up and down projections are then the
dense MLP's own layer classes, whose quantization method stores and multiplies the blocks (--linear-backend)
and whose loaders split them over tensor-parallel ranks. MXFP4 experts (gpt-oss) stay in the layer as the
checkpoint's blocks and scales, multiplied on --linear-backend's block kernels (quantization/mxfp4.py)."""

from typing import cast

import torch
from torch import nn

from pagedserve.distributed import get_tp_rank, get_tp_world_size, tensor_model_parallel_all_reduce
from pagedserve.layers.activation import gated_activation
from pagedserve.layers.linear import (
    MergedColumnParallelLinear,
    RowParallelLinear,
    _divide,
    set_weight_loader,
)
from pagedserve.quantization.base import (
    QuantizeMethodBase,
    experts_quantized,
    linear,
    linear_backend,
    packed_experts,
)
from pagedserve.quantization.mxfp4 import Mxfp4ExpertsMethod


def select_experts(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, num_experts] -> (weights [T, top_k] in the logits' dtype, expert ids [T, top_k]):
    softmax in float32, the top k, renormalized to sum to one when `renormalize` (HF's order)."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids


def select_top_logits(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss's routing: the top k logits, then a softmax over those k alone (HF's order)."""
    logits, ids = torch.topk(router_logits, top_k, dim=-1)
    return torch.softmax(logits, dim=-1, dtype=logits.dtype), ids


def select_grouped_experts(
    router_logits: torch.Tensor,
    top_k: int,
    num_groups: int,
    topk_groups: int,
    correction_bias: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's routing, router_logits [T, num_experts] in float32 -> (scores [T, top_k], ids [T, top_k]).
    Without `correction_bias` (V2): softmax scores; the experts of the `topk_groups` groups whose best
    expert scores highest compete. With it (V3, noaux_tc): sigmoid scores, the bias added for the choice
    only (groups ranked by the sum of their two best), the weights the unbiased scores. One group: plain
    top-k (V2's greedy)."""
    biased = correction_bias is not None
    scores = router_logits.sigmoid() if biased else router_logits.softmax(dim=-1)
    choice = scores + correction_bias if correction_bias is not None else scores
    if num_groups > 1:
        grouped = choice.view(choice.shape[0], num_groups, -1)
        group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1) if biased else grouped.max(dim=-1).values
        kept = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(topk_groups, dim=-1)[1], 1)
        # NOTE: a dropped expert scores -inf (V3) or 0 (V2: HF's, so a kept expert of score 0 ties with it)
        mask = kept.bool()[:, :, None].expand_as(grouped).reshape_as(choice)
        choice = choice.masked_fill(~mask, float("-inf") if biased else 0.0)
    ids = choice.topk(top_k, dim=-1)[1]
    return scores.gather(1, ids), ids


class FusedMoE(nn.Module):
    """Experts' weights stacked: w13 [num_experts, 2 * intermediate / tp, hidden] (gate rows, then up
    rows) and w2 [num_experts, hidden, intermediate / tp]; quantized, one gate/up layer per expert (`w13`,
    shards 0 and 1) and one down layer (`w2`). `activation`: the gated activation of w13's output when it
    is not a `hidden_act` name's (gpt-oss's clamped SwiGLU); `bias`: each expert's w13_bias
    [num_experts, 2 * intermediate / tp] and w2_bias [num_experts, hidden] (gpt-oss)."""

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        hidden_act: str = "silu",
        activation: nn.Module | None = None,
        bias: bool = False,
    ) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_world_size()
        # NOTE: the linear layers' check of the split, with its message naming the flag.
        self.intermediate = _divide(intermediate_size, self.tp_size, "moe intermediate size")
        self.num_experts = num_experts
        self.act_fn = activation or gated_activation(hidden_act)
        self.mxfp4 = packed_experts() == "mxfp4"
        # NOTE: a scheme that quantizes experts may leave them to the layer (a GGUF's MXFP4 experts)
        self.quantized = experts_quantized() and not self.mxfp4
        self.has_bias = bias
        if bias:
            self.w13_bias = nn.Parameter(torch.empty(num_experts, 2 * self.intermediate), requires_grad=False)
            self.w2_bias = nn.Parameter(torch.empty(num_experts, hidden_size), requires_grad=False)
            for param in (self.w13_bias, self.w2_bias):
                set_weight_loader(param, self.weight_loader)
        if self.mxfp4:
            self.quant_method = Mxfp4ExpertsMethod(linear_backend(), num_experts)
            self.quant_method.create_weights(self, hidden_size, self.intermediate)
            return
        if self.quantized:
            self.w13 = nn.ModuleList(
                MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2) for _ in range(num_experts)
            )
            self.w2 = nn.ModuleList(
                RowParallelLinear(intermediate_size, hidden_size) for _ in range(num_experts)
            )
            return
        self.w13_weight = nn.Parameter(
            torch.empty(num_experts, 2 * self.intermediate, hidden_size), requires_grad=False
        )
        self.w2_weight = nn.Parameter(
            torch.empty(num_experts, hidden_size, self.intermediate), requires_grad=False
        )
        for param in (self.w13_weight, self.w2_weight):
            set_weight_loader(param, self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object) -> None:
        """shard_id (expert, part): part "gate" / "up" [intermediate, hidden] or "down" [hidden,
        intermediate] of one expert; expert None: every expert at once ("gate_up" [E, 2 * intermediate,
        hidden], "down" [E, hidden, intermediate]), the fused layout of newer checkpoints; the biases
        alike, without the hidden dimension ("gate_up" [E, 2 * intermediate]; "down" [E, hidden], whole
        on every rank)."""
        assert isinstance(shard_id, tuple)
        expert, part = shard_id
        size, start = self.intermediate, self.tp_rank * self.intermediate
        target = param.data if expert is None else param.data[expert]
        if param is getattr(self, "w2_bias", None):
            target.copy_(loaded)
        elif part == "down" and param.dtype == torch.uint8:  # MXFP4 blocks/scales: columns in blocks of 32
            dim = 2 if expert is None else 1
            blocks = target.shape[dim]
            target.copy_(loaded.narrow(dim, self.tp_rank * blocks, blocks))
        elif part == "down":
            target.copy_(loaded.narrow(len(loaded.shape) - 1, start, size))
        elif part == "gate_up":
            full = loaded.shape[1] // 2
            target[:, :size].copy_(loaded.narrow(1, start, size))
            target[:, size:].copy_(loaded.narrow(1, full + start, size))
        else:
            offset = 0 if part == "gate" else size
            target[offset : offset + size].copy_(loaded.narrow(0, start, size))

    def _project(self, name: str, expert: int, x: torch.Tensor) -> torch.Tensor:
        """x times expert `expert`'s w13 (gate/up) or w2 (down), transposed."""
        if self.quantized:  # NOTE: the method, not the layer's forward: one all-reduce for all experts
            layer = cast(nn.ModuleList, getattr(self, name))[expert]
            return cast(QuantizeMethodBase, layer.quant_method).apply(layer, x)
        if self.mxfp4:
            return self.quant_method.project(self, name, expert, x)
        return linear(x, cast(torch.Tensor, getattr(self, f"{name}_weight"))[expert])

    def _gate_up(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        out = self._project("w13", expert, x)
        return out + self.w13_bias[expert] if self.has_bias else out

    def _down(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        out = self._project("w2", expert, x)
        # NOTE: on one rank only: the partial outputs are summed over the ranks, the bias is whole on each.
        return out + self.w2_bias[expert] if self.has_bias and self.tp_rank == 0 else out

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """x [T, hidden]; topk_weights/topk_ids [T, top_k] -> sum_k weight * expert_k(x), [T, hidden]."""
        top_k = topk_ids.shape[1]
        flat_ids = topk_ids.flatten()  # [T * top_k]
        order = torch.argsort(flat_ids, stable=True)  # (token, choice) pairs grouped by expert
        tokens = order // top_k
        counts = torch.bincount(flat_ids, minlength=self.num_experts).tolist()
        grouped = x[tokens]  # [T * top_k, hidden]
        outputs = torch.empty_like(grouped)
        start = 0
        for expert, count in enumerate(counts):
            if count:
                rows = slice(start, start + count)
                hidden = self.act_fn(self._gate_up(expert, grouped[rows]))
                outputs[rows] = self._down(expert, hidden)
                start += count
        outputs *= topk_weights.flatten()[order, None]
        out = torch.zeros_like(x).index_add_(0, tokens, outputs)
        return tensor_model_parallel_all_reduce(out)

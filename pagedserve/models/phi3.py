"""Phi-3: the Llama blocks; the checkpoint stores q/k/v fused (qkv_proj) and gate/up fused (gate_up_proj),
split here into the shards each rank keeps; LongRoPE ("su") scaling is in layers/rotary.py."""

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from pagedserve.models.llama import LlamaForCausalLM, ParamShard
from pagedserve.utils.hf_config import head_dim

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def split_qkv(config: "PretrainedConfig", tensor: torch.Tensor) -> list[tuple[torch.Tensor, str]]:
    """A fused [q; k; v] tensor (rows) -> its three parts with their shard ids."""
    dim = head_dim(config)
    sizes = [config.num_attention_heads * dim] + [config.num_key_value_heads * dim] * 2
    return list(zip(torch.split(tensor, sizes), "qkv"))  # NOTE: a torch function reads a lazy tensor


class Phi3ForCausalLM(LlamaForCausalLM):
    def checkpoint_tensors(self, name: str, tensor: torch.Tensor) -> Iterator[ParamShard]:
        if ".qkv_proj." in name:
            yield from ((name, part, shard) for part, shard in split_qkv(self.config, tensor))
        elif ".gate_up_proj." in name:
            yield from ((name, part, shard) for shard, part in enumerate(torch.chunk(tensor, 2)))
        else:
            yield from super().checkpoint_tensors(name, tensor)

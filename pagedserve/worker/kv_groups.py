"""The workers' side of KV cache groups (`config/kv_layout.py`): which block tables each attention
layer reads, and which K/V tensor it shares with the layers at the same place in the other groups."""

from pagedserve.config.kv_layout import KVCacheGroups
from pagedserve.errors import ConfigError
from pagedserve.layers.attention import Attention


def bind_kv_cache_groups(layers: list[Attention], groups: KVCacheGroups, indices: range) -> dict[int, int]:
    """Set each of the model's attention layers (in model order; `indices`: their layer indices, a
    pipeline stage's) to its group; returns id(layer) -> the index of the K/V tensor it uses. Raises
    ConfigError when the layers do not match the groups read from the config (a family whose layers and
    config disagree about windows), or when layers that share a tensor differ in KV heads or head size."""
    places = groups.tensor_of_layer()
    if len(layers) != len(indices) or indices.stop > len(places):
        raise ConfigError(
            f"The model has {len(layers)} attention layers (layers {indices.start}-{indices.stop - 1} on "
            f"this rank) but its config describes {len(places)} (num_hidden_layers): the KV cache groups "
            "cannot be laid out."
        )
    tensor_of: dict[int, int] = {}
    shapes: dict[int, tuple[int, int]] = {}
    for index, layer in zip(indices, layers):
        group, tensor = places[index]
        if layer.spec.sliding_window != groups.windows[group]:
            raise ConfigError(
                f"Attention layer {index} has sliding window {layer.spec.sliding_window} but the config "
                f"gives it {groups.windows[group]}: the model and utils/hf_config.py disagree."
            )
        shape = (layer.spec.num_kv_heads, layer.spec.head_dim)
        if shapes.setdefault(tensor, shape) != shape:
            raise ConfigError(
                f"Attention layer {index} has {shape[0]} KV heads of size {shape[1]}, unlike the layers "
                f"sharing its K/V tensor ({shapes[tensor]}): models mixing windowed and full layers need "
                "one KV shape on every layer."
            )
        layer.kv_cache_group = group
        tensor_of[id(layer)] = tensor
    return tensor_of

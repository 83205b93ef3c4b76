"""Checkpoint tensors of a HF folder: `*.safetensors`, sharded (with an index) or not."""
import glob
import json
import os
from collections.abc import Iterator

import torch
from safetensors import safe_open

from pagedserve.errors import ConfigError


def iterate_safetensors(folder: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) one at a time, so only one tensor is in memory beyond the model."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        files = [os.path.join(folder, name) for name in files]
    else:
        files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise ConfigError(f"No *.safetensors files in {folder}: pagedserve loads safetensors or GGUF.")
    for path in files:
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
